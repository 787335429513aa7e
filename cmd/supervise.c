/*
 * gridfsctl supervise: run backends and servers, restart them when they die,
 * print "Too many open files", fail health checks or run out of descriptors.
 * The work is in lib/supervise/; this file parses options and is the
 * control client (status, restart, stop, reload).
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/supervise/supervise.h"
#include "cmd.h"

enum {
	OPT_CONTROL = 0x100,
	OPT_CHECK,
	OPT_JSON,
	OPT_NAME,
	OPT_RESTART_ON,
	OPT_NOFILE,
	OPT_HEALTH,
	OPT_LISTEN,
	OPT_INSTANCES,
	OPT_LOG,
	OPT_STOP_SIGNAL,
	OPT_STOP_GRACE,
	OPT_MAX_RESTARTS,
};

#define SV_OPT(name, arg, val, help, ...) CMD_OPT(0, name, arg, help, .id = (val), __VA_ARGS__)

/* Quick-form settings, applied as config keys so both forms parse values alike. */
struct kv {
	const char *key, *value;
};

struct opts {
	const char *config;
	const char *control;
	const char *name;
	bool check, json, quick_given;
	struct kv kvs[64];
	int nkv;
};

#define TO(field) CMD_TO(struct opts, field)

static const struct cmd_opt supervise_opts[] = {
	CMD_OPT('c', "config", "FILE", "run the programs of an INI file (see gridfsctl-supervise.conf(5))",
	        .kind = CMD_STRING, .to = TO(config)),
	SV_OPT("control", "PATH", OPT_CONTROL, "control socket (default: the config's, else "
	       "$XDG_RUNTIME_DIR, /run/gridfsctl, or /tmp/gridfsctl-UID)", .kind = CMD_STRING,
	       .to = TO(control)),
	SV_OPT("check", NULL, OPT_CHECK, "parse the config, print what would run, and exit",
	       .kind = CMD_SET, .to = TO(check)),
	SV_OPT("json", NULL, OPT_JSON, "status: one JSON object per instance", .kind = CMD_SET,
	       .to = TO(json)),
	CMD_OPT_HEADING("quick form (gridfsctl supervise [options] -- CMD ARGS...):"),
	SV_OPT("name", "NAME", OPT_NAME, "program name (default: the command's basename)"),
	SV_OPT("restart-on", "REGEX", OPT_RESTART_ON, "restart when a line on its stderr matches "
	       "(repeatable; replaces the defaults: 'Too many open files', 'can not open file', EMFILE...)"),
	SV_OPT("nofile", "N", OPT_NOFILE, "RLIMIT_NOFILE (soft and hard) for the program"),
	SV_OPT("health", "URL", OPT_HEALTH, "mongodb://... ping or http://host:port/path check"),
	SV_OPT("listen", "HOST:PORT", OPT_LISTEN, "bind and pass the socket as LISTEN_FDS=1"),
	SV_OPT("instances", "N", OPT_INSTANCES, "run N copies (they share the --listen socket)"),
	SV_OPT("log", "FILE", OPT_LOG, "program output to FILE (rotated at 10M) instead of stdout"),
	SV_OPT("stop-signal", "SIG", OPT_STOP_SIGNAL, "signal that asks it to stop (default TERM)"),
	SV_OPT("stop-grace", "TIME", OPT_STOP_GRACE, "SIGKILL after this (default 10s)"),
	SV_OPT("max-restarts", "N", OPT_MAX_RESTARTS, "FATAL after N restarts within a minute (default 5)"),
	CMD_OPT_HEADING("control (talks to a running supervisor):"),
	CMD_OPT_WORD("status", "[--json]", "states, pids, restarts, uptime, health, descriptor use"),
	CMD_OPT_WORD("restart", "NAME|all", "restart a program (instances one at a time) or instance NAME:I"),
	CMD_OPT_WORD("reload", NULL, "re-read the config (as SIGHUP)"),
	CMD_OPT_WORD("stop", NULL, "stop every program and the supervisor; waits until done"),
	CMD_OPT_END,
};

