/*
 * The restart policy: what follows an exit, a restart_on match, or running
 * out of descriptors. Restarts back off exponentially (backoff_initial
 * doubling up to backoff_max); more than max_restarts of them within
 * restart_window make the instance FATAL until someone asks for a restart.
 * What follows an exit depends on why the instance was stopped (enum
 * after): the table at the end has one row for each. Output matches never
 * make an instance FATAL, since a line can be a client's words: they get
 * what is left of the restart budget and no more.
 */
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "../util.h"
#include "internal.h"

int
sv_backoff_ms(int initial_ms, int max_ms, int k)
{
	if (k <= 0)
		return 0;
	double d = initial_ms;
	for (int i = 1; i < k && d < max_ms; i++)
		d *= 2;
	return d > max_ms ? max_ms : (int)d;
}

int
sv_count_recent(const double *times, size_t n, double now, double window)
{
	int k = 0;
	for (size_t i = 0; i < n; i++)
		if (times[i] > now - window && times[i] <= now)
			k++;
	return k;
}

void
sv_schedule_restart(struct instance *in, const char *why)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	double t = gfs_mono_seconds();
	int k = sv_count_recent(in->restart_times, in->nring < RESTART_RING ? in->nring : RESTART_RING,
	                        t, c->restart_window_s);
	if (k >= c->max_restarts) {
		in->state = ST_FATAL;
		sv_event(s, "%s: giving up: %d restarts within %d s (max_restarts %d); FATAL until "
		         "'gridfsctl supervise restart %s'", in->name, k, c->restart_window_s,
		         c->max_restarts, in->name);
		return;
	}
	int delay = sv_backoff_ms(c->backoff_initial_ms, c->backoff_max_ms, k);
	in->restart_times[in->nring % RESTART_RING] = t;
	in->nring++;
	in->restarts++;
	in->state = ST_BACKOFF;
	/*
	 * Even with no delay the start goes through the timer: sv_start_instance
	 * calls us when it fails, and must not recurse.
	 */
	in->t_start = t + delay / 1000.0;
	sv_event(s, "%s: restarting in %.1f s (%s; restart %d within %d s)", in->name, delay / 1000.0,
	         why, k + 1, c->restart_window_s);
}

/*
 * Pattern restarts get the restart budget that is left, and never more: a
 * restart for a pattern must not be what makes a program FATAL, since the
 * line may say nothing about its health. Once the budget is spent a match
 * is reported (once) and the program left running; crashes and failed
 * health checks still count as ever.
 */
static bool
pattern_budget_spent(struct instance *in, int which)
{
	const struct sv_program *c = &in->prog->cfg;
	int k = sv_count_recent(in->restart_times, in->nring < RESTART_RING ? in->nring : RESTART_RING,
	                        gfs_mono_seconds(), c->restart_window_s);
	if (k < c->max_restarts) {
		in->pattern_held = false;
		return false;
	}
	if (!in->pattern_held)
		sv_event(in->sv, "%s: output matched restart_on '%s' again after %d restarts within %d s "
		         "(max_restarts): not restarting it for a pattern; it keeps running", in->name,
		         c->patterns[which], k, c->restart_window_s);
	in->pattern_held = true;
	return true;
}

/*
 * Out of descriptors again right after a restart: the limit is too low, not
 * a leak. Returns false when the next start cannot get a higher limit, so
 * that restarting would not help.
 */
static bool
raise_next_nofile(struct instance *in, double up)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	long soft = -1, hard = -1;
	struct rlimit rl, own;
	getrlimit(RLIMIT_NOFILE, &own);
	if (!fdw_limits(in->pid, &soft, &hard)) {
		if (!sv_nofile_limits(in, &rl))
			rl = own;
		soft = rl.rlim_cur == RLIM_INFINITY ? -1 : (long)rl.rlim_cur;
	}
	/* The next start may go as high as nofile_hard, else as our own hard limit. */
	long cap = c->nofile_hard ? c->nofile_hard
	         : own.rlim_max == RLIM_INFINITY ? -1 : (long)own.rlim_max;
	long target = soft > 0 ? fdw_raise_target(soft, cap) : 0;
	if (soft > 0 && target > soft) {
		in->nofile_next = target;
		sv_event(s, "%s: out of descriptors again %.1f s after a restart with a limit of %ld: "
		         "the limit is too low for this load, not a leak; next start gets nofile %ld "
		         "(set nofile in the config)", in->name, up, soft, target);
		return true;
	}
	sv_event(s, "%s: out of descriptors again %.1f s after a restart, already at the highest "
	         "limit allowed (%ld): the limit is too low for this load; not restarting it, as "
	         "that cannot help; raise nofile_hard or the supervisor's own limit",
	         in->name, up, soft);
	return false;
}

void
sv_restart_for_pattern(struct instance *in, const char *line, int which)
{
	const struct sv_program *c = &in->prog->cfg;
	if (!sv_states[in->state].up)
		return;
	if (pattern_budget_spent(in, which))
		return;
	bool emfile = sv_line_is_emfile(line);
	sv_event(in->sv, "%s: output matched restart_on '%s': %.300s", in->name, c->patterns[which],
	         line);
	double up = gfs_mono_seconds() - in->started_at;
	in->emfile_cause = emfile;
	if (emfile && in->last_emfile && up < EMFILE_RECUR_S && !raise_next_nofile(in, up))
		return;
	if (!in->exiting) /* an exited child is restarted by the exit policy */
		sv_stop_instance(in, AFTER_POLICY, "restart_on pattern");
}

/* The stop was for the supervisor, or for a program leaving the configuration. */
static void
exit_stopped(struct instance *in, int status, bool was_stopping)
{
	in->state = ST_STOPPED;
}

/* A requested restart: start again at once, and go on with a rolling restart. */
static void
exit_restart_now(struct instance *in, int status, bool was_stopping)
{
	in->state = ST_STOPPED;
	in->last_emfile = false;
	sv_start_instance(in);
	if (in->prog->rolling >= 0)
		sv_rolling_advance(in->prog);
}

/* A crash, a match, a failed check: restart after a backoff, unless done or given up. */
static void
exit_by_policy(struct instance *in, int status, bool was_stopping)
{
	bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
	if (!was_stopping && !in->prog->cfg.autorestart && clean) {
		in->state = ST_EXITED;
		return;
	}
	in->last_emfile = in->emfile_cause;
	sv_schedule_restart(in, was_stopping && in->why ? in->why : in->last_exit);
	if (in->prog->rolling >= 0)
		sv_rolling_advance(in->prog);
}

static void (*const after_exit[])(struct instance *in, int status, bool was_stopping) = {
	[AFTER_POLICY] = exit_by_policy,
	[AFTER_NOW] = exit_restart_now,
	[AFTER_STOP] = exit_stopped,
};

/* The instance has exited and its output is drained: what happens next. */
void
sv_after_exit(struct instance *in, int status, bool was_stopping)
{
	enum after after = in->after; /* read after the drain, whose last lines may change it */
	in->after = AFTER_POLICY;
	if (in->sv->stopping || in->prog->removing)
		after = AFTER_STOP;
	after_exit[after](in, status, was_stopping);
}
