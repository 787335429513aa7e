/* gridfsctl serve: options, signals and the listening socket; the server is lib/serve/. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../lib/addr.h"
#include "../lib/serve/serve.h"
#include "../lib/sdnotify.h"
#include "cmd.h"

enum {
	OPT_LISTEN = 0x100, OPT_PREFIX, OPT_CACHE_SIZE, OPT_PRELOAD, OPT_THREADS, OPT_WORKERS,
	OPT_QUEUE, OPT_STREAM, OPT_MAXCONN, OPT_TIMEOUT, OPT_HEADER_TIMEOUT, OPT_MAX_PER_IP,
	OPT_MAXHDR, OPT_CACHE_CONTROL, OPT_ACCESS_LOG, OPT_POLL, OPT_POLL_WINDOW, OPT_RELOAD,
	OPT_NEG_TTL, OPT_DRAIN, OPT_NO_REUSE, OPT_CACHE_DIR, OPT_CACHE_DIR_SIZE,
};

struct serve_opts {
	struct httpserve_config cfg;
	char host[64];
	const char *access_log;
	FILE *log;            /* the access log open now: SIGHUP replaces it */
	int drain_ms;
};

#define SERVE_OPT(name, arg, val, help, ...) CMD_OPT(0, name, arg, help, .id = (val), __VA_ARGS__)
#define TO(field) CMD_TO(struct serve_opts, field)
#define BAD_SIZE "invalid size '%s'"
#define BAD_NUMBER "invalid number '%s'"
/* Durations are kept as int milliseconds: INT_MAX / 1000 seconds at most. */
#define BAD_SECONDS "invalid number of seconds '%s' (at most 2147483)"
_Static_assert(INT_MAX / 1000 == 2147483, "BAD_SECONDS names INT_MAX / 1000");

/*
 * Every option but --listen is a value for a field; a duration that is an
 * interval (or the header timeout) needs a floor, the others may be 0.
 */
