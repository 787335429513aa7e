/* The command-line side of gridfsctl: option parsing, output, exit codes. */
#ifndef GRIDFSCTL_CMD_H
#define GRIDFSCTL_CMD_H

#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../lib/gfs.h"
#include "../lib/read_strategy.h"

/* Exit codes, documented in gridfsctl(1). */
enum {
	EXIT_OK = 0,
	EXIT_PARTIAL = 1,    /* some items failed, differ, or problems were found */
	EXIT_USAGE = 2,      /* bad command line or configuration */
	EXIT_BACKEND = 3,    /* backend unreachable, or a server command failed */
	EXIT_NOTFOUND = 4,   /* the named file, id or revision does not exist */
	EXIT_LOCAL = 5,      /* a local file could not be read or written */
	EXIT_BUSY = 6,       /* another process holds the lock */
	EXIT_LIMIT = 7,      /* --max-delete: the run would have deleted more; it deleted nothing */
	EXIT_INTERRUPTED = 130,
};

/* Settings shared by every subcommand (connection, verbosity). */
struct globals {
	const char *uri;     /* from --uri, $GRIDFSCTL_URI, the config file, or the default */
	const char *db;      /* NULL: from the URI path, else "test" */
	const char *bucket;  /* NULL: "fs" */
	bool quiet;
	bool progress;       /* stderr is a terminal (or --progress, --stats), not -q or --no-progress */
	double stats_s;      /* --stats: a plain progress line every this many seconds; 0: a bar */
};

extern struct globals G;
extern const char *progname;   /* "gridfsctl" */
extern const char *cmdname;    /* the subcommand being run, for messages */

/*
 * A command describes itself (as tmux's cmd_entry, git's OPT_* rows): each
 * cmd/VERB.c exports cmd_VERB_entry, and its option rows are the one place
 * an option is written down. The getopt tables, --help, the usage line and
 * what _options and _complete tell the shell completions are all derived
 * from them (cmd/rows.c, cmd/complete.c), so they cannot disagree.
 *
 * A row is an option (name set), a group of rows shared by several verbs
 * (group set: CMD_OPT_GROUP), a heading in --help (only help set), a
 * control word taken as an operand (word set, like supervise's "status"),
 * a deprecated spelling of an option (alias_of set: CMD_OPT_ALIAS), or the
 * end (all unset).
 *
 * A deprecated spelling keeps an old letter or name working for one
 * release: it parses as the option it names, with a one-line warning on
 * stderr. --help lists it apart, and the completions do not offer it.
 *
 * An option row also says what its argument becomes, as git's OPT_INTEGER
 * and lib/supervise/svconfig.c's keys[] do: a row with a kind (below) is
 * taken by parse_options() itself (cmd/optvalue.c), and the verb's on_opt
 * sees only the rows that are really its own (kind CMD_CALL). Such a row
 * writes into the options struct the verb hands parse_options() as ctx, at
 * .to = CMD_TO(that struct, field): a row of one verb names one struct,
 * and a group shared by several verbs has CMD_CALL rows only. A number
 * outside min..max, or malformed, is a usage error (exit 2) whose one line
 * is .bad, a printf format given the argument (it may leave it out).
 */
enum cmd_opt_kind {
	CMD_CALL,      /* on_opt takes it (the default) */
	CMD_SET,       /* a flag: the bool becomes true */
	CMD_CLEAR,     /* a flag: the bool becomes false */
	CMD_STRING,    /* the argument itself (argv lives as long as the run); min 1: not empty */
	CMD_COUNT,     /* an integer in min..max (parse_int: max at most LONG_MAX) */
	CMD_BYTES,     /* a size with an optional suffix, 64K, 1M (parse_size), in min..max */
	CMD_MS,        /* a duration (500ms, 2s, 1m; bare: seconds), as ms in min..max */
	CMD_WORD,      /* one of .values, as its index among them (0 for the first) */
};
/*
 * The C type of the field a row writes: CMD_TO reads it off the field, so
 * that no row writes a long into an int.
 */
enum cmd_opt_type {
	CMD_T_BOOL = 1, CMD_T_STRING, CMD_T_INT, CMD_T_LONG, CMD_T_UINT, CMD_T_ULONG, CMD_T_ULLONG,
};
struct cmd_opt_to {
	size_t off;
	enum cmd_opt_type type;
};
#define CMD_TO(type, field) {offsetof(type, field), CMD_TYPE_OF(((type *)0)->field)}
/* Not evaluated: only the field's type is looked at. Any other type does not compile. */
#define CMD_TYPE_OF(x) _Generic((x), bool: CMD_T_BOOL, const char *: CMD_T_STRING, \
	int: CMD_T_INT, long: CMD_T_LONG, unsigned: CMD_T_UINT, unsigned long: CMD_T_ULONG, \
	unsigned long long: CMD_T_ULLONG)

