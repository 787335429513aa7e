/*
 * Starting an instance. The supervisor binds a program's listen socket
 * once and hands it to every instance as LISTEN_FDS=1 (systemd's socket
 * passing), so instances share it and a restart never refuses a client.
 * Each child gets two pipes (stdout and stderr, kept apart for restart_on),
 * its own process group (so a stop reaches what it started), /dev/null as
 * stdin, the program's environment and RLIMIT_NOFILE, and PR_SET_PDEATHSIG
 * so that it does not outlive us unsupervised. Whatever fails before the
 * exec is a restart through the policy, never a crash of the supervisor.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../addr.h"
#include "../util.h"
#include "internal.h"

extern char **environ;

int
sv_pidfd_open(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

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

/* Whether one of the n entries of env sets the variable named by the len bytes of name. */
static bool
has_var(char **env, size_t n, const char *name, size_t len)
{
	for (size_t i = 0; i < n; i++)
		if (strncmp(env[i], name, len) == 0 && env[i][len] == '=')
			return true;
	return false;
}

/* The child's environment: ours, minus stale LISTEN_*, plus the program's, plus ours for it. */
static char **
build_env(const struct instance *in, size_t *pid_slot)
{
	const struct sv_program *c = &in->prog->cfg;
	size_t n = 0;
	while (environ[n])
		n++;
	char **env = gfs_xcalloc(n + c->nenv + 8, sizeof *env);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (strncmp(environ[i], "LISTEN_", 7) == 0)
			continue;
		if (!has_var(c->env, c->nenv, environ[i], strcspn(environ[i], "=")))
			env[k++] = gfs_xstrdup(environ[i]);
	}
	for (size_t j = 0; j < c->nenv; j++)
		env[k++] = gfs_xstrdup(c->env[j]);
	/*
	 * The driver keeps counters no one reads in /dev/shm/mongoc-PID, which
	 * only a clean exit removes: a child killed hard leaves it, and the next
	 * process given that pid prints "Falling back to malloc for counters"
	 * before main() can stop it. Unless the configuration says otherwise.
	 */
	if (!has_var(env, k, "MONGOC_DISABLE_SHM", strlen("MONGOC_DISABLE_SHM")))
		env[k++] = gfs_xstrdup("MONGOC_DISABLE_SHM=1");
	char tmp[160];
	snprintf(tmp, sizeof tmp, "GRIDFSCTL_SUPERVISE_NAME=%s", in->name);
	env[k++] = gfs_xstrdup(tmp);
	snprintf(tmp, sizeof tmp, "GRIDFSCTL_SUPERVISE_INSTANCE=%d", in->index);
	env[k++] = gfs_xstrdup(tmp);
	*pid_slot = (size_t)-1;
	if (in->prog->listen_fd >= 0) {
		env[k++] = gfs_xstrdup("LISTEN_FDS=1");
		snprintf(tmp, sizeof tmp, "LISTEN_FDNAMES=%s", c->name);
		env[k++] = gfs_xstrdup(tmp);
		/* Filled in by the child, which alone knows its pid before exec. */
		*pid_slot = k;
		env[k++] = gfs_xstrdup("LISTEN_PID=                    ");
	}
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

bool
sv_nofile_limits(const struct instance *in, struct rlimit *rl)
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
void
sv_arm_watches(struct instance *in)
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
	sv_event(in->sv, "%s: pipe: %s", in->name, strerror(errno));
	sv_self_fd_note(in->sv, "pipe");
	sv_schedule_restart(in, "could not be started");
	return false;
}

/* What a start needs before the fork: the held listen socket, the log file, the user. */
static bool
prepare(struct instance *in, struct passwd **pw)
{
	struct sv *s = in->sv;
	struct program *p = in->prog;
	const struct sv_program *c = &p->cfg;
	char err[300];
	if (c->listen && p->listen_fd < 0) {
		p->listen_fd = bind_listen(c->listen, err, sizeof err);
		if (p->listen_fd < 0) {
			sv_event(s, "%s: %s", in->name, err);
			sv_schedule_restart(in, "cannot bind its listen socket");
			return false;
		}
		sv_event(s, "%s: holding listen socket %s for its instances", c->name, c->listen);
	}
	char lp[4200];
	if (!in->log && log_path_for(in, lp, sizeof lp)) {
		in->log = logfile_open(lp, c->log_max, c->log_backups);
		if (!in->log) {
			sv_event(s, "%s: log %s: %s", in->name, lp, strerror(errno));
			sv_self_fd_note(s, "log file");
		}
	}
	*pw = NULL;
	if (c->user) {
		*pw = getpwnam(c->user);
		if (!*pw) {
			sv_event(s, "%s: unknown user '%s'", in->name, c->user);
			in->state = ST_FATAL;
			return false;
		}
	}
	return true;
}

/* The child runs as pid: watch it, and start its clocks afresh. */
static void
started(struct instance *in, pid_t pid, int outr, int errr)
{
	struct sv *s = in->sv;
	in->pid = pid;
	in->pgid = pid;
	sv_stream_open(in, &in->out, outr);
	sv_stream_open(in, &in->err, errr);
	in->pidfd = sv_pidfd_open(pid);
	if (in->pidfd >= 0)
		sv_ep_add(s, in->pidfd, &in->w_pid, W_PIDFD, in);
	in->started_at = gfs_mono_seconds();
	in->state = in->prog->cfg.startsecs > 0 ? ST_STARTING : ST_RUNNING;
	in->after = AFTER_POLICY;
	in->emfile_cause = false;
	in->health_failures = 0;
	in->health = -1;
	in->fd_warned = false;
	fdw_trend_reset(&in->trend);
	memset(&in->fds, 0, sizeof in->fds);
	in->fd_soft = in->fd_hard = 0;
	sv_arm_watches(in);
}

void
sv_start_instance(struct instance *in)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	struct passwd *pw;
	in->t_start = 0;
	if (!sv_after_ready(in->prog)) {
		if (in->state != ST_WAITING)
			sv_event(s, "%s: waiting for %s to be up and healthy", in->name, c->after);
		in->state = ST_WAITING;
		return;
	}
	if (!prepare(in, &pw))
		return;
	int pipefd[2], errfd[2];
	if (!output_pipes(in, pipefd, errfd))
		return;
	struct rlimit rl;
	bool set_rl = sv_nofile_limits(in, &rl);
	size_t pid_slot;
	char **env = build_env(in, &pid_slot);
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		sv_event(s, "%s: fork: %s", in->name, strerror(errno));
		for (int i = 0; i < 2; i++) {
			close(pipefd[i]);
			close(errfd[i]);
		}
		free_env(env);
		sv_schedule_restart(in, "could not be started");
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
	started(in, pid, pipefd[0], errfd[0]);
	char lim[64] = "";
	if (set_rl)
		snprintf(lim, sizeof lim, ", nofile %ld", (long)rl.rlim_cur);
	char *shown = sv_redact_command(c->command); /* never a password in the log */
	sv_event(s, "%s: started pid %d%s: %s", in->name, (int)pid, lim, shown);
	free(shown);
}
