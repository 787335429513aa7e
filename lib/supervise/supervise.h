/*
 * The supervisor, a sub-library of its own (lib/supervise/): this is its
 * public header, all that cmd/supervise.c includes; internal.h lists the
 * parts and what they share, docs/design.md draws them. It runs the
 * programs of a configuration, watches them in a single-threaded epoll
 * loop and restarts them by policy. It reports what it does and children's
 * output through descriptors that it never lets block it (and through a
 * callback).
 *
 * Event sources, all in one epoll set:
 *   signalfd    SIGCHLD (also orphans adopted as subreaper), SIGTERM, SIGINT, SIGHUP
 *   pidfd       one per child: its exit, race-free
 *   pipes       each child's stdout and stderr, two pipes read line by line;
 *               restart_on reads stderr only unless told otherwise, since
 *               stdout may carry what clients sent (an access log)
 *   timerfd     a single timer armed at the earliest deadline (backoff, stop
 *               grace, health checks, descriptor samples): no polling sleeps
 *   unix socket the control socket and its clients
 * Health checks run in a forked checker process with a deadline, so a
 * hanging server can never block the loop. What a program's output says
 * never makes it FATAL (a line can be a client's words); once a program is
 * FATAL its held listen socket is closed, so clients are refused, not queued.
 */
#ifndef GFS_SUPERVISE_H
#define GFS_SUPERVISE_H

#include <stdbool.h>
#include <stddef.h>

#include "svconfig.h"

struct sv;

struct sv_callbacks {
	/* One line describing something the supervisor did or saw (no newline), or NULL. */
	void (*event)(void *ctx, const char *line);
	void *ctx;
	/*
	 * Where the same lines go as "<event_prefix><UTC time> line" (-1:
	 * nowhere), written as output_fd is. When both are the same file or
	 * pipe, one buffer serves both, so lines keep their order.
	 */
	int event_fd;
	const char *event_prefix;
	/*
	 * Where the lines of a child's output that has no log file go, as
	 * "[instance] line" (-1: nowhere). Never written in a way that blocks:
	 * while its reader falls behind, lines are held up to a limit, then
	 * dropped and counted.
	 */
	int output_fd;
};

/*
 * Creates a supervisor for cfg (taken over: do not free it). config_path is
 * re-read on SIGHUP (NULL: reload is not possible). control_path NULL uses
 * cfg's or the default. Binds the control socket; fails if another
 * supervisor answers on it (err says so, *busy set).
 */
struct sv *sv_new(struct sv_config *cfg, const char *config_path, const char *control_path,
                  const struct sv_callbacks *cb, bool *busy, char *err, size_t errlen);
/* Starts every program and runs until stopped. Returns 0 after a clean stop. */
int sv_run(struct sv *s);
void sv_free(struct sv *s);

/* The default control socket path (malloc'd): $XDG_RUNTIME_DIR, /run/gridfsctl for root, else /tmp. */
char *sv_default_control_path(void);
/*
 * Sends one request line ("status", "restart NAME", "stop", "reload") and
 * returns the whole reply (a JSON document), malloc'd. For "stop" the reply
 * comes when the supervisor has stopped everything.
 */
char *sv_control_request(const char *path, const char *request, int timeout_ms, char *err,
                         size_t errlen);

/* A copy of a command line (malloc'd) with the password of every scheme://user:password@ as ***. */
char *sv_redact_command(const char *cmd);

#endif
