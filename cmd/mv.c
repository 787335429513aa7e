/* gridfsctl mv: rename a stored file, every revision, never leaving neither name resolving. */
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "../lib/mirror/mirror.h"
#include "../lib/mv.h"

enum { OPT_JSON = 1, OPT_UNSAFE };

struct mv_opts {
	bool force, dry_run, json, allow_unsafe;
};

#define TO(field) CMD_TO(struct mv_opts, field)

static const struct cmd_opt mv_opts[] = {
	CMD_OPT('f', "force", NULL, "when NEW exists, replace it: its revisions are removed once "
	        "every revision of OLD carries NEW", .kind = CMD_SET, .to = TO(force)),
	CMD_OPT('n', "dry-run", NULL, "say what would be renamed and removed; change nothing",
	        .kind = CMD_SET, .to = TO(dry_run)),
	CMD_OPT(0, "allow-unsafe-name", NULL, "rename to a NEW that mirror and get would refuse as a "
	        "path", .id = OPT_UNSAFE, .kind = CMD_SET, .to = TO(allow_unsafe)),
	CMD_OPT(0, "json", NULL, "print one JSON event: {filename, from, moved, deleted}",
	        .id = OPT_JSON, .kind = CMD_SET, .to = TO(json)),
	CMD_OPT_END,
};

/* One line, human or JSON: what was (or would be) renamed and removed. */
static void
report(const struct mv_opts *o, const char *from, const char *to, size_t renamed, int64_t removed,
       int rc)
{
	if (o->json) {
		bson_t doc;
		json_event(&doc, "move");
		json_filename(&doc, to);
		BSON_APPEND_UTF8(&doc, "from", from);
		BSON_APPEND_INT64(&doc, "moved", (int64_t)renamed);
		BSON_APPEND_INT64(&doc, "deleted", removed);
		if (o->dry_run)
			BSON_APPEND_BOOL(&doc, "dryRun", true);
		if (rc != EXIT_OK)
			BSON_APPEND_UTF8(&doc, "error", last_message());
		print_json(stdout, &doc);
		bson_destroy(&doc);
	} else if (rc == EXIT_OK && o->dry_run) {
		action_line(stdout, true, "would rename %s -> %s (%zu revision%s); would remove %lld "
		            "older revision%s of %s", from, to, renamed, renamed == 1 ? "" : "s",
		            (long long)removed, removed == 1 ? "" : "s", to);
	}
}

static int
check_names(const struct mv_opts *o, const char *from, const char *to)
{
	gfs_error err;
	if (strcmp(from, to) == 0) {
		usage_error("OLD and NEW are the same name");
		return EXIT_USAGE;
	}
	if (!*to) {
		usage_error("NEW is empty");
		return EXIT_USAGE;
	}
	if (!o->allow_unsafe && !gfs_mirror_name_check(to, strlen(to), &err)) {
		warnx_("%s: %s, so mirror and get would refuse it as a path; --allow-unsafe-name to "
		       "rename to it anyway", to, err.msg);
		return EXIT_USAGE;
	}
	return EXIT_OK;
}

static int
run_mv(gfs_session *s, const struct mv_opts *o, const char *from, const char *to)
{
	gfs_mv_plan plan;
	gfs_error err;
	size_t renamed = 0;
	int64_t removed = 0;
	int rc = EXIT_OK;
	if (!gfs_mv_plan_load(s, from, to, &plan, &err)) {
		rc = fail(&err);
	} else if (plan.from.n == 0) {
		gfs_error_set(&err, GFS_ENOTFOUND, "%s: no such file", from);
		rc = fail(&err);
	} else if (plan.onto.n > 0 && !o->force) {
		warnx_("%s: exists (%zu revision%s); --force replaces it once the move is complete", to,
		       plan.onto.n, plan.onto.n == 1 ? "" : "s");
		rc = EXIT_USAGE;
	} else if (o->dry_run) {
		renamed = plan.from.n;
		removed = (int64_t)plan.onto.n;
	} else if (!gfs_mv_run(s, &plan, to, &renamed, &removed, &err)) {
		rc = fail(&err);
	}
	report(o, from, to, renamed, removed, rc);
	gfs_mv_plan_free(&plan);
	return rc;
}

static int
cmd_mv(int argc, char **argv)
{
	struct mv_opts o = {0};
	int i = parse_options(argc, argv, &cmd_mv_entry, NULL, &o);
	if (i < 0)
		return EXIT_USAGE;
	if (argc - i != 2) {
		usage_error("give OLD and NEW, two stored names");
		return EXIT_USAGE;
	}
	int rc = check_names(&o, argv[i], argv[i + 1]);
	if (rc != EXIT_OK)
		return rc;
	gfs_conn *conn = connect_for_writes();
	if (!conn)
		return EXIT_USAGE;
	gfs_session *s = gfs_session_pop(conn);
	/* A few updates: a signal waits for them, so the move is never left half done. */
	catch_interrupts(INTERRUPT_RESTART, NULL);
	rc = run_mv(s, &o, argv[i], argv[i + 1]);
	gfs_session_push(s);
	gfs_conn_close(conn);
	return rc;
}

static const struct cmd_exit mv_exits[] = {
	{0, "ok"}, {2, "usage, or NEW exists without --force"}, {3, "backend"},
	{4, "no such OLD"}, {-1, NULL},
};

const struct cmd_entry cmd_mv_entry = {
	.name = "mv",
	.summary = "rename a stored file (every revision)",
	.operands = "OLD NEW",
	.opts = mv_opts,
	.exits = mv_exits,
	.run = cmd_mv,
};
