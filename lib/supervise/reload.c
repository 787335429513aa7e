/*
 * Changes to what runs: a reload (SIGHUP or the "reload" request) compares
 * the new configuration with the running one, program by program. An
 * unchanged program keeps running; a changed one is stopped, and its
 * replacement, waiting in ->replacement, starts once every process of the
 * old one is gone (and takes over its listen socket when the address is
 * the same, so clients are never refused across the change); a removed
 * one is stopped and freed. A requested restart of a program goes through
 * its instances one at a time (rolling), each waiting until the one before
 * is up. Stopping everything (a signal, the "stop" request) is here too.
 *
 * The order between programs (after = NAME): an instance whose program is
 * after another waits (WAITING) until that one is up and healthy, and on
 * stop a program is stopped only once no program after it runs. Both are
 * decided again after every batch of events (sv_advance_order), since
 * what they wait for is a health check, a startsecs or an exit.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Restarts the instances of p one at a time, so a shared socket always has someone accepting. */
void
sv_rolling_advance(struct program *p)
{
	if (p->rolling < 0)
		return;
	if (p->rolling > 0) {
		struct instance *prev = &p->inst[p->rolling - 1];
		if (sv_states[prev->state].settling)
			return; /* not up yet */
	}
	if (p->rolling >= p->ninst) {
		p->rolling = -1;
		return;
	}
	struct instance *in = &p->inst[p->rolling++];
	in->nring = 0; /* a requested restart starts a fresh restart window, FATAL or not */
	sv_stop_instance(in, AFTER_NOW, "restart requested");
	if (!sv_alive(in) && in->state == ST_RUNNING)
		sv_rolling_advance(p);
}

/* The program of that name, being removed or not: there is at most one. */
static struct program *
find_program(struct sv *s, const char *name)
{
	for (struct program *p = s->progs; p; p = p->next)
		if (strcmp(p->cfg.name, name) == 0)
			return p;
	return NULL;
}

bool
sv_restart_named(struct sv *s, const char *name, char *msg, size_t len)
{
	bool any = false;
	for (struct program *p = s->progs; p; p = p->next) {
		if (p->removing)
			continue;
		if (strcmp(p->cfg.name, name) == 0 || strcmp(name, "all") == 0) {
			sv_event(s, "%s: restart requested", p->cfg.name);
			p->rolling = 0;
			sv_rolling_advance(p);
			any = true;
			continue;
		}
		for (int i = 0; i < p->ninst; i++)
			if (strcmp(p->inst[i].name, name) == 0) {
				struct instance *in = &p->inst[i];
				sv_event(s, "%s: restart requested", in->name);
				in->nring = 0;
				sv_stop_instance(in, AFTER_NOW, "restart requested");
				any = true;
			}
	}
	snprintf(msg, len, any ? "restarting %s" : "no program or instance named '%s'", name);
	return any;
}

void
sv_append_program(struct sv *s, struct program *np)
{
	struct program **pp = &s->progs;
	while (*pp)
		pp = &(*pp)->next;
	*pp = np;
}

void
sv_start_program(struct program *p)
{
	for (int i = 0; i < p->ninst; i++)
		sv_start_instance(&p->inst[i]);
}

/* Frees programs being removed once all their processes are gone; starts replacements. */
void
sv_finish_program_removal(struct sv *s)
{
	struct program **pp = &s->progs;
	while (*pp) {
		struct program *p = *pp;
		if (!p->removing || !sv_prog_quiet(p)) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		struct program *r = p->replacement;
		if (r && p->listen_fd >= 0 && r->cfg.listen && p->cfg.listen &&
		    strcmp(r->cfg.listen, p->cfg.listen) == 0) {
			r->listen_fd = p->listen_fd; /* keep accepting across the change */
			p->listen_fd = -1;
		}
		sv_event(s, "%s: %s", p->cfg.name, r ? "stopped; starting it with the new configuration"
		                                     : "removed");
		sv_prog_free(p);
		if (r && !s->stopping) {
			sv_append_program(s, r);
			sv_start_program(r);
		} else if (r) {
			sv_prog_free(r);
		}
	}
}

static void
remove_program(struct program *p, struct program *replacement)
{
	p->removing = true;
	p->replacement = replacement;
	for (int i = 0; i < p->ninst; i++)
		sv_stop_instance(&p->inst[i], AFTER_STOP, replacement ? "configuration changed" : "removed from the configuration");
}

/*
 * A program still stopping from an earlier reload: the newest configuration
 * replaces what was to start after it (np NULL: nothing starts).
 */
static void
replace_pending(struct program *p, struct program *np)
{
	if (p->replacement)
		sv_prog_free(p->replacement);
	p->replacement = np;
}

/* Applies one program of the new configuration; returns 'a'dded, 'c'hanged or 0. */
static int
reload_program(struct sv *s, const struct sv_program *cfg)
{
	struct program *old = find_program(s, cfg->name);
	if (old && !old->removing && sv_program_equal(&old->cfg, cfg))
		return 0;
	if (old && old->removing && old->replacement &&
	    sv_program_equal(&old->replacement->cfg, cfg))
		return 0;
	struct program *np = sv_prog_new(s, cfg);
	if (!old) {
		sv_append_program(s, np);
		sv_start_program(np);
		return 'a';
	}
	if (old->removing)
		replace_pending(old, np);
	else
		remove_program(old, np);
	return 'c';
}