struct cmd_opt {
	char shortopt;        /* 0: none */
	const char *name;     /* the long option, without "--" */
	const char *arg;      /* its argument as --help names it (N, DIR, FILE|-); NULL: a flag */
	const char *help;     /* one paragraph; --help wraps it, completions shorten it */
	int id;               /* what getopt and opt_fn receive; 0: shortopt */
	const char *values;   /* the words an enumerated argument takes, space-separated */
	const char *word;     /* a control word */
	const struct cmd_opt *group;
	const char *alias_of; /* the long name of the option this spelling is deprecated for */
	enum cmd_opt_kind kind;
	struct cmd_opt_to to; /* where a row with a kind writes, in the verb's options struct */
	uint64_t min, max;    /* CMD_COUNT, CMD_BYTES, CMD_MS (in ms); CMD_STRING: min */
	const char *bad;      /* the usage error for a value out of range or malformed */
};
/* A row: CMD_OPT('p', "prefix", "P", "help"), more fields designated: .id = ..., .values = ... */
#define CMD_OPT(s, l, a, h, ...) {.shortopt = (s), .name = (l), .arg = (a), .help = (h), __VA_ARGS__}
#define CMD_OPT_WORD(w, a, h) {.word = (w), .arg = (a), .help = (h)}
#define CMD_OPT_GROUP(rows) {.group = (rows)}
#define CMD_OPT_HEADING(text) {.help = (text)}
/* -s or --long (NULL: none) as a deprecated spelling of --target; an id of its own when long. */
#define CMD_OPT_ALIAS(s, l, a, target, ...) \
	{.shortopt = (s), .name = (l), .arg = (a), .alias_of = (target), __VA_ARGS__}
#define CMD_OPT_END {.name = NULL}

/* An exit status a command returns, and when. */
struct cmd_exit {
	int code;             /* -1 ends the list */
	const char *why;
};

/* Written with designated initialisers (.name = "ls", ...): an unset field is NULL. */
struct cmd_entry {
	const char *name;
	const char *summary;  /* one line */
	const char *operands; /* after the options in the usage line: "DIR", "NAME|--id OID" */
	const struct cmd_opt *opts;
	const struct cmd_exit *exits;
	int (*run)(int argc, char **argv);
};

/* Walks rows with the groups (and theirs) spliced in; cmd_opt_next() returns NULL after the last. */
enum { CMD_OPT_DEPTH = 3 };
struct cmd_opt_iter {
	const struct cmd_opt *at[CMD_OPT_DEPTH];
	int depth;
};
void cmd_opt_begin(struct cmd_opt_iter *it, const struct cmd_opt *rows);
const struct cmd_opt *cmd_opt_next(struct cmd_opt_iter *it);
/* What opt_fn receives for the row. */
int cmd_opt_id(const struct cmd_opt *o);
/* Whether the row is an option to list, offer and complete: named, and not a deprecated spelling. */
bool cmd_opt_listed(const struct cmd_opt *o);
/*
 * When id is a deprecated spelling among rows, warns once on stderr that
 * it goes in the next release and returns the id of the option it names;
 * else returns id.
 */
int cmd_opt_resolve(const struct cmd_opt *rows, int id);

/* Every command, NULL-terminated (cmd/commands.c). */
extern const struct cmd_entry *const commands[];
/* The command called name, or NULL. */
const struct cmd_entry *find_command(const char *name);
/* The global options (cmd/globals.c), and those with --version, taken only before a command. */
extern const struct cmd_opt global_opts[], leading_opts[];
/* Their ids (what cmd/options.c's parser switches on): above every verb's own. */
enum { OPT_URI = 0x1000, OPT_DB, OPT_BUCKET, OPT_QUIET, OPT_NO_PROGRESS, OPT_PROGRESS, OPT_STATS,
       OPT_HELP, OPT_VERSION };

/*
 * Derived from the rows (cmd/rows.c): the options part of --help, and a
 * command's whole --help; the getopt tables, for the command's rows and
 * then extra (NULL-terminated shorts and longs, caller frees both).
 */
