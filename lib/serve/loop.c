/*
 * The loop, start and stop. httpserve_start binds (or takes an inherited
 * socket), starts one libmicrohttpd daemon per event thread, fed by one
 * accepting thread (acceptor.c) that hands each connection to the least
 * busy loop, then the workers, the guard, the poller and the preloader.
 * Quiesce stops accepting; drain waits for the requests begun; stop joins
 * every thread and frees. libmicrohttpd's own log and descriptor
 * exhaustion (EMFILE) are reported from here.
 */
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static void
stop_and_join(pthread_mutex_t *mu, pthread_cond_t *cv, bool *stop, pthread_t t, bool *started)
{
	if (!*started)
		return;
	pthread_mutex_lock(mu);
	*stop = true;
	pthread_cond_signal(cv);
	pthread_mutex_unlock(mu);
	pthread_join(t, NULL);
	*started = false;
}

static void
on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
              enum MHD_ConnectionNotificationCode toe)
{
	struct loop *lp = cls;
	struct httpserve *srv = lp->srv;
	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		struct conn_state *cs = gfs_xcalloc(1, sizeof *cs);
		*socket_ctx = cs;
		guard_track(srv, conn, cs);
		return; /* counted open and unanswered in on_accept already */
	}
	struct conn_state *cs = *socket_ctx;
	if (cs)
		guard_untrack(srv, cs);
	atomic_fetch_sub(&lp->conns, 1);
	atomic_fetch_sub(&srv->open_connections, 1);
	acceptor_resume(atomic_load(&srv->acceptor));
	if (cs && !cs->had_request)
		connection_answered(srv);
	free(cs);
	*socket_ctx = NULL;
}

/* ---- libmicrohttpd's log, and running out of descriptors ---------- */

static void
on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	struct httpserve *srv = cls;
	char msg[512];
	vsnprintf(msg, sizeof msg, fmt, ap);
	size_t n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
		msg[--n] = '\0';
	/* Bad requests are the clients' business: a line a second at most. */
	int64_t now = gfs_now_ms(), last = atomic_load(&srv->last_mhd_log_ms);
	if (now - last >= 1000 && atomic_compare_exchange_strong(&srv->last_mhd_log_ms, &last, now))
		serve_logf(srv, "http: %s", msg);
}

/*
 * accept() found no descriptor (or memory) to spare. The line names
 * "Too many open files" so that a supervisor watching the log can act;
 * one every 10 seconds at most, however long the shortage lasts.
 */
static void
on_accept_limit(void *ctx, int err)
{
	struct httpserve *srv = ctx;
	atomic_fetch_add(&srv->emfile_events, 1);
	int64_t now = gfs_now_ms(), last = atomic_load(&srv->last_emfile_log_ms);
	if (now - last < 10000 || !atomic_compare_exchange_strong(&srv->last_emfile_log_ms, &last, now))
		return;
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	serve_logf(srv, "accept: %s (limit %llu, %ld connections open); not accepting until a connection closes",
	           err == EMFILE ? "Too many open files" : err == ENFILE ? "Too many open files in system"
	                                                               : strerror(err),
	           (unsigned long long)rl.rlim_cur, atomic_load(&srv->open_connections));
}

/* The loop with the fewest connections; ties go round, so two clients never share a thread. */
static void
on_accept(void *ctx, int fd, const struct sockaddr *addr, socklen_t len)
{
	struct httpserve *srv = ctx;
	char key[INET6_ADDRSTRLEN];
	bool counted = srv->cfg.max_per_ip && addr_text(addr, key);
	if (counted && !admit_address(srv, key)) {
		close(fd);
		return;
	}
	unsigned best = srv->next_loop % srv->nd;
	for (unsigned k = 1; k < srv->nd; k++) {
		unsigned i = (srv->next_loop + k) % srv->nd;
		if (atomic_load(&srv->loops[i].conns) < atomic_load(&srv->loops[best].conns))
			best = i;
	}
	srv->next_loop = best + 1;
	/*
	 * Counted before the hand-over: libmicrohttpd starts the connection
	 * later, on the event thread, and a drain in between must wait for it.
	 * Should it drop one unstarted (out of memory), a drain waits out its
	 * timeout: the safe side. Open from now on too: the accepting thread
	 * takes a burst of connections before an event thread starts any, and
	 * counted only once started, a burst that ran out of descriptors was
	 * reported with "1 connections open".
	 */
	atomic_fetch_add(&srv->unanswered_connections, 1);
	atomic_fetch_add(&srv->loops[best].conns, 1);
	atomic_fetch_add(&srv->open_connections, 1);
	/* On failure libmicrohttpd has closed fd, and logged why (its connection limit, memory). */
	if (MHD_add_connection(srv->loops[best].d, fd, addr, len) == MHD_YES)
		return;
	atomic_fetch_sub(&srv->loops[best].conns, 1);
	atomic_fetch_sub(&srv->open_connections, 1);
	if (counted) {
		pthread_mutex_lock(&srv->guard_mu);
		release_address(srv, key);
		pthread_mutex_unlock(&srv->guard_mu);
	}
	connection_answered(srv);
}

