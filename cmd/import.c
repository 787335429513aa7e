/* gridfsctl import: not implemented yet. */
#include "cmd.h"

const char import_help[] = "";
const struct option import_options[] = {{NULL, 0, NULL, 0}};

int
cmd_import(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	warnx_("not implemented yet");
	return EXIT_USAGE;
}
