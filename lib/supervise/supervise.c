/* The supervisor's event loop: see supervise.h for the design. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <bson/bson.h>

#include "../addr.h"
#include "fdwatch.h"
#include "../gfs.h"
#include "logrotate.h"
#include "sdnotify.h"
#include "supervise.h"

extern char **environ;

/* A descriptor-exhaustion hit this soon after a start means the limit, not a leak, is the problem. */
#define EMFILE_RECUR_S 10.0
#define RESTART_RING SV_MAX_RESTARTS
/* Output lines up to this long are matched whole; longer ones in pieces that overlap by LINE_OVERLAP. */
#define LINE_MAX_ 16384
#define LINE_OVERLAP 1024
/* How long the control socket goes unwatched when we have no descriptor to accept with. */
#define ACCEPT_PAUSE_S 1.0
/* Relayed output held for a reader that falls behind; beyond it, lines are dropped. */
#define RELAY_MAX (1024 * 1024)
/* Event lines held for a reader of standard error; they are short, so this is thousands of them. */
#define EVENTS_MAX (256 * 1024)
/* How long an exiting supervisor gives its readers to take what is held. */
#define EXIT_DRAIN_S 1.0

enum state { ST_STOPPED, ST_STARTING, ST_RUNNING, ST_BACKOFF, ST_STOPPING, ST_FATAL, ST_EXITED };

static const char *const state_names[] = {"STOPPED", "STARTING", "RUNNING", "BACKOFF",
                                          "STOPPING", "FATAL", "EXITED"};

/* What to do once a stopping child has exited. */
enum after { AFTER_POLICY, AFTER_NOW, AFTER_STOP };

enum wkind { W_SIGNAL, W_TIMER, W_CONTROL, W_CLIENT, W_OUTPUT, W_PIDFD, W_CHECKER, W_RELAY };

struct watch {
	enum wkind kind;
	void *ptr;
};

struct program;
struct instance;

/* One of a child's output pipes, read line by line. */
struct stream {
	struct instance *in;
	bool is_err;            /* the child's standard error */
	int fd;
	struct watch w;
	size_t len;             /* buf[0..len) is held */
	size_t seen;            /* buf[0..seen): the tail of an overlong line, passed on already */
	char buf[LINE_MAX_];
};

struct instance {
	struct program *prog;
	struct sv *sv;
	int index;
	char name[96];
	enum state state;
	pid_t pid, pgid;
	int pidfd;
	struct watch w_pid, w_chk;
	struct stream out, err;
	struct logfile *log;
	double started_at;
	double restart_times[RESTART_RING];
	size_t nring;
	unsigned restarts;
	enum after after;
	const char *why;        /* why it is being stopped, for the restart message */
	bool emfile_cause;      /* the current stop was for running out of descriptors */
	bool exiting;           /* draining the output of a child that has exited */
	bool last_emfile;       /* the previous restart was for that too */
	bool pattern_held;      /* a match went unanswered: the restart budget is spent */
	long nofile_next;       /* a raised nofile for the next start; 0: the configured one */
	char last_exit[96];
	/* deadlines, monotonic seconds; 0 = none */
	double t_start, t_kill, t_running, t_health, t_check_deadline, t_fd;
	/* what the exited main process left in its group after a stop signal: SIGKILLed at t_group_kill */
	pid_t leftover_pgid;
	double t_group_kill;
	/* health */
	pid_t checker;
	int checker_pidfd, checker_pipe;
	int health_failures;
	int health;             /* -1 unknown, 0 failing, 1 ok */
	char health_msg[400];
	/* descriptors */
	struct fdw_trend trend;
	struct fdw_counts fds;
	long fd_soft, fd_hard;
	bool fd_warned;
};

struct program {
	struct sv_program cfg;
	struct sv_patterns pats;
	struct instance *inst;
	int ninst;
	int listen_fd;
	bool removing;
	struct program *replacement;
	int rolling;            /* next instance of a rolling restart, -1 none */
	struct program *next;
};

struct client {
	struct sv *sv;
	int fd;
	struct watch w;
	char buf[512];
	size_t len;
	bool waiting_stop;      /* answered "stop": closed when the supervisor exits */
	struct client *next;
};

/* Children's output without a log file, or event lines, on their way to a descriptor. */
struct relay {
	int fd;                 /* -1: the output goes nowhere */
	bool own;               /* fd is our own opening of the caller's: closed at the end */
	bool sock;              /* written with MSG_DONTWAIT: the socket's flags are shared */
	bool watched;           /* in epoll, waiting for fd to become writable */
	char *buf;              /* max + 1 bytes once needed */
	size_t max;
	size_t off, len;        /* buf[off..len) is still to be written */
	unsigned long long dropped, dropped_lines; /* since the buffer last emptied */
	const char *what;       /* "standard output" or "standard error", for messages */
	struct watch w;
};

struct sv {
	struct sv_callbacks cb;
	struct relay out, err;
	struct relay *ev;       /* where event lines go: &err, or &out when both are one file */
	char *config_path;
	char *control_path;
	struct program *progs;
	struct client *clients;
	int epfd, sigfd, timerfd, ctlfd;
	struct watch w_sig, w_timer, w_ctl;
	bool stopping;
	int stop_signals;
	double t_accept;        /* watch the control socket again then; 0: watched */
	double t_watchdog;      /* send WATCHDOG=1 then; 0: systemd asked for none */
	double watchdog_s;      /* half the interval systemd asked for */
	struct sv_config *pending;      /* unused beyond sv_new */
};

/* ---- small helpers ------------------------------------------------------ */

static void relay_event(struct sv *s, const char *line);

static void
event(struct sv *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
event(struct sv *s, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (s->cb.event)
		s->cb.event(s->cb.ctx, line);
	relay_event(s, line);
}

/* systemd's Type=notify (sdnotify.h): a failure is an event, never fatal. */
static void
notify(struct sv *s, const char *state)
{
	if (gfs_sd_notify(state) < 0)
		event(s, "NOTIFY_SOCKET %s: %s", gfs_sd_notify_socket(), strerror(errno));
}

static void
ep_add(struct sv *s, int fd, struct watch *w, enum wkind kind, void *ptr)
{
	w->kind = kind;
	w->ptr = ptr;
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = w};
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
		event(s, "epoll_ctl: %s", strerror(errno));
}

static void
ep_close(struct sv *s, int *fd)
{
	if (*fd < 0)
		return;
	epoll_ctl(s->epfd, EPOLL_CTL_DEL, *fd, NULL);
	close(*fd);
	*fd = -1;
}

static int
sys_pidfd_open(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

static int
sys_pidfd_send_signal(int pidfd, int sig)
{
	return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

/* Counts our own descriptors, to say so when the supervisor itself runs out. */
static void
self_fd_note(struct sv *s, const char *what)
{
	if (errno != EMFILE && errno != ENFILE)
		return;
	struct fdw_counts c = {0};
	long soft = -1, hard = -1;
	if (fdw_count(getpid(), &c))
		fdw_limits(getpid(), &soft, &hard);
	event(s, "the supervisor itself is out of descriptors (%s: %ld open, limit %ld): raise its "
	         "own limit (LimitNOFILE= in the unit, ulimit -n)", what, c.total, soft);
}

/* ---- pure policy -------------------------------------------------------- */

int
sv_backoff_ms(int initial_ms, int max_ms, int k)
{
	if (k <= 0)
		return 0;
	double d = initial_ms;
	for (int i = 1; i < k && d < max_ms; i++)
		d *= 2;
	return d > max_ms ? max_ms : (int)d;
}

int
sv_count_recent(const double *times, size_t n, double now, double window)
{
	int k = 0;
	for (size_t i = 0; i < n; i++)
		if (times[i] > now - window && times[i] <= now)
			k++;
	return k;
}

/* Skips a bracket expression starting at p ('['); returns its closing ']' (or the end). */
static const char *
skip_bracket(const char *p)
{
	p++;
	if (*p == '^')
		p++;
	if (*p == ']')
		p++;
	for (; *p && *p != ']'; p++) {
		if (*p == '[' && (p[1] == ':' || p[1] == '.' || p[1] == '=')) {
			char close = p[1];
			for (p += 2; *p && !(p[0] == close && p[1] == ']'); p++)
				;
			if (!*p)
				return p - 1;
			p++;
		}
	}
	return *p ? p : p - 1;
}

static void
keep_longest(char *best, size_t *blen, const char *cur, size_t *clen)
{
	if (*clen > *blen) {
		memcpy(best, cur, *clen);
		*blen = *clen;
	}
	*clen = 0;
}

char *
sv_required_literal(const char *re)
{
	char best[256], cur[256];
	size_t blen = 0, clen = 0;
	int depth = 0;
	for (const char *p = re; *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '|' && depth == 0)
			return NULL; /* an alternative: nothing is required */
		if (c == '[') {
			p = skip_bracket(p);
		} else if (c == '\\') {
			if (p[1])
				p++;
		} else if (c == '{') {
			while (p[1] && *p != '}')
				p++;
		} else if (c == '(') {
			depth++;
		} else if (c == ')') {
			if (depth)
				depth--;
		} else if (depth == 0 && c < 0x80 && !strchr(".*+?{}^$", c)) {
			/* A character that may occur zero times is not required. */
			if (p[1] != '?' && p[1] != '*' && p[1] != '{') {
				if (clen < sizeof cur)
					cur[clen++] = (char)c;
				continue;
			}
		}
		keep_longest(best, &blen, cur, &clen);
	}
	keep_longest(best, &blen, cur, &clen);
	return blen >= 3 ? strndup(best, blen) : NULL;
}

bool
sv_patterns_compile(struct sv_patterns *p, char *const *patterns, size_t n, char *err,
                    size_t errlen)
{
	p->re = calloc(n ? n : 1, sizeof *p->re);
	p->lit = calloc(n ? n : 1, sizeof *p->lit);
	if (!p->re || !p->lit)
		abort();
	p->n = 0;
	for (size_t i = 0; i < n; i++) {
		int rc = regcomp(&p->re[i], patterns[i], REG_EXTENDED | REG_ICASE | REG_NOSUB);
		if (rc != 0) {
			char msg[128];
			regerror(rc, &p->re[i], msg, sizeof msg);
			snprintf(err, errlen, "bad pattern '%s': %s", patterns[i], msg);
			sv_patterns_free(p);
			return false;
		}
		p->lit[i] = sv_required_literal(patterns[i]);
		p->n++;
	}
	return true;
}

int
sv_patterns_match(const struct sv_patterns *p, const char *line)
{
	/* glibc's regexec costs ~0.4 us a line per pattern; strcasestr rules most lines out first. */
	for (size_t i = 0; i < p->n; i++)
		if ((!p->lit[i] || strcasestr(line, p->lit[i])) && regexec(&p->re[i], line, 0, NULL, 0) == 0)
			return (int)i;
	return -1;
}

void
sv_patterns_free(struct sv_patterns *p)
{
	for (size_t i = 0; i < p->n; i++) {
		regfree(&p->re[i]);
		free(p->lit[i]);
	}
	free(p->re);
	free(p->lit);
	p->re = NULL;
	p->lit = NULL;
	p->n = 0;
}

bool
sv_line_is_emfile(const char *line)
{
	static bool compiled;
	static struct sv_patterns pats;
	if (!compiled) {
		size_t n = 0;
		while (sv_default_patterns[n])
			n++;
		char err[200];
		if (!sv_patterns_compile(&pats, (char *const *)sv_default_patterns, n, err, sizeof err))
			return false;
		compiled = true;
	}
	return sv_patterns_match(&pats, line) >= 0;
}

/* Where the password of the URL whose authority starts at a ends, or NULL when it has none. */
static const char *
password_span(const char *a, const char **pw)
{
	size_t n;
	*pw = gfs_uri_password(a, strcspn(a, "/?# \t\n'\""), &n);
	return *pw ? *pw + n : NULL;
}

char *
sv_redact_command(const char *cmd)
{
	/* Each "***" is at most 3 bytes longer than what it stands for, and needs a "://". */
	size_t len = strlen(cmd);
	char *out = malloc(2 * len + 4);
	if (!out)
		abort();
	char *o = out;
	const char *p = cmd, *scheme;
	while ((scheme = strstr(p, "://")) != NULL) {
		const char *a = scheme + 3, *pw = NULL;
		const char *at = password_span(a, &pw);
		const char *upto = at ? pw : a;
		memcpy(o, p, (size_t)(upto - p));
		o += upto - p;
		if (at) {
			memcpy(o, "***", 3);
			o += 3;
		}
		p = at ? at : a;
	}
	strcpy(o, p);
	return out;
}

/* ---- control socket path ------------------------------------------------ */

char *
sv_default_control_path(void)
{
	char buf[4096];
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (xdg && *xdg)
		snprintf(buf, sizeof buf, "%s/gridfsctl-supervise.sock", xdg);
	else if (geteuid() == 0)
		snprintf(buf, sizeof buf, "/run/gridfsctl/supervise.sock");
	else
		snprintf(buf, sizeof buf, "/tmp/gridfsctl-%u/supervise.sock", (unsigned)geteuid());
	char *p = strdup(buf);
	if (!p)
		abort();
	return p;
}

static bool
fill_sockaddr(struct sockaddr_un *sa, const char *path, char *err, size_t errlen)
{
	memset(sa, 0, sizeof *sa);
	sa->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof sa->sun_path) {
		snprintf(err, errlen, "control socket path too long: %s", path);
		return false;
	}
	strcpy(sa->sun_path, path);
	return true;
}

