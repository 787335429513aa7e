/*
 * The configuration of gridfsctl supervise: an INI file with a [supervise]
 * section for the supervisor and one [program:NAME] section per child.
 * Parsing is pure (no processes, no sockets) so it can be unit tested.
 */
#ifndef GFS_SVCONFIG_H
#define GFS_SVCONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Patterns that mean "the process ran out of descriptors"; the default restart_on. */
extern const char *const sv_default_patterns[];

/* The supervisor remembers this many restart times: max_restarts cannot be higher. */
#define SV_MAX_RESTARTS 64
/* A shorter backoff_initial would let a crashing program fork as fast as it can. */
#define SV_MIN_BACKOFF_MS 10

/* restart_on_stream: what a program says about itself goes to stderr; its data may go to stdout. */
enum { SV_STREAM_STDERR, SV_STREAM_STDOUT, SV_STREAM_BOTH };

struct sv_program {
	char *name;
	char **argv;            /* the split command, NULL-terminated */
	char *command;          /* as written, for messages and change detection */
	char *directory;        /* NULL: the supervisor's */
	char **env;             /* "KEY=VALUE" entries added to the supervisor's environment */
	size_t nenv;
	char *user;             /* NULL: do not change user */
	long nofile;            /* soft RLIMIT_NOFILE before exec; 0 keeps the inherited one */
	long nofile_hard;       /* hard limit; 0 keeps the inherited one (raised to nofile if lower) */
	char **patterns;        /* restart_on, POSIX extended regexes, matched case-insensitively */
	size_t npatterns;
	bool patterns_given;    /* the first restart_on line replaces the defaults */
	int restart_on_stream;  /* which output restart_on reads: SV_STREAM_* */
	char *health;           /* mongodb://... or http://host:port/path; NULL: none */
	int health_interval_ms;
	int health_timeout_ms;
	int health_retries;     /* consecutive failures before a restart */
	int stop_signal;
	int stop_grace_ms;
	int instances;
	char *listen;           /* HOST:PORT the supervisor binds and passes as LISTEN_FDS */
	char *log;              /* child output; NULL: copied to the supervisor's stdout */
	uint64_t log_max;       /* rotate when the log would exceed this; 0: never */
	int log_backups;
	bool autorestart;       /* restart after a clean exit too */
	int startsecs;          /* up this long counts as started */
	int backoff_initial_ms;
	int backoff_max_ms;
	int max_restarts;       /* more restarts than this within restart_window: FATAL */
	int restart_window_s;
	int fd_interval_ms;     /* descriptor sampling period; 0 disables the watch */
	int fd_threshold_pct;   /* act above this share of the soft limit */
	int fd_horizon_s;       /* act when the trend exhausts the limit within this */
	bool fd_raise;          /* raise the soft limit live before restarting */
	char *after;            /* start once this program is up and healthy, stop before it; NULL: none */
	int after_line;         /* where its after key is (0: not from a file) */
	int line;               /* where its section starts in the file (0: not from a file) */
	int command_line;       /* where its command key is (0: not from a file) */
};

struct sv_config {
	char *control;          /* control socket path; NULL: the default */
	char *logdir;           /* default directory for program logs */
	struct sv_program *progs;
	size_t nprogs;
};

/* Fills p with the defaults; name is copied. */
void sv_program_defaults(struct sv_program *p, const char *name);
void sv_program_free(struct sv_program *p);
/* Copies src into dst (deep). */
void sv_program_copy(struct sv_program *dst, const struct sv_program *src);
/* True when running a and b would differ (restart needed on reload). */
bool sv_program_equal(const struct sv_program *a, const struct sv_program *b);

/* Sets one key of a program. Returns false with a message in err. */
bool sv_program_set(struct sv_program *p, const char *key, const char *value, char *err, size_t errlen);
/* Checks a finished program (command present, patterns compile, ...). */
bool sv_program_check(const struct sv_program *p, char *err, size_t errlen);

/* Parses a config file or string. On failure err holds "FILE:LINE: message". */
bool sv_config_load(const char *path, struct sv_config *out, char *err, size_t errlen);
bool sv_config_parse(const char *text, const char *name, struct sv_config *out, char *err,
                     size_t errlen);
void sv_config_free(struct sv_config *c);

/*
 * Splits a command line the way a shell splits words, without expansions:
 * blanks separate words, '...' quotes literally, "..." quotes with \" \\ \$
 * escapes, and a backslash outside quotes escapes the next character.
 * Returns a NULL-terminated array (free with sv_argv_free), or NULL on an
 * unterminated quote or an empty command.
 */
char **sv_split_command(const char *s);
void sv_argv_free(char **argv);

/* Parses "TERM", "SIGTERM", "15" into a signal number. */
int sv_parse_signal(const char *s);
const char *sv_signal_name(int sig);

#endif
