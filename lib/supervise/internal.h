/*
 * The supervisor's private header: the structures every part shares and
 * the calls between the parts. Nothing outside lib/supervise/ includes it
 * (the unit tests aside). Each part is one file, its design in its opening
 * comment:
 *
 *   loop.c      the event loop: epoll set, signals, the one timer and its
 *               table of instance deadlines; sv_new, sv_run, sv_free
 *   instance.c  programs and instances, the state table, asking one to stop
 *   spawn.c     starting an instance: pipes, environment, limits, fork/exec
 *   reap.c      what an exit means: reaping, adopted daemons, leftovers
 *   policy.c    what follows an exit or a restart_on match: backoff, FATAL,
 *               the restart budget, raising nofile
 *   output.c    children's output, line by line: to logs, relays, patterns
 *   relay.c     writing to our stdout/stderr without ever blocking
 *   checks.c    checks on a running instance: health probes, descriptors
 *   control.c   the control socket, its client and its requests
 *   reload.c    configuration changes, requested (rolling) restarts, stop
 *   patterns.c  restart_on matching and command redaction
 *
 * Calls between parts are named sv_*; what a part keeps to itself is
 * static. Errors are events (sv_event): the supervisor never stops for a
 * program's trouble.
 */
#ifndef GFS_SV_INTERNAL_H
#define GFS_SV_INTERNAL_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "fdwatch.h"
#include "logrotate.h"
#include "supervise.h"

/* A descriptor-exhaustion hit this soon after a start means the limit, not a leak, is the problem. */
#define EMFILE_RECUR_S 10.0
#define RESTART_RING SV_MAX_RESTARTS
/* Output lines up to this long are matched whole; longer ones in pieces that overlap by LINE_OVERLAP. */
#define LINE_MAX_ 16384
#define LINE_OVERLAP 1024

/* Pure policy, exposed to the unit tests (policy.c, patterns.c). */

/* Delay before restart number k+1 when k restarts happened in the window: 0, initial, 2*initial, ... capped. */
int sv_backoff_ms(int initial_ms, int max_ms, int k);
/* How many of times[0..n) fall within (now - window, now]. */
int sv_count_recent(const double *times, size_t n, double now, double window);

struct sv_patterns {
	regex_t *re;
	char **lit;     /* a substring every match contains (or NULL): skips most regexec calls */
	size_t n;
};
bool sv_patterns_compile(struct sv_patterns *p, char *const *patterns, size_t n, char *err,
                         size_t errlen);
/*
 * The longest run of plain characters that every match of the extended
 * regex must contain, matched case-insensitively (malloc'd), or NULL when
 * none of at least 3 characters can be proven.
 */
char *sv_required_literal(const char *re);
/* The index of the first pattern matching line, or -1. */
int sv_patterns_match(const struct sv_patterns *p, const char *line);
void sv_patterns_free(struct sv_patterns *p);
/* True when line reports running out of descriptors (whatever restart_on says). */
bool sv_line_is_emfile(const char *line);
enum state { ST_STOPPED, ST_STARTING, ST_RUNNING, ST_BACKOFF, ST_STOPPING, ST_FATAL, ST_EXITED,
             ST_WAITING };

/* What each state means to the other parts (instance.c has the table). */
struct state_info {
	const char *name;       /* as status shows it */
	bool up;                /* started and not being stopped: checked, and matched by restart_on */
	bool settling;          /* on its way up or down: a rolling restart waits for it */
	bool idle;              /* given up or done: nothing will start it by itself */
};
extern const struct state_info sv_states[];

/* What to do once a stopping child has exited. */
enum after { AFTER_POLICY, AFTER_NOW, AFTER_STOP };

/* What woke the loop; loop.c's table maps each kind to its handler. */
enum wkind { W_SIGNAL, W_TIMER, W_CONTROL, W_CLIENT, W_OUTPUT, W_PIDFD, W_CHECKER, W_RELAY };

struct watch {
	enum wkind kind;
	void *ptr;
};

struct program;
struct instance;

/* One of a child's output pipes, read line by line. */
struct stream {
	struct instance *in;
	bool is_err;            /* the child's standard error */
	int fd;
	struct watch w;
	size_t len;             /* buf[0..len) is held */
	size_t seen;            /* buf[0..seen): the tail of an overlong line, passed on already */
	char buf[LINE_MAX_];
};

struct instance {
	struct program *prog;
	struct sv *sv;
	int index;
	char name[96];
	enum state state;
	pid_t pid, pgid;
	int pidfd;
	struct watch w_pid, w_chk;
	struct stream out, err;
	struct logfile *log;
	double started_at;
	double restart_times[RESTART_RING];
	size_t nring;
	unsigned restarts;
	enum after after;
	const char *why;        /* why it is being stopped, for the restart message */
	bool emfile_cause;      /* the current stop was for running out of descriptors */
	bool exiting;           /* draining the output of a child that has exited */
	bool last_emfile;       /* the previous restart was for that too */
	bool pattern_held;      /* a match went unanswered: the restart budget is spent */
	long nofile_next;       /* a raised nofile for the next start; 0: the configured one */
	char last_exit[96];
	/* deadlines, monotonic seconds; 0 = none (loop.c's timer table lists them) */
	double t_start, t_kill, t_running, t_health, t_check_deadline, t_fd;
	/* what the exited main process left in its group after a stop signal: SIGKILLed at t_group_kill */
	pid_t leftover_pgid;
	double t_group_kill;
	/* health */
	pid_t checker;
	int checker_pidfd, checker_pipe;
	int health_failures;
	int health;             /* -1 unknown, 0 failing, 1 ok */
	char health_msg[400];
	/* descriptors */
	struct fdw_trend trend;
	struct fdw_counts fds;
	long fd_soft, fd_hard;
	bool fd_warned;
};

