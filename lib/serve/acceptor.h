/*
 * One thread that accepts connections on a listening socket and hands
 * each to a callback, which gives it to an event loop of its choosing.
 *
 * Why not let every event loop accept for itself: with SO_REUSEPORT the
 * kernel hashes each connection to one loop's socket, and with a shared
 * socket the loops race for it; either way a handful of keep-alive
 * connections (a proxy in front, a benchmark at low concurrency) often
 * lands on one loop while the others idle, halving throughput. Handing
 * connections out from one place lets the caller balance them.
 *
 * Out of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM), it reports once
 * and stops accepting until acceptor_resume() says a descriptor was freed
 * or a short pause has passed: never a busy loop, and open connections are
 * served meanwhile.
 */
#ifndef GFS_ACCEPTOR_H
#define GFS_ACCEPTOR_H

#include <stdbool.h>
#include <sys/socket.h>

#include "../error.h"

typedef struct acceptor acceptor;

/* Takes ownership of fd, a new connection (non-blocking, close-on-exec). */
typedef void (*acceptor_conn_fn)(void *ctx, int fd, const struct sockaddr *addr, socklen_t len);
/* accept() failed for lack of resources (err is its errno); accepting pauses. */
typedef void (*acceptor_limit_fn)(void *ctx, int err);

/* A listening TCP socket bound to addr (non-blocking, close-on-exec), or -1. */
int acceptor_listen(const struct sockaddr_storage *addr, bool reuse_port, int backlog,
                    gfs_error *err);

acceptor *acceptor_start(int listen_fd, acceptor_conn_fn on_conn, acceptor_limit_fn on_limit,
                         void *ctx, gfs_error *err);
/* A descriptor was freed: if accepting is paused, try again now. Cheap when it is not. */
void acceptor_resume(acceptor *a);
/*
 * Stops accepting and joins the thread; the listening socket stays open.
 * acceptor_resume may still be called until acceptor_free.
 */
void acceptor_stop(acceptor *a);
/*
 * Stops the thread like acceptor_stop, then hands over every connection
 * the kernel has already queued (up to max of them), so that closing the
 * socket next resets none of them.
 */
void acceptor_drain(acceptor *a, int max);
void acceptor_free(acceptor *a);

#endif