static bool
dir_is_private(const char *dir, char *err, size_t errlen)
{
	struct stat st;
	if (lstat(dir, &st) != 0) {
		snprintf(err, errlen, "control socket directory %s: %s", dir, strerror(errno));
		return false;
	}
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 07777) != 0700) {
		snprintf(err, errlen, "control socket directory %s is not a directory of uid %u with "
		         "mode 0700 (%s, uid %u, mode %04o): refusing to use it; remove it or pass "
		         "--control", dir, (unsigned)geteuid(), S_ISDIR(st.st_mode) ? "directory"
		         : S_ISLNK(st.st_mode) ? "symlink" : "not a directory", (unsigned)st.st_uid,
		         (unsigned)(st.st_mode & 07777));
		return false;
	}
	return true;
}

/*
 * Creates the socket's directory owner-only. The default one (in /tmp, or
 * $XDG_RUNTIME_DIR) must also be ours alone when it exists already:
 * another user could have made it first and would see, or swap, our socket.
 */
static bool
make_parent_dir(const char *path, bool must_be_private, char *err, size_t errlen)
{
	char *dir = strdup(path);
	if (!dir)
		abort();
	char *slash = strrchr(dir, '/');
	bool ok = true;
	if (slash && slash != dir) {
		*slash = '\0';
		mkdir(dir, 0700);
		if (must_be_private)
			ok = dir_is_private(dir, err, errlen);
	}
	free(dir);
	return ok;
}

static int
bind_control(const char *path, bool is_default, bool *busy, char *err, size_t errlen)
{
	struct sockaddr_un sa;
	*busy = false;
	if (!fill_sockaddr(&sa, path, err, errlen))
		return -1;
	if (!make_parent_dir(path, is_default, err, errlen))
		return -1;
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0) {
		close(probe);
		*busy = true;
		snprintf(err, errlen, "another supervisor answers on %s", path);
		return -1;
	}
	if (probe >= 0)
		close(probe);
	unlink(path); /* stale: nobody answers */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -1;
	}
	mode_t old = umask(077);
	int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
	umask(old);
	if (rc != 0 || chmod(path, 0600) != 0 || listen(fd, 16) != 0) {
		snprintf(err, errlen, "control socket %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

char *
sv_control_request(const char *path, const char *request, int timeout_ms, char *err, size_t errlen)
{
	struct sockaddr_un sa;
	if (!fill_sockaddr(&sa, path, err, errlen))
		return NULL;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return NULL;
	}
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		snprintf(err, errlen, "no supervisor on %s: %s", path, strerror(errno));
		close(fd);
		return NULL;
	}
	size_t rlen = strlen(request);
	char *msg = malloc(rlen + 2);
	if (!msg)
		abort();
	memcpy(msg, request, rlen);
	msg[rlen] = '\n';
	bool sent = send(fd, msg, rlen + 1, MSG_NOSIGNAL) == (ssize_t)(rlen + 1);
	free(msg);
	if (!sent) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		close(fd);
		return NULL;
	}
	shutdown(fd, SHUT_WR);
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);
	if (!buf)
		abort();
	for (;;) {
		if (len + 1024 > cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			if (!buf)
				abort();
		}
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			snprintf(err, errlen, "%s: %s", path,
			         errno == EAGAIN ? "no answer in time" : strerror(errno));
			free(buf);
			close(fd);
			return NULL;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	if (len == 0) {
		snprintf(err, errlen, "%s: empty answer", path);
		free(buf);
		return NULL;
	}
	return buf;
}

/* ---- listen sockets handed to children ---------------------------------- */

static int
bind_listen(const char *spec, char *err, size_t errlen)
{
	struct gfs_addr a;
	char msg[300];
	if (!gfs_addr_parse(spec, 0, &a, msg, sizeof msg)) { /* checked when the config was read */
		snprintf(err, errlen, "listen %.250s", msg);
		return -1;
	}
	struct sockaddr_storage ss;
	socklen_t sl = gfs_addr_sockaddr(&a, &ss);
	int fd = socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (fd < 0 || bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 1024) != 0) {
		snprintf(err, errlen, "listen %s: %s", spec, strerror(errno));
		if (fd >= 0)
			close(fd);
		fd = -1;
	}
	return fd;
}

/* ---- programs and instances --------------------------------------------- */

static struct program *
program_new(struct sv *s, const struct sv_program *cfg)
{
	struct program *p = calloc(1, sizeof *p);
	if (!p)
		abort();
	sv_program_copy(&p->cfg, cfg);
	char err[256];
	if (!sv_patterns_compile(&p->pats, p->cfg.patterns, p->cfg.npatterns, err, sizeof err))
		event(s, "%s: %s", p->cfg.name, err); /* checked at parse time; never expected */
	p->listen_fd = -1;
	p->rolling = -1;
	p->ninst = p->cfg.instances;
	p->inst = calloc((size_t)p->ninst, sizeof *p->inst);
	if (!p->inst)
		abort();
	for (int i = 0; i < p->ninst; i++) {
		struct instance *in = &p->inst[i];
		in->prog = p;
		in->sv = s;
		in->index = i;
		in->pidfd = in->out.fd = in->err.fd = in->checker_pidfd = in->checker_pipe = -1;
		in->out.in = in->err.in = in;
		in->err.is_err = true;
		in->health = -1;
		in->state = ST_STOPPED;
		if (p->ninst == 1)
			snprintf(in->name, sizeof in->name, "%s", p->cfg.name);
		else
			snprintf(in->name, sizeof in->name, "%s:%d", p->cfg.name, i);
	}
	return p;
}

static void
program_free(struct program *p)
{
	for (int i = 0; i < p->ninst; i++)
		logfile_close(p->inst[i].log);
	if (p->listen_fd >= 0)
		close(p->listen_fd);
	sv_patterns_free(&p->pats);
	sv_program_free(&p->cfg);
	free(p->inst);
	free(p);
}

static bool
alive(const struct instance *in)
{
	return in->pid > 0;
}

static bool
program_quiet(const struct program *p)
{
	for (int i = 0; i < p->ninst; i++)
		if (alive(&p->inst[i]) || p->inst[i].checker > 0 || p->inst[i].leftover_pgid > 0)
			return false;
	return true;
}

/* True while some process, even a zombie, still has process group pgid. */
static bool
group_exists(pid_t pgid)
{
	return kill(-pgid, 0) == 0 || errno == EPERM;
}

static const char *
log_path_for(const struct instance *in, char *buf, size_t len)
{
	const char *base = in->prog->cfg.log;
	if (!base)
		return NULL;
	if (in->prog->ninst == 1) {
		snprintf(buf, len, "%s", base);
		return buf;
	}
	/* web.log -> web.1.log for instance 1 */
	const char *dot = strrchr(base, '.');
	const char *slash = strrchr(base, '/');
	if (dot && (!slash || dot > slash))
		snprintf(buf, len, "%.*s.%d%s", (int)(dot - base), base, in->index, dot);
	else
		snprintf(buf, len, "%s.%d", base, in->index);
	return buf;
}

/* The child's environment: ours, minus stale LISTEN_*, plus the program's, plus ours for it. */
static char **
build_env(const struct instance *in, size_t *pid_slot)
{
	const struct sv_program *c = &in->prog->cfg;
	size_t n = 0;
	while (environ[n])
		n++;
	char **env = calloc(n + c->nenv + 8, sizeof *env);
	if (!env)
		abort();
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (strncmp(environ[i], "LISTEN_", 7) == 0)
			continue;
		bool overridden = false;
		size_t kl = strcspn(environ[i], "=");
		for (size_t j = 0; j < c->nenv; j++)
			if (strncmp(c->env[j], environ[i], kl + 1) == 0)
				overridden = true;
		if (!overridden)
			env[k++] = strdup(environ[i]);
	}
	for (size_t j = 0; j < c->nenv; j++)
		env[k++] = strdup(c->env[j]);
	char tmp[160];
	snprintf(tmp, sizeof tmp, "GRIDFSCTL_SUPERVISE_NAME=%s", in->name);
	env[k++] = strdup(tmp);
	snprintf(tmp, sizeof tmp, "GRIDFSCTL_SUPERVISE_INSTANCE=%d", in->index);
	env[k++] = strdup(tmp);
	*pid_slot = (size_t)-1;
	if (in->prog->listen_fd >= 0) {
		env[k++] = strdup("LISTEN_FDS=1");
		snprintf(tmp, sizeof tmp, "LISTEN_FDNAMES=%s", c->name);
		env[k++] = strdup(tmp);
		/* Filled in by the child, which alone knows its pid before exec. */
		*pid_slot = k;
		env[k++] = strdup("LISTEN_PID=                    ");
	}
	for (size_t i = 0; i < k; i++)
		if (!env[i])
			abort();
	return env;
}