/* The quick form's rows: each is a key of the program's section. */
static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct opts *o = ctx;
	static const char *const keys[] = {
		[OPT_RESTART_ON - OPT_RESTART_ON] = "restart_on",
		[OPT_NOFILE - OPT_RESTART_ON] = "nofile",
		[OPT_HEALTH - OPT_RESTART_ON] = "health",
		[OPT_LISTEN - OPT_RESTART_ON] = "listen",
		[OPT_INSTANCES - OPT_RESTART_ON] = "instances",
		[OPT_LOG - OPT_RESTART_ON] = "log",
		[OPT_STOP_SIGNAL - OPT_RESTART_ON] = "stop_signal",
		[OPT_STOP_GRACE - OPT_RESTART_ON] = "stop_grace",
		[OPT_MAX_RESTARTS - OPT_RESTART_ON] = "max_restarts",
	};
	if (opt == OPT_NAME) {
		o->name = arg;
		o->quick_given = true;
		return 0;
	}
	if (opt >= OPT_RESTART_ON && opt <= OPT_MAX_RESTARTS) {
		if (o->nkv == (int)(sizeof o->kvs / sizeof o->kvs[0])) {
			usage_error("too many options");
			return -1;
		}
		o->kvs[o->nkv++] = (struct kv){keys[opt - OPT_RESTART_ON], arg};
		o->quick_given = true;
		return 0;
	}
	return -1;
}

/* ---- running ------------------------------------------------------------- */

/* Quotes a word so that sv_split_command() gives it back unchanged. */
static void
append_quoted(char **buf, size_t *len, const char *w)
{
	size_t need = *len + strlen(w) * 4 + 4;
	*buf = gfs_xreallocarray(*buf, need, 1);
	char *p = *buf + *len;
	if (*len)
		*p++ = ' ';
	bool plain = *w != '\0' && strspn(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	                                        "0123456789-_./=:,+@%") == strlen(w);
	if (plain) {
		strcpy(p, w);
		p += strlen(w);
	} else {
		*p++ = '\'';
		for (; *w; w++) {
			if (*w == '\'') {
				memcpy(p, "'\\''", 4);
				p += 4;
			} else {
				*p++ = *w;
			}
		}
		*p++ = '\'';
	}
	*p = '\0';
	*len = (size_t)(p - *buf);
}

static bool
quick_config(struct opts *o, int argc, char **argv, struct sv_config *cfg)
{
	memset(cfg, 0, sizeof *cfg);
	const char *name = o->name;
	char base[128];
	if (!name) {
		const char *slash = strrchr(argv[0], '/');
		snprintf(base, sizeof base, "%s", slash ? slash + 1 : argv[0]);
		for (char *c = base; *c; c++)
			if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.", *c))
				*c = '_';
		name = base;
	}
	cfg->progs = gfs_xcalloc(1, sizeof *cfg->progs);
	cfg->nprogs = 1;
	struct sv_program *p = &cfg->progs[0];
	sv_program_defaults(p, name);
	char *cmd = NULL;
	size_t len = 0;
	for (int i = 0; i < argc; i++)
		append_quoted(&cmd, &len, argv[i]);
	char err[400];
	bool ok = sv_program_set(p, "command", cmd, err, sizeof err);
	free(cmd);
	for (int i = 0; ok && i < o->nkv; i++)
		ok = sv_program_set(p, o->kvs[i].key, o->kvs[i].value, err, sizeof err);
	if (ok)
		ok = sv_program_check(p, err, sizeof err);
	if (!ok) {
		usage_error("%s", err);
		sv_config_free(cfg);
		return false;
	}
	return true;
}

static void
print_check(const struct sv_config *cfg)
{
	for (size_t i = 0; i < cfg->nprogs; i++) {
		const struct sv_program *p = &cfg->progs[i];
		char *cmd = sv_redact_command(p->command); /* --check output gets pasted into tickets */
		printf("%s: %d instance%s: %s\n", p->name, p->instances, p->instances == 1 ? "" : "s",
		       cmd);
		free(cmd);
		for (char **a = p->argv; *a; a++) {
			char *arg = sv_redact_command(*a);
			printf("  argv: %s\n", arg);
			free(arg);
		}
		if (p->nofile)
			printf("  nofile: %ld\n", p->nofile);
		if (p->listen)
			printf("  listen: %s\n", p->listen);
		if (p->after)
			printf("  after: %s\n", p->after);
		if (p->health) {
			char *shown = gfs_uri_redact(p->health);
			printf("  health: %s every %d ms, timeout %d ms\n", shown, p->health_interval_ms,
			       p->health_timeout_ms);
			bson_free(shown);
		}
		if (p->log)
			printf("  log: %s\n", p->log);
		for (size_t k = 0; k < p->npatterns; k++)
			printf("  restart_on: %s\n", p->patterns[k]);
		if (p->npatterns)
			printf("  restart_on_stream: %s\n", p->restart_on_stream == SV_STREAM_BOTH ? "both"
			       : p->restart_on_stream == SV_STREAM_STDOUT ? "stdout" : "stderr");
	}
}

