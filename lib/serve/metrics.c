/*
 * What the server tells about itself: the Prometheus text of /_metrics,
 * read from the counters the other parts bump (struct httpserve's metrics
 * block, counters.c's latency histogram) and from the caches, the index
 * and the job queue; and the access log, a line per request in combined
 * format. A new counter is a field in the metrics block and its line here.
 */
#include <dirent.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "internal.h"

/* Combined log format, as Apache and nginx write it. */
void
write_access_log(struct httpserve *srv, struct req *r, unsigned status)
{
	char addr[INET6_ADDRSTRLEN] = "-";
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn,
	                                                             MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (!ci || !addr_text(ci->client_addr, addr))
		snprintf(addr, sizeof addr, "-");
	time_t t = (time_t)(r->start_ms / 1000);
	struct tm tm;
	localtime_r(&t, &tm);
	static const char mon[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
	                                "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
	long off = tm.tm_gmtoff / 60;
	char when[64];
	snprintf(when, sizeof when, "%02d/%s/%04d:%02d:%02d:%02d %c%02ld%02ld", tm.tm_mday,
	         mon[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec,
	         off < 0 ? '-' : '+', labs(off) / 60, labs(off) % 60);
	char bytes[24] = "-";
	if (r->body_bytes)
		snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)r->body_bytes);
	pthread_mutex_lock(&srv->log_mu);
	fprintf(srv->access_log, "%s - - [%s] \"%s %s %s\" %u %s \"%s\" \"%s\"\n", addr, when,
	        r->method[0] ? r->method : "-", r->uri, r->version[0] ? r->version : "-", status,
	        bytes, r->referer ? r->referer : "-", r->agent ? r->agent : "-");
	pthread_mutex_unlock(&srv->log_mu);
}

/* ---- metrics --------------------------------------------------------- */

static long
count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	long n = 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3; /* ".", ".." and the directory's own descriptor */
}

#define P "gridfsctl_serve_"

/* The memory cache's, the disk tier's and its open entries' counters. */
static void
metrics_caches(struct httpserve *srv, struct gfs_buf *b)
{
	struct http_cache_stats cs;
	http_cache_stats(srv->cache, &cs);
	gfs_buf_printf(b, "# TYPE " P "cache_hits_total counter\n" P "cache_hits_total %llu\n"
	                "# TYPE " P "cache_misses_total counter\n" P "cache_misses_total %llu\n"
	                "# TYPE " P "cache_evictions_total counter\n" P "cache_evictions_total %llu\n"
	                "# TYPE " P "negative_cache_hits_total counter\n" P "negative_cache_hits_total %llu\n"
	                "# TYPE " P "cache_bytes gauge\n" P "cache_bytes %zu\n"
	                "# TYPE " P "cache_max_bytes gauge\n" P "cache_max_bytes %zu\n"
	                "# TYPE " P "cache_entries gauge\n" P "cache_entries %zu\n"
	                "# TYPE " P "preloaded_files_total counter\n" P "preloaded_files_total %llu\n",
	                (unsigned long long)cs.hits, (unsigned long long)cs.misses,
	                (unsigned long long)cs.evictions, (unsigned long long)cs.neg_hits, cs.bytes,
	                cs.max_bytes, cs.entries, (unsigned long long)atomic_load(&srv->preloaded));
	struct disktier_stats ds = {0};
	if (srv->tier)
		disktier_stats(srv->tier, &ds);
	gfs_buf_printf(b, "# TYPE " P "disk_hits_total counter\n" P "disk_hits_total %llu\n"
	                "# TYPE " P "disk_misses_total counter\n" P "disk_misses_total %llu\n"
	                "# TYPE " P "disk_evictions_total counter\n" P "disk_evictions_total %llu\n"
	                "# TYPE " P "disk_errors_total counter\n" P "disk_errors_total %llu\n"
	                "# TYPE " P "disk_fills_dropped_total counter\n" P "disk_fills_dropped_total %llu\n"
	                "# TYPE " P "disk_bytes gauge\n" P "disk_bytes %llu\n"
	                "# TYPE " P "disk_max_bytes gauge\n" P "disk_max_bytes %llu\n"
	                "# TYPE " P "disk_entries gauge\n" P "disk_entries %llu\n"
	                "# TYPE " P "disk_unproven_entries gauge\n" P "disk_unproven_entries %llu\n"
	                "# TYPE " P "disk_proofs_total counter\n" P "disk_proofs_total %llu\n"
	                "# TYPE " P "disk_proof_failures_total counter\n" P "disk_proof_failures_total %llu\n"
	                "# HELP " P "backend_reads_total File bodies read from the backend, for any reason.\n"
	                "# TYPE " P "backend_reads_total counter\n" P "backend_reads_total %llu\n"
	                "# HELP " P "integrity_failures_total Bodies read for a request that failed the integrity rule.\n"
	                "# TYPE " P "integrity_failures_total counter\n" P "integrity_failures_total %llu\n",
	                (unsigned long long)ds.hits, (unsigned long long)ds.misses,
	                (unsigned long long)ds.evictions, (unsigned long long)ds.errors,
	                (unsigned long long)ds.dropped, (unsigned long long)ds.bytes, (unsigned long long)ds.max_bytes,
	                (unsigned long long)ds.entries, (unsigned long long)ds.unproven,
	                (unsigned long long)ds.proofs, (unsigned long long)ds.proof_failures,
	                (unsigned long long)atomic_load(&srv->backend_reads),
	                (unsigned long long)atomic_load(&srv->integrity_failures));
	gfs_buf_printf(b, "# HELP " P "primary_rereads_total Files a secondary showed damaged or missing, "
	                "read again on the primary.\n"
	                "# TYPE " P "primary_rereads_total counter\n" P "primary_rereads_total %llu\n",
	                (unsigned long long)atomic_load(&srv->primary_rereads));
	struct http_cache_stats kept = {0};
	if (srv->open)
		http_cache_stats(srv->open, &kept);
	gfs_buf_printf(b, "# TYPE " P "disk_open_entries gauge\n" P "disk_open_entries %zu\n"
	                "# TYPE " P "disk_open_bypassed_total counter\n" P "disk_open_bypassed_total %llu\n",
	                kept.entries, (unsigned long long)atomic_load(&srv->open_bypassed));
}

