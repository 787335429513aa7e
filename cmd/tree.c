/*
 * Which files a command takes: the options that say which part of a disk
 * tree goes where in the bucket, shared by the verbs that store a tree
 * (import, watch), and the name filters they share with the verbs that
 * read stored names (mirror, verify): one set of rows, so that no two
 * verbs come to spell or explain them differently.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "../lib/walk.h"

enum { OPT_TREE_HIDDEN = 0x3000, OPT_TREE_KEEP_TEMP, OPT_EXCLUDE_FROM, OPT_FILES_FROM };

const struct cmd_opt filter_opts[] = {
	CMD_OPT('x', "exclude", "GLOB", "skip files and directories matching GLOB (repeatable)"),
	CMD_OPT('i', "include", "GLOB", "take only files matching GLOB (repeatable)"),
	CMD_OPT(0, "exclude-from", "FILE", "--exclude each GLOB of FILE, one a line (blank lines and "
	        "'#' comments skipped; '-' standard input)", .id = OPT_EXCLUDE_FROM),
	CMD_OPT(0, "files-from", "FILE", "take only the paths FILE lists, one a line, relative to DIR "
	        "or --prefix ('-' standard input)", .id = OPT_FILES_FROM),
	CMD_OPT_END,
};

const struct cmd_opt tree_opts[] = {
	PREFIX_OPT("store under the folder P (default: the top level)"),
	CMD_OPT_GROUP(filter_opts),
	CMD_OPT(0, "hidden", NULL, "take hidden files and directories (names starting with '.')",
	        .id = OPT_TREE_HIDDEN),
	CMD_OPT(0, "keep-temp", NULL, "take temporary files (*.part, *~, .#*)", .id = OPT_TREE_KEEP_TEMP),
	CMD_OPT('t', "type", "MIME", "content type for every file (default: detected by libmagic)"),
	CMD_OPT_END,
};

/* Appends each line of path ('-': stdin) to *out, but blank ones and '#' comments; -1 on error. */
static int
read_lines(const char *path, struct name_filter *f, const char ***out, size_t *n)
{
	FILE *in = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
	if (!in) {
		warn_("%s", path);
		return -1;
	}
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	while ((len = getline(&line, &cap, in)) >= 0) {
		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (len == 0 || line[0] == '#')
			continue;
		char *kept = gfs_xstrdup(strncmp(line, "./", 2) == 0 ? line + 2 : line);
		add_glob((const char ***)&f->lines, &f->n_lines, kept);
		add_glob(out, n, kept);
	}
	free(line);
	bool failed = ferror(in);
	int e = errno;
	if (in != stdin)
		fclose(in);
	if (failed) {
		errno = e;
		warn_("%s", path);
		return -1;
	}
	return 0;
}

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int
filter_option(int id, const char *arg, struct name_filter *f)
{
	switch (id) {
	case 'x': add_glob(&f->exclude, &f->n_exclude, arg); return 0;
	case 'i': add_glob(&f->include, &f->n_include, arg); return 0;
	case OPT_EXCLUDE_FROM: return read_lines(arg, f, &f->exclude, &f->n_exclude);
	case OPT_FILES_FROM:
		if (read_lines(arg, f, (const char ***)&f->files, &f->n_files) < 0)
			return -1;
		/* An empty list takes nothing, as asked: not the same as no list. */
		if (!f->files)
			f->files = gfs_xcalloc(1, sizeof *f->files);
		qsort(f->files, f->n_files, sizeof *f->files, cmp_str);
		return 0;
	}
	return 1;
}

bool
filter_active(const struct name_filter *f)
{
	return f->n_include || f->n_exclude || f->files;
}

/* For the walk's select: a path --files-from lists (a tree's files in the walk's terms). */
static bool
listed(const char *rel, void *ctx)
{
	const struct name_filter *f = ctx;
	return !f->files || bsearch(&rel, f->files, f->n_files, sizeof *f->files, cmp_str);
}

/* The walk options of f alone: every name taken but what f leaves out. */
static void
filter_walk(const struct name_filter *f, struct gfs_walk_opts *w)
{
	w->include = f->include;
	w->n_include = f->n_include;
	w->exclude = f->exclude;
	w->n_exclude = f->n_exclude;
	w->select = f->files ? listed : NULL;
	w->select_ctx = (void *)f;
}

bool
filter_selects(const struct name_filter *f, const char *rel)
{
	struct gfs_walk_opts w = {.hidden = true, .temp = true};
	filter_walk(f, &w);
	return gfs_walk_path_selected(&w, rel);
}

void
free_name_filter(struct name_filter *f)
{
	for (size_t i = 0; i < f->n_lines; i++)
		free(f->lines[i]);
	free(f->lines);
	free(f->include);
	free(f->exclude);
	free(f->files);
	memset(f, 0, sizeof *f);
}

int
tree_option(int id, const char *arg, struct tree_select *t)
{
	switch (id) {
	case 'p': t->prefix = arg; return 0;
	case 't': t->content_type = arg; return 0;
	case OPT_TREE_HIDDEN: t->hidden = true; return 0;
	case OPT_TREE_KEEP_TEMP: t->temp = true; return 0;
	}
	return filter_option(id, arg, &t->filter);
}

void
tree_select_walk(const struct tree_select *t, struct gfs_walk_opts *w)
{
	filter_walk(&t->filter, w);
	w->hidden = t->hidden;
	w->temp = t->temp;
}

void
free_tree_select(struct tree_select *t)
{
	free_name_filter(&t->filter);
}
