/* gridfsctl serve: not implemented yet. */
#include "cmd.h"

const char serve_help[] = "";
const struct option serve_options[] = {{NULL, 0, NULL, 0}};

int
cmd_serve(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
