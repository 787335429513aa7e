/*
 * The options that say which part of a disk tree goes where in the bucket,
 * shared by the verbs that store a tree (import, watch): one set of rows,
 * so the two cannot come to spell or explain them differently.
 */
#include <stdlib.h>

#include "cmd.h"
#include "../lib/walk.h"

enum { OPT_TREE_HIDDEN = 0x3000, OPT_TREE_KEEP_TEMP };

const struct cmd_opt tree_opts[] = {
	PREFIX_OPT("store under the folder P (default: the top level)"),
	CMD_OPT('x', "exclude", "GLOB", "skip files and directories matching GLOB (repeatable)"),
	CMD_OPT('i', "include", "GLOB", "take only files matching GLOB (repeatable)"),
	CMD_OPT(0, "hidden", NULL, "take hidden files and directories (names starting with '.')",
	        .id = OPT_TREE_HIDDEN),
	CMD_OPT(0, "keep-temp", NULL, "take temporary files (*.part, *~, .#*)", .id = OPT_TREE_KEEP_TEMP),
	CMD_OPT('t', "type", "MIME", "content type for every file (default: detected by libmagic)"),
	CMD_OPT_END,
};

int
tree_option(int id, const char *arg, struct tree_select *t)
{
	switch (id) {
	case 'p': t->prefix = arg; return 0;
	case 'x': add_glob(&t->exclude, &t->n_exclude, arg); return 0;
	case 'i': add_glob(&t->include, &t->n_include, arg); return 0;
	case 't': t->content_type = arg; return 0;
	case OPT_TREE_HIDDEN: t->hidden = true; return 0;
	case OPT_TREE_KEEP_TEMP: t->temp = true; return 0;
	}
	return 1;
}

void
tree_select_walk(const struct tree_select *t, struct gfs_walk_opts *w)
{
	w->include = t->include;
	w->n_include = t->n_include;
	w->exclude = t->exclude;
	w->n_exclude = t->n_exclude;
	w->hidden = t->hidden;
	w->temp = t->temp;
}

void
free_tree_select(struct tree_select *t)
{
	free(t->include);
	free(t->exclude);
	t->include = t->exclude = NULL;
	t->n_include = t->n_exclude = 0;
}
