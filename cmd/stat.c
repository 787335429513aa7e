/* gridfsctl stat: not implemented yet. */
#include "cmd.h"

const char stat_help[] = "";
const struct option stat_options[] = {{NULL, 0, NULL, 0}};

int
cmd_stat(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
