/* gridfsctl rm: not implemented yet. */
#include "cmd.h"

const char rm_help[] = "";
const struct option rm_options[] = {{NULL, 0, NULL, 0}};

int
cmd_rm(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
