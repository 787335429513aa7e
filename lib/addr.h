/*
 * TCP listening addresses as users write them: HOST:PORT, [IPV6]:PORT,
 * :PORT or PORT. The host is numeric (no resolver is asked, so what is
 * bound is what was written) and, when left out, is the loopback address:
 * listening on every interface is something one writes out, as 0.0.0.0:PORT
 * or [::]:PORT. Every listener of gridfsctl (serve --listen, supervise's
 * listen key) parses through here, so they agree on what a spec means.
 */
#ifndef GFS_ADDR_H
#define GFS_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

struct gfs_addr {
	char host[64];          /* numeric, without brackets: "127.0.0.1", "::1" */
	unsigned port;          /* 1..65535; 0 only with GFS_ADDR_ANY_PORT */
	int family;             /* AF_INET or AF_INET6 */
};

/* Port 0 ("any free port") is refused unless flags has this: only a caller that reports the port can use it. */
#define GFS_ADDR_ANY_PORT 1u

/* Parses a listening address; false with a one-line reason in err (which names spec). */
bool gfs_addr_parse(const char *spec, unsigned flags, struct gfs_addr *a, char *err, size_t errlen);
/*
 * The HOST[:PORT] of a URL one connects to: a host name or numeric address
 * ([IPV6] in brackets, which host gets without them), and the port, dflt
 * when none is written. The port is checked as for a listening address.
 * spec ends at a '/', so a URL's path can follow it.
 */
bool gfs_hostport_parse(const char *spec, unsigned dflt, char *host, size_t hostlen,
                        unsigned *port, char *err, size_t errlen);
/* The socket address of a parsed address; returns its length. */
socklen_t gfs_addr_sockaddr(const struct gfs_addr *a, struct sockaddr_storage *ss);
/* Formats a as HOST:PORT, with brackets around an IPv6 host. */
void gfs_addr_format(const struct gfs_addr *a, char *buf, size_t len);

#endif