static void
free_env(char **env)
{
	for (char **e = env; *e; e++)
		free(*e);
	free(env);
}

static void
child_fail(const char *what, const char *arg)
{
	char msg[512];
	int n = snprintf(msg, sizeof msg, "gridfsctl supervise: %s %s: %s\n", what, arg, strerror(errno));
	if (n > 0)
		(void)!write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
	_exit(127);
}

/* fd itself when above 2, else a copy that is (close-on-exec, as the original). */
static int
above_stdio(int fd)
{
	if (fd > STDERR_FILENO)
		return fd;
	int d = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
	return d < 0 ? fd : d;
}

/* Runs in the forked child: becomes the program. */
static void
exec_child(const struct instance *in, int outw, int errw, char **env, size_t pid_slot,
           struct passwd *pw, const struct rlimit *rl, pid_t parent)
{
	const struct sv_program *c = &in->prog->cfg;
	setpgid(0, 0);
	sigset_t none;
	sigemptyset(&none);
	for (int sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			signal(sig, SIG_DFL);
	sigprocmask(SIG_SETMASK, &none, NULL);

	/* Started with 0-2 closed, the pipes may be among them: no dup2 below may undo another. */
	outw = above_stdio(outw);
	errw = above_stdio(errw);
	int devnull = open("/dev/null", O_RDONLY);
	if (devnull >= 0 && devnull != STDIN_FILENO) {
		dup2(devnull, STDIN_FILENO);
		close(devnull);
	}
	dup2(outw, STDOUT_FILENO);
	dup2(errw, STDERR_FILENO);
	if (in->prog->listen_fd >= 0) {
		if (in->prog->listen_fd != 3 && dup2(in->prog->listen_fd, 3) < 0)
			child_fail("dup2", "listen socket");
		fcntl(3, F_SETFD, 0); /* dup2 onto itself keeps close-on-exec */
		char *slot = env[pid_slot];
		snprintf(slot, strlen(slot) + 1, "LISTEN_PID=%d", (int)getpid());
	}
	if (rl && setrlimit(RLIMIT_NOFILE, rl) != 0)
		child_fail("setrlimit", "RLIMIT_NOFILE");
	if (c->directory && chdir(c->directory) != 0)
		child_fail("chdir", c->directory);
	if (pw) {
		if (initgroups(pw->pw_name, pw->pw_gid) != 0 || setgid(pw->pw_gid) != 0)
			child_fail("setgid", pw->pw_name);
		if (setuid(pw->pw_uid) != 0)
			child_fail("setuid", pw->pw_name);
	}
	/*
	 * If the supervisor dies, its children go too, rather than linger
	 * unsupervised. Set after the user change, which clears it.
	 */
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	if (getppid() != parent)
		_exit(127); /* it died before we asked */
	/* Nothing of ours beyond 0-2 (and the listen socket) leaks into the program. */
	close_range(in->prog->listen_fd >= 0 ? 4 : 3, ~0U, 0);
	execvpe(c->argv[0], c->argv, env);
	child_fail("exec", c->argv[0]);
}

static void schedule_restart(struct instance *in, const char *why);

static bool
nofile_limits(const struct instance *in, struct rlimit *rl)
{
	const struct sv_program *c = &in->prog->cfg;
	long soft = in->nofile_next ? in->nofile_next : c->nofile;
	if (!soft && !c->nofile_hard)
		return false;
	struct rlimit cur;
	getrlimit(RLIMIT_NOFILE, &cur);
	/*
	 * As systemd's LimitNOFILE=N: nofile alone sets both limits, since many
	 * servers (and Go's runtime) raise their soft limit to the hard one at
	 * start. nofile_hard leaves room that the descriptor watch can grant live.
	 */
	rl->rlim_cur = soft ? (rlim_t)soft : cur.rlim_cur;
	rl->rlim_max = c->nofile_hard ? (rlim_t)c->nofile_hard : soft ? (rlim_t)soft : cur.rlim_max;
	if (rl->rlim_cur > rl->rlim_max)
		rl->rlim_max = rl->rlim_cur;
	return true;
}

/*
 * The deadlines that watch a running program: startsecs, health checks,
 * descriptor samples. Counted from its start, also when it is a daemon
 * adopted later, which is watched as its foreground parent was.
 */
static void
arm_watches(struct instance *in)
{
	const struct sv_program *c = &in->prog->cfg;
	if (in->state == ST_STARTING)
		in->t_running = in->started_at + c->startsecs;
	if (c->health) {
		double first = c->health_interval_ms / 1000.0;
		in->t_health = in->started_at + (first < 1.0 ? first : 1.0);
	}
	if (c->fd_interval_ms > 0)
		in->t_fd = in->started_at + c->fd_interval_ms / 1000.0;
}

/* The child's stdout and stderr: two pipes, so that restart_on can tell them apart. */
static bool
output_pipes(struct instance *in, int out[2], int err[2])
{
	if (pipe2(out, O_CLOEXEC) == 0) {
		if (pipe2(err, O_CLOEXEC) == 0)
			return true;
		close(out[0]);
		close(out[1]);
	}
	event(in->sv, "%s: pipe: %s", in->name, strerror(errno));
	self_fd_note(in->sv, "pipe");
	schedule_restart(in, "could not be started");
	return false;
}

static void
stream_open(struct instance *in, struct stream *st, int fd)
{
	st->fd = fd;
	st->len = st->seen = 0;
	fcntl(fd, F_SETFL, O_NONBLOCK);
	ep_add(in->sv, fd, &st->w, W_OUTPUT, st);
}

static void
start_instance(struct instance *in)
{
	struct sv *s = in->sv;
	struct program *p = in->prog;
	const struct sv_program *c = &p->cfg;
	char err[300];

	in->t_start = 0;
	if (c->listen && p->listen_fd < 0) {
		p->listen_fd = bind_listen(c->listen, err, sizeof err);
		if (p->listen_fd < 0) {
			event(s, "%s: %s", in->name, err);
			schedule_restart(in, "cannot bind its listen socket");
			return;
		}
		event(s, "%s: holding listen socket %s for its instances", c->name, c->listen);
	}
	char lp[4200];
	if (!in->log && log_path_for(in, lp, sizeof lp)) {
		in->log = logfile_open(lp, c->log_max, c->log_backups);
		if (!in->log) {
			event(s, "%s: log %s: %s", in->name, lp, strerror(errno));
			self_fd_note(s, "log file");
		}
	}
	struct passwd *pw = NULL;
	if (c->user) {
		pw = getpwnam(c->user);
		if (!pw) {
			event(s, "%s: unknown user '%s'", in->name, c->user);
			in->state = ST_FATAL;
			return;
		}
	}
	int pipefd[2], errfd[2];
	if (!output_pipes(in, pipefd, errfd))
		return;
	struct rlimit rl;
	bool set_rl = nofile_limits(in, &rl);
	size_t pid_slot;
	char **env = build_env(in, &pid_slot);
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		event(s, "%s: fork: %s", in->name, strerror(errno));
		for (int i = 0; i < 2; i++) {
			close(pipefd[i]);
			close(errfd[i]);
		}
		free_env(env);
		schedule_restart(in, "could not be started");
		return;
	}
	if (pid == 0) {
		close(pipefd[0]);
		close(errfd[0]);
		exec_child(in, pipefd[1], errfd[1], env, pid_slot, pw, set_rl ? &rl : NULL, parent);
	}
	setpgid(pid, pid); /* also here: no race with the child's own call */
	close(pipefd[1]);
	close(errfd[1]);
	free_env(env);
	in->pid = pid;
	in->pgid = pid;
	stream_open(in, &in->out, pipefd[0]);
	stream_open(in, &in->err, errfd[0]);
	in->pidfd = sys_pidfd_open(pid);
	if (in->pidfd >= 0)
		ep_add(s, in->pidfd, &in->w_pid, W_PIDFD, in);
	in->started_at = gfs_mono_seconds();
	in->state = c->startsecs > 0 ? ST_STARTING : ST_RUNNING;
	in->after = AFTER_POLICY;
	in->emfile_cause = false;
	in->health_failures = 0;
	in->health = -1;
	in->fd_warned = false;
	fdw_trend_reset(&in->trend);
	memset(&in->fds, 0, sizeof in->fds);
	in->fd_soft = in->fd_hard = 0;
	arm_watches(in);
	char lim[64] = "";
	if (set_rl)
		snprintf(lim, sizeof lim, ", nofile %ld", (long)rl.rlim_cur);
	char *shown = sv_redact_command(c->command); /* never a password in the log */
	event(s, "%s: started pid %d%s: %s", in->name, (int)pid, lim, shown);
	free(shown);
}

/*
 * Signals the program's process group, and the main process through its
 * pidfd only when it has left that group: a second SIGTERM is "stop now"
 * to many programs (and kills a Python one that is already exiting).
 */
static void
signal_group(struct instance *in, int sig)
{
	bool in_group = in->pgid > 0 && getpgid(in->pid) == in->pgid;
	if (in->pgid > 0)
		kill(-in->pgid, sig);
	if (!in_group && in->pidfd >= 0)
		sys_pidfd_send_signal(in->pidfd, sig);
}

static void
kill_checker(struct instance *in)
{
	if (in->checker > 0)
		kill(in->checker, SIGKILL);
}

/* Asks the instance to stop; after decides what happens once it has exited. */
static void
stop_instance(struct instance *in, enum after after, const char *why)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	if (!alive(in)) {
		in->t_start = 0;
		if (after == AFTER_NOW && !s->stopping && !in->prog->removing) {
			in->state = ST_STOPPED;
			start_instance(in);
		} else if (in->state != ST_FATAL || after == AFTER_STOP) {
			in->state = ST_STOPPED;
		}
		return;
	}
	in->after = after;
	if (in->state == ST_STOPPING)
		return;
	in->why = why;
	in->state = ST_STOPPING;
	in->t_health = in->t_fd = in->t_running = 0;
	kill_checker(in);
	event(s, "%s: stopping pid %d with %s (%s), SIGKILL after %.1f s", in->name, (int)in->pid,
	      sv_signal_name(c->stop_signal), why, c->stop_grace_ms / 1000.0);
	signal_group(in, c->stop_signal);
	in->t_kill = gfs_mono_seconds() + c->stop_grace_ms / 1000.0;
}

static void
schedule_restart(struct instance *in, const char *why)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	double t = gfs_mono_seconds();
	int k = sv_count_recent(in->restart_times, in->nring < RESTART_RING ? in->nring : RESTART_RING,
	                        t, c->restart_window_s);
	if (k >= c->max_restarts) {
		in->state = ST_FATAL;
		event(s, "%s: giving up: %d restarts within %d s (max_restarts %d); FATAL until "
		         "'gridfsctl supervise restart %s'", in->name, k, c->restart_window_s,
		      c->max_restarts, in->name);
		return;
	}
	int delay = sv_backoff_ms(c->backoff_initial_ms, c->backoff_max_ms, k);
	in->restart_times[in->nring % RESTART_RING] = t;
	in->nring++;
	in->restarts++;
	in->state = ST_BACKOFF;
	/*
	 * Even with no delay the start goes through the timer: start_instance
	 * calls us when it fails, and must not recurse.
	 */
	in->t_start = t + delay / 1000.0;
	event(s, "%s: restarting in %.1f s (%s; restart %d within %d s)", in->name, delay / 1000.0,
	      why, k + 1, c->restart_window_s);
}