static void
metrics_backend_latency(struct httpserve *srv, struct gfs_buf *b)
{
	gfs_buf_printf(b, "# HELP " P "backend_seconds Time to read a file or look one up.\n"
	                "# TYPE " P "backend_seconds histogram\n");
	uint64_t cum = 0;
	for (int i = 0; i < NBUCKETS; i++) {
		cum += atomic_load(&srv->latency_bucket[i]);
		if (i < NBUCKETS - 1)
			gfs_buf_printf(b, P "backend_seconds_bucket{le=\"%g\"} %llu\n", latency_bounds[i],
			                (unsigned long long)cum);
		else
			gfs_buf_printf(b, P "backend_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
	}
	gfs_buf_printf(b, P "backend_seconds_sum %.6f\n" P "backend_seconds_count %llu\n",
	                (double)atomic_load(&srv->latency_sum_us) / 1e6,
	                (unsigned long long)atomic_load(&srv->latency_count));
}

enum MHD_Result
serve_metrics(struct req *r)
{
	struct httpserve *srv = r->srv;
	struct gfs_buf b = {gfs_xmalloc(8192), 0, 8192};
	gfs_buf_printf(&b, "# HELP " P "requests_total Requests answered, by status.\n# TYPE " P "requests_total counter\n");
	for (int s = 100; s < 600; s++) {
		uint64_t n = atomic_load(&srv->status_count[s]);
		if (n)
			gfs_buf_printf(&b, P "requests_total{code=\"%d\"} %llu\n", s, (unsigned long long)n);
	}
	gfs_buf_printf(&b, "# HELP " P "response_bytes_total Body bytes sent.\n# TYPE " P "response_bytes_total counter\n"
	                P "response_bytes_total %llu\n", (unsigned long long)atomic_load(&srv->bytes_sent));
	metrics_caches(srv, &b);
	metrics_backend_latency(srv, &b);
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	unsigned queued = (unsigned)gfs_workq_count(srv->jobs);
	pthread_mutex_lock(&srv->jobs_mu);
	size_t inflight = strmap_count(srv->inflight);
	pthread_mutex_unlock(&srv->jobs_mu);
	gfs_buf_printf(&b, "# TYPE " P "open_connections gauge\n" P "open_connections %ld\n"
	                "# TYPE " P "open_fds gauge\n" P "open_fds %ld\n"
	                "# TYPE " P "max_fds gauge\n" P "max_fds %llu\n"
	                "# TYPE " P "accept_emfile_total counter\n" P "accept_emfile_total %llu\n"
	                "# TYPE " P "queue_full_total counter\n" P "queue_full_total %llu\n"
	                "# TYPE " P "coalesced_total counter\n" P "coalesced_total %llu\n"
	                "# TYPE " P "header_timeouts_total counter\n" P "header_timeouts_total %llu\n"
	                "# TYPE " P "per_address_refused_total counter\n" P "per_address_refused_total %llu\n"
	                "# TYPE " P "fetch_queue gauge\n" P "fetch_queue %u\n"
	                "# TYPE " P "fetches_in_flight gauge\n" P "fetches_in_flight %zu\n"
	                "# TYPE " P "backend_up gauge\n" P "backend_up %d\n"
	                "# TYPE " P "index_files gauge\n" P "index_files %zu\n"
	                "# TYPE " P "index_age_seconds gauge\n" P "index_age_seconds %.3f\n"
	                "# TYPE " P "index_poll_seconds gauge\n" P "index_poll_seconds %.3f\n"
	                "# TYPE " P "index_reload_seconds gauge\n" P "index_reload_seconds %.3f\n"
	                "# TYPE " P "index_poll_interval_seconds gauge\n" P "index_poll_interval_seconds %.3f\n",
	                atomic_load(&srv->open_connections), count_fds(), (unsigned long long)rl.rlim_cur,
	                (unsigned long long)atomic_load(&srv->emfile_events),
	                (unsigned long long)atomic_load(&srv->queue_full),
	                (unsigned long long)atomic_load(&srv->coalesced),
	                (unsigned long long)atomic_load(&srv->header_timeouts),
	                (unsigned long long)atomic_load(&srv->per_ip_refused), queued, inflight,
	                atomic_load(&srv->backend_down) ? 0 : 1, name_index_count(srv->index),
	                name_index_fresh_ms(srv->index) ? (double)(gfs_now_ms() - name_index_fresh_ms(srv->index)) / 1e3 : -1.0,
	                (double)atomic_load(&srv->poll_us) / 1e6, (double)atomic_load(&srv->reload_us) / 1e6,
	                (double)atomic_load(&srv->poll_interval_ms) / 1e3);
	gfs_buf_printf(&b, "# HELP " P "thread_connections Open connections of each event thread.\n"
	                "# TYPE " P "thread_connections gauge\n");
	for (unsigned i = 0; i < srv->nd; i++)
		gfs_buf_printf(&b, P "thread_connections{thread=\"%u\"} %ld\n", i, atomic_load(&srv->loops[i].conns));
	struct MHD_Response *resp =
	    made(MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE));
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	return queue_once(r, 200, resp, b.len);
}
