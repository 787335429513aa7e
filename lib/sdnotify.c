/* sd_notify by hand: see sdnotify.h. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "sdnotify.h"
#include "util.h"

/* Set by gfs_sd_notify_detach(), which takes the variables out of the environment. */
static char kept_socket[sizeof ((struct sockaddr_un *)0)->sun_path];
static uint64_t kept_watchdog;
static int detached;

const char *
gfs_sd_notify_socket(void)
{
	const char *path = detached ? kept_socket : getenv("NOTIFY_SOCKET");
	return path && *path ? path : NULL;
}

int
gfs_sd_notify(const char *state)
{
	const char *path = gfs_sd_notify_socket();
	if (!path)
		return 0;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len = strlen(path);
	if (len < 2 || len >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@')) {
		errno = EINVAL;
		return -1;
	}
	memcpy(sa.sun_path, path, len);
	if (path[0] == '@')
		sa.sun_path[0] = '\0';
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
	ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, sl);
	int e = errno;
	close(fd);
	errno = e;
	return n < 0 ? -1 : 1;
}

static uint64_t
watchdog_from_env(void)
{
	const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
	long v, p;
	if (!usec || !gfs_parse_long(usec, 1, 1L << 40, &v))
		return 0;
	if (pid && *pid && (!gfs_parse_long(pid, 1, 1L << 30, &p) || p != (long)getpid()))
		return 0;
	return (uint64_t)v;
}

uint64_t
gfs_sd_watchdog_usec(void)
{
	return detached ? kept_watchdog : watchdog_from_env();
}

void
gfs_sd_notify_detach(void)
{
	if (detached)
		return;
	const char *path = getenv("NOTIFY_SOCKET");
	size_t len = path ? strlen(path) : 0;
	if (len >= sizeof kept_socket)
		strcpy(kept_socket, "?"); /* too long for any socket: gfs_sd_notify says EINVAL */
	else if (path)
		memcpy(kept_socket, path, len + 1);
	kept_watchdog = watchdog_from_env();
	detached = 1;
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
}