static void finish_program_removal(struct sv *s);
static void rolling_advance(struct program *p);

static void
describe_status(int status, char *buf, size_t len)
{
	if (WIFEXITED(status))
		snprintf(buf, len, "exited with code %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "killed by %s%s", sv_signal_name(WTERMSIG(status)),
		         WCOREDUMP(status) ? " (core dumped)" : "");
	else
		snprintf(buf, len, "ended (status %d)", status);
}

static void drain_stream(struct stream *st);

/*
 * The main process is gone but its group was told to stop (by stop_instance,
 * or by signal_leftovers after a crash): what ignores that signal gets
 * SIGKILL when the grace period ends, as the main process would have.
 * Without this a stop left such processes running for ever.
 */
static void
watch_leftovers(struct instance *in, bool was_stopping, int status, double t_kill)
{
	bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
	if (in->pgid <= 0 || !group_exists(in->pgid))
		return;
	if (!was_stopping && clean)
		return; /* nobody was signalled: a daemon forking away, see signal_leftovers */
	if (was_stopping && t_kill == 0)
		return; /* the grace period is over: the whole group got SIGKILL already */
	in->leftover_pgid = in->pgid;
	in->t_group_kill = was_stopping ? t_kill
	                 : gfs_mono_seconds() + in->prog->cfg.stop_grace_ms / 1000.0;
}

/*
 * SIGKILLs what is left of a group when its grace period ends. A process
 * group id is the pid of its first leader, and Linux does not hand out a
 * pid again while any process, zombie included, still uses it as a group
 * id. Leftovers whose parent died are reparented to us (the subreaper), so
 * the last of them stays a zombie in the group until we reap it, which we
 * do only in reap(), never between the check and the kill below. So a
 * group that exists here is still the one we started, not a stranger's.
 * (Only a leftover that a process outside the group parents could end it
 * behind our back, and that takes a program moving processes between
 * groups.)
 */
static void
kill_leftovers(struct instance *in)
{
	pid_t pgid = in->leftover_pgid;
	in->leftover_pgid = 0;
	if (!group_exists(pgid))
		return;
	event(in->sv, "%s: what pid %d left in its process group did not stop within %.1f s: "
	      "sending SIGKILL", in->name, (int)pgid, in->prog->cfg.stop_grace_ms / 1000.0);
	kill(-pgid, SIGKILL);
}

/* Forgets leftovers whose group has emptied, so a stop need not wait out their grace. */
static void
forget_gone_leftovers(struct sv *s)
{
	for (struct program *p = s->progs; p; p = p->next)
		for (int i = 0; i < p->ninst; i++) {
			struct instance *in = &p->inst[i];
			if (in->leftover_pgid > 0 && !group_exists(in->leftover_pgid)) {
				in->leftover_pgid = 0;
				in->t_group_kill = 0;
			}
		}
}

/* True when pid has the read end's pipe (inode ino) among its descriptors. */
static bool
holds_pipe(pid_t pid, ino_t ino)
{
	char dir[64], want[64];
	snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
	snprintf(want, sizeof want, "pipe:[%lu]", (unsigned long)ino);
	DIR *d = opendir(dir);
	if (!d)
		return false;
	bool found = false;
	struct dirent *e;
	while (!found && (e = readdir(d)) != NULL) {
		char link[64];
		ssize_t n = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
		if (n <= 0)
			continue;
		link[n] = '\0';
		found = strcmp(link, want) == 0;
	}
	closedir(d);
	return found;
}

/*
 * Every orphan below us is reparented to us, whichever program left it.
 * Only one still in the instance's process group, or still writing to its
 * output pipe, is the instance's: what another program left must not be
 * taken for this one's daemon.
 */
static bool
orphan_is_ours(const struct instance *in, pid_t pid)
{
	if (in->pgid > 0 && getpgid(pid) == in->pgid)
		return true;
	const struct stream *pipes[] = {&in->out, &in->err};
	for (size_t i = 0; i < 2; i++) {
		struct stat st;
		if (pipes[i]->fd >= 0 && fstat(pipes[i]->fd, &st) == 0 && holds_pipe(pid, st.st_ino))
			return true;
	}
	return false;
}

/* A daemonising child exits 0 and leaves its real process behind, reparented to us. */
static bool
adopt_orphan(struct instance *in)
{
	struct sv *s = in->sv;
	DIR *d = opendir("/proc");
	if (!d)
		return false;
	pid_t me = getpid(), found = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL && !found) {
		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		char path[300], buf[512];
		snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t n = read(fd, buf, sizeof buf - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		char *rp = strrchr(buf, ')');
		int ppid = 0;
		char st;
		if (!rp || sscanf(rp + 1, " %c %d", &st, &ppid) != 2 || ppid != me || st == 'Z')
			continue;
		pid_t pid = (pid_t)atoi(e->d_name);
		bool known = false;
		for (struct program *p = s->progs; p; p = p->next)
			for (int i = 0; i < p->ninst; i++)
				if (p->inst[i].pid == pid || p->inst[i].checker == pid)
					known = true;
		if (!known && orphan_is_ours(in, pid))
			found = pid;
	}
	closedir(d);
	if (!found)
		return false;
	in->pid = found;
	in->pgid = getpgid(found);
	in->pidfd = sys_pidfd_open(found);
	if (in->pidfd >= 0)
		ep_add(s, in->pidfd, &in->w_pid, W_PIDFD, in);
	event(s, "%s: it daemonised; now tracking pid %d", in->name, (int)found);
	return true;
}

static void
on_exit_status(struct instance *in, int status)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	double ran = gfs_mono_seconds() - in->started_at;
	ep_close(s, &in->pidfd);
	pid_t pid = in->pid;
	double t_kill = in->t_kill;
	in->pid = 0;
	in->t_kill = in->t_health = in->t_fd = in->t_running = 0;
	describe_status(status, in->last_exit, sizeof in->last_exit);
	event(s, "%s: pid %d %s after %.1f s", in->name, (int)pid, in->last_exit, ran);
	bool was_stopping = in->state == ST_STOPPING;

	/*
	 * A daemon left behind keeps the output pipe: it is still this program,
	 * checked and sampled as before (a check under way goes on).
	 */
	if (!was_stopping && !s->stopping && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
	    adopt_orphan(in)) {
		arm_watches(in);
		return;
	}
	kill_checker(in);
	watch_leftovers(in, was_stopping, status, t_kill);
	in->exiting = true;
	drain_stream(&in->out);
	drain_stream(&in->err);
	in->exiting = false;
	enum after after = in->after; /* read after the drain, whose last lines may change it */
	in->after = AFTER_POLICY;
	if (s->stopping || in->prog->removing || after == AFTER_STOP) {
		in->state = ST_STOPPED;
		return;
	}
	if (after == AFTER_NOW) {
		in->state = ST_STOPPED;
		in->last_emfile = false;
		start_instance(in);
		if (in->prog->rolling >= 0)
			rolling_advance(in->prog);
		return;
	}
	if (!was_stopping && !c->autorestart && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		in->state = ST_EXITED;
		return;
	}
	in->last_emfile = in->emfile_cause;
	schedule_restart(in, was_stopping && in->why ? in->why : in->last_exit);
	if (in->prog->rolling >= 0)
		rolling_advance(in->prog);
}

static struct instance *
find_pid(struct sv *s, pid_t pid, bool *checker)
{
	for (struct program *p = s->progs; p; p = p->next)
		for (int i = 0; i < p->ninst; i++) {
			if (p->inst[i].pid == pid) {
				*checker = false;
				return &p->inst[i];
			}
			if (p->inst[i].checker == pid) {
				*checker = true;
				return &p->inst[i];
			}
		}
	return NULL;
}

static void on_checker_exit(struct instance *in, int status);

/*
 * The main process has exited (still a zombie, so its group id cannot be
 * reused yet): what it started in its group would otherwise outlive it and
 * hold its port or files. A clean exit may be a daemon forking away, which
 * on_exit_status adopts; and a stopping instance's group got the signal.
 */
static void
signal_leftovers(struct instance *in, const siginfo_t *si)
{
	bool may_daemonise = si->si_code == CLD_EXITED && si->si_status == 0;
	if (in->pgid <= 0 || in->state == ST_STOPPING || in->sv->stopping || may_daemonise)
		return;
	kill(-in->pgid, in->prog->cfg.stop_signal);
}

/* Reaps every exited child: ours, health checkers, and orphans adopted as subreaper. */
static void
reap(struct sv *s)
{
	for (;;) {
		siginfo_t si;
		memset(&si, 0, sizeof si);
		if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0)
			break;
		bool is_checker;
		struct instance *in = find_pid(s, si.si_pid, &is_checker);
		if (in && !is_checker)
			signal_leftovers(in, &si);
		if (waitid(P_PID, (id_t)si.si_pid, &si, WEXITED | WNOHANG) != 0 || si.si_pid == 0)
			break;
		int status = si.si_code == CLD_EXITED ? W_EXITCODE(si.si_status, 0)
		           : si.si_code == CLD_DUMPED ? (si.si_status | 0x80) : si.si_status;
		if (!in)
			continue; /* an orphan that some child left behind */
		if (is_checker)
			on_checker_exit(in, status);
		else
			on_exit_status(in, status);
	}
	forget_gone_leftovers(s);
	finish_program_removal(s);
}

/* ---- relaying output and event lines ------------------------------------ */

/*
 * A reader of our standard output or error that stops (a pager, a full
 * pipe) must not stop the supervisor: a blocked write would leave every
 * child's pipe unread, and the children blocked in turn. So a relay never
 * blocks. It holds what the reader has not taken up to its max, then drops
 * whole lines until the reader has caught up, and then says how much went.
 */
static void
relay_open(struct relay *r, int fd, size_t max, const char *what)
{
	r->fd = -1;
	r->max = max;
	r->what = what;
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0)
		return;
	if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) {
		r->fd = fd; /* a local file never waits for a reader */
		return;
	}
	if (S_ISSOCK(st.st_mode)) {
		r->fd = fd;
		r->sock = true;
		return;
	}
	/*
	 * A pipe, FIFO or terminal. O_NONBLOCK on fd itself would change the
	 * open file description we share with our parent (and maybe stderr);
	 * an opening of our own makes only our writes non-blocking.
	 */
	char path[64];
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	int own = open(path, O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	if (own >= 0) {
		r->fd = own;
		r->own = true;
		return;
	}
	/* No /proc: better a shared O_NONBLOCK than a supervisor that blocks. */
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	r->fd = fd;
}