static int
run_supervisor(struct opts *o, struct sv_config *cfg)
{
	if (o->check) {
		print_check(cfg);
		sv_config_free(cfg);
		return EXIT_OK;
	}
	/* Event lines go through the supervisor's own non-blocking relay, not stdio. */
	char prefix[128];
	snprintf(prefix, sizeof prefix, "%s %s: ", progname, cmdname);
	struct sv_callbacks cb = {.event_fd = STDERR_FILENO, .event_prefix = prefix,
	                          .output_fd = STDOUT_FILENO};
	bool busy;
	char err[600];
	struct sv *s = sv_new(cfg, o->config, o->control, &cb, &busy, err, sizeof err);
	if (!s) {
		warnx_("%s", err);
		return busy ? EXIT_BUSY : EXIT_LOCAL;
	}
	int rc = sv_run(s);
	sv_free(s);
	return rc == 0 ? EXIT_OK : EXIT_PARTIAL;
}

/* ---- the control client --------------------------------------------------- */

static char *
control_path(struct opts *o)
{
	if (o->control)
		return strdup(o->control);
	if (o->config) {
		struct sv_config cfg;
		char err[600];
		if (!sv_config_load(o->config, &cfg, err, sizeof err)) {
			warnx_("%s", err);
			return NULL;
		}
		char *p = cfg.control ? strdup(cfg.control) : NULL;
		sv_config_free(&cfg);
		if (p)
			return p;
	}
	return sv_default_control_path();
}

static const char *
str_field(const bson_t *doc, const char *key, const char *dflt)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, doc, key) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return dflt;
}

static double
num_field(const bson_t *doc, const char *key)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, doc, key) && BSON_ITER_HOLDS_NUMBER(&it))
		return bson_iter_as_double(&it);
	return 0;
}

static void
format_uptime(double s, char *buf, size_t len)
{
	long t = (long)s;
	if (t >= 86400)
		snprintf(buf, len, "%ldd%ldh", t / 86400, t % 86400 / 3600);
	else if (t >= 3600)
		snprintf(buf, len, "%ldh%ldm", t / 3600, t % 3600 / 60);
	else if (t >= 60)
		snprintf(buf, len, "%ldm%lds", t / 60, t % 60);
	else
		snprintf(buf, len, "%.1fs", s);
}

/*
 * An instance as gridfsctl(1)'s JSON vocabulary has it: a "time", and its
 * uptime a duration in seconds ("uptimeSeconds"), not the control
 * socket's milliseconds.
 */
static void
print_instance_json(const bson_t *d)
{
	bson_t out;
	bson_iter_t it;
	json_event(&out, "status");
	if (bson_iter_init(&it, d))
		while (bson_iter_next(&it)) {
			if (strcmp(bson_iter_key(&it), "uptimeMs") == 0)
				json_seconds(&out, "uptimeSeconds", num_field(d, "uptimeMs") / 1000);
			else
				bson_append_iter(&out, NULL, 0, &it);
		}
	print_json(stdout, &out);
	bson_destroy(&out);
}

/* Prints one instance; returns false when it is not in a good state. */
static bool
print_instance(const bson_t *d, bool json)
{
	const char *state = str_field(d, "state", "?");
	const char *health = str_field(d, "health", "-");
	bool good = (strcmp(state, "RUNNING") == 0 || strcmp(state, "STARTING") == 0 ||
	             strcmp(state, "EXITED") == 0) && strcmp(health, "failing") != 0;
	if (json) {
		print_instance_json(d);
		return good;
	}
	char up[32] = "-", fds[96] = "-";
	if (num_field(d, "pid") > 0)
		format_uptime(num_field(d, "uptimeMs") / 1000, up, sizeof up);
	bson_iter_t it, sub;
	if (bson_iter_init_find(&it, d, "fds") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
	    bson_iter_recurse(&it, &sub)) {
		uint32_t l;
		const uint8_t *data;
		bson_iter_document(&it, &l, &data);
		bson_t f;
		if (bson_init_static(&f, data, l))
			snprintf(fds, sizeof fds, "%.0f/%.0f (sock %.0f, file %.0f, pipe %.0f)",
			         num_field(&f, "open"), num_field(&f, "limit"), num_field(&f, "sockets"),
			         num_field(&f, "files"), num_field(&f, "pipes"));
	}
	printf("%-16s %-9s %7.0f %9s %8.0f  %-8s %s\n", str_field(d, "name", "?"), state,
	       num_field(d, "pid"), up, num_field(d, "restarts"), health, fds);
	return good;
}