/* ---- start and stop -------------------------------------------------- */

static void
free_meta_cb(void *m)
{
	gfs_meta_unref(m);
}

static bool
resolve(const char *host, unsigned port, struct sockaddr_storage *ss, gfs_error *err)
{
	struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
	                         .ai_socktype = SOCK_STREAM};
	struct addrinfo *ai;
	char ports[16];
	snprintf(ports, sizeof ports, "%u", port);
	int rc = getaddrinfo(host, ports, &hints, &ai);
	if (rc != 0) {
		gfs_error_set(err, GFS_EINVAL, "cannot listen on %s: %s", host, gai_strerror(rc));
		return false;
	}
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	return true;
}

static void
free_server(struct httpserve *srv)
{
	struct MHD_Response *rs[] = {srv->r400, srv->r404, srv->r405, srv->r500, srv->r503, srv->r503busy};
	for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
		if (rs[i])
			MHD_destroy_response(rs[i]);
	disktier_close(srv->tier); /* first: its writer may still hold bodies */
	if (srv->open)
		http_cache_free(srv->open);
	http_cache_free(srv->cache);
	name_index_free(srv->index);
	/* Empty: the workers answered every job before they ended, and none came without them. */
	gfs_workq_free(srv->jobs, NULL);
	strmap_free(srv->inflight);
	strmap_free(srv->per_ip);
	free(srv->workers);
	free(srv->prefix);
	free(srv);
}

static void
stop_threads(struct httpserve *srv)
{
	pthread_mutex_lock(&srv->jobs_mu);
	srv->stopping = true;
	pthread_mutex_unlock(&srv->jobs_mu);
	gfs_workq_close(srv->jobs);
	for (unsigned i = 0; i < srv->nworkers; i++)
		pthread_join(srv->workers[i], NULL);
	srv->nworkers = 0;
	stop_and_join(&srv->preload_mu, &srv->preload_cv, &srv->preload_stop, srv->preloader,
	              &srv->preloader_started);
	stop_and_join(&srv->guard_mu, &srv->guard_cv, &srv->guard_stop, srv->guard, &srv->guard_started);
	stop_and_join(&srv->poll_mu, &srv->poll_cv, &srv->poll_stop, srv->poller, &srv->poller_started);
}

/* Starts an event thread: a libmicrohttpd daemon with no socket of its own. */
static struct MHD_Daemon *
start_loop(struct httpserve *srv, struct loop *lp, unsigned limit)
{
	const struct httpserve_config *c = &srv->cfg;
	unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
	                 MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
	struct MHD_OptionItem opts[] = {
		{MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)on_mhd_log, srv},
		{MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)on_uri, srv},
		{MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, srv},
		{MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_connection, lp},
		{MHD_OPTION_CONNECTION_LIMIT, limit, NULL},
		{MHD_OPTION_CONNECTION_TIMEOUT, c->timeout_s, NULL},
		{MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)c->conn_memory, NULL},
		{MHD_OPTION_END, 0, NULL},
	};
	return MHD_start_daemon(flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_ARRAY, opts,
	                        MHD_OPTION_END);
}

static bool
open_listener(struct httpserve *srv, gfs_error *err)
{
	const struct httpserve_config *c = &srv->cfg;
	if (c->listen_fd >= 0) {
		srv->listen_fd = c->listen_fd;
		return true;
	}
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	if (!resolve(c->host, c->port, &ss, err))
		return false;
	gfs_error lerr;
	gfs_error_clear(&lerr);
	srv->listen_fd = acceptor_listen(&ss, c->reuse_port, LISTEN_BACKLOG, &lerr);
	if (srv->listen_fd >= 0)
		return true;
	gfs_error_set(err, GFS_ELOCAL, "cannot listen on %s port %u: %s", c->host, c->port, lerr.msg);
	return false;
}