void print_opt_rows(FILE *out, const struct cmd_opt *rows);
void print_command_help(FILE *out, const struct cmd_entry *e);
void getopt_tables(const struct cmd_opt *rows, const struct cmd_opt *extra, char **shorts,
                   struct option **longs);
/*
 * "Did you mean": the word nearest to typed among those offered, when it
 * is close enough to be a typo of it (cmd/rows.c). nearest_option() offers
 * rows (a verb's own) and the global ones for a long option as typed
 * ("--prefx=a"); NULL when nothing is close.
 */
struct nearest {
	const char *typed, *best;
	size_t dist;
};
void nearest_begin(struct nearest *n, const char *typed);
void nearest_offer(struct nearest *n, const char *word);
const char *nearest_option(const struct cmd_opt *rows, const char *arg);
/* _options, _complete and _names, the verbs the shell completions call (cmd/complete.c). */
int run_completion_verb(int argc, char **argv);

/*
 * The name filters of import, watch, mirror and verify (rsync's and
 * rclone's): --exclude, --include, --exclude-from and --files-from, one
 * set of rows. A path is always relative: to DIR for a tree, to --prefix
 * for stored names. filter_option() takes their ids (1: not one of them,
 * -1: a usage error); filter_selects() is the one rule for stored names,
 * the walk's (lib/walk.h) with nothing hidden or temporary left out.
 */
struct name_filter {
	const char **include, **exclude;
	size_t n_include, n_exclude;
	char **files;          /* --files-from: the only paths taken, sorted; NULL: all */
	size_t n_files;
	char **lines;          /* what --exclude-from and --files-from read, freed with the filter */
	size_t n_lines;
};
extern const struct cmd_opt filter_opts[];
int filter_option(int id, const char *arg, struct name_filter *f);
bool filter_active(const struct name_filter *f);
bool filter_selects(const struct name_filter *f, const char *rel);
void free_name_filter(struct name_filter *f);

/*
 * The rows of the disk-tree selection import and watch share (prefix,
 * the name filters, hidden and temporary files, content type);
 * tree_option() takes their ids, and returns 1 when id is not one of
 * them, -1 after a usage error.
 */
struct tree_select {
	const char *prefix, *content_type;
	struct name_filter filter;
	bool hidden, temp;
};
extern const struct cmd_opt tree_opts[];
/*
 * --prefix of the verbs that read a prefix rather than store under one
 * (mirror, verify): the same letter, name and argument, the verb's help,
 * and more fields designated after it (.kind = ..., .to = ...).
 */
#define PREFIX_OPT(help, ...) CMD_OPT('p', "prefix", "P", help, __VA_ARGS__)
/* How an _id is written on the command line (--id ID), for the rows' help. */
#define ID_SYNTAX "24 hex digits (an ObjectId), or typed: oid:HEX, str:TEXT, int:N, long:N"
/* --rev N and its deprecated spelling -r, as get and stat take them (on_opt: 'R'). */
#define REV_OPTS \
	CMD_OPT(0, "rev", "N", "revision: -1 newest (default), -2 the one before, 0 the first", \
	        .id = 'R'), \
	CMD_OPT_ALIAS('r', NULL, "N", "rev")
int tree_option(int id, const char *arg, struct tree_select *t);
/* Copies the selection into walk options; the globs stay t's (free_tree_select). */
struct gfs_walk_opts;
void tree_select_walk(const struct tree_select *t, struct gfs_walk_opts *w);
void free_tree_select(struct tree_select *t);

/*
 * Parses argv for the command e: its own options plus the global ones,
 * which are accepted before or after the subcommand name. Stores each of
 * the subcommand's own options whose row has a kind into ctx, and calls
 * on_opt for the others (NULL: there are none). Handles --help. Returns
 * optind (index of the first operand), or -1 after printing a usage error.
 */
typedef int (*opt_fn)(int opt, const char *arg, void *ctx);
int parse_options(int argc, char **argv, const struct cmd_entry *e, opt_fn on_opt, void *ctx);
/*
 * One option of rows, id as getopt gave it (deprecated spellings resolved):
 * a row with a kind stores arg into ctx, any other goes to on_opt. 0, or
 * -1 after a usage error.
 */
int cmd_opt_take(const struct cmd_opt *rows, int id, const char *arg, opt_fn on_opt, void *ctx);

/*
 * Handles one global option at argv[0] (with its argument in argv[1] or
 * after '='). Returns how many argv entries it used, 0 if argv[0] is not a
 * global option, -1 after a usage error.
 */
int global_option(int argc, char **argv);
/* Fills in G from $GRIDFSCTL_URI and the config file where argv left it unset (cmd/settings.c). */
int load_settings(void);