static const struct cmd_opt serve_opts[] = {
	SERVE_OPT("listen", "ADDR:PORT", OPT_LISTEN,
	          "address to listen on (default 127.0.0.1:8080; [::1]:PORT for IPv6)"),
	SERVE_OPT("prefix", "P", OPT_PREFIX, "serve P/<path> as /<path>",
	          .kind = CMD_STRING, .to = TO(cfg.prefix)),
	SERVE_OPT("cache-size", "SIZE", OPT_CACHE_SIZE,
	          "bytes of file bodies kept in memory (default 256M)",
	          .kind = CMD_BYTES, .to = TO(cfg.cache_size), .max = SIZE_MAX / 2, .bad = BAD_SIZE),
	SERVE_OPT("cache-dir", "DIR", OPT_CACHE_DIR,
	          "keep file bodies on disk in DIR too (created 0700), across restarts",
	          .kind = CMD_STRING, .to = TO(cfg.cache_dir), .min = 1,
	          .bad = "--cache-dir: empty directory name"),
	SERVE_OPT("cache-dir-size", "SIZE", OPT_CACHE_DIR_SIZE,
	          "bytes DIR may hold (default: 90% of its free space, at most 100G)",
	          .kind = CMD_BYTES, .to = TO(cfg.cache_dir_size), .min = 1 << 20, .max = UINT64_MAX,
	          .bad = "--cache-dir-size: invalid size '%s' (at least 1M)"),
	SERVE_OPT("preload", NULL, OPT_PRELOAD,
	          "fill the cache (and the --cache-dir) in one pass, while serving (see /_health)",
	          .kind = CMD_SET, .to = TO(cfg.preload)),
	SERVE_OPT("threads", "N", OPT_THREADS, "event threads (default: one per CPU)",
	          .kind = CMD_COUNT, .to = TO(cfg.threads), .min = 1, .max = 1000000, .bad = BAD_NUMBER),
	SERVE_OPT("workers", "N", OPT_WORKERS, "backend fetch threads (default 8)",
	          .kind = CMD_COUNT, .to = TO(cfg.workers), .min = 1, .max = 1000000, .bad = BAD_NUMBER),
	SERVE_OPT("queue", "N", OPT_QUEUE, "fetches allowed to wait before answering 503 (default 1024)",
	          .kind = CMD_COUNT, .to = TO(cfg.queue_max), .min = 1, .max = 1000000, .bad = BAD_NUMBER),
	SERVE_OPT("stream-threshold", "SIZE", OPT_STREAM,
	          "larger files are streamed, not cached (default 4M)",
	          .kind = CMD_BYTES, .to = TO(cfg.stream_threshold), .max = SIZE_MAX / 2, .bad = BAD_SIZE),
	SERVE_OPT("max-connections", "N", OPT_MAXCONN, "connection limit (default 10000)",
	          .kind = CMD_COUNT, .to = TO(cfg.max_connections), .min = 1, .max = 1000000,
	          .bad = BAD_NUMBER),
	SERVE_OPT("timeout", "SECS", OPT_TIMEOUT, "close idle connections after SECS (default 30)",
	          .kind = CMD_COUNT, .to = TO(cfg.timeout_s), .min = 1, .max = 1000000, .bad = BAD_NUMBER),
	SERVE_OPT("header-timeout", "SECS", OPT_HEADER_TIMEOUT,
	          "close a connection whose request headers take longer (default 10)",
	          .kind = CMD_MS, .to = TO(cfg.header_timeout_ms), .min = 100, .max = INT_MAX,
	          .bad = BAD_SECONDS),
	SERVE_OPT("max-per-ip", "N", OPT_MAX_PER_IP,
	          "connections open at once from one address (default 256; 0: no limit)",
	          .kind = CMD_COUNT, .to = TO(cfg.max_per_ip), .max = 1000000,
	          .bad = "--max-per-ip: " BAD_NUMBER),
	SERVE_OPT("max-header-size", "SIZE", OPT_MAXHDR,
	          "per-connection buffer that bounds request headers (default 16K)",
	          .kind = CMD_BYTES, .to = TO(cfg.conn_memory), .min = 4096, .max = 1 << 20,
	          .bad = BAD_SIZE),
	SERVE_OPT("cache-control", "VALUE", OPT_CACHE_CONTROL,
	          "Cache-Control header (default \"public, max-age=60\"; \"\" for none)",
	          .kind = CMD_STRING, .to = TO(cfg.cache_control)),
	SERVE_OPT("access-log", "FILE|-", OPT_ACCESS_LOG,
	          "write a combined-format access log to FILE or stdout",
	          .kind = CMD_STRING, .to = TO(access_log)),
	SERVE_OPT("poll", "SECS", OPT_POLL, "look for new uploads every SECS (default 2)",
	          .kind = CMD_MS, .to = TO(cfg.poll_ms), .min = 100, .max = INT_MAX, .bad = BAD_SECONDS),
	SERVE_OPT("poll-window", "SECS", OPT_POLL_WINDOW,
	          "and for uploads dated up to SECS before the last poll (default 30)",
	          .kind = CMD_MS, .to = TO(cfg.poll_window_ms), .max = INT_MAX, .bad = BAD_SECONDS),
	SERVE_OPT("reload", "SECS", OPT_RELOAD, "reread the whole index every SECS (default 60)",
	          .kind = CMD_MS, .to = TO(cfg.reload_ms), .min = 100, .max = INT_MAX, .bad = BAD_SECONDS),
	SERVE_OPT("negative-ttl", "SECS", OPT_NEG_TTL,
	          "remember missing ids and revisions for SECS (default 5)",
	          .kind = CMD_MS, .to = TO(cfg.neg_ttl_ms), .max = INT_MAX, .bad = BAD_SECONDS),
	SERVE_OPT("drain-timeout", "SECS", OPT_DRAIN,
	          "on SIGTERM, wait this long for requests in progress (default 10)",
	          .kind = CMD_MS, .to = TO(drain_ms), .max = INT_MAX, .bad = BAD_SECONDS),
	SERVE_OPT("no-reuse-port", NULL, OPT_NO_REUSE, "do not set SO_REUSEPORT on the listening socket",
	          .kind = CMD_CLEAR, .to = TO(cfg.reuse_port)),
	CMD_OPT_END,
};

/* --listen, through the one parser every listener uses (lib/addr.h); port 0 is logged at start. */
static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct serve_opts *o = ctx;
	struct gfs_addr a;
	char err[300];
	if (!gfs_addr_parse(arg, GFS_ADDR_ANY_PORT, &a, err, sizeof err)) {
		usage_error("--listen: %s", err);
		return -1;
	}
	snprintf(o->host, sizeof o->host, "%s", a.host);
	o->cfg.port = a.port;
	return 0;
}

/*
 * One write per line, so lines from different threads never interleave;
 * escaped like every human line, since they name stored files and requests.
 */
static void
log_line(const char *msg)
{
	char buf[1200], *safe = printable(msg, strlen(msg));
	int n = snprintf(buf, sizeof buf, "%s serve: %s\n", progname, safe);
	free(safe);
	if (n > (int)sizeof buf - 1)
		n = (int)sizeof buf - 1, buf[n - 1] = '\n';
	ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
	(void)w;
}

