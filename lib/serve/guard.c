/*
 * The slow-client guard: a deadline for a request's headers, and a limit
 * of connections per address. Every open connection is listed here (its
 * struct conn_state); a guard thread shuts the late ones, and closes the
 * tier entries kept open that the tier has since evicted.
 */
#include <arpa/inet.h>
#include <sys/socket.h>
#include <time.h>

#include "internal.h"

/* ---- slow clients: a deadline for headers, a limit per address ------ */

/*
 * libmicrohttpd's timeout restarts at every byte received, so a client
 * that trickles its headers a byte at a time holds a connection for ever.
 * A request's line and headers get header_timeout_ms from the moment they
 * are due (the connection's start, or for a later request on a kept-alive
 * connection, the idle timeout after the previous one ends); a guard
 * thread shuts down the sockets of the late ones, and libmicrohttpd then
 * closes them as it would any connection its client ended. Connections
 * are listed under guard_mu, which their close also takes: libmicrohttpd
 * closes a descriptor only after telling us, so the guard never shuts a
 * reused one.
 */

static int64_t
mono_ms(void)
{
	return mono_us() / 1000;
}

/* The numeric address of a client, as the per-address count and the access log name it. */
bool
addr_text(const struct sockaddr *sa, char out[INET6_ADDRSTRLEN])
{
	if (sa && sa->sa_family == AF_INET)
		return inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out,
		                 INET6_ADDRSTRLEN) != NULL;
	if (sa && sa->sa_family == AF_INET6)
		return inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out,
		                 INET6_ADDRSTRLEN) != NULL;
	return false;
}

/* Counts a connection from key, unless that address has max_per_ip open already. */
bool
admit_address(struct httpserve *srv, const char *key)
{
	pthread_mutex_lock(&srv->guard_mu);
	uintptr_t n = (uintptr_t)strmap_get(srv->per_ip, key);
	bool ok = n < srv->cfg.max_per_ip;
	if (ok)
		strmap_put(srv->per_ip, key, (void *)(n + 1));
	pthread_mutex_unlock(&srv->guard_mu);
	if (ok)
		return true;
	atomic_fetch_add(&srv->per_ip_refused, 1);
	int64_t now = gfs_now_ms(), last = atomic_load(&srv->last_per_ip_log_ms);
	if (now - last >= 10000 && atomic_compare_exchange_strong(&srv->last_per_ip_log_ms, &last, now))
		serve_logf(srv, "connection from %s refused: %u open from that address already (the limit)",
		           key, srv->cfg.max_per_ip);
	return false;
}

/* Called with guard_mu held. */
void
release_address(struct httpserve *srv, const char *key)
{
	uintptr_t n = (uintptr_t)strmap_get(srv->per_ip, key);
	if (n > 1)
		strmap_put(srv->per_ip, key, (void *)(n - 1));
	else
		strmap_del(srv->per_ip, key);
}

void
guard_track(struct httpserve *srv, struct MHD_Connection *conn, struct conn_state *cs)
{
	const union MHD_ConnectionInfo *fi = MHD_get_connection_info(conn,
	                                                             MHD_CONNECTION_INFO_CONNECTION_FD);
	const union MHD_ConnectionInfo *ai = MHD_get_connection_info(conn,
	                                                             MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	cs->fd = fi ? fi->connect_fd : -1;
	if (srv->cfg.max_per_ip && ai && !addr_text(ai->client_addr, cs->addr))
		cs->addr[0] = '\0';
	atomic_init(&cs->header_deadline_ms, mono_ms() + srv->cfg.header_timeout_ms);
	pthread_mutex_lock(&srv->guard_mu);
	cs->next = srv->conns;
	if (srv->conns)
		srv->conns->prev = cs;
	srv->conns = cs;
	pthread_mutex_unlock(&srv->guard_mu);
}

void
guard_untrack(struct httpserve *srv, struct conn_state *cs)
{
	pthread_mutex_lock(&srv->guard_mu);
	if (cs->prev)
		cs->prev->next = cs->next;
	else
		srv->conns = cs->next;
	if (cs->next)
		cs->next->prev = cs->prev;
	if (cs->addr[0])
		release_address(srv, cs->addr);
	pthread_mutex_unlock(&srv->guard_mu);
}

static struct conn_state *
conn_state_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn,
	                                                             MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	return ci ? ci->socket_context : NULL;
}

/* A request's headers are in: no deadline while it is answered. */
void
header_arrived(struct MHD_Connection *conn)
{
	struct conn_state *cs = conn_state_of(conn);
	if (cs)
		atomic_store(&cs->header_deadline_ms, 0);
}

/* A request is over; the next one on this connection is due within the idle timeout. */
void
header_due(struct httpserve *srv, struct MHD_Connection *conn)
{
	struct conn_state *cs = conn_state_of(conn);
	if (cs)
		atomic_store(&cs->header_deadline_ms, mono_ms() + (int64_t)srv->cfg.timeout_s * 1000 +
		                                          srv->cfg.header_timeout_ms);
}

static void
shut_late_headers(struct httpserve *srv, int64_t now)
{
	for (struct conn_state *cs = srv->conns; cs; cs = cs->next) {
		int64_t d = atomic_load(&cs->header_deadline_ms);
		if (!d || now < d || cs->shut || cs->fd < 0)
			continue;
		shutdown(cs->fd, SHUT_RDWR);
		cs->shut = true;
		atomic_fetch_add(&srv->header_timeouts, 1);
	}
}

static bool
evicted_from_tier(void *user, void *ctx)
{
	return !disktier_has(ctx, user);
}

/*
 * An unlinked entry's space is freed only when its last descriptor is
 * closed: open entries the tier evicted are let go once it has evicted
 * something, not when (if ever) they are asked for again, or a full disk
 * stays full of files no one can see.
 */
static void
close_evicted(struct httpserve *srv, uint64_t *seen)
{
	if (!srv->open)
		return;
	struct disktier_stats st;
	disktier_stats(srv->tier, &st);
	if (st.evictions == *seen)
		return;
	*seen = st.evictions;
	http_cache_drop_if(srv->open, evicted_from_tier, srv->tier);
}

/* Shuts connections whose headers are late; lets go of open entries the tier evicted. */
void *
guard_main(void *arg)
{
	struct httpserve *srv = arg;
	int64_t step = srv->cfg.header_timeout_ms / 4;
	step = step < 50 ? 50 : step > 250 ? 250 : step;
	uint64_t evictions = 0;
	pthread_mutex_lock(&srv->guard_mu);
	while (!srv->guard_stop) {
		struct timespec ts;
		gfs_deadline_in(&ts, (int)step);
		pthread_cond_timedwait(&srv->guard_cv, &srv->guard_mu, &ts);
		if (srv->guard_stop)
			break;
		shut_late_headers(srv, mono_ms());
		pthread_mutex_unlock(&srv->guard_mu);
		close_evicted(srv, &evictions);
		pthread_mutex_lock(&srv->guard_mu);
	}
	pthread_mutex_unlock(&srv->guard_mu);
	return NULL;
}

void
note_request(struct httpserve *srv, struct MHD_Connection *conn)
{
	struct conn_state *cs = conn_state_of(conn);
	if (!cs || cs->had_request)
		return;
	cs->had_request = true;
	connection_answered(srv);
}