/* True when a and b lead to the same pipe, terminal, socket or file. */
static bool
same_file(int a, int b)
{
	struct stat sa, sb;
	return a >= 0 && b >= 0 && fstat(a, &sa) == 0 && fstat(b, &sb) == 0 &&
	       sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/*
 * With 2>&1 two relays would each hold and drop their own lines and write
 * in whatever order their reader let them: event lines could overtake the
 * output they are about, or split a long line. One relay keeps the order.
 */
static void
relays_open(struct sv *s, const struct sv_callbacks *cb)
{
	relay_open(&s->out, cb->output_fd, RELAY_MAX, "standard output");
	s->ev = &s->err;
	if (cb->event_fd >= 0 && s->out.fd >= 0 && same_file(cb->output_fd, cb->event_fd))
		s->ev = &s->out;
	else
		relay_open(&s->err, cb->event_fd, EVENTS_MAX, "standard error");
}

static void
relay_watch(struct sv *s, struct relay *r, bool on)
{
	if (r->fd < 0 || on == r->watched)
		return;
	r->w.kind = W_RELAY;
	r->w.ptr = r;
	struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = &r->w};
	if (epoll_ctl(s->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, r->fd, &ev) == 0)
		r->watched = on;
}

static void
relay_close(struct sv *s, struct relay *r)
{
	relay_watch(s, r, false);
	if (r->own && r->fd >= 0)
		close(r->fd);
	r->fd = -1;
	r->off = r->len = 0;
}

static ssize_t
relay_write(const struct relay *r, const char *data, size_t len)
{
	if (r->sock)
		return send(r->fd, data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	return write(r->fd, data, len);
}

/* Once the buffer has emptied, what was dropped is said where it went missing. */
static void
relay_note_dropped(struct relay *r)
{
	if (r->dropped == 0)
		return;
	int n = snprintf(r->buf, r->max + 1, "[%llu bytes dropped (%llu lines): %s was not being "
	                 "read]\n", r->dropped, r->dropped_lines, r->what);
	r->off = 0;
	r->len = n > 0 ? (size_t)n : 0;
	r->dropped = r->dropped_lines = 0;
}

/* Writes what the reader takes now; waits in epoll for the rest. */
static void
relay_flush(struct sv *s, struct relay *r)
{
	while (r->fd >= 0 && r->off < r->len) {
		ssize_t n = relay_write(r, r->buf + r->off, r->len - r->off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			relay_watch(s, r, true);
			if (!r->watched)
				break; /* cannot wait for it: give up below */
			return;
		}
		if (n <= 0)
			break;
		r->off += (size_t)n;
		if (r->off == r->len) {
			r->off = r->len = 0;
			relay_note_dropped(r);
		}
	}
	if (r->fd >= 0 && r->off < r->len) {
		const char *why = strerror(errno);
		relay_close(s, r);
		/* Reaches the event callback, or standard error when only stdout failed. */
		event(s, "%s: %s: %s discarded from now on", r->what, why,
		      r != s->ev ? "children's output without a log file is"
		      : r == &s->out ? "children's output and event lines are" : "event lines are");
		return;
	}
	relay_watch(s, r, false);
}

/* Makes room for need more bytes, or counts them as dropped. */
static bool
relay_room(struct sv *s, struct relay *r, size_t need)
{
	if (!r->buf) {
		r->buf = malloc(r->max + 1);
		if (!r->buf)
			abort();
	}
	if (r->dropped == 0 && r->off > 0 && r->max - r->len < need) {
		/* What the reader took leaves room at the front. */
		memmove(r->buf, r->buf + r->off, r->len - r->off);
		r->len -= r->off;
		r->off = 0;
	}
	if (r->dropped == 0 && r->max - r->len >= need)
		return true;
	/* Dropping goes on until the reader has caught up, so the note marks one gap. */
	bool first = r->dropped == 0;
	r->dropped += need;
	r->dropped_lines++;
	/* Said on standard error; when that is this relay, the note will say it. */
	if (first && r != s->ev)
		event(s, "%s is not being read: dropping children's output until it is", r->what);
	return false;
}

static void
relay_printf(struct sv *s, struct relay *r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
relay_printf(struct sv *s, struct relay *r, const char *fmt, ...)
{
	if (r->fd < 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n <= 0 || !relay_room(s, r, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(r->buf + r->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	r->len += (size_t)n;
	if (!r->watched)
		relay_flush(s, r);
}

static void
relay_event(struct sv *s, const char *line)
{
	struct timespec ts;
	struct tm tm;
	char when[32];
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
	relay_printf(s, s->ev, "%s%s.%03ldZ %s\n", s->cb.event_prefix ? s->cb.event_prefix : "",
	             when, ts.tv_nsec / 1000000, line);
}

/*
 * At exit nothing is left to supervise, and a reader that is merely slow
 * (systemd's journal, a busy terminal) should still get the last lines.
 * One that has stopped costs us EXIT_DRAIN_S.
 */
static void
relay_drain(struct sv *s, struct relay *r, double deadline)
{
	relay_flush(s, r);
	while (r->fd >= 0 && r->off < r->len) {
		double left = deadline - gfs_mono_seconds();
		struct pollfd pfd = {.fd = r->fd, .events = POLLOUT};
		if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) <= 0)
			return;
		relay_flush(s, r);
	}
}

/* ---- output ------------------------------------------------------------- */

/*
 * Pattern restarts get the restart budget that is left, and never more: a
 * restart for a pattern must not be what makes a program FATAL, since the
 * line may say nothing about its health. Once the budget is spent a match
 * is reported (once) and the program left running; crashes and failed
 * health checks still count as ever.
 */
static bool
pattern_budget_spent(struct instance *in, int which)
{
	const struct sv_program *c = &in->prog->cfg;
	int k = sv_count_recent(in->restart_times, in->nring < RESTART_RING ? in->nring : RESTART_RING,
	                        gfs_mono_seconds(), c->restart_window_s);
	if (k < c->max_restarts) {
		in->pattern_held = false;
		return false;
	}
	if (!in->pattern_held)
		event(in->sv, "%s: output matched restart_on '%s' again after %d restarts within %d s "
		      "(max_restarts): not restarting it for a pattern; it keeps running", in->name,
		      c->patterns[which], k, c->restart_window_s);
	in->pattern_held = true;
	return true;
}

/*
 * Out of descriptors again right after a restart: the limit is too low, not
 * a leak. Returns false when the next start cannot get a higher limit, so
 * that restarting would not help.
 */
static bool
raise_next_nofile(struct instance *in, double up)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	long soft = -1, hard = -1;
	struct rlimit rl, own;
	getrlimit(RLIMIT_NOFILE, &own);
	if (!fdw_limits(in->pid, &soft, &hard)) {
		if (!nofile_limits(in, &rl))
			rl = own;
		soft = rl.rlim_cur == RLIM_INFINITY ? -1 : (long)rl.rlim_cur;
	}
	/* The next start may go as high as nofile_hard, else as our own hard limit. */
	long cap = c->nofile_hard ? c->nofile_hard
	         : own.rlim_max == RLIM_INFINITY ? -1 : (long)own.rlim_max;
	long target = soft > 0 ? fdw_raise_target(soft, cap) : 0;
	if (soft > 0 && target > soft) {
		in->nofile_next = target;
		event(s, "%s: out of descriptors again %.1f s after a restart with a limit of %ld: "
		         "the limit is too low for this load, not a leak; next start gets nofile %ld "
		         "(set nofile in the config)", in->name, up, soft, target);
		return true;
	}
	event(s, "%s: out of descriptors again %.1f s after a restart, already at the highest "
	         "limit allowed (%ld): the limit is too low for this load; not restarting it, as "
	         "that cannot help; raise nofile_hard or the supervisor's own limit",
	      in->name, up, soft);
	return false;
}

static void
restart_for_pattern(struct instance *in, const char *line, int which)
{
	const struct sv_program *c = &in->prog->cfg;
	if (in->state != ST_STARTING && in->state != ST_RUNNING)
		return;
	if (pattern_budget_spent(in, which))
		return;
	bool emfile = sv_line_is_emfile(line);
	event(in->sv, "%s: output matched restart_on '%s': %.300s", in->name, c->patterns[which],
	      line);
	double up = gfs_mono_seconds() - in->started_at;
	in->emfile_cause = emfile;
	if (emfile && in->last_emfile && up < EMFILE_RECUR_S && !raise_next_nofile(in, up))
		return;
	if (!in->exiting) /* an exited child is restarted by the exit policy */
		stop_instance(in, AFTER_POLICY, "restart_on pattern");
}

/* Whether restart_on looks at this stream: request data a server logs must not restart it. */
static bool
stream_matched(const struct stream *st)
{
	int which = st->in->prog->cfg.restart_on_stream;
	return which == SV_STREAM_BOTH || (which == SV_STREAM_STDERR) == st->is_err;
}

/*
 * One line, or one piece of an overlong one, in line[0..len): matched
 * whole, but relayed from from on, since line[0..from) went with the piece
 * before it.
 */
static void
on_line(struct stream *st, char *line, size_t from, size_t len)
{
	struct instance *in = st->in;
	struct sv *s = in->sv;
	char save = line[len];
	line[len] = '\0';
	if (!in->log)
		relay_printf(s, &s->out, "[%s] %s\n", in->name, line + (from < len ? from : len));
	int which = stream_matched(st) ? sv_patterns_match(&in->prog->pats, line) : -1;
	if (which >= 0)
		restart_for_pattern(in, line, which);
	line[len] = save;
}

/* Raw output to the log: whole reads at a time, one write(2) for many lines. */
static void
log_bytes(struct instance *in, const char *data, size_t len)
{
	if (in->log && len && !logfile_write(in->log, data, len))
		event(in->sv, "%s: log write: %s", in->name, strerror(errno));
}

/* An overlong line fills the buffer: passed on as a piece, its tail kept to match with the next. */
static void
take_piece(struct stream *st)
{
	on_line(st, st->buf, st->seen, st->len);
	log_bytes(st->in, st->buf + st->seen, st->len - st->seen);
	log_bytes(st->in, "\n", 1);
	memmove(st->buf, st->buf + st->len - LINE_OVERLAP, LINE_OVERLAP);
	st->len = st->seen = LINE_OVERLAP;
}

/* Passes on the complete lines held, and keeps what follows the last newline. */
static void
take_lines(struct stream *st)
{
	char *start = st->buf, *nl;
	while ((nl = memchr(start, '\n', st->len - (size_t)(start - st->buf))) != NULL) {
		size_t l = (size_t)(nl - start);
		if (l && start[l - 1] == '\r')
			l--;
		on_line(st, start, start == st->buf ? st->seen : 0, l);
		start = nl + 1;
	}
	if (start == st->buf) {
		if (st->len == sizeof st->buf - 1)
			take_piece(st);
		return;
	}
	log_bytes(st->in, st->buf + st->seen, (size_t)(start - st->buf) - st->seen);
	st->len -= (size_t)(start - st->buf);
	st->seen = 0;
	memmove(st->buf, start, st->len);
}

static void
handle_output(struct stream *st, bool drain_all)
{
	/* Bounded even when draining: a process left behind may write forever. */
	for (int rounds = 0; st->fd >= 0 && rounds < (drain_all ? 256 : 16); rounds++) {
		ssize_t n = read(st->fd, st->buf + st->len, sizeof st->buf - 1 - st->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0 || errno != EAGAIN)
				ep_close(st->in->sv, &st->fd);
			return;
		}
		st->len += (size_t)n;
		take_lines(st);
	}
}

/* What a child that has exited left in a pipe, and a last line without a newline. */
static void
drain_stream(struct stream *st)
{
	handle_output(st, true);
	ep_close(st->in->sv, &st->fd);
	if (st->len > st->seen) {
		on_line(st, st->buf, st->seen, st->len);
		log_bytes(st->in, st->buf + st->seen, st->len - st->seen);
		log_bytes(st->in, "\n", 1);
	}
	st->len = st->seen = 0;
}

/* ---- health checks (in a forked checker) -------------------------------- */

static bool
check_mongodb(const char *url, int timeout_ms, char *msg, size_t len)
{
	char *u = malloc(strlen(url) + 128);
	if (!u)
		abort();
	strcpy(u, url);
	const char *after_scheme = strstr(u, "://") + 3;
	bool has_q = strchr(after_scheme, '?') != NULL;
	bool has_path = strchr(after_scheme, '/') != NULL;
	/* The driver's timeouts, not our SIGKILL, should end a check that gets no answer. */
	if (!has_path)
		strcat(u, "/");
	if (!strcasestr(u, "serverSelectionTimeoutMS")) {
		sprintf(u + strlen(u), "%sserverSelectionTimeoutMS=%d", has_q ? "&" : "?", timeout_ms);
		has_q = true;
	}
	if (!strcasestr(u, "connectTimeoutMS"))
		sprintf(u + strlen(u), "%sconnectTimeoutMS=%d", has_q ? "&" : "?", timeout_ms);
	gfs_error err;
	gfs_conn *conn = gfs_conn_open(u, NULL, NULL, &err);
	free(u);
	bool ok = conn && gfs_conn_ping(conn, &err);
	if (!ok)
		snprintf(msg, len, "%.380s", err.msg);
	gfs_conn_close(conn);
	return ok;
}

static bool
check_http(const char *url, int timeout_ms, char *msg, size_t len)
{
	const char *hp = url + 7;
	const char *path = strchr(hp, '/');
	char h[256], port[8];
	unsigned pn;
	if (!gfs_hostport_parse(hp, 80, h, sizeof h, &pn, msg, len))
		return false; /* checked when the config was read */
	snprintf(port, sizeof port, "%u", pn);
	int hl = (int)(path ? (size_t)(path - hp) : strlen(hp));
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
	int rc = getaddrinfo(h, port, &hints, &res);
	if (rc != 0) {
		snprintf(msg, len, "%s: %s", h, gai_strerror(rc));
		return false;
	}
	int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	if (fd >= 0) {
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	}
	if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
		snprintf(msg, len, "connect %s:%s: %s", h, port, strerror(errno));
		freeaddrinfo(res);
		if (fd >= 0)
			close(fd);
		return false;
	}
	freeaddrinfo(res);
	char req[1024];
	int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %.*s\r\nConnection: close\r\n\r\n",
	                 path ? path : "/", hl, hp);
	if (n < 0 || (size_t)n >= sizeof req || send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
		snprintf(msg, len, "send: %s", strerror(errno));
		close(fd);
		return false;
	}
	char resp[256];
	size_t got = 0;
	while (got < sizeof resp - 1 && !memchr(resp, '\n', got)) {
		ssize_t r = read(fd, resp + got, sizeof resp - 1 - got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	resp[got] = '\0';
	resp[strcspn(resp, "\r\n")] = '\0';
	int code = 0;
	/* Only the status line matters: "HTTP/1.x NNN reason". */
	if (sscanf(resp, "HTTP/%*d.%*d %d", &code) != 1) {
		snprintf(msg, len, "no HTTP status line (got %zu bytes)", got);
		return false;
	}
	if (code < 200 || code > 299) {
		snprintf(msg, len, "%s", resp);
		return false;
	}
	return true;
}

/*
 * A checker inherits our stderr as the caller's blocking descriptor, not
 * the relay's: a driver warning written there while nobody reads it would
 * hold the check until its deadline and fail a healthy program. Its answer
 * goes through its pipe, so it says nothing anywhere else.
 */
static void
checker_quiet(void)
{
	int fd = open("/dev/null", O_WRONLY);
	if (fd < 0)
		return;
	dup2(fd, STDOUT_FILENO);
	dup2(fd, STDERR_FILENO);
	if (fd > STDERR_FILENO)
		close(fd);
}

static void
start_check(struct instance *in)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	in->t_health = gfs_mono_seconds() + c->health_interval_ms / 1000.0;
	if (in->checker > 0)
		return; /* the last one is still running: its deadline handles it */
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) != 0) {
		self_fd_note(s, "health check pipe");
		return;
	}
	pid_t pid = fork();
	if (pid < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return;
	}
	if (pid == 0) {
		close(pfd[0]);
		checker_quiet();
		char msg[400] = "";
		bool ok = strncmp(c->health, "http://", 7) == 0
		              ? check_http(c->health, c->health_timeout_ms, msg, sizeof msg)
		              : check_mongodb(c->health, c->health_timeout_ms, msg, sizeof msg);
		if (!ok)
			(void)!write(pfd[1], msg, strlen(msg));
		_exit(ok ? 0 : 1);
	}
	close(pfd[1]);
	in->checker = pid;
	in->checker_pipe = pfd[0];
	in->checker_pidfd = sys_pidfd_open(pid);
	if (in->checker_pidfd >= 0)
		ep_add(s, in->checker_pidfd, &in->w_chk, W_CHECKER, in);
	in->t_check_deadline = gfs_mono_seconds() + c->health_timeout_ms / 1000.0;
}