/* Every event thread, then the thread that accepts for them. */
static bool
start_daemons(struct httpserve *srv, gfs_error *err)
{
	const struct httpserve_config *c = &srv->cfg;
	unsigned count = c->threads < 1 ? 1 : c->threads > MAX_DAEMONS ? MAX_DAEMONS : c->threads;
	unsigned limit = c->max_connections / count ? c->max_connections / count : 1;
	for (srv->nd = 0; srv->nd < count; srv->nd++) {
		struct loop *lp = &srv->loops[srv->nd];
		lp->srv = srv;
		atomic_init(&lp->conns, 0);
		lp->d = start_loop(srv, lp, limit);
		if (!lp->d) {
			gfs_error_set(err, GFS_ELOCAL, "cannot start the HTTP event threads");
			return false;
		}
	}
	if (!open_listener(srv, err))
		return false;
	acceptor *a = acceptor_start(srv->listen_fd, on_accept, on_accept_limit, srv, err);
	atomic_store(&srv->acceptor, a);
	if (!a && c->listen_fd >= 0)
		gfs_error_set(err, GFS_ELOCAL, "cannot serve on the inherited socket (fd %d)", c->listen_fd);
	return a != NULL;
}

static void
stop_accepting(struct httpserve *srv)
{
	acceptor_stop(atomic_load(&srv->acceptor));
	if (srv->listen_fd >= 0)
		close(srv->listen_fd);
	srv->listen_fd = -1;
}

/* The acceptor goes last: closing connections tell it to resume until then. */
static void
stop_daemons(struct httpserve *srv)
{
	stop_accepting(srv);
	for (unsigned i = 0; i < srv->nd; i++)
		MHD_stop_daemon(srv->loops[i].d);
	srv->nd = 0;
	acceptor_free(atomic_exchange(&srv->acceptor, NULL));
}

/* Listening already: the pass fills the caches behind requests answered from the backend. */
static void
start_preload(struct httpserve *srv)
{
	atomic_store(&srv->preload_state, HTTPSERVE_PRELOAD_RUNNING);
	srv->preloader_started = pthread_create(&srv->preloader, NULL, preload_main, srv) == 0;
	if (srv->preloader_started)
		return;
	atomic_store(&srv->preload_state, HTTPSERVE_PRELOAD_FAILED);
	serve_logf(srv, "preload stopped early: cannot start its thread; files are read when asked for");
	if (srv->cfg.preloaded)
		srv->cfg.preloaded(false, 0, 0);
}