void
sv_reload(struct sv *s)
{
	if (!s->config_path) {
		sv_event(s, "SIGHUP: no configuration file to re-read (quick form)");
		return;
	}
	if (s->stopping) {
		sv_event(s, "not reloading: stopping");
		return;
	}
	struct sv_config cfg;
	char err[600];
	if (!sv_config_load(s->config_path, &cfg, err, sizeof err)) {
		sv_event(s, "reload failed, keeping the running configuration: %s", err);
		return;
	}
	sv_event(s, "reloading %s", s->config_path);
	int added = 0, changed = 0, removed = 0;
	for (struct program *p = s->progs; p; p = p->next) {
		bool keep = false;
		for (size_t i = 0; i < cfg.nprogs; i++)
			if (strcmp(cfg.progs[i].name, p->cfg.name) == 0)
				keep = true;
		if (keep || (p->removing && !p->replacement))
			continue;
		if (p->removing)
			replace_pending(p, NULL);
		else
			remove_program(p, NULL);
		removed++;
	}
	for (size_t i = 0; i < cfg.nprogs; i++) {
		int what = reload_program(s, &cfg.progs[i]);
		added += what == 'a';
		changed += what == 'c';
	}
	sv_event(s, "reloaded: %d added, %d changed, %d removed", added, changed, removed);
	sv_config_free(&cfg);
	sv_finish_program_removal(s);
}

/* Up: past startsecs (RUNNING), and its health check passing if it has one. */
static bool
instance_ready(const struct instance *in)
{
	if (!sv_states[in->state].up)
		return false;
	return in->prog->cfg.health ? in->health == 1 : in->state == ST_RUNNING;
}

bool
sv_after_ready(const struct program *p)
{
	if (!p->cfg.after)
		return true;
	const struct program *q = find_program(p->inst[0].sv, p->cfg.after);
	if (!q || q->removing)
		return false; /* a changed one: its replacement is not running yet */
	for (int i = 0; i < q->ninst; i++)
		if (!instance_ready(&q->inst[i]))
			return false;
	return true;
}

/* Whether a program after p still has a process: p must outlive it. */
static bool
needed(struct sv *s, const struct program *p)
{
	for (struct program *q = s->progs; q; q = q->next)
		if (q != p && q->cfg.after && strcmp(q->cfg.after, p->cfg.name) == 0 && !sv_prog_quiet(q))
			return true;
	return false;
}

static void
stop_program(struct sv *s, struct program *p)
{
	bool wait = needed(s, p);
	for (int i = 0; i < p->ninst; i++) {
		struct instance *in = &p->inst[i];
		/* A process outlives its dependents; one that does not run has nothing to order. */
		if (sv_alive(in) ? !wait : in->state != ST_STOPPED)
			sv_stop_instance(in, AFTER_STOP, s->stop_why);
	}
}

void
sv_stop_all(struct sv *s, const char *why)
{
	if (!s->stopping) {
		sv_event(s, "stopping every program (%s)", why);
		sv_notify(s, "STOPPING=1");
		snprintf(s->stop_why, sizeof s->stop_why, "%s", why);
	}
	s->stopping = true;
	for (struct program *p = s->progs; p; p = p->next) {
		p->rolling = -1;
		stop_program(s, p);
	}
}

void
sv_advance_order(struct sv *s)
{
	for (struct program *p = s->progs; p; p = p->next) {
		if (s->stopping) {
			stop_program(s, p);
			continue;
		}
		if (p->removing || !sv_after_ready(p))
			continue;
		for (int i = 0; i < p->ninst; i++)
			if (p->inst[i].state == ST_WAITING)
				sv_start_instance(&p->inst[i]);
	}
}

/*
 * A held socket with no instance left to accept on it would queue every
 * connection until it timed out: closed instead, connections are refused
 * at once. The next start binds it again.
 */
void
sv_release_idle_listen(struct sv *s)
{
	if (s->stopping)
		return; /* and a program being replaced hands its socket on */
	for (struct program *p = s->progs; p; p = p->next) {
		if (p->listen_fd < 0 || p->removing)
			continue;
		bool idle = true;
		for (int i = 0; i < p->ninst && idle; i++)
			idle = !sv_alive(&p->inst[i]) &&
			       sv_states[p->inst[i].state].idle;
		if (!idle)
			continue;
		close(p->listen_fd);
		p->listen_fd = -1;
		sv_event(s, "%s: no instance left to accept on %s: closed the listen socket, so that "
		         "connections are refused, not left waiting", p->cfg.name, p->cfg.listen);
	}
}

bool
sv_all_quiet(struct sv *s)
{
	for (struct program *p = s->progs; p; p = p->next)
		if (!sv_prog_quiet(p))
			return false;
	return true;
}
