/*
 * Parsing and comparing the supervise configuration (see
 * gridfsctl-supervise.conf(5)). libinih splits the file; our reader counts
 * lines so that every error says FILE:LINE. The keys of a [program:NAME]
 * section are one table (keys[]): a new key is a field in struct
 * sv_program, its default in sv_program_defaults, a row in keys[] (with a
 * generic setter when its value is a number, duration, size, flag or
 * string), its comparison in sv_program_equal, and the man page.
 */
#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <regex.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../addr.h"
#include "svconfig.h"
#include "../util.h"

/*
 * What running out of descriptors looks like in the logs of the programs we
 * supervise: glibc's strerror(EMFILE), mongod's "can not open file", libuv and
 * others' wording, the errno name and number.
 */
const char *const sv_default_patterns[] = {
	"Too many open files",
	"can ?not open file",
	"Out of file descriptors",
	"EMFILE",
	"errno[ :=]+24([^0-9]|$)",
	NULL,
};

static void
seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static void
list_append(char ***list, size_t *n, const char *s)
{
	char **l = gfs_xreallocarray(*list, *n + 2, sizeof *l);
	l[(*n)++] = gfs_xstrdup(s);
	l[*n] = NULL;
	*list = l;
}

static void
list_free(char **list, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(list[i]);
	free(list);
}

void
sv_argv_free(char **argv)
{
	if (!argv)
		return;
	for (char **a = argv; *a; a++)
		free(*a);
	free(argv);
}

static void
set_default_patterns(struct sv_program *p)
{
	for (const char *const *d = sv_default_patterns; *d; d++)
		list_append(&p->patterns, &p->npatterns, *d);
}

void
sv_program_defaults(struct sv_program *p, const char *name)
{
	memset(p, 0, sizeof *p);
	p->name = gfs_xstrdup(name);
	set_default_patterns(p);
	p->health_interval_ms = 5000;
	p->health_timeout_ms = 2000;
	p->health_retries = 3;
	p->stop_signal = SIGTERM;
	p->stop_grace_ms = 10000;
	p->instances = 1;
	p->log_max = 10 << 20;
	p->log_backups = 3;
	p->autorestart = true;
	p->startsecs = 1;
	p->backoff_initial_ms = 1000;
	p->backoff_max_ms = 30000;
	p->max_restarts = 5;
	p->restart_window_s = 60;
	p->fd_interval_ms = 2000;
	p->fd_threshold_pct = 80;
	p->fd_horizon_s = 60;
	p->fd_raise = true;
}

void
sv_program_free(struct sv_program *p)
{
	if (!p)
		return;
	free(p->name);
	sv_argv_free(p->argv);
	free(p->command);
	free(p->directory);
	list_free(p->env, p->nenv);
	free(p->user);
	list_free(p->patterns, p->npatterns);
	free(p->health);
	free(p->listen);
	free(p->log);
	free(p->after);
	memset(p, 0, sizeof *p);
}

static char **
list_copy(char **src, size_t n)
{
	if (!src)
		return NULL;
	char **d = gfs_xcalloc(n + 1, sizeof *d);
	for (size_t i = 0; i < n; i++)
		d[i] = gfs_xstrdup(src[i]);
	return d;
}

void
sv_program_copy(struct sv_program *dst, const struct sv_program *src)
{
	*dst = *src;
	dst->name = gfs_xstrdup(src->name);
	size_t argc = 0;
	while (src->argv && src->argv[argc])
		argc++;
	dst->argv = src->argv ? list_copy(src->argv, argc) : NULL;
	dst->command = gfs_xstrdup(src->command);
	dst->directory = gfs_xstrdup(src->directory);
	dst->env = list_copy(src->env, src->nenv);
	dst->user = gfs_xstrdup(src->user);
	dst->patterns = list_copy(src->patterns, src->npatterns);
	dst->health = gfs_xstrdup(src->health);
	dst->listen = gfs_xstrdup(src->listen);
	dst->log = gfs_xstrdup(src->log);
	dst->after = gfs_xstrdup(src->after);
}

static bool
streq(const char *a, const char *b)
{
	if (!a || !b)
		return a == b;
	return strcmp(a, b) == 0;
}

static bool
listeq(char **a, size_t na, char **b, size_t nb)
{
	if (na != nb)
		return false;
	for (size_t i = 0; i < na; i++)
		if (!streq(a[i], b[i]))
			return false;
	return true;
}