httpserve *
httpserve_start(gfs_conn *conn, const struct httpserve_config *cfg, gfs_error *err)
{
	struct httpserve *srv = gfs_xcalloc(1, sizeof *srv);
	srv->listen_fd = -1;
	srv->cfg = *cfg;
	srv->access_log = cfg->access_log;
	srv->conn = conn;
	srv->prefix = gfs_prefix_normalize(cfg->prefix);
	srv->index = name_index_new(srv->prefix);
	srv->cache = http_cache_new(cfg->cache_size, free_meta_cb);
	srv->inflight = strmap_new(256);
	if (srv->cfg.stream_threshold > cfg->cache_size / 8)
		srv->cfg.stream_threshold = cfg->cache_size / 8;
	pthread_mutex_init(&srv->jobs_mu, NULL);
	srv->jobs = gfs_workq_new(cfg->queue_max, 0);
	pthread_mutex_init(&srv->poll_mu, NULL);
	pthread_cond_init(&srv->poll_cv, NULL);
	pthread_mutex_init(&srv->active_mu, NULL);
	pthread_cond_init(&srv->active_cv, NULL);
	pthread_mutex_init(&srv->log_mu, NULL);
	pthread_mutex_init(&srv->guard_mu, NULL);
	pthread_cond_init(&srv->guard_cv, NULL);
	pthread_mutex_init(&srv->preload_mu, NULL);
	pthread_cond_init(&srv->preload_cv, NULL);
	srv->per_ip = strmap_new(256);
	atomic_init(&srv->last_emfile_log_ms, 0);
	atomic_init(&srv->last_mhd_log_ms, 0);
	make_status_responses(srv);
	if (cfg->cache_dir) {
		srv->tier = disktier_open(cfg->cache_dir, cfg->cache_dir_size, cfg->log, err);
		if (!srv->tier) {
			free_server(srv);
			return NULL;
		}
		/* A quarter of the descriptors at most: connections need the rest. */
		struct rlimit rl;
		rlim_t n = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur / 4 : 256;
		n = n > OPEN_ENTRIES_MAX ? OPEN_ENTRIES_MAX : n;
		if (MHD_is_feature_supported(MHD_FEATURE_RESPONSES_SHARED_FD) == MHD_YES)
			srv->open = http_cache_new((size_t)n * (HTTP_CACHE_ENTRY_OVERHEAD + sizeof(struct kept)),
			    free_meta_cb);
		srv->seen_window = n > 64 ? (unsigned)n : 64;
	}

	gfs_session *ses = gfs_session_pop(conn);
	gfs_error lerr;
	gfs_error_clear(&lerr);
	int64_t t0 = mono_us();
	bool loaded = name_index_load(srv->index, ses, &lerr);
	atomic_store(&srv->reload_us, mono_us() - t0);
	atomic_store(&srv->poll_interval_ms, cfg->poll_ms);
	if (!loaded) {
		atomic_store(&srv->backend_down, true);
		serve_logf(srv, "cannot load the index yet (will retry): %s", lerr.msg);
	}
	gfs_session_push(ses);
	if (srv->tier && loaded)
		disktier_reconcile(srv->tier, srv->index);
	srv->workers = gfs_xcalloc(cfg->workers, sizeof *srv->workers);
	for (; srv->nworkers < cfg->workers; srv->nworkers++)
		if (pthread_create(&srv->workers[srv->nworkers], NULL, worker_main, srv) != 0)
			break;
	srv->poller_started = pthread_create(&srv->poller, NULL, poller_main, srv) == 0;
	srv->guard_started = pthread_create(&srv->guard, NULL, guard_main, srv) == 0;
	if (srv->nworkers == 0 || !srv->poller_started || !srv->guard_started) {
		gfs_error_set(err, GFS_ELOCAL, "cannot start threads");
		stop_threads(srv);
		free_server(srv);
		return NULL;
	}
	if (!start_daemons(srv, err)) {
		stop_daemons(srv);
		stop_threads(srv);
		free_server(srv);
		return NULL;
	}
	if (cfg->preload)
		start_preload(srv);
	return srv;
}

unsigned
httpserve_port(httpserve *srv)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (srv->listen_fd < 0 || getsockname(srv->listen_fd, (struct sockaddr *)&ss, &len) != 0)
		return srv->cfg.port;
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

FILE *
httpserve_set_access_log(httpserve *srv, FILE *log)
{
	pthread_mutex_lock(&srv->log_mu);
	FILE *old = srv->access_log;
	if (old)
		fflush(old);
	srv->access_log = log;
	pthread_mutex_unlock(&srv->log_mu);
	return old;
}

void
httpserve_quiesce(httpserve *srv)
{
	if (srv->quiesced)
		return;
	srv->quiesced = true;
	/*
	 * Our own socket's queue dies with it, so take it first (at most what
	 * it can hold: it keeps filling until the close). An inherited one
	 * stays open in the process that passed it, for the next server.
	 */
	if (srv->cfg.listen_fd < 0)
		acceptor_drain(atomic_load(&srv->acceptor), LISTEN_BACKLOG);
	stop_accepting(srv);
}

bool
httpserve_drain(httpserve *srv, int timeout_ms)
{
	struct timespec ts;
	gfs_deadline_in(&ts, timeout_ms);
	atomic_store(&srv->draining, true);
	pthread_mutex_lock(&srv->active_mu);
	int rc = 0;
	/*
	 * Requests in progress, and connections accepted whose request may still
	 * be on its way: closing those unanswered would fail a client that did
	 * nothing wrong (seen under ab -c 25 during a supervised restart).
	 */
	while ((atomic_load(&srv->active) > 0 || atomic_load(&srv->unanswered_connections) > 0) && rc == 0)
		rc = pthread_cond_timedwait(&srv->active_cv, &srv->active_mu, &ts);
	bool drained = atomic_load(&srv->active) == 0 && atomic_load(&srv->unanswered_connections) == 0;
	pthread_mutex_unlock(&srv->active_mu);
	return drained;
}

void
httpserve_stop(httpserve *srv)
{
	if (!srv)
		return;
	/* Workers answer what is queued with 503 and resume every waiting connection first. */
	stop_threads(srv);
	stop_daemons(srv);
	if (srv->access_log)
		fflush(srv->access_log);
	free_server(srv);
}