static void
on_checker_exit(struct instance *in, int status)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	char msg[400] = "";
	if (in->checker_pipe >= 0) {
		fcntl(in->checker_pipe, F_SETFL, O_NONBLOCK);
		ssize_t n = read(in->checker_pipe, msg, sizeof msg - 1);
		msg[n > 0 ? n : 0] = '\0';
		close(in->checker_pipe);
		in->checker_pipe = -1;
	}
	ep_close(s, &in->checker_pidfd);
	in->checker = 0;
	bool timed_out = in->t_check_deadline < 0;
	in->t_check_deadline = 0;
	if (in->state != ST_RUNNING && in->state != ST_STARTING)
		return;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		if (in->health != 1) {
			char *shown = gfs_uri_redact(c->health); /* never a password in the log */
			event(s, "%s: healthy%s (%s)", in->name, in->health_failures ? " again" : "", shown);
			bson_free(shown);
		}
		in->health = 1;
		in->health_failures = 0;
		return;
	}
	if (timed_out)
		snprintf(msg, sizeof msg, "no answer within %.1f s", c->health_timeout_ms / 1000.0);
	else if (!*msg)
		describe_status(status, msg, sizeof msg);
	snprintf(in->health_msg, sizeof in->health_msg, "%.380s", msg);
	if (in->state == ST_STARTING && in->health != 1) {
		/* Still within startsecs and never healthy yet: not ready is not failing. */
		event(s, "%s: not ready yet: %s", in->name, msg);
		return;
	}
	in->health = 0;
	in->health_failures++;
	event(s, "%s: health check failed (%d of %d): %s", in->name, in->health_failures,
	      c->health_retries, msg);
	if (in->health_failures >= c->health_retries)
		stop_instance(in, AFTER_POLICY, "health check failed");
}

/* ---- descriptor watch --------------------------------------------------- */

static void
sample_fds(struct instance *in)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	double t = gfs_mono_seconds();
	in->t_fd = t + c->fd_interval_ms / 1000.0;
	struct fdw_counts fc;
	long soft, hard;
	if (!fdw_count(in->pid, &fc) || !fdw_limits(in->pid, &soft, &hard))
		return;
	in->fds = fc;
	in->fd_soft = soft;
	in->fd_hard = hard;
	fdw_trend_add(&in->trend, t, fc.total);
	double slope = fdw_trend_slope(&in->trend), eta;
	struct fdw_policy pol = {c->fd_threshold_pct, c->fd_horizon_s, c->fd_raise};
	enum fdw_action act = fdw_decide(fc.total, soft, hard, slope, &pol, &eta);
	if (act == FDW_OK) {
		in->fd_warned = false;
		return;
	}
	char what[300], etas[64] = "";
	if (eta >= 0)
		snprintf(etas, sizeof etas, ", limit reached in ~%.0f s", eta);
	snprintf(what, sizeof what, "%ld of %ld descriptors open (sockets %ld, files %ld, pipes %ld, "
	         "other %ld), trend %+.1f/s%s", fc.total, soft, fc.sockets, fc.files, fc.pipes,
	         fc.other, slope, etas);
	if (act == FDW_RAISE) {
		long target = fdw_raise_target(soft, hard);
		char err[200];
		if (fdw_set_soft(in->pid, target, err, sizeof err)) {
			in->fd_soft = target;
			fdw_trend_reset(&in->trend); /* judge the new limit on fresh samples */
			event(s, "%s: %s: raised its soft limit live %ld -> %ld (hard %ld)", in->name, what,
			      soft, target, hard);
		} else {
			event(s, "%s: %s: cannot raise its limit: %s", in->name, what, err);
		}
		return;
	}
	if (act == FDW_WARN) {
		if (!in->fd_warned)
			event(s, "%s: %s; at its hard limit, nothing left to raise", in->name, what);
		in->fd_warned = true;
		return;
	}
	event(s, "%s: %s; at its hard limit and still climbing: restarting", in->name, what);
	in->emfile_cause = true;
	stop_instance(in, AFTER_POLICY, "descriptors exhausted");
}

/* ---- timers ------------------------------------------------------------- */

static void
consider(double *earliest, double t)
{
	if (t > 0 && (*earliest == 0 || t < *earliest))
		*earliest = t;
}

static void
arm_timer(struct sv *s)
{
	double earliest = s->t_accept;
	consider(&earliest, s->t_watchdog);
	for (struct program *p = s->progs; p; p = p->next)
		for (int i = 0; i < p->ninst; i++) {
			struct instance *in = &p->inst[i];
			consider(&earliest, in->t_start);
			consider(&earliest, in->t_kill);
			consider(&earliest, in->t_group_kill);
			consider(&earliest, in->t_running);
			consider(&earliest, in->t_health);
			consider(&earliest, in->t_check_deadline);
			consider(&earliest, in->t_fd);
		}
	struct itimerspec its = {0};
	if (earliest > 0) {
		its.it_value.tv_sec = (time_t)earliest;
		its.it_value.tv_nsec = (long)((earliest - (double)(time_t)earliest) * 1e9);
		if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
			its.it_value.tv_nsec = 1;
	}
	timerfd_settime(s->timerfd, TFD_TIMER_ABSTIME, &its, NULL);
}

static bool
due(double *t, double now)
{
	if (*t > 0 && *t <= now) {
		*t = 0;
		return true;
	}
	return false;
}

