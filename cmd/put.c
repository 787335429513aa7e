/* gridfsctl put: not implemented yet. */
#include "cmd.h"

const char put_help[] = "";
const struct option put_options[] = {{NULL, 0, NULL, 0}};

int
cmd_put(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