/*
 * What systemd's STATUS= says. READY=1 comes once serve listens; with
 * --preload, the pass is still running then, and the pass's end (on its
 * own thread, possibly before READY=1 is sent) changes the status again:
 * one mutex keeps the last word the true one.
 */
static pthread_mutex_t status_mu = PTHREAD_MUTEX_INITIALIZER;
static httpserve *status_srv;

static void
notify_status(const char *extra)
{
	const char *word = httpserve_preload_word(httpserve_preload_state(status_srv));
	char msg[160];
	snprintf(msg, sizeof msg, "%sSTATUS=serving%s%s", extra, word ? "; preload " : "",
	         word ? word : "");
	notify_systemd(msg);
}

static void
on_preloaded(bool ok, uint64_t files, double seconds)
{
	pthread_mutex_lock(&status_mu);
	if (status_srv)
		notify_status("");
	pthread_mutex_unlock(&status_mu);
	if (ok && !G.quiet)
		warnx_("preload done: %llu files cached in %.1f s", (unsigned long long)files, seconds);
}

/* SIGHUP after log rotation: append to a new file of the same name. */
static FILE *
reopen_log(httpserve *srv, const char *path, FILE *cur)
{
	FILE *f = fopen(path, "a");
	if (!f) {
		warn_("%s: cannot reopen the access log; keeping the old one", path);
		return cur;
	}
	setvbuf(f, NULL, _IOLBF, 0);
	fclose(httpserve_set_access_log(srv, f));
	return f;
}

/* A server with many clients needs many descriptors: take all the hard limit allows. */
static void
raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
		warn_("cannot raise the open files limit");
}

/* systemd socket activation: one listening socket at fd 3, meant for this process. */
static int
inherited_socket(void)
{
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	long p, n;
	if (!pid || !fds || !parse_int(pid, 1, 1L << 30, &p) || p != (long)getpid() ||
	    !parse_int(fds, 1, 1024, &n))
		return -1;
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	if (n > 1)
		warnx_("%ld sockets passed; serving on the first only", n);
	int fd = 3;
	int fl = fcntl(fd, F_GETFD);
	if (fl < 0)
		return -1;
	fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
	return fd;
}

/*
 * The next signal of set; meanwhile WATCHDOG=1 at half the interval systemd
 * asked for, on a deadline that signals in between (SIGHUP) do not push
 * back. The main thread only waits for signals, so the pings say the
 * process lives, not that every event thread does.
 */
static int
wait_signal(const sigset_t *set)
{
	static double next_ping;
	double every = (double)gfs_sd_watchdog_usec() / 2e6;
	if (every <= 0) {
		int sig;
		return sigwait(set, &sig) == 0 ? sig : SIGTERM;
	}
	for (;;) {
		double now = gfs_mono_seconds();
		if (next_ping <= now) {
			notify_systemd("WATCHDOG=1");
			next_ping = now + every;
		}
		double left = next_ping - now;
		struct timespec ts = {.tv_sec = (time_t)left, .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
		int sig = sigtimedwait(set, NULL, &ts);
		if (sig > 0)
			return sig;
		if (errno != EAGAIN && errno != EINTR)
			return SIGTERM;
	}
}

/*
 * A missing backend should turn into a 503 in about two seconds, not the
 * driver's default wait, unless the connection string says otherwise.
 */
static char *
serve_uri(const char *uri)
{
	return uri_with_option(uri, "serverSelectionTimeoutMS", 2000);
}

/* What serve does without options; the defaults --help gives. */
static void
set_defaults(struct serve_opts *o)
{
	memset(o, 0, sizeof *o);
	snprintf(o->host, sizeof o->host, "127.0.0.1");
	struct httpserve_config *c = &o->cfg;
	c->port = 8080;
	c->listen_fd = -1;
	c->reuse_port = true;
	c->cache_size = 256u << 20;
	c->stream_threshold = 4u << 20;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	c->threads = ncpu > 0 ? (unsigned)ncpu : 2;
	c->workers = 8;
	c->queue_max = 1024;
	c->max_connections = 10000;
	c->timeout_s = 30;
	c->header_timeout_ms = 10000;
	c->max_per_ip = 256;
	c->conn_memory = 16 * 1024;
	c->cache_control = "public, max-age=60";
	c->poll_ms = 2000;
	c->poll_window_ms = 30000;
	c->reload_ms = 60000;
	c->neg_ttl_ms = 5000;
	o->drain_ms = 10000;
	c->log = log_line;
	c->preloaded = on_preloaded;
}

/* The options, checked together; EXIT_OK or EXIT_USAGE. */
static int
serve_options(int argc, char **argv, struct serve_opts *o)
{
	set_defaults(o);
	int ind = parse_options(argc, argv, &cmd_serve_entry, on_opt, o);
	if (ind < 0)
		return EXIT_USAGE;
	if (ind < argc) {
		usage_error("unexpected argument '%s'", argv[ind]);
		return EXIT_USAGE;
	}
	o->cfg.host = o->host;
	/* More threads than these would only cost memory: taken, and capped. */
	if (o->cfg.threads > 1024)
		o->cfg.threads = 1024;
	if (o->cfg.workers > 256)
		o->cfg.workers = 256;
	if (o->cfg.cache_control && !*o->cfg.cache_control)
		o->cfg.cache_control = NULL;   /* --cache-control "": no header */
	if (o->cfg.cache_dir_size && !o->cfg.cache_dir) {
		usage_error("--cache-dir-size needs --cache-dir");
		return EXIT_USAGE;
	}
	return EXIT_OK;
}

/* Not stderr: request data must never look like the server's own messages. */
static FILE *
open_access_log(const char *path)
{
	FILE *log = strcmp(path, "-") == 0 ? stdout : fopen(path, "a");
	if (!log) {
		warn_("%s", path);
		return NULL;
	}
	setvbuf(log, NULL, _IOLBF, 0); /* stdout too: nothing was written to it yet */
	return log;
}

static void
close_access_log(FILE *log)
{
	if (log && log != stdout)
		fclose(log);
}

/* Every thread inherits this mask; only the main thread takes the signals. */
static void
block_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, set, NULL);
	signal(SIGPIPE, SIG_IGN);
}