static void
on_timer(struct sv *s)
{
	uint64_t ticks;
	(void)!read(s->timerfd, &ticks, sizeof ticks);
	double t = gfs_mono_seconds() + 0.0005;
	if (due(&s->t_accept, t))
		ep_add(s, s->ctlfd, &s->w_ctl, W_CONTROL, NULL);
	if (due(&s->t_watchdog, t)) {
		notify(s, "WATCHDOG=1");
		s->t_watchdog = t + s->watchdog_s;
	}
	for (struct program *p = s->progs; p; p = p->next)
		for (int i = 0; i < p->ninst; i++) {
			struct instance *in = &p->inst[i];
			if (due(&in->t_kill, t) && alive(in)) {
				event(s, "%s: pid %d did not stop within %.1f s: sending SIGKILL", in->name,
				      (int)in->pid, p->cfg.stop_grace_ms / 1000.0);
				signal_group(in, SIGKILL);
			}
			if (due(&in->t_group_kill, t) && in->leftover_pgid > 0)
				kill_leftovers(in);
			if (due(&in->t_start, t) && in->state == ST_BACKOFF)
				start_instance(in);
			if (due(&in->t_running, t) && in->state == ST_STARTING) {
				in->state = ST_RUNNING;
				if (p->rolling >= 0)
					rolling_advance(p);
			}
			if (due(&in->t_check_deadline, t) && in->checker > 0) {
				in->t_check_deadline = -1; /* tells on_checker_exit it timed out */
				kill(in->checker, SIGKILL);
			}
			if (due(&in->t_health, t) && (in->state == ST_RUNNING || in->state == ST_STARTING))
				start_check(in);
			if (due(&in->t_fd, t) && (in->state == ST_RUNNING || in->state == ST_STARTING))
				sample_fds(in);
		}
	/* t_check_deadline = -1 must not arm the timer */
}

/* ---- restarts on request, reload, stop ---------------------------------- */

/* Restarts the instances of p one at a time, so a shared socket always has someone accepting. */
static void
rolling_advance(struct program *p)
{
	if (p->rolling < 0)
		return;
	if (p->rolling > 0) {
		struct instance *prev = &p->inst[p->rolling - 1];
		if (prev->state == ST_STARTING || prev->state == ST_STOPPING)
			return; /* not up yet */
	}
	if (p->rolling >= p->ninst) {
		p->rolling = -1;
		return;
	}
	struct instance *in = &p->inst[p->rolling++];
	in->nring = 0; /* a requested restart starts a fresh restart window, FATAL or not */
	stop_instance(in, AFTER_NOW, "restart requested");
	if (!alive(in) && in->state == ST_RUNNING)
		rolling_advance(p);
}

/* The program of that name, being removed or not: there is at most one. */
static struct program *
find_program(struct sv *s, const char *name)
{
	for (struct program *p = s->progs; p; p = p->next)
		if (strcmp(p->cfg.name, name) == 0)
			return p;
	return NULL;
}

static bool
restart_named(struct sv *s, const char *name, char *msg, size_t len)
{
	bool any = false;
	for (struct program *p = s->progs; p; p = p->next) {
		if (p->removing)
			continue;
		if (strcmp(p->cfg.name, name) == 0 || strcmp(name, "all") == 0) {
			event(s, "%s: restart requested", p->cfg.name);
			p->rolling = 0;
			rolling_advance(p);
			any = true;
			continue;
		}
		for (int i = 0; i < p->ninst; i++)
			if (strcmp(p->inst[i].name, name) == 0) {
				struct instance *in = &p->inst[i];
				event(s, "%s: restart requested", in->name);
				in->nring = 0;
				stop_instance(in, AFTER_NOW, "restart requested");
				any = true;
			}
	}
	snprintf(msg, len, any ? "restarting %s" : "no program or instance named '%s'", name);
	return any;
}

static void
append_program(struct sv *s, struct program *np)
{
	struct program **pp = &s->progs;
	while (*pp)
		pp = &(*pp)->next;
	*pp = np;
}

static void
start_program(struct program *p)
{
	for (int i = 0; i < p->ninst; i++)
		start_instance(&p->inst[i]);
}

/* Frees programs being removed once all their processes are gone; starts replacements. */
static void
finish_program_removal(struct sv *s)
{
	struct program **pp = &s->progs;
	while (*pp) {
		struct program *p = *pp;
		if (!p->removing || !program_quiet(p)) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		struct program *r = p->replacement;
		if (r && p->listen_fd >= 0 && r->cfg.listen && p->cfg.listen &&
		    strcmp(r->cfg.listen, p->cfg.listen) == 0) {
			r->listen_fd = p->listen_fd; /* keep accepting across the change */
			p->listen_fd = -1;
		}
		event(s, "%s: %s", p->cfg.name, r ? "stopped; starting it with the new configuration"
		                                  : "removed");
		program_free(p);
		if (r && !s->stopping) {
			append_program(s, r);
			start_program(r);
		} else if (r) {
			program_free(r);
		}
	}
}

static void
remove_program(struct program *p, struct program *replacement)
{
	p->removing = true;
	p->replacement = replacement;
	for (int i = 0; i < p->ninst; i++)
		stop_instance(&p->inst[i], AFTER_STOP, replacement ? "configuration changed" : "removed from the configuration");
}

/*
 * A program still stopping from an earlier reload: the newest configuration
 * replaces what was to start after it (np NULL: nothing starts).
 */
static void
replace_pending(struct program *p, struct program *np)
{
	if (p->replacement)
		program_free(p->replacement);
	p->replacement = np;
}

/* Applies one program of the new configuration; returns 'a'dded, 'c'hanged or 0. */
static int
reload_program(struct sv *s, const struct sv_program *cfg)
{
	struct program *old = find_program(s, cfg->name);
	if (old && !old->removing && sv_program_equal(&old->cfg, cfg))
		return 0;
	if (old && old->removing && old->replacement &&
	    sv_program_equal(&old->replacement->cfg, cfg))
		return 0;
	struct program *np = program_new(s, cfg);
	if (!old) {
		append_program(s, np);
		start_program(np);
		return 'a';
	}
	if (old->removing)
		replace_pending(old, np);
	else
		remove_program(old, np);
	return 'c';
}

static void
reload(struct sv *s)
{
	if (!s->config_path) {
		event(s, "SIGHUP: no configuration file to re-read (quick form)");
		return;
	}
	if (s->stopping) {
		event(s, "not reloading: stopping");
		return;
	}
	struct sv_config cfg;
	char err[600];
	if (!sv_config_load(s->config_path, &cfg, err, sizeof err)) {
		event(s, "reload failed, keeping the running configuration: %s", err);
		return;
	}
	event(s, "reloading %s", s->config_path);
	int added = 0, changed = 0, removed = 0;
	for (struct program *p = s->progs; p; p = p->next) {
		bool keep = false;
		for (size_t i = 0; i < cfg.nprogs; i++)
			if (strcmp(cfg.progs[i].name, p->cfg.name) == 0)
				keep = true;
		if (keep || (p->removing && !p->replacement))
			continue;
		if (p->removing)
			replace_pending(p, NULL);
		else
			remove_program(p, NULL);
		removed++;
	}
	for (size_t i = 0; i < cfg.nprogs; i++) {
		int what = reload_program(s, &cfg.progs[i]);
		added += what == 'a';
		changed += what == 'c';
	}
	event(s, "reloaded: %d added, %d changed, %d removed", added, changed, removed);
	sv_config_free(&cfg);
	finish_program_removal(s);
}

static void
stop_all(struct sv *s, const char *why)
{
	if (!s->stopping) {
		event(s, "stopping every program (%s)", why);
		notify(s, "STOPPING=1");
	}
	s->stopping = true;
	for (struct program *p = s->progs; p; p = p->next) {
		p->rolling = -1;
		for (int i = 0; i < p->ninst; i++)
			stop_instance(&p->inst[i], AFTER_STOP, why);
	}
}

/*
 * A held socket with no instance left to accept on it would queue every
 * connection until it timed out: closed instead, connections are refused
 * at once. The next start binds it again.
 */
static void
release_idle_listen(struct sv *s)
{
	if (s->stopping)
		return; /* and a program being replaced hands its socket on */
	for (struct program *p = s->progs; p; p = p->next) {
		if (p->listen_fd < 0 || p->removing)
			continue;
		bool idle = true;
		for (int i = 0; i < p->ninst && idle; i++)
			idle = !alive(&p->inst[i]) &&
			       (p->inst[i].state == ST_FATAL || p->inst[i].state == ST_EXITED);
		if (!idle)
			continue;
		close(p->listen_fd);
		p->listen_fd = -1;
		event(s, "%s: no instance left to accept on %s: closed the listen socket, so that "
		      "connections are refused, not left waiting", p->cfg.name, p->cfg.listen);
	}
}

static bool
all_quiet(struct sv *s)
{
	for (struct program *p = s->progs; p; p = p->next)
		if (!program_quiet(p))
			return false;
	return true;
}

/* ---- control clients ---------------------------------------------------- */

static void
append_instance(bson_t *arr, const char *key, const struct instance *in, double t)
{
	const struct sv_program *c = &in->prog->cfg;
	bson_t d;
	bson_append_document_begin(arr, key, -1, &d);
	BSON_APPEND_UTF8(&d, "name", in->name);
	BSON_APPEND_UTF8(&d, "program", c->name);
	BSON_APPEND_UTF8(&d, "state", state_names[in->state]);
	BSON_APPEND_INT32(&d, "pid", alive(in) ? in->pid : 0);
	BSON_APPEND_INT32(&d, "restarts", (int32_t)in->restarts);
	/* Integers: libbson prints doubles with 20 digits. */
	BSON_APPEND_INT64(&d, "uptimeMs", alive(in) ? (int64_t)((t - in->started_at) * 1000) : 0);
	if (*in->last_exit)
		BSON_APPEND_UTF8(&d, "lastExit", in->last_exit);
	if (c->health)
		BSON_APPEND_UTF8(&d, "health", in->health == 1 ? "ok" : in->health == 0 ? "failing"
		                                                                        : "unknown");
	if (in->health == 0)
		BSON_APPEND_UTF8(&d, "healthError", in->health_msg);
	if (alive(in) && in->fd_soft != 0) {
		bson_t f;
		BSON_APPEND_DOCUMENT_BEGIN(&d, "fds", &f);
		BSON_APPEND_INT64(&f, "open", in->fds.total);
		BSON_APPEND_INT64(&f, "limit", in->fd_soft);
		BSON_APPEND_INT64(&f, "hardLimit", in->fd_hard);
		BSON_APPEND_INT64(&f, "sockets", in->fds.sockets);
		BSON_APPEND_INT64(&f, "files", in->fds.files);
		BSON_APPEND_INT64(&f, "pipes", in->fds.pipes);
		BSON_APPEND_INT64(&f, "other", in->fds.other);
		BSON_APPEND_INT64(&f, "trendPerMin", (int64_t)(fdw_trend_slope(&in->trend) * 60));
		bson_append_document_end(&d, &f);
	}
	bson_append_document_end(arr, &d);
}