struct program {
	struct sv_program cfg;
	struct sv_patterns pats;
	struct instance *inst;
	int ninst;
	int listen_fd;
	bool removing;
	struct program *replacement;
	int rolling;            /* next instance of a rolling restart, -1 none */
	struct program *next;
};

struct client {
	struct sv *sv;
	int fd;
	struct watch w;
	char buf[512];
	size_t len;
	bool waiting_stop;      /* answered "stop": closed when the supervisor exits */
	struct client *next;
};

/* Children's output without a log file, or event lines, on their way to a descriptor. */
struct relay {
	int fd;                 /* -1: the output goes nowhere */
	bool own;               /* fd is our own opening of the caller's: closed at the end */
	bool sock;              /* written with MSG_DONTWAIT: the socket's flags are shared */
	bool watched;           /* in epoll, waiting for fd to become writable */
	char *buf;              /* max + 1 bytes once needed */
	size_t max;
	size_t off, len;        /* buf[off..len) is still to be written */
	unsigned long long dropped, dropped_lines; /* since the buffer last emptied */
	const char *what;       /* "standard output" or "standard error", for messages */
	struct watch w;
};

struct sv {
	struct sv_callbacks cb;
	struct relay out, err;
	struct relay *ev;       /* where event lines go: &err, or &out when both are one file */
	char *config_path;
	char *control_path;
	struct program *progs;
	struct client *clients;
	int epfd, sigfd, timerfd, ctlfd;
	struct watch w_sig, w_timer, w_ctl;
	bool stopping;
	char stop_why[64];      /* what sv_stop_all was told, for the programs it stops later */
	int stop_signals;
	double t_accept;        /* watch the control socket again then; 0: watched */
	double t_watchdog;      /* send WATCHDOG=1 then; 0: systemd asked for none */
	double watchdog_s;      /* half the interval systemd asked for */
};

/* loop.c */
void sv_event(struct sv *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sv_ep_add(struct sv *s, int fd, struct watch *w, enum wkind kind, void *ptr);
void sv_ep_close(struct sv *s, int *fd);
void sv_self_fd_note(struct sv *s, const char *what);
void sv_notify(struct sv *s, const char *state);

/* instance.c */
struct program *sv_prog_new(struct sv *s, const struct sv_program *cfg);
void sv_prog_free(struct program *p);
bool sv_alive(const struct instance *in);
bool sv_prog_quiet(const struct program *p);
void sv_signal_group(struct instance *in, int sig);
void sv_kill_checker(struct instance *in);
void sv_stop_instance(struct instance *in, enum after after, const char *why);
void sv_describe_status(int status, char *buf, size_t len);

/* spawn.c */
int sv_pidfd_open(pid_t pid);
bool sv_nofile_limits(const struct instance *in, struct rlimit *rl);
void sv_arm_watches(struct instance *in);
void sv_start_instance(struct instance *in);

/* reap.c */
void sv_reap(struct sv *s);
void sv_kill_leftovers(struct instance *in);

/* policy.c */
void sv_schedule_restart(struct instance *in, const char *why);
void sv_after_exit(struct instance *in, int status, bool was_stopping);
void sv_restart_for_pattern(struct instance *in, const char *line, int which);

/* output.c */
void sv_stream_open(struct instance *in, struct stream *st, int fd);
void sv_handle_output(struct stream *st, bool drain_all);
void sv_drain_stream(struct stream *st);

/* relay.c */
void sv_relays_open(struct sv *s, const struct sv_callbacks *cb);
void sv_relay_close(struct sv *s, struct relay *r);
void sv_relay_flush(struct sv *s, struct relay *r);
void sv_relay_printf(struct sv *s, struct relay *r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void sv_relay_event(struct sv *s, const char *line);
void sv_relay_drain(struct sv *s, struct relay *r, double deadline);

/* checks.c */
void sv_start_check(struct instance *in);
void sv_on_checker_exit(struct instance *in, int status);
void sv_sample_fds(struct instance *in);

/* control.c */
int sv_bind_control(const char *path, bool is_default, bool *busy, char *err, size_t errlen);
void sv_on_accept(struct sv *s);
void sv_on_client(struct sv *s, struct client *cl);
/* Answers and lets go the clients waiting for a stop, and closes the control socket. */
void sv_clients_stopped(struct sv *s);
/* Closes the control socket and removes its path; nothing if closed already. */
void sv_control_close(struct sv *s);
void sv_clients_free(struct sv *s);

/* reload.c */
void sv_rolling_advance(struct program *p);
bool sv_restart_named(struct sv *s, const char *name, char *msg, size_t len);
void sv_append_program(struct sv *s, struct program *np);
void sv_start_program(struct program *p);
void sv_finish_program_removal(struct sv *s);
void sv_reload(struct sv *s);
void sv_stop_all(struct sv *s, const char *why);
void sv_release_idle_listen(struct sv *s);
bool sv_after_ready(const struct program *p);
void sv_advance_order(struct sv *s);
bool sv_all_quiet(struct sv *s);

#endif
