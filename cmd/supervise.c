/* gridfsctl supervise: not implemented yet. */
#include "cmd.h"

const char supervise_help[] = "";
const struct option supervise_options[] = {{NULL, 0, NULL, 0}};

int
cmd_supervise(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