bool
sv_program_equal(const struct sv_program *a, const struct sv_program *b)
{
	return streq(a->name, b->name) && streq(a->command, b->command) &&
	    streq(a->directory, b->directory) && listeq(a->env, a->nenv, b->env, b->nenv) &&
	    streq(a->user, b->user) && a->nofile == b->nofile && a->nofile_hard == b->nofile_hard &&
	    listeq(a->patterns, a->npatterns, b->patterns, b->npatterns) &&
	    a->restart_on_stream == b->restart_on_stream &&
	    streq(a->health, b->health) && a->health_interval_ms == b->health_interval_ms &&
	    a->health_timeout_ms == b->health_timeout_ms && a->health_retries == b->health_retries &&
	    a->stop_signal == b->stop_signal && a->stop_grace_ms == b->stop_grace_ms &&
	    a->instances == b->instances && streq(a->listen, b->listen) && streq(a->log, b->log) &&
	    a->log_max == b->log_max && a->log_backups == b->log_backups &&
	    a->autorestart == b->autorestart && a->startsecs == b->startsecs &&
	    a->backoff_initial_ms == b->backoff_initial_ms && a->backoff_max_ms == b->backoff_max_ms &&
	    a->max_restarts == b->max_restarts && a->restart_window_s == b->restart_window_s &&
	    a->fd_interval_ms == b->fd_interval_ms && a->fd_threshold_pct == b->fd_threshold_pct &&
	    a->fd_horizon_s == b->fd_horizon_s && a->fd_raise == b->fd_raise &&
	    streq(a->after, b->after);
}

/* ---- small value parsers ----------------------------------------------- */

