/* gridfsctl verify: not implemented yet. */
#include "cmd.h"

const char verify_help[] = "";
const struct option verify_options[] = {{NULL, 0, NULL, 0}};

int
cmd_verify(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
