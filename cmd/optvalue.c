/*
 * The option rows that say what their argument becomes (struct cmd_opt's
 * kind, cmd/cmd.h): parse_options() hands each option here, and a row with
 * a kind is read, range-checked and written into the verb's options struct
 * in one place, with the row's own message when it is refused; the others
 * go on to the verb's on_opt. The readers are the ones the special
 * options use too (parse_int, parse_size, gfs_parse_duration_ms), so that
 * a number means the same whichever way its option is taken.
 */
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "../lib/util.h"

/* The row of rows (groups spliced in) that getopt's id stands for, or NULL. */
static const struct cmd_opt *
row_of(const struct cmd_opt *rows, int id)
{
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, rows);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));)
		if (o->name && !o->alias_of && cmd_opt_id(o) == id)
			return o;
	return NULL;
}

static int
refuse(const struct cmd_opt *o, const char *arg)
{
	if (o->bad)
		usage_error(o->bad, arg);
	else
		usage_error("--%s: invalid value '%s'", o->name, arg);
	return -1;
}

/* A row whose kind and field do not go together: a mistake in the rows, not the user's. */
static _Noreturn void
wrong_field(const struct cmd_opt *o)
{
	fprintf(stderr, "%s: internal error: --%s does not write a field of its kind\n", progname,
	        o->name);
	abort();
}

/* The field the row writes, checked to be of a type its kind can write. */
static void *
field_of(const struct cmd_opt *o, void *ctx)
{
	enum cmd_opt_type t = o->to.type;
	bool fits;
	switch (o->kind) {
	case CMD_SET:
	case CMD_CLEAR: fits = t == CMD_T_BOOL; break;
	case CMD_STRING: fits = t == CMD_T_STRING; break;
	default: fits = t != CMD_T_BOOL && t != CMD_T_STRING && t != 0; break;
	}
	if (!fits)
		wrong_field(o);
	return (char *)ctx + o->to.off;
}

/* v, already within the row's range, into a number field of the row's type. */
static void
store_number(const struct cmd_opt *o, void *field, uint64_t v)
{
	switch (o->to.type) {
	case CMD_T_INT: *(int *)field = (int)v; return;
	case CMD_T_LONG: *(long *)field = (long)v; return;
	case CMD_T_UINT: *(unsigned *)field = (unsigned)v; return;
	case CMD_T_ULONG: *(unsigned long *)field = (unsigned long)v; return;
	case CMD_T_ULLONG: *(unsigned long long *)field = (unsigned long long)v; return;
	default: wrong_field(o);
	}
}

/* The index of arg among the row's values, or -1. */
static long
word_index(const struct cmd_opt *o, const char *arg)
{
	size_t len = strlen(arg);
	long i = 0;
	for (const char *w = o->values; w && *w; i++) {
		size_t n = strcspn(w, " ");
		if (n == len && len && strncmp(w, arg, n) == 0)
			return i;
		w += n;
		w += strspn(w, " ");
	}
	return -1;
}

/* Reads arg as the row's kind says; false when it is malformed or out of range. */
static bool
read_number(const struct cmd_opt *o, const char *arg, uint64_t *out)
{
	long n;
	switch (o->kind) {
	case CMD_COUNT:
		if (!parse_int(arg, (long)o->min, (long)o->max, &n))
			return false;
		*out = (uint64_t)n;
		return true;
	case CMD_BYTES:
		return parse_size(arg, out) && *out >= o->min && *out <= o->max;
	case CMD_MS:
		if (!gfs_parse_duration_ms(arg, (long)o->min, (long)o->max, &n))
			return false;
		*out = (uint64_t)n;
		return true;
	case CMD_WORD:
		if ((n = word_index(o, arg)) < 0)
			return false;
		*out = (uint64_t)n;
		return true;
	default:
		return false;
	}
}

/* Takes the option of a row with a kind into ctx; 0, or -1 after a usage error. */
static int
store(const struct cmd_opt *o, const char *arg, void *ctx)
{
	void *field = field_of(o, ctx);
	uint64_t v;
	switch (o->kind) {
	case CMD_SET:
	case CMD_CLEAR:
		*(bool *)field = o->kind == CMD_SET;
		return 0;
	case CMD_STRING:
		if (o->min > 0 && !*arg)
			return refuse(o, arg);
		*(const char **)field = arg;
		return 0;
	default:
		if (!read_number(o, arg, &v))
			return refuse(o, arg);
		store_number(o, field, v);
		return 0;
	}
}

int
cmd_opt_take(const struct cmd_opt *rows, int id, const char *arg, opt_fn on_opt, void *ctx)
{
	const struct cmd_opt *o = row_of(rows, id);
	if (o && o->kind != CMD_CALL)
		return store(o, arg, ctx);
	if (!on_opt) {
		fprintf(stderr, "%s: internal error: option %d has no row that takes it\n", progname, id);
		abort();
	}
	return on_opt(id, arg, ctx);
}
