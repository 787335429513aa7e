/*
 * The sd_notify protocol (systemd's Type=notify), without libsystemd: a
 * state string such as "READY=1" goes as one datagram to the unix socket
 * named by $NOTIFY_SOCKET (a path, or '@' for an abstract name). The
 * protocol is small and stable, and a dependency for one sendto() would
 * not earn its place.
 */
#ifndef GFS_SDNOTIFY_H
#define GFS_SDNOTIFY_H

#include <stdint.h>

/* Sends state to $NOTIFY_SOCKET: 1 sent, 0 none is set (nothing to do), -1 failed with errno. */
int gfs_sd_notify(const char *state);
/*
 * How often systemd wants WATCHDOG=1 from this process ($WATCHDOG_USEC,
 * when $WATCHDOG_PID is unset or ours), in microseconds; 0 when it does not.
 */
uint64_t gfs_sd_watchdog_usec(void);
/*
 * Takes NOTIFY_SOCKET and WATCHDOG_* out of the environment, so that
 * children do not speak for us; later calls keep using what was there.
 */
void gfs_sd_notify_detach(void);
/* The $NOTIFY_SOCKET in use, or NULL: for messages. */
const char *gfs_sd_notify_socket(void);

#endif