static const struct {
	const char *name;
	int sig;
} signals[] = {
	{"HUP", SIGHUP}, {"INT", SIGINT}, {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
	{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"STOP", SIGSTOP},
	{"CONT", SIGCONT}, {NULL, 0},
};

int
sv_parse_signal(const char *s)
{
	if (isdigit((unsigned char)*s)) {
		char *end;
		long v = strtol(s, &end, 10);
		return *end || v <= 0 || v >= NSIG ? -1 : (int)v;
	}
	if (strncasecmp(s, "SIG", 3) == 0)
		s += 3;
	for (int i = 0; signals[i].name; i++)
		if (strcasecmp(s, signals[i].name) == 0)
			return signals[i].sig;
	return -1;
}

const char *
sv_signal_name(int sig)
{
	static const char *const full[] = {
		[SIGHUP] = "SIGHUP", [SIGINT] = "SIGINT", [SIGQUIT] = "SIGQUIT", [SIGILL] = "SIGILL",
		[SIGABRT] = "SIGABRT", [SIGBUS] = "SIGBUS", [SIGFPE] = "SIGFPE", [SIGKILL] = "SIGKILL",
		[SIGUSR1] = "SIGUSR1", [SIGSEGV] = "SIGSEGV", [SIGUSR2] = "SIGUSR2", [SIGPIPE] = "SIGPIPE",
		[SIGALRM] = "SIGALRM", [SIGTERM] = "SIGTERM", [SIGCHLD] = "SIGCHLD", [SIGCONT] = "SIGCONT",
		[SIGSTOP] = "SIGSTOP",
	};
	if (sig > 0 && (size_t)sig < sizeof full / sizeof full[0] && full[sig])
		return full[sig];
	return "signal";
}

static bool
parse_bool(const char *s, bool *out)
{
	if (!strcasecmp(s, "yes") || !strcasecmp(s, "true") || !strcmp(s, "1") || !strcasecmp(s, "on"))
		*out = true;
	else if (!strcasecmp(s, "no") || !strcasecmp(s, "false") || !strcmp(s, "0") || !strcasecmp(s, "off"))
		*out = false;
	else
		return false;
	return true;
}

static bool
parse_int_range(const char *s, int min, int max, int *out)
{
	long v;
	if (!gfs_parse_long(s, min, max, &v))
		return false;
	*out = (int)v;
	return true;
}

/* ---- command splitting ------------------------------------------------- */

struct strbuf {
	char *s;
	size_t len, cap;
};

static void
sb_putc(struct strbuf *b, char c)
{
	GFS_GROW(b->s, b->len + 2, b->cap, 32);
	b->s[b->len++] = c;
	b->s[b->len] = '\0';
}

char **
sv_split_command(const char *s)
{
	char **argv = NULL;
	size_t argc = 0;
	struct strbuf w = {0};
	bool inword = false;
	for (const char *p = s;; p++) {
		if (*p == '\0' || *p == ' ' || *p == '\t' || *p == '\n') {
			if (inword) {
				list_append(&argv, &argc, w.s ? w.s : "");
				w.len = 0;
				if (w.s)
					w.s[0] = '\0';
				inword = false;
			}
			if (*p == '\0')
				break;
			continue;
		}
		inword = true;
		if (*p == '\'') {
			const char *q = strchr(p + 1, '\'');
			if (!q)
				goto bad;
			for (p++; p < q; p++)
				sb_putc(&w, *p);
		} else if (*p == '"') {
			for (p++; *p && *p != '"'; p++) {
				if (*p == '\\' && (p[1] == '"' || p[1] == '\\' || p[1] == '$'))
					p++;
				sb_putc(&w, *p);
			}
			if (*p != '"')
				goto bad;
		} else if (*p == '\\') {
			if (p[1] == '\0')
				goto bad;
			sb_putc(&w, *++p);
		} else {
			sb_putc(&w, *p);
		}
	}
	free(w.s);
	if (argc == 0) {
		free(argv);
		return NULL;
	}
	return argv;
bad:
	free(w.s);
	list_free(argv, argc);
	return NULL;
}

/* ---- the keys of a [program:NAME] section ------------------------------ */

/* An indented line continues the key (command, and the keys that add to a list). */
#define KEY_CONTINUES 1
/* The key may be given again in its section: it adds to what it held. */
#define KEY_REPEATS 2

/*
 * One row of the key table (keys[], below): how a value is parsed and
 * where it goes. The generic setters (set_int, set_ms, ...) write the
 * field at off; the others know their field and ignore it.
 */
struct key {
	const char *name;
	bool (*set)(struct sv_program *p, const struct key *k, const char *v, char *err,
	            size_t errlen);
	size_t off;             /* of the field in struct sv_program */
	long min, max;          /* for numbers and durations (ms) */
	const char *help;       /* what a value is, as errors say it: "expected HELP, got ..." */
	unsigned flags;         /* KEY_* */
};

#define FIELD(p, k, type) ((type *)((char *)(p) + (k)->off))

static bool valid_name(const char *s);

/* ---- environment = A=1, B="x, y" --------------------------------------- */

static bool
add_environment(struct sv_program *p, const struct key *k, const char *value, char *err,
                size_t errlen)
{
	const char *s = value;
	while (*s) {
		while (*s == ' ' || *s == '\t' || *s == ',')
			s++;
		if (!*s)
			break;
		struct strbuf item = {0};
		bool quoted = false;
		for (; *s && (quoted || *s != ','); s++) {
			if (*s == '"') {
				quoted = !quoted;
				continue;
			}
			sb_putc(&item, *s);
		}
		if (quoted) {
			free(item.s);
			seterr(err, errlen, "environment: unterminated quote");
			return false;
		}
		while (item.len && (item.s[item.len - 1] == ' ' || item.s[item.len - 1] == '\t'))
			item.s[--item.len] = '\0';
		char *eq = item.s ? strchr(item.s, '=') : NULL;
		if (!eq || eq == item.s) {
			seterr(err, errlen, "environment: expected KEY=VALUE, got '%s'", item.s ? item.s : "");
			free(item.s);
			return false;
		}
		list_append(&p->env, &p->nenv, item.s);
		free(item.s);
	}
	return true;
}

static bool
add_pattern(struct sv_program *p, const struct key *k, const char *value, char *err,
            size_t errlen)
{
	if (!p->patterns_given) {
		list_free(p->patterns, p->npatterns);
		p->patterns = NULL;
		p->npatterns = 0;
		p->patterns_given = true;
	}
	if (strcmp(value, "none") == 0)
		return true;
	if (strcmp(value, "default") == 0) {
		set_default_patterns(p);
		return true;
	}
	regex_t re;
	int rc = regcomp(&re, value, REG_EXTENDED | REG_ICASE | REG_NOSUB);
	if (rc != 0) {
		char msg[128];
		regerror(rc, &re, msg, sizeof msg);
		seterr(err, errlen, "restart_on: bad pattern '%s': %s", value, msg);
		return false;
	}
	regfree(&re);
	list_append(&p->patterns, &p->npatterns, value);
	return true;
}

static void
replace(char **slot, const char *value)
{
	free(*slot);
	*slot = *value ? gfs_xstrdup(value) : NULL;
}

static bool
set_stream(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	static const char *const names[] = {[SV_STREAM_STDERR] = "stderr",
	                                    [SV_STREAM_STDOUT] = "stdout", [SV_STREAM_BOTH] = "both"};
	for (int i = 0; i < 3; i++)
		if (strcmp(v, names[i]) == 0) {
			p->restart_on_stream = i;
			return true;
		}
	seterr(err, errlen, "restart_on_stream: expected stderr, stdout or both, got '%s'", v);
	return false;
}

/* An http:// check's host and port, checked now rather than at the first check. */
static bool
check_http_health(const char *v, char *err, size_t errlen)
{
	char host[256], msg[300];
	unsigned port;
	if (strncmp(v, "http://", 7) != 0 || gfs_hostport_parse(v + 7, 80, host, sizeof host, &port,
	                                                        msg, sizeof msg))
		return true;
	seterr(err, errlen, "health: %s", msg);
	return false;
}

/* Kept as the parser understood it, so messages and reload compare what is bound. */
static bool
set_listen(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	struct gfs_addr a;
	char msg[300], norm[96];
	if (!*v)
		return replace(&p->listen, v), true;
	if (!gfs_addr_parse(v, 0, &a, msg, sizeof msg)) {
		seterr(err, errlen, "listen: %s", msg);
		return false;
	}
	gfs_addr_format(&a, norm, sizeof norm);
	replace(&p->listen, norm);
	return true;
}

/* Repeated or continued lines extend the command: libinih caps a line at 199 bytes. */
static bool
set_command(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	if (p->command) {
		char *joined = gfs_xmalloc(strlen(p->command) + strlen(v) + 2);
		sprintf(joined, "%s %s", p->command, v);
		free(p->command);
		p->command = joined;
	} else {
		p->command = gfs_xstrdup(v);
	}
	sv_argv_free(p->argv);
	p->argv = sv_split_command(p->command);
	return true;
}

static bool
set_health(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	if (*v && strncmp(v, "mongodb://", 10) != 0 && strncmp(v, "mongodb+srv://", 14) != 0 &&
	    strncmp(v, "http://", 7) != 0) {
		seterr(err, errlen, "health: expected mongodb://... or http://..., got '%s'", v);
		return false;
	}
	if (!check_http_health(v, err, errlen))
		return false;
	replace(&p->health, v);
	return true;
}

/* The name is checked against the other sections once the file is read (finish). */
static bool
set_after(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	if (*v && !valid_name(v)) {
		seterr(err, errlen, "after: expected a program name, got '%s'", v);
		return false;
	}
	replace(&p->after, v);
	return true;
}

static bool
expected(const struct key *k, const char *what, const char *v, char *err, size_t errlen)
{
	seterr(err, errlen, "%s: expected %s, got '%s'", k->name, what, v);
	return false;
}

/* An empty value unsets a string. */
static bool
set_str(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	replace(FIELD(p, k, char *), v);
	return true;
}

static bool
set_int(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	if (parse_int_range(v, (int)k->min, (int)k->max, FIELD(p, k, int)))
		return true;
	char what[80];
	snprintf(what, sizeof what, "%s%s%ld..%ld", k->help, *k->help ? " " : "", k->min, k->max);
	return expected(k, what, v, err, errlen);
}

static bool
set_long(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	return gfs_parse_long(v, k->min, k->max, FIELD(p, k, long)) ||
	       expected(k, k->help, v, err, errlen);
}

static bool
set_bool(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	return parse_bool(v, FIELD(p, k, bool)) || expected(k, k->help, v, err, errlen);
}

static bool
set_size(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	return gfs_parse_size(v, FIELD(p, k, uint64_t)) || expected(k, k->help, v, err, errlen);
}

/* A duration, in ms; min, when set, is the shortest allowed. */
static bool
set_ms(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	long ms;
	if (!gfs_parse_duration_ms(v, 0, INT_MAX, &ms)) {
		seterr(err, errlen, "%s: bad duration '%s' (%s)", k->name, v, k->help);
		return false;
	}
	if (k->min > 0 && ms < k->min) {
		seterr(err, errlen, "%s: at least %ldms, got '%s'", k->name, k->min, v);
		return false;
	}
	*FIELD(p, k, int) = (int)ms;
	return true;
}

static bool
set_signal(struct sv_program *p, const struct key *k, const char *v, char *err, size_t errlen)
{
	int sig = sv_parse_signal(v);
	if (sig < 0) {
		seterr(err, errlen, "%s: unknown signal '%s'", k->name, v);
		return false;
	}
	*FIELD(p, k, int) = sig;
	return true;
}

#define OFF(field) offsetof(struct sv_program, field)
#define DURATION "like 500ms, 2s, 1m"
#define NDESC "a number of descriptors"

/* Every key of a [program:NAME] section (gridfsctl-supervise.conf(5) says what each does). */
static const struct key keys[] = {
	{"command", set_command, 0, 0, 0, "", KEY_CONTINUES},
	{"directory", set_str, OFF(directory), 0, 0, "", 0},
	{"environment", add_environment, 0, 0, 0, "", KEY_CONTINUES | KEY_REPEATS},
	{"user", set_str, OFF(user), 0, 0, "", 0},
	{"nofile", set_long, OFF(nofile), 0, 1L << 30, NDESC, 0},
	{"nofile_hard", set_long, OFF(nofile_hard), 0, 1L << 30, NDESC, 0},
	{"restart_on", add_pattern, 0, 0, 0, "", KEY_CONTINUES | KEY_REPEATS},
	{"restart_on_stream", set_stream, 0, 0, 0, "", 0},
	{"health", set_health, 0, 0, 0, "", 0},
	{"health_interval", set_ms, OFF(health_interval_ms), 0, 0, DURATION, 0},
	{"health_timeout", set_ms, OFF(health_timeout_ms), 0, 0, DURATION, 0},
	{"health_retries", set_int, OFF(health_retries), 1, 1000, "", 0},
	{"stop_signal", set_signal, OFF(stop_signal), 0, 0, "", 0},
	{"stop_grace", set_ms, OFF(stop_grace_ms), 0, 0, DURATION, 0},
	{"instances", set_int, OFF(instances), 1, 64, "", 0},
	{"listen", set_listen, 0, 0, 0, "", 0},
	{"log", set_str, OFF(log), 0, 0, "", 0},
	{"log_max", set_size, OFF(log_max), 0, 0, "a size like 10M", 0},
	{"log_backups", set_int, OFF(log_backups), 0, 100, "", 0},
	{"autorestart", set_bool, OFF(autorestart), 0, 0, "yes or no", 0},
	{"startsecs", set_int, OFF(startsecs), 0, 86400, "seconds", 0},
	/* An empty window would count no restarts, and FATAL would never come. */
	{"restart_window", set_int, OFF(restart_window_s), 1, 86400, "seconds", 0},
	{"backoff_initial", set_ms, OFF(backoff_initial_ms), SV_MIN_BACKOFF_MS, 0, DURATION, 0},
	{"backoff_max", set_ms, OFF(backoff_max_ms), 0, 0, DURATION, 0},
	{"max_restarts", set_int, OFF(max_restarts), 0, SV_MAX_RESTARTS, "a count", 0},
	{"fd_interval", set_ms, OFF(fd_interval_ms), 0, 0, DURATION, 0},
	{"fd_threshold", set_int, OFF(fd_threshold_pct), 1, 100, "a percentage", 0},
	{"fd_horizon", set_int, OFF(fd_horizon_s), 0, 86400, "seconds", 0},
	{"fd_raise", set_bool, OFF(fd_raise), 0, 0, "yes or no", 0},
	{"after", set_after, 0, 0, 0, "", 0},
};

static const struct key *
find_key(const char *name)
{
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
		if (strcmp(keys[i].name, name) == 0)
			return &keys[i];
	return NULL;
}

bool
sv_program_set(struct sv_program *p, const char *key, const char *v, char *err, size_t errlen)
{
	const struct key *k = find_key(key);
	if (!k) {
		seterr(err, errlen, "unknown key '%s'", key);
		return false;
	}
	return k->set(p, k, v, err, errlen);
}

bool
sv_program_check(const struct sv_program *p, char *err, size_t errlen)
{
	if (!p->command) {
		seterr(err, errlen, "program '%s' has no command", p->name);
		return false;
	}
	if (p->command[strspn(p->command, " \t")] == '\0') {
		seterr(err, errlen, "program '%s': empty command", p->name);
		return false;
	}
	if (!p->argv) {
		seterr(err, errlen, "program '%s': cannot split the command (unterminated quote)",
		       p->name);
		return false;
	}
	if (p->nofile_hard && p->nofile > p->nofile_hard) {
		seterr(err, errlen, "program '%s': nofile %ld is above nofile_hard %ld", p->name,
		       p->nofile, p->nofile_hard);
		return false;
	}
	if (p->health && p->health_timeout_ms <= 0) {
		seterr(err, errlen, "program '%s': health_timeout must be positive", p->name);
		return false;
	}
	if (p->backoff_max_ms < p->backoff_initial_ms) {
		seterr(err, errlen, "program '%s': backoff_max is below backoff_initial", p->name);
		return false;
	}
	return true;
}

/* ---- the file ---------------------------------------------------------- */

/* Names met so far, with the line of each: a second one is an error that points at both. */
struct seen {
	char **names;
	int *lines;
	size_t n;
};

static int
seen_line(const struct seen *v, const char *name)
{
	for (size_t i = 0; i < v->n; i++)
		if (strcmp(v->names[i], name) == 0)
			return v->lines[i];
	return 0;
}

static void
seen_add(struct seen *v, const char *name, int line)
{
	int *l = gfs_xreallocarray(v->lines, v->n + 1, sizeof *l);
	l[v->n] = line;
	v->lines = l;
	list_append(&v->names, &v->n, name);
}

static void
seen_free(struct seen *v)
{
	list_free(v->names, v->n);
	free(v->lines);
	memset(v, 0, sizeof *v);
}

/*
 * libinih reports no line numbers to the handler and keeps parsing after an
 * error, so we feed it through our own reader, which counts lines, and stop
 * at the first error with the line it was on.
 */
struct parse_state {
	struct sv_config *cfg;
	char *err;              /* the message of the first error, without FILE:LINE */
	size_t errlen;
	bool failed;
	int err_line;
	FILE *f;                /* the input: a file, or else text */
	const char *text;
	int line;               /* of the chunk read last */
	int section_line;       /* of the last [section] header */
	bool at_bol;            /* the next chunk starts a line */
	bool cont;              /* the line read last continues the key before it */
	bool after_key;         /* the section has had a key: an indented line continues it */
	struct seen sections;   /* every [section] so far */
	struct seen keys;       /* the keys of the current section */
};

static char *
read_chunk(char *buf, int size, struct parse_state *st)
{
	if (st->failed)
		return NULL; /* ends the parse: inih would go on to the next key */
	if (st->f)
		return fgets(buf, size, st->f);
	if (!*st->text)
		return NULL;
	size_t want = strcspn(st->text, "\n");
	if (st->text[want] == '\n')
		want++;
	if (want > (size_t)size - 1)
		want = (size_t)size - 1;
	memcpy(buf, st->text, want);
	buf[want] = '\0';
	st->text += want;
	return buf;
}

static bool
more_input(struct parse_state *st)
{
	if (!st->f)
		return *st->text != '\0';
	int c = getc(st->f);
	if (c == EOF)
		return false;
	ungetc(c, st->f);
	return true;
}

static int fail(struct parse_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Sections are checked as their header is read, not when a key comes: an
 * empty misspelt section would otherwise pass unseen, and a second section
 * of one name would be merged into the first.
 */
static void
on_section(struct parse_state *st, const char *p)
{
	size_t n = strcspn(p, "]");
	if (p[n] != ']')
		return; /* inih reports the syntax error */
	char name[200];
	snprintf(name, sizeof name, "%.*s", (int)n, p);
	st->section_line = st->line;
	st->after_key = false;
	seen_free(&st->keys);
	if (strcmp(name, "supervise") != 0 && strncmp(name, "program:", 8) != 0) {
		fail(st, "unknown section [%s] (expected [supervise] or [program:NAME])", name);
		return;
	}
	if (name[0] == 'p' && !valid_name(name + 8)) {
		fail(st, "[%s]: a program name is letters, digits, '_', '-', '.'", name);
		return;
	}
	int first = seen_line(&st->sections, name);
	if (first) {
		fail(st, "duplicate section [%s] (first at line %d)", name, first);
		return;
	}
	seen_add(&st->sections, name, st->line);
}

static char *
reader(char *buf, int size, void *stream)
{
	struct parse_state *st = stream;
	bool bol = st->at_bol;
	if (!read_chunk(buf, size, st))
		return NULL;
	if (bol)
		st->line++;
	size_t len = strlen(buf);
	st->at_bol = len > 0 && buf[len - 1] == '\n';
	if (!st->at_bol && more_input(st)) {
		/* inih would take the rest for a line of its own. */
		fail(st, "line longer than %d characters (continue it on an indented line)", size - 2);
		return NULL;
	}
	const char *p = buf;
	while (*p == ' ' || *p == '\t')
		p++;
	bool blank = *p == '\0' || *p == '\n' || *p == '\r' || *p == ';' || *p == '#';
	/* What inih takes for a continuation: an indented line after a key. */
	st->cont = bol && p > buf && !blank && st->after_key;
	if (bol && *p == '[' && !st->cont)
		on_section(st, p + 1);
	return buf;
}

static bool
valid_name(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.')
			return false;
	return true;
}

static struct sv_program *
find_or_add(struct sv_config *c, const char *name, int line)
{
	for (size_t i = 0; i < c->nprogs; i++)
		if (strcmp(c->progs[i].name, name) == 0)
			return &c->progs[i];
	struct sv_program *p = gfs_xreallocarray(c->progs, c->nprogs + 1, sizeof *p);
	c->progs = p;
	sv_program_defaults(&c->progs[c->nprogs], name);
	c->progs[c->nprogs].line = line;
	return &c->progs[c->nprogs++];
}

static int
fail(struct parse_state *st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(st->err, st->errlen, fmt, ap);
	va_end(ap);
	st->failed = true;
	st->err_line = st->line;
	return 0;
}

static unsigned
key_flags(const char *name)
{
	const struct key *k = find_key(name);
	return k ? k->flags : 0;
}

/*
 * A key given twice in one section is an error, as "last one counts" hid a
 * mistake; only the list keys repeat, and only they and command continue.
 */
static bool
check_repeat(struct parse_state *st, const char *section, const char *key)
{
	unsigned flags = key_flags(key);
	if (st->cont) {
		if (!(flags & KEY_CONTINUES))
			return fail(st, "[%s] '%s' cannot be continued on an indented line", section,
			            key);
		return true;
	}
	st->after_key = true;
	if (flags & KEY_REPEATS)
		return true;
	int first = seen_line(&st->keys, key);
	if (first)
		return fail(st, "[%s] duplicate key '%s' (first at line %d)", section, key, first);
	seen_add(&st->keys, key, st->line);
	return true;
}

static int
on_supervise_key(struct parse_state *st, const char *key, const char *value)
{
	if (strcmp(key, "control") == 0) {
		replace(&st->cfg->control, value);
		return 1;
	}
	if (strcmp(key, "logdir") == 0) {
		replace(&st->cfg->logdir, value);
		return 1;
	}
	return fail(st, "[supervise]: unknown key '%s'", key);
}

static int
on_key(void *user, const char *section, const char *key, const char *value)
{
	struct parse_state *st = user;
	if (st->failed)
		return 1;
	if (!check_repeat(st, section, key))
		return 0;
	if (strcmp(section, "supervise") == 0)
		return on_supervise_key(st, key, value);
	if (strncmp(section, "program:", 8) != 0) /* keys before any [section] */
		return fail(st, "key '%s' outside a section", key);
	struct sv_program *p = find_or_add(st->cfg, section + 8, st->section_line);
	if (strcmp(key, "command") == 0 && !p->command_line)
		p->command_line = st->line;
	if (strcmp(key, "after") == 0)
		p->after_line = st->line;
	char msg[400];
	if (!sv_program_set(p, key, value, msg, sizeof msg))
		return fail(st, "[%s] %s", section, msg);
	return 1;
}

static const struct sv_program *
find_prog(const struct sv_config *c, const char *name)
{
	for (size_t i = 0; i < c->nprogs; i++)
		if (strcmp(c->progs[i].name, name) == 0)
			return &c->progs[i];
	return NULL;
}

/*
 * The start order: every after names another program, and following them
 * never comes back (each program has one after at most, so a walk of
 * nprogs steps either ends or is in a cycle). Errors point at the after line.
 */
static bool
check_order(const struct sv_config *c, const struct sv_program *p, char *msg, size_t len)
{
	if (!p->after)
		return true;
	if (!find_prog(c, p->after)) {
		seterr(msg, len, "[program:%s] after: no program '%s' in this file", p->name, p->after);
		return false;
	}
	char path[400];
	int n = snprintf(path, sizeof path, "%s", p->name);
	const struct sv_program *q = p;
	for (size_t step = 0; q && q->after && step < c->nprogs; step++) {
		q = find_prog(c, q->after);
		if (n > 0 && (size_t)n < sizeof path)
			n += snprintf(path + n, sizeof path - (size_t)n, " -> %s", q ? q->name : "?");
		if (q == p) {
			seterr(msg, len, "[program:%s] after: a cycle (%s)", p->name, path);
			return false;
		}
	}
	return true;
}

/* Checks that need the whole program; their errors point at its section. */
static bool
finish(struct sv_config *c, const char *name, char *err, size_t errlen)
{
	if (c->nprogs == 0) {
		seterr(err, errlen, "%s: no [program:NAME] section", name);
		return false;
	}
	for (size_t i = 0; i < c->nprogs; i++) {
		struct sv_program *p = &c->progs[i];
		char msg[400];
		if (!sv_program_check(p, msg, sizeof msg)) {
			/* A command that does not split is the command's line's fault. */
			int line = p->command && !p->argv && p->command_line ? p->command_line : p->line;
			seterr(err, errlen, "%s:%d: %s", name, line, msg);
			return false;
		}
		if (!check_order(c, p, msg, sizeof msg)) {
			seterr(err, errlen, "%s:%d: %s", name, p->after_line ? p->after_line : p->line, msg);
			return false;
		}
		if (!p->log && c->logdir) {
			p->log = gfs_xmalloc(strlen(c->logdir) + strlen(p->name) + 6);
			sprintf(p->log, "%s/%s.log", c->logdir, p->name);
		}
	}
	return true;
}

static bool parse_stream(struct parse_state *st, const char *name);

static bool
parse(struct parse_state *st, const char *name)
{
	bool ok = parse_stream(st, name);
	seen_free(&st->sections);
	seen_free(&st->keys);
	return ok;
}

static bool
parse_stream(struct parse_state *st, const char *name)
{
	int line = ini_parse_stream(reader, st, on_key, st);
	if (line == -1 || (st->f && ferror(st->f))) {
		seterr(st->err, st->errlen, "%s: %s", name, strerror(errno));
		return false;
	}
	/* inih's own syntax errors come with no message of ours. */
	if (line != 0 && (!st->failed || line < st->err_line)) {
		seterr(st->err, st->errlen, "%s:%d: syntax error (expected [section] or key = value)",
		       name, line);
		return false;
	}
	if (st->failed) {
		char msg[480];
		snprintf(msg, sizeof msg, "%s", st->err);
		seterr(st->err, st->errlen, "%s:%d: %s", name, st->err_line, msg);
		return false;
	}
	return finish(st->cfg, name, st->err, st->errlen);
}

bool
sv_config_parse(const char *text, const char *name, struct sv_config *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	*err = '\0';
	struct parse_state st = {.cfg = out, .err = err, .errlen = errlen, .text = text,
	                         .at_bol = true};
	if (!parse(&st, name)) {
		sv_config_free(out);
		return false;
	}
	return true;
}

bool
sv_config_load(const char *path, struct sv_config *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	*err = '\0';
	FILE *f = fopen(path, "r");
	if (!f) {
		seterr(err, errlen, "%s: %s", path, strerror(errno));
		return false;
	}
	struct parse_state st = {.cfg = out, .err = err, .errlen = errlen, .f = f, .at_bol = true};
	bool ok = parse(&st, path);
	fclose(f);
	if (!ok)
		sv_config_free(out);
	return ok;
}

void
sv_config_free(struct sv_config *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nprogs; i++)
		sv_program_free(&c->progs[i]);
	free(c->progs);
	free(c->control);
	free(c->logdir);
	memset(c, 0, sizeof *c);
}