static int
print_status(const char *reply, bool json)
{
	bson_error_t berr;
	bson_t *doc = bson_new_from_json((const uint8_t *)reply, -1, &berr);
	if (!doc) {
		warnx_("unreadable answer from the supervisor: %s", berr.message);
		return EXIT_BACKEND;
	}
	bson_iter_t it, arr;
	bool all_good = true;
	if (!json)
		printf("%-16s %-9s %7s %9s %8s  %-8s %s\n", "NAME", "STATE", "PID", "UPTIME", "RESTARTS",
		       "HEALTH", "FDS (open/limit)");
	if (bson_iter_init_find(&it, doc, "instances") && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			uint32_t l;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
				continue;
			bson_iter_document(&arr, &l, &data);
			bson_t d;
			if (bson_init_static(&d, data, l) && !print_instance(&d, json))
				all_good = false;
		}
	}
	bson_destroy(doc);
	return all_good ? EXIT_OK : EXIT_PARTIAL;
}

static int
control(struct opts *o, int argc, char **argv)
{
	const char *verb = argv[0];
	char request[512];
	if (strcmp(verb, "status") == 0 || strcmp(verb, "stop") == 0 || strcmp(verb, "reload") == 0) {
		if (argc != 1) {
			usage_error("'%s' takes no operand", verb);
			return EXIT_USAGE;
		}
		snprintf(request, sizeof request, "%s", verb);
	} else if (strcmp(verb, "restart") == 0) {
		if (argc != 2 || !*argv[1] || strchr(argv[1], '\n')) {
			usage_error("usage: restart NAME|NAME:INSTANCE|all");
			return EXIT_USAGE;
		}
		snprintf(request, sizeof request, "restart %.400s", argv[1]);
	} else {
		usage_error("unknown action '%s' (status, restart, reload, stop; or -- CMD ARGS...)", verb);
		return EXIT_USAGE;
	}
	char *path = control_path(o);
	if (!path)
		return EXIT_USAGE;
	char err[600];
	/* stop answers once every program has stopped, which may take their grace periods. */
	int timeout = strcmp(verb, "stop") == 0 ? 600000 : 10000;
	char *reply = sv_control_request(path, request, timeout, err, sizeof err);
	free(path);
	if (!reply) {
		warnx_("%s", err);
		return EXIT_BACKEND;
	}
	int rc;
	if (strcmp(verb, "status") == 0) {
		rc = print_status(reply, o->json);
	} else {
		bson_error_t berr;
		bson_t *doc = bson_new_from_json((const uint8_t *)reply, -1, &berr);
		bson_iter_t it;
		bool ok = doc && bson_iter_init_find(&it, doc, "ok") && bson_iter_as_bool(&it);
		const char *msg = doc ? str_field(doc, ok ? "message" : "error", "") : reply;
		if (o->json)
			fputs(reply, stdout);
		else if (!ok)
			warnx_("%s", msg);
		else if (!G.quiet)
			printf("%s\n", msg);
		rc = ok ? EXIT_OK : EXIT_NOTFOUND;
		bson_destroy(doc);
	}
	free(reply);
	return rc;
}

static int
cmd_supervise(int argc, char **argv)
{
	struct opts o = {0};
	int first = parse_options(argc, argv, &cmd_supervise_entry, on_opt, &o);
	if (first < 0)
		return EXIT_USAGE;
	int nops = argc - first;
	bool dashdash = first > 0 && strcmp(argv[first - 1], "--") == 0;
	if (nops > 0 && !dashdash)
		return control(&o, nops, argv + first);
	if (nops > 0) {
		if (o.config) {
			usage_error("give either -c FILE or -- CMD ARGS..., not both");
			return EXIT_USAGE;
		}
		struct sv_config cfg;
		if (!quick_config(&o, nops, argv + first, &cfg))
			return EXIT_USAGE;
		return run_supervisor(&o, &cfg);
	}
	if (!o.config) {
		usage_error("nothing to supervise: give -c FILE or -- CMD ARGS...");
		return EXIT_USAGE;
	}
	if (o.quick_given) {
		usage_error("--name, --restart-on, --nofile ... belong to the quick form (-- CMD ARGS...)");
		return EXIT_USAGE;
	}
	struct sv_config cfg;
	char err[600];
	if (!sv_config_load(o.config, &cfg, err, sizeof err)) {
		warnx_("%s", err);
		return EXIT_USAGE;
	}
	return run_supervisor(&o, &cfg);
}

static const struct cmd_exit supervise_exits[] = {
	{0, "stopped (any signal or stop), request done, or status all healthy"},
	{1, "status: some instance unhealthy"}, {2, "usage or configuration"},
	{3, "no supervisor answers"}, {4, "no such program"}, {5, "the control socket cannot be made"},
	{6, "another supervisor runs"}, {-1, NULL},
};

const struct cmd_entry cmd_supervise_entry = {
	.name = "supervise",
	.summary = "keep backends and servers running, watching their descriptors",
	.operands = "[-- CMD ARGS... | status | restart NAME | reload | stop]",
	.opts = supervise_opts,
	.exits = supervise_exits,
	.run = cmd_supervise,
};
