/* gridfsctl mirror: not implemented yet. */
#include "cmd.h"

const char mirror_help[] = "";
const struct option mirror_options[] = {{NULL, 0, NULL, 0}};

int
cmd_mirror(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
