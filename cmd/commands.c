/* The verbs: the table main() and the completions look a command up in. */
#include <string.h>

#include "cmd.h"

/* Every command describes itself in its own file (cmd/cmd.h: struct cmd_entry). */
const struct cmd_entry *const commands[] = {
	&cmd_ls_entry, &cmd_get_entry, &cmd_put_entry, &cmd_rm_entry, &cmd_mv_entry, &cmd_stat_entry,
	&cmd_import_entry, &cmd_verify_entry, &cmd_mirror_entry, &cmd_watch_entry,
	&cmd_serve_entry, &cmd_supervise_entry, &cmd_doctor_entry, NULL,
};

const struct cmd_entry *
find_command(const char *name)
{
	for (const struct cmd_entry *const *c = commands; *c; c++)
		if (strcmp((*c)->name, name) == 0)
			return *c;
	return NULL;
}
