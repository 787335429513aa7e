/* gridfsctl ls: not implemented yet. */
#include "cmd.h"

const char ls_help[] = "";
const struct option ls_options[] = {{NULL, 0, NULL, 0}};

int
cmd_ls(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
