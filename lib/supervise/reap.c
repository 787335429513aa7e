/*
 * Exits. SIGCHLD and the pidfds only wake us; reaping is one waitid loop
 * over every child: instances, health checkers, and orphans that come to
 * us as subreaper. An instance's exit goes through three questions before
 * the restart policy (policy.c) decides: did it daemonise (a clean exit
 * that left its real process behind, which is adopted and watched as the
 * parent was), did it leave processes in its group (signalled, then
 * SIGKILLed after the grace period), and what is left in its pipes (read
 * to the end, since its last lines may be what restart_on looks for).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../util.h"
#include "internal.h"

/* True while some process, even a zombie, still has process group pgid. */
static bool
group_exists(pid_t pgid)
{
	return kill(-pgid, 0) == 0 || errno == EPERM;
}

/*
 * The main process is gone but its group was told to stop (by sv_stop_instance,
 * or by signal_leftovers after a crash): what ignores that signal gets
 * SIGKILL when the grace period ends, as the main process would have.
 * Without this a stop left such processes running for ever.
 */
static void
watch_leftovers(struct instance *in, bool was_stopping, int status, double t_kill)
{
	bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
	if (in->pgid <= 0 || !group_exists(in->pgid))
		return;
	if (!was_stopping && clean)
		return; /* nobody was signalled: a daemon forking away, see signal_leftovers */
	if (was_stopping && t_kill == 0)
		return; /* the grace period is over: the whole group got SIGKILL already */
	in->leftover_pgid = in->pgid;
	in->t_group_kill = was_stopping ? t_kill
	                 : gfs_mono_seconds() + in->prog->cfg.stop_grace_ms / 1000.0;
}

/*
 * SIGKILLs what is left of a group when its grace period ends. A process
 * group id is the pid of its first leader, and Linux does not hand out a
 * pid again while any process, zombie included, still uses it as a group
 * id. Leftovers whose parent died are reparented to us (the subreaper), so
 * the last of them stays a zombie in the group until we reap it, which we
 * do only in sv_reap(), never between the check and the kill below. So a
 * group that exists here is still the one we started, not a stranger's.
 * (Only a leftover that a process outside the group parents could end it
 * behind our back, and that takes a program moving processes between
 * groups.)
 */
void
sv_kill_leftovers(struct instance *in)
{
	pid_t pgid = in->leftover_pgid;
	in->leftover_pgid = 0;
	if (!group_exists(pgid))
		return;
	sv_event(in->sv, "%s: what pid %d left in its process group did not stop within %.1f s: "
	         "sending SIGKILL", in->name, (int)pgid, in->prog->cfg.stop_grace_ms / 1000.0);
	kill(-pgid, SIGKILL);
}

/* Forgets leftovers whose group has emptied, so a stop need not wait out their grace. */
static void
forget_gone_leftovers(struct sv *s)
{
	for (struct program *p = s->progs; p; p = p->next)
		for (int i = 0; i < p->ninst; i++) {
			struct instance *in = &p->inst[i];
			if (in->leftover_pgid > 0 && !group_exists(in->leftover_pgid)) {
				in->leftover_pgid = 0;
				in->t_group_kill = 0;
			}
		}
}

/* True when pid has the read end's pipe (inode ino) among its descriptors. */
static bool
holds_pipe(pid_t pid, ino_t ino)
{
	char dir[64], want[64];
	snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
	snprintf(want, sizeof want, "pipe:[%lu]", (unsigned long)ino);
	DIR *d = opendir(dir);
	if (!d)
		return false;
	bool found = false;
	struct dirent *e;
	while (!found && (e = readdir(d)) != NULL) {
		char link[64];
		ssize_t n = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
		if (n <= 0)
			continue;
		link[n] = '\0';
		found = strcmp(link, want) == 0;
	}
	closedir(d);
	return found;
}

/*
 * Every orphan below us is reparented to us, whichever program left it.
 * Only one still in the instance's process group, or still writing to its
 * output pipe, is the instance's: what another program left must not be
 * taken for this one's daemon.
 */
static bool
orphan_is_ours(const struct instance *in, pid_t pid)
{
	if (in->pgid > 0 && getpgid(pid) == in->pgid)
		return true;
	const struct stream *pipes[] = {&in->out, &in->err};
	for (size_t i = 0; i < 2; i++) {
		struct stat st;
		if (pipes[i]->fd >= 0 && fstat(pipes[i]->fd, &st) == 0 && holds_pipe(pid, st.st_ino))
			return true;
	}
	return false;
}

