/* gridfsctl watch: not implemented yet. */
#include "cmd.h"

const char watch_help[] = "";
const struct option watch_options[] = {{NULL, 0, NULL, 0}};

int
cmd_watch(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