static char *
status_json(struct sv *s)
{
	bson_t doc = BSON_INITIALIZER, arr;
	BSON_APPEND_BOOL(&doc, "ok", true);
	BSON_APPEND_INT32(&doc, "pid", getpid());
	BSON_APPEND_ARRAY_BEGIN(&doc, "instances", &arr);
	double t = gfs_mono_seconds();
	int k = 0;
	for (struct program *p = s->progs; p; p = p->next)
		for (int i = 0; i < p->ninst; i++) {
			char key[16];
			snprintf(key, sizeof key, "%d", k++);
			append_instance(&arr, key, &p->inst[i], t);
		}
	bson_append_array_end(&doc, &arr);
	char *json = bson_as_relaxed_extended_json(&doc, NULL);
	bson_destroy(&doc);
	return json;
}

static char *
reply_json(bool ok, const char *msg)
{
	bson_t doc = BSON_INITIALIZER;
	BSON_APPEND_BOOL(&doc, "ok", ok);
	BSON_APPEND_UTF8(&doc, ok ? "message" : "error", msg);
	char *json = bson_as_relaxed_extended_json(&doc, NULL);
	bson_destroy(&doc);
	return json;
}

static void
client_close(struct sv *s, struct client *cl)
{
	struct client **pp = &s->clients;
	while (*pp && *pp != cl)
		pp = &(*pp)->next;
	if (*pp)
		*pp = cl->next;
	ep_close(s, &cl->fd);
	free(cl);
}

static void
client_send(struct client *cl, char *json)
{
	/* Replies are small; a client that stops reading gets cut off by the send timeout. */
	int flags = fcntl(cl->fd, F_GETFL);
	fcntl(cl->fd, F_SETFL, flags & ~O_NONBLOCK);
	struct timeval tv = {1, 0};
	setsockopt(cl->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	size_t len = strlen(json);
	json[len] = '\n';
	(void)!send(cl->fd, json, len + 1, MSG_NOSIGNAL);
	json[len] = '\0';
	bson_free(json);
}

static void
client_request(struct sv *s, struct client *cl, char *req)
{
	char msg[300];
	if (strcmp(req, "status") == 0) {
		client_send(cl, status_json(s));
	} else if (strncmp(req, "restart ", 8) == 0) {
		bool ok = restart_named(s, req + 8, msg, sizeof msg);
		client_send(cl, reply_json(ok, msg));
	} else if (strcmp(req, "reload") == 0) {
		reload(s);
		client_send(cl, reply_json(true, "reloaded"));
	} else if (strcmp(req, "stop") == 0) {
		stop_all(s, "stop requested");
		cl->waiting_stop = true;
		epoll_ctl(s->epfd, EPOLL_CTL_DEL, cl->fd, NULL); /* answered when everything has stopped */
		return;
	} else {
		snprintf(msg, sizeof msg, "unknown request '%.100s'", req);
		client_send(cl, reply_json(false, msg));
	}
	client_close(s, cl);
}

static void
on_client(struct sv *s, struct client *cl)
{
	ssize_t n = read(cl->fd, cl->buf + cl->len, sizeof cl->buf - 1 - cl->len);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0 && cl->len == 0) {
		client_close(s, cl);
		return;
	}
	if (n > 0)
		cl->len += (size_t)n;
	cl->buf[cl->len] = '\0';
	char *nl = strchr(cl->buf, '\n');
	if (!nl && n > 0 && cl->len < sizeof cl->buf - 1)
		return;
	if (nl)
		*nl = '\0';
	client_request(s, cl, cl->buf);
}

static void
on_accept(struct sv *s)
{
	int fd = accept4(s->ctlfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
		/* The connection stays queued and the socket readable: pause, or we would spin. */
		self_fd_note(s, "control connection");
		epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->ctlfd, NULL);
		s->t_accept = gfs_mono_seconds() + ACCEPT_PAUSE_S;
		return;
	}
	if (fd < 0)
		return; /* gone before we got to it (ECONNABORTED, EAGAIN) */
	struct client *cl = calloc(1, sizeof *cl);
	if (!cl)
		abort();
	cl->sv = s;
	cl->fd = fd;
	cl->next = s->clients;
	s->clients = cl;
	ep_add(s, fd, &cl->w, W_CLIENT, cl);
}

/* ---- signals and the loop ----------------------------------------------- */

static void
on_signal(struct sv *s)
{
	struct signalfd_siginfo si;
	while (read(s->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
		switch (si.ssi_signo) {
		case SIGCHLD:
			reap(s);
			break;
		case SIGHUP:
			reload(s);
			break;
		case SIGTERM:
		case SIGINT:
			if (s->stopping && ++s->stop_signals > 1) {
				event(s, "%s again: killing every program now", sv_signal_name((int)si.ssi_signo));
				for (struct program *p = s->progs; p; p = p->next)
					for (int i = 0; i < p->ninst; i++) {
						if (alive(&p->inst[i]))
							signal_group(&p->inst[i], SIGKILL);
						if (p->inst[i].leftover_pgid > 0)
							kill_leftovers(&p->inst[i]);
					}
			}
			stop_all(s, sv_signal_name((int)si.ssi_signo));
			s->stop_signals++;
			break;
		}
	}
}

struct sv *
sv_new(struct sv_config *cfg, const char *config_path, const char *control_path,
       const struct sv_callbacks *cb, bool *busy, char *err, size_t errlen)
{
	/*
	 * Started with 0, 1 or 2 closed, our sockets and pipes would take those
	 * numbers and the children's stdio would land on them.
	 */
	for (int fd = 0; fd <= 2; fd++)
		if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
			break;
	struct sv *s = calloc(1, sizeof *s);
	if (!s)
		abort();
	s->cb = *cb;
	s->sigfd = s->timerfd = s->ctlfd = -1;
	s->out.fd = s->err.fd = -1;
	/* Before anything can have an event to tell, and a relay to wait for its reader with. */
	s->epfd = epoll_create1(EPOLL_CLOEXEC);
	relays_open(s, cb);
	s->config_path = config_path ? realpath(config_path, NULL) : NULL;
	if (config_path && !s->config_path)
		s->config_path = strdup(config_path);
	s->control_path = control_path ? strdup(control_path)
	                : cfg->control ? strdup(cfg->control) : sv_default_control_path();
	s->ctlfd = bind_control(s->control_path, !control_path && !cfg->control, busy, err, errlen);
	if (s->ctlfd < 0) {
		free(s->control_path);
		s->control_path = NULL; /* not ours to unlink */
		sv_config_free(cfg);
		sv_free(s);
		return NULL;
	}
	for (size_t i = 0; i < cfg->nprogs; i++)
		append_program(s, program_new(s, &cfg->progs[i]));
	sv_config_free(cfg);

	/*
	 * An inherited SIGCHLD = SIG_IGN makes the kernel reap our children
	 * itself: no exit status, and pidfds that stay readable forever.
	 */
	signal(SIGCHLD, SIG_DFL);
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGCHLD);
	sigaddset(&mask, SIGHUP);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	s->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	s->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (s->sigfd < 0 || s->epfd < 0 || s->timerfd < 0) {
		snprintf(err, errlen, "event loop setup: %s", strerror(errno));
		sv_free(s);
		return NULL;
	}
	ep_add(s, s->sigfd, &s->w_sig, W_SIGNAL, NULL);
	ep_add(s, s->timerfd, &s->w_timer, W_TIMER, NULL);
	ep_add(s, s->ctlfd, &s->w_ctl, W_CONTROL, NULL);
	/* A closed stdout or control client must not kill the supervisor of everything. */
	signal(SIGPIPE, SIG_IGN);
	/* The programs are not ours to speak for to systemd, nor it for them. */
	gfs_sd_notify_detach();
	/* Orphans of daemonising children become ours, not init's: we can still see them. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	return s;
}

int
sv_run(struct sv *s)
{
	event(s, "supervising %s; control socket %s",
	      s->config_path ? s->config_path : "one program", s->control_path);
	for (struct program *p = s->progs; p; p = p->next)
		start_program(p);
	/* Started, not yet proven running: systemd's READY means "the supervisor is up". */
	notify(s, "READY=1\nSTATUS=supervising");
	uint64_t wd = gfs_sd_watchdog_usec();
	s->watchdog_s = (double)wd / 2e6;
	s->t_watchdog = wd ? gfs_mono_seconds() + s->watchdog_s : 0;
	while (!(s->stopping && all_quiet(s))) {
		arm_timer(s);
		struct epoll_event evs[32];
		int n = epoll_wait(s->epfd, evs, 32, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			event(s, "epoll_wait: %s", strerror(errno));
			return 1;
		}
		for (int i = 0; i < n; i++) {
			struct watch *w = evs[i].data.ptr;
			enum wkind kind = w->kind; /* w may be freed by its handler */
			switch (kind) {
			case W_SIGNAL: on_signal(s); break;
			case W_TIMER: on_timer(s); break;
			case W_CONTROL: on_accept(s); break;
			case W_CLIENT: on_client(s, w->ptr); break;
			case W_OUTPUT: handle_output(w->ptr, false); break;
			case W_PIDFD:
			case W_CHECKER: reap(s); break;
			case W_RELAY: relay_flush(s, w->ptr); break;
			}
			/* Handlers may free what later events point at: re-poll instead of going on. */
			if (kind == W_SIGNAL || kind == W_CLIENT || kind == W_PIDFD || kind == W_CHECKER)
				break;
		}
		release_idle_listen(s);
	}
	event(s, "every program stopped; exiting");
	double deadline = gfs_mono_seconds() + EXIT_DRAIN_S;
	relay_drain(s, &s->out, deadline);
	relay_drain(s, s->ev, deadline);
	for (struct client *cl = s->clients; cl; cl = cl->next)
		if (cl->waiting_stop)
			client_send(cl, reply_json(true, "stopped"));
	return 0;
}

void
sv_free(struct sv *s)
{
	if (!s)
		return;
	while (s->clients)
		client_close(s, s->clients);
	relay_close(s, &s->out);
	relay_close(s, &s->err);
	free(s->out.buf);
	free(s->err.buf);
	struct program *p = s->progs;
	while (p) {
		struct program *next = p->next;
		if (p->replacement)
			program_free(p->replacement);
		for (int i = 0; i < p->ninst; i++) {
			ep_close(s, &p->inst[i].pidfd);
			ep_close(s, &p->inst[i].out.fd);
			ep_close(s, &p->inst[i].err.fd);
			ep_close(s, &p->inst[i].checker_pidfd);
			if (p->inst[i].checker_pipe >= 0)
				close(p->inst[i].checker_pipe);
		}
		program_free(p);
		p = next;
	}
	if (s->ctlfd >= 0) {
		close(s->ctlfd);
		if (s->control_path)
			unlink(s->control_path);
	}
	/*
	 * The signals stay blocked: a SIGTERM that arrives while we exit after a
	 * clean stop must not turn exit status 0 into death by signal.
	 */
	if (s->sigfd >= 0)
		close(s->sigfd);
	if (s->timerfd >= 0)
		close(s->timerfd);
	if (s->epfd >= 0)
		close(s->epfd);
	free(s->control_path);
	free(s->config_path);
	free(s);
}