/* A daemonising child exits 0 and leaves its real process behind, reparented to us. */
static bool
adopt_orphan(struct instance *in)
{
	struct sv *s = in->sv;
	DIR *d = opendir("/proc");
	if (!d)
		return false;
	pid_t me = getpid(), found = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL && !found) {
		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		char path[300], buf[512];
		snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t n = read(fd, buf, sizeof buf - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		char *rp = strrchr(buf, ')');
		int ppid = 0;
		char st;
		if (!rp || sscanf(rp + 1, " %c %d", &st, &ppid) != 2 || ppid != me || st == 'Z')
			continue;
		pid_t pid = (pid_t)atoi(e->d_name);
		bool known = false;
		for (struct program *p = s->progs; p; p = p->next)
			for (int i = 0; i < p->ninst; i++)
				if (p->inst[i].pid == pid || p->inst[i].checker == pid)
					known = true;
		if (!known && orphan_is_ours(in, pid))
			found = pid;
	}
	closedir(d);
	if (!found)
		return false;
	in->pid = found;
	in->pgid = getpgid(found);
	in->pidfd = sv_pidfd_open(found);
	if (in->pidfd >= 0)
		sv_ep_add(s, in->pidfd, &in->w_pid, W_PIDFD, in);
	sv_event(s, "%s: it daemonised; now tracking pid %d", in->name, (int)found);
	return true;
}

static void
instance_exited(struct instance *in, int status)
{
	struct sv *s = in->sv;
	double ran = gfs_mono_seconds() - in->started_at;
	sv_ep_close(s, &in->pidfd);
	pid_t pid = in->pid;
	double t_kill = in->t_kill;
	in->pid = 0;
	in->t_kill = in->t_health = in->t_fd = in->t_running = 0;
	sv_describe_status(status, in->last_exit, sizeof in->last_exit);
	sv_event(s, "%s: pid %d %s after %.1f s", in->name, (int)pid, in->last_exit, ran);
	bool was_stopping = in->state == ST_STOPPING;

	/*
	 * A daemon left behind keeps the output pipe: it is still this program,
	 * checked and sampled as before (a check under way goes on).
	 */
	if (!was_stopping && !s->stopping && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
	    adopt_orphan(in)) {
		sv_arm_watches(in);
		return;
	}
	sv_kill_checker(in);
	watch_leftovers(in, was_stopping, status, t_kill);
	in->exiting = true;
	sv_drain_stream(&in->out);
	sv_drain_stream(&in->err);
	in->exiting = false;
	sv_after_exit(in, status, was_stopping);
}

static struct instance *
find_pid(struct sv *s, pid_t pid, bool *checker)
{
	for (struct program *p = s->progs; p; p = p->next)
		for (int i = 0; i < p->ninst; i++) {
			if (p->inst[i].pid == pid) {
				*checker = false;
				return &p->inst[i];
			}
			if (p->inst[i].checker == pid) {
				*checker = true;
				return &p->inst[i];
			}
		}
	return NULL;
}

/*
 * The main process has exited (still a zombie, so its group id cannot be
 * reused yet): what it started in its group would otherwise outlive it and
 * hold its port or files. A clean exit may be a daemon forking away, which
 * instance_exited adopts; and a stopping instance's group got the signal.
 */
static void
signal_leftovers(struct instance *in, const siginfo_t *si)
{
	bool may_daemonise = si->si_code == CLD_EXITED && si->si_status == 0;
	if (in->pgid <= 0 || in->state == ST_STOPPING || in->sv->stopping || may_daemonise)
		return;
	kill(-in->pgid, in->prog->cfg.stop_signal);
}

/* Reaps every exited child: ours, health checkers, and orphans adopted as subreaper. */
void
sv_reap(struct sv *s)
{
	for (;;) {
		siginfo_t si;
		memset(&si, 0, sizeof si);
		if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0)
			break;
		bool is_checker;
		struct instance *in = find_pid(s, si.si_pid, &is_checker);
		if (in && !is_checker)
			signal_leftovers(in, &si);
		if (waitid(P_PID, (id_t)si.si_pid, &si, WEXITED | WNOHANG) != 0 || si.si_pid == 0)
			break;
		int status = si.si_code == CLD_EXITED ? W_EXITCODE(si.si_status, 0)
		           : si.si_code == CLD_DUMPED ? (si.si_status | 0x80) : si.si_status;
		if (!in)
			continue; /* an orphan that some child left behind */
		if (is_checker)
			sv_on_checker_exit(in, status);
		else
			instance_exited(in, status);
	}
	forget_gone_leftovers(s);
	sv_finish_program_removal(s);
}
