/*
 * Programs and their instances. A program is one [program:NAME] section,
 * its compiled patterns and its held listen socket; it has 1..64 instances,
 * each a process with a state:
 *
 *   STOPPED --start--> STARTING --up for startsecs--> RUNNING
 *   STARTING, RUNNING --sv_stop_instance (match, check, request)--> STOPPING
 *   any of them --exit, then policy.c--> BACKOFF --backoff over--> STARTING
 *                                     or FATAL   (too many restarts)
 *                                     or EXITED  (clean exit, no autorestart)
 *                                     or STOPPED (stopped for good)
 *   STOPPED, BACKOFF --start, the program it is after not up--> WAITING
 *   WAITING --that program up and healthy (reload.c)--> STARTING
 *
 * The transitions live in the parts that see their causes; what a state
 * means to all of them is the table below, so that "is it up" is asked one
 * way everywhere. Stopping goes through sv_stop_instance alone: its enum
 * after says what follows the exit (policy.c's table).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../util.h"
#include "internal.h"

const struct state_info sv_states[] = {
	[ST_STOPPED] = {"STOPPED", .up = false},
	[ST_STARTING] = {"STARTING", .up = true, .settling = true},
	[ST_RUNNING] = {"RUNNING", .up = true},
	[ST_BACKOFF] = {"BACKOFF", .up = false},
	[ST_STOPPING] = {"STOPPING", .settling = true},
	[ST_FATAL] = {"FATAL", .idle = true},
	[ST_EXITED] = {"EXITED", .idle = true},
	/* on its way up: a rolling restart waits for it, as for STARTING */
	[ST_WAITING] = {"WAITING", .settling = true},
};

static int
sys_pidfd_send_signal(int pidfd, int sig)
{
	return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

struct program *
sv_prog_new(struct sv *s, const struct sv_program *cfg)
{
	struct program *p = gfs_xcalloc(1, sizeof *p);
	sv_program_copy(&p->cfg, cfg);
	char err[256];
	if (!sv_patterns_compile(&p->pats, p->cfg.patterns, p->cfg.npatterns, err, sizeof err))
		sv_event(s, "%s: %s", p->cfg.name, err); /* checked at parse time; never expected */
	p->listen_fd = -1;
	p->rolling = -1;
	p->ninst = p->cfg.instances;
	p->inst = gfs_xcalloc((size_t)p->ninst, sizeof *p->inst);
	for (int i = 0; i < p->ninst; i++) {
		struct instance *in = &p->inst[i];
		in->prog = p;
		in->sv = s;
		in->index = i;
		in->pidfd = in->out.fd = in->err.fd = in->checker_pidfd = in->checker_pipe = -1;
		in->out.in = in->err.in = in;
		in->err.is_err = true;
		in->health = -1;
		in->state = ST_STOPPED;
		if (p->ninst == 1)
			snprintf(in->name, sizeof in->name, "%s", p->cfg.name);
		else
			snprintf(in->name, sizeof in->name, "%s:%d", p->cfg.name, i);
	}
	return p;
}

void
sv_prog_free(struct program *p)
{
	for (int i = 0; i < p->ninst; i++)
		logfile_close(p->inst[i].log);
	if (p->listen_fd >= 0)
		close(p->listen_fd);
	sv_patterns_free(&p->pats);
	sv_program_free(&p->cfg);
	free(p->inst);
	free(p);
}

bool
sv_alive(const struct instance *in)
{
	return in->pid > 0;
}

bool
sv_prog_quiet(const struct program *p)
{
	for (int i = 0; i < p->ninst; i++)
		if (sv_alive(&p->inst[i]) || p->inst[i].checker > 0 || p->inst[i].leftover_pgid > 0)
			return false;
	return true;
}

/*
 * Signals the program's process group, and the main process through its
 * pidfd only when it has left that group: a second SIGTERM is "stop now"
 * to many programs (and kills a Python one that is already exiting).
 */
void
sv_signal_group(struct instance *in, int sig)
{
	bool in_group = in->pgid > 0 && getpgid(in->pid) == in->pgid;
	if (in->pgid > 0)
		kill(-in->pgid, sig);
	if (!in_group && in->pidfd >= 0)
		sys_pidfd_send_signal(in->pidfd, sig);
}

void
sv_kill_checker(struct instance *in)
{
	if (in->checker > 0)
		kill(in->checker, SIGKILL);
}

/*
 * Nothing runs to be stopped: a restart starts it now, a stop ends its
 * backoff, and a FATAL one stays FATAL unless it is stopped for good.
 */
static void
stop_idle(struct instance *in, enum after after)
{
	in->t_start = 0;
	if (after == AFTER_NOW && !in->sv->stopping && !in->prog->removing) {
		in->state = ST_STOPPED;
		sv_start_instance(in);
	} else if (in->state != ST_FATAL || after == AFTER_STOP) {
		in->state = ST_STOPPED;
	}
}

/* Asks the instance to stop; after decides what happens once it has exited. */
void
sv_stop_instance(struct instance *in, enum after after, const char *why)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	if (!sv_alive(in)) {
		stop_idle(in, after);
		return;
	}
	in->after = after;
	if (in->state == ST_STOPPING)
		return;
	in->why = why;
	in->state = ST_STOPPING;
	in->t_health = in->t_fd = in->t_running = 0;
	sv_kill_checker(in);
	sv_event(s, "%s: stopping pid %d with %s (%s), SIGKILL after %.1f s", in->name, (int)in->pid,
	         sv_signal_name(c->stop_signal), why, c->stop_grace_ms / 1000.0);
	sv_signal_group(in, c->stop_signal);
	in->t_kill = gfs_mono_seconds() + c->stop_grace_ms / 1000.0;
}

void
sv_describe_status(int status, char *buf, size_t len)
{
	if (WIFEXITED(status))
		snprintf(buf, len, "exited with code %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "killed by %s%s", sv_signal_name(WTERMSIG(status)),
		         WCOREDUMP(status) ? " (core dumped)" : "");
	else
		snprintf(buf, len, "ended (status %d)", status);
}