/* err(3)-style messages prefixed "gridfsctl CMD: " (cmd/messages.c). */
void warnx_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void warn_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));   /* appends strerror(errno) */
void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last message those printed, unescaped, for the "error" of a JSON summary; "" if none. */
const char *last_message(void);

/* Maps a library error to an exit code (cmd/messages.c: the one map). */
int exit_code_for(const gfs_error *err);
/* Prints err as one line and returns its exit code. */
int fail(const gfs_error *err);

/* systemd's Type=notify (lib/sdnotify.h) for serve and watch: a failure is said, never fatal. */
void notify_systemd(const char *state);
/*
 * Finishes what killed writers left (removals cut short, puts' unfinished
 * uploads), saying so on stderr; held: a lock the caller holds, or NULL.
 * An exit status.
 */
int recover_interrupted(gfs_session *s, const char *held);

/* Connects with the globals; prints a one-line error and returns NULL on failure. */
gfs_conn *connect_or_warn(void);
/* connect_or_warn() for a verb that decides writes from what it reads: its reads go to the primary. */
gfs_conn *connect_for_writes(void);

/* Prints a bson document as one JSON line, its strings made valid UTF-8 first (cmd/json.c). */
void print_json(FILE *out, const bson_t *doc);

/*
 * The JSON vocabulary of gridfsctl(1) (cmd/json.c). json_write() is the one
 * writer: compact, dates as ISO 8601 UTC strings, doubles without noise.
 * An event line starts with json_event() ("time", "event"); a verb's last
 * line is its summary, {"time", "summary": {"verb", "dryRun"?, counts...,
 * "interrupted", "seconds", "error"?}}, built between json_summary_begin()
 * and _end(). Durations go through json_seconds() (milliseconds, as
 * 3-decimal seconds). One word per action: an event is the action
 * ("upload", "replace", "delete", "write", "move"), its count the
 * participle ("uploaded", ...); json_action() maps what a library says.
 */
bool json_write(FILE *out, const bson_t *doc);
void json_event(bson_t *doc, const char *event);
void json_filename(bson_t *doc, const char *name);
void json_seconds(bson_t *doc, const char *key, double seconds);
/* The event word for an action said in the past tense ("removed" -> "delete"); others as they are. */
const char *json_action(const char *said);
/* "path": a local path relative to the command's DIR, its bytes as a stored name would take them. */
void json_path(bson_t *doc, const char *rel, size_t len);
struct json_summary {
	bson_t doc, body;
	bool interrupted;   /* set by the verb, or a stop signal arrived */
};
void json_summary_begin(struct json_summary *s, const char *verb, bool dry_run);
/* Adds "interrupted", "seconds" and, when error is not empty, "error"; prints the line. */
void json_summary_end(FILE *out, struct json_summary *s, double seconds, const char *error);

/*
 * s[0..len) for human eyes (cmd/human.c), the one escaping rule of gridfsctl(1): C0 and
 * C1 controls, DEL and bytes that are not UTF-8 become \xNN. Caller frees.
 */
char *printable(const char *s, size_t len);
/*
 * A stored name as messages show it: whole up to GFS_NAME_SHOWN_MAX - 1
 * bytes, else its head and its tail around "...(N bytes)...", so that a
 * name of kilobytes neither floods the line nor hides the reason after it,
 * and names that differ in length never look alike. Returns buf.
 */