/* Serves until SIGTERM or SIGINT (reopening the log on SIGHUP), then drains; returns the signal. */
static int
serve_until_stopped(httpserve *srv, struct serve_opts *o, sigset_t *set)
{
	if (!G.quiet) {
		if (o->cfg.listen_fd >= 0)
			warnx_("serving on the inherited socket (fd %d)", o->cfg.listen_fd);
		else
			warnx_("serving http://%s%s%s:%u/", strchr(o->host, ':') ? "[" : "", o->host,
			       strchr(o->host, ':') ? "]" : "", httpserve_port(srv));
	}
	pthread_mutex_lock(&status_mu);
	status_srv = srv;
	notify_status("READY=1\n");
	pthread_mutex_unlock(&status_mu);
	int sig = wait_signal(set);
	while (sig != SIGTERM && sig != SIGINT) {
		if (sig == SIGHUP && o->log && o->log != stdout)
			o->log = reopen_log(srv, o->access_log, o->log);
		sig = wait_signal(set);
	}
	pthread_mutex_lock(&status_mu);
	status_srv = NULL; /* a pass cut short by the stop says nothing more */
	pthread_mutex_unlock(&status_mu);
	notify_systemd("STOPPING=1");
	if (!G.quiet)
		warnx_("%s: draining", sig == SIGINT ? "interrupted" : "terminated");
	httpserve_quiesce(srv);
	if (!httpserve_drain(srv, o->drain_ms))
		warnx_("requests or connections still open after the drain timeout; closing them");
	httpserve_stop(srv);
	return sig;
}

static int
cmd_serve(int argc, char **argv)
{
	struct serve_opts o;
	int rc = serve_options(argc, argv, &o);
	if (rc != EXIT_OK)
		return rc;
	raise_nofile();
	o.cfg.listen_fd = inherited_socket();
	if (o.access_log && !(o.log = open_access_log(o.access_log)))
		return EXIT_LOCAL;
	o.cfg.access_log = o.log;
	sigset_t set;
	block_signals(&set);
	char *uri = serve_uri(G.uri);
	gfs_error err;
	gfs_conn *conn = uri ? gfs_conn_open(uri, G.db, G.bucket, &err) : NULL;
	free(uri);
	httpserve *srv = conn ? httpserve_start(conn, &o.cfg, &err) : NULL;
	if (!srv)
		rc = fail(&err);
	/* SIGTERM is how a service manager stops a server: a clean stop, 0. */
	else if (serve_until_stopped(srv, &o, &set) == SIGINT)
		rc = EXIT_INTERRUPTED;
	if (conn)
		gfs_conn_close(conn);
	close_access_log(o.log);
	return rc;
}

static const struct cmd_exit serve_exits[] = {
	{0, "stopped by SIGTERM"}, {2, "usage"}, {5, "cannot listen or open the access log"},
	{130, "stopped by SIGINT"}, {-1, NULL},
};

const struct cmd_entry cmd_serve_entry = {
	.name = "serve",
	.summary = "serve files over HTTP",
	.opts = serve_opts,
	.exits = serve_exits,
	.run = cmd_serve,
};
