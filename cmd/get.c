/* gridfsctl get: not implemented yet. */
#include "cmd.h"

const char get_help[] = "";
const struct option get_options[] = {{NULL, 0, NULL, 0}};

int
cmd_get(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