const char *shown_name(char buf[GFS_NAME_SHOWN_MAX], const char *name);
/* Formats one line, escapes all of it with printable() and writes it with a newline. */
void human_line(FILE *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * A human line about an action (a file written, uploaded, removed, a
 * repair, a summary): as human_line(), and in a dry run ended by
 * DRY_RUN_MARK, as rsync does, so that no line of a dry run reads as done.
 */
#define DRY_RUN_MARK "(DRY RUN)"
void action_line(FILE *out, bool dry_run, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* doctor's topology report (cmd/topology.c): its human lines, through doctor's line(), its JSON. */
struct gfs_topology;
typedef void (*topology_line_fn)(bool problem, const char *what, const char *detail);
void topology_print(const struct gfs_topology *t, const char *bucket, topology_line_fn line);
void topology_json(bson_t *doc, const struct gfs_topology *t);

/* Flushes and closes stdout at exit: a write error turns EXIT_OK into EXIT_LOCAL. */
int close_stdout(int rc);

/* Everyday-verb helpers (cmd/util.c). */
void file_to_json(const gfs_file *f, bson_t *out);
int lookup_file(gfs_session *s, const char *name, const char *id_hex, int revision, gfs_file *out);
/*
 * The status of a run over several items (names, files): an item's own
 * when it is the only one, or when every one failed, or when the failure
 * is grave (backend, usage, --max-delete, a signal: it ends the run, and
 * tally_add() returns false); else 1 when only some failed.
 */
struct tally {
	int n, nfail, last;
};
bool tally_add(struct tally *t, int rc);
bool tally_grave(int rc);
int tally_status(const struct tally *t);
/*
 * What ls and get select: a shell PATTERN when operand has a wildcard, the
 * names matching --regex, else the names beginning with operand (NULL:
 * all). -1 after a usage error; else the caller frees m.
 */
struct gfs_match;
int select_operand(const char *operand, const char *regex, struct gfs_match *m);
/* --id's typed syntax (lib/select.h: OID, oid:, str:, int:, long:); false after a usage error. */
bool parse_id_option(const char *arg, bson_value_t *out);
bool one_target(int nargs, const char *id_hex);
int parse_rev_option(const char *arg, long *rev);
void add_glob(const char ***list, size_t *n, const char *arg);
/* The --max-delete argument of import, mirror and watch; -1 after a usage error. */
struct gfs_max_delete;
int max_delete_option(const char *arg, struct gfs_max_delete *out);
/* False, after a usage error, when --max-delete is given without --delete: a bound on nothing. */
bool max_delete_fits(const struct gfs_max_delete *md, bool deleting);
/* The --hold argument of verify and mirror (bytes, above 0); -1 after a usage error. */
int hold_option(const char *arg, size_t *out);
/*
 * How chunks are read (verify's --strategy, mirror's --read, named by opt):
 * a word of gfs_read_strategy_parse(); batched is taken with a warning, as
 * it reads as each. -1 after a usage error.
 */
int read_option(const char *opt, const char *arg, enum gfs_read_strategy *out);

/*
 * Interrupts (cmd/interrupt.c), the one way every verb is asked to stop.
 * After catch_interrupts(), the first SIGINT or SIGTERM sets stop_signal to
 * its number and calls hook (NULL: none; it must be async-signal-safe); the
 * verb checks stop_signal where it can stop cleanly, and exits 130. A
 * second signal kills as usual. Worker threads may read stop_signal.
 * INTERRUPT_RESTART: system calls the signal interrupts resume (SA_RESTART)
 * instead of failing with EINTR.
 */
extern atomic_int stop_signal;
enum { INTERRUPT_RESTART = 1 };
void catch_interrupts(int flags, void (*hook)(int sig));
/* Back to the default action of SIGINT and SIGTERM. */
void release_interrupts(void);
/*
 * A verb whose engine may not answer a stop in time hands it to
 * gfs_run_stoppable() (lib/stoppable.h) with &stop_signal.
 */
/*
 * For an event loop: blocks SIGINT, SIGTERM and extra (0: none) in the
 * calling thread, before any other thread exists, and returns a non-blocking
 * signalfd that reads them (-1 on failure, errno set).
 */
int interrupt_signalfd(int extra);

/* uri with ?name=value added, unless it sets name already; malloc'd, NULL when out of memory. */
char *uri_with_option(const char *uri, const char *name, long value);

/* Parses sizes like "512", "64K", "1G". */
bool parse_size(const char *s, uint64_t *out);
/* Parses a positive int in [min, max]. */
bool parse_int(const char *s, long min, long max, long *out);

/* b bytes as "512 B", "40.0 KiB", "1.5 MiB": the one unit style of every human size. */
void human_bytes(double b, char *buf, size_t len);

/*
 * A progress line on stderr, drawn only when G.progress; rate-limited.
 * total_* may be 0 when unknown.
 */
struct progress;
struct progress *progress_start(const char *what, uint64_t total_items, uint64_t total_bytes);
void progress_update(struct progress *p, uint64_t items, uint64_t bytes);
void progress_set_totals(struct progress *p, uint64_t total_items, uint64_t total_bytes);
void progress_done(struct progress *p);

/* The subcommands. */
extern const struct cmd_entry cmd_ls_entry, cmd_get_entry, cmd_put_entry, cmd_rm_entry,
    cmd_mv_entry, cmd_stat_entry, cmd_import_entry, cmd_verify_entry, cmd_mirror_entry,
    cmd_watch_entry, cmd_serve_entry, cmd_supervise_entry, cmd_doctor_entry;

#endif
