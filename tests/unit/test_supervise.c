/* Unit tests for supervise's pure parts: config, command splitting, backoff, patterns, fd trend. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../lib/util.h"
#include "../../lib/supervise/internal.h" /* the pure parts, and the public API */

static void
split_words(void **state)
{
	(void)state;
	char **a = sv_split_command("/bin/echo  'a b' \"c \\\" d\" e\\ f '' x'y'z");
	assert_non_null(a);
	assert_string_equal(a[0], "/bin/echo");
	assert_string_equal(a[1], "a b");
	assert_string_equal(a[2], "c \" d");
	assert_string_equal(a[3], "e f");
	assert_string_equal(a[4], "");
	assert_string_equal(a[5], "xyz");
	assert_null(a[6]);
	sv_argv_free(a);
	a = sv_split_command("sh -c 'it'\\''s'");
	assert_non_null(a);
	assert_string_equal(a[2], "it's");
	sv_argv_free(a);
	assert_null(sv_split_command("  "));
	assert_null(sv_split_command("echo 'open"));
	assert_null(sv_split_command("echo \"open"));
	assert_null(sv_split_command("echo trailing\\"));
}

static void
durations_and_signals(void **state)
{
	(void)state;
	long ms;
	assert_true(gfs_parse_duration_ms("500ms", 0, INT_MAX, &ms));
	assert_int_equal(ms, 500);
	assert_true(gfs_parse_duration_ms("2", 0, INT_MAX, &ms));
	assert_int_equal(ms, 2000);
	assert_true(gfs_parse_duration_ms("1.5s", 0, INT_MAX, &ms));
	assert_int_equal(ms, 1500);
	assert_true(gfs_parse_duration_ms("3m", 0, INT_MAX, &ms));
	assert_int_equal(ms, 180000);
	assert_false(gfs_parse_duration_ms("fast", 0, INT_MAX, &ms));
	assert_false(gfs_parse_duration_ms("-1s", 0, INT_MAX, &ms));
	assert_false(gfs_parse_duration_ms("5 weeks", 0, INT_MAX, &ms));
	/* NaN compared false with every bound and became INT_MIN ms. */
	assert_false(gfs_parse_duration_ms("nan", 0, INT_MAX, &ms));
	assert_false(gfs_parse_duration_ms("inf", 0, INT_MAX, &ms));
	assert_false(gfs_parse_duration_ms("1e300h", 0, INT_MAX, &ms));
	assert_int_equal(sv_parse_signal("TERM"), SIGTERM);
	assert_int_equal(sv_parse_signal("sigint"), SIGINT);
	assert_int_equal(sv_parse_signal("9"), SIGKILL);
	assert_int_equal(sv_parse_signal("NOPE"), -1);
	assert_int_equal(sv_parse_signal("0"), -1);
	assert_string_equal(sv_signal_name(SIGKILL), "SIGKILL");
}

static const char full_config[] =
    "; a comment\n"
    "[supervise]\n"
    "control = /run/x.sock\n"
    "logdir = /var/log/gs\n"
    "[program:backend]\n"
    "command = /usr/bin/mongod --dbpath /data\n"
    "  --port 27017\n"
    "directory = /data\n"
    "environment = A=1, B=\"x, y\"\n"
    "environment = C=3\n"
    "user = mongodb\n"
    "nofile = 64000\n"
    "nofile_hard = 128000\n"
    "health = mongodb://127.0.0.1:27017/\n"
    "health_interval = 2s\n"
    "health_timeout = 500ms\n"
    "health_retries = 4\n"
    "stop_signal = INT\n"
    "stop_grace = 1m\n"
    "log_max = 1M\n"
    "log_backups = 5\n"
    "autorestart = no\n"
    "startsecs = 3\n"
    "backoff_initial = 250ms\n"
    "backoff_max = 10s\n"
    "max_restarts = 7\n"
    "restart_window = 120\n"
    "fd_interval = 5s\n"
    "fd_threshold = 90\n"
    "fd_horizon = 600\n"
    "fd_raise = no\n"
    "[program:web]\n"
    "command = gridfsctl serve\n"
    "instances = 2\n"
    "listen = 127.0.0.1:8080\n"
    "log = /tmp/web.log\n"
    "restart_on = none\n"
    "after = backend\n"
    "[program:other]\n"
    "command = x\n"
    "restart_on = boom$\n"
    "restart_on = default\n"
    "restart_on_stream = both\n";

static void
config_all_keys(void **state)
{
	(void)state;
	struct sv_config c;
	char err[600];
	assert_true(sv_config_parse(full_config, "t.ini", &c, err, sizeof err));
	assert_string_equal(c.control, "/run/x.sock");
	assert_int_equal(c.nprogs, 3);
	struct sv_program *b = &c.progs[0];
	assert_string_equal(b->name, "backend");
	assert_string_equal(b->command, "/usr/bin/mongod --dbpath /data --port 27017");
	assert_string_equal(b->argv[4], "27017");
	assert_string_equal(b->directory, "/data");
	assert_int_equal(b->nenv, 3);
	assert_string_equal(b->env[1], "B=x, y");
	assert_string_equal(b->env[2], "C=3");
	assert_string_equal(b->user, "mongodb");
	assert_int_equal(b->nofile, 64000);
	assert_int_equal(b->nofile_hard, 128000);
	assert_int_equal(b->health_interval_ms, 2000);
	assert_int_equal(b->health_timeout_ms, 500);
	assert_int_equal(b->health_retries, 4);
	assert_int_equal(b->stop_signal, SIGINT);
	assert_int_equal(b->stop_grace_ms, 60000);
	assert_int_equal(b->log_max, 1 << 20);
	assert_int_equal(b->log_backups, 5);
	assert_false(b->autorestart);
	assert_int_equal(b->startsecs, 3);
	assert_int_equal(b->backoff_initial_ms, 250);
	assert_int_equal(b->backoff_max_ms, 10000);
	assert_int_equal(b->max_restarts, 7);
	assert_int_equal(b->restart_window_s, 120);
	assert_int_equal(b->fd_interval_ms, 5000);
	assert_int_equal(b->fd_threshold_pct, 90);
	assert_int_equal(b->fd_horizon_s, 600);
	assert_false(b->fd_raise);
	assert_string_equal(b->log, "/var/log/gs/backend.log");
	assert_true(b->npatterns >= 4);
	struct sv_program *w = &c.progs[1];
	assert_int_equal(w->instances, 2);
	assert_string_equal(w->listen, "127.0.0.1:8080");
	assert_string_equal(w->log, "/tmp/web.log");
	assert_int_equal(w->npatterns, 0);
	assert_string_equal(w->after, "backend");
	assert_null(b->after);
	struct sv_program *o = &c.progs[2];
	assert_string_equal(o->patterns[0], "boom$");
	assert_string_equal(o->patterns[1], "Too many open files");
	assert_int_equal(o->restart_on_stream, SV_STREAM_BOTH);

	/* Equality drives reload: a copy is equal, any change is not. */
	struct sv_program cp;
	sv_program_copy(&cp, b);
	assert_true(sv_program_equal(&cp, b));
	cp.nofile++;
	assert_false(sv_program_equal(&cp, b));
	sv_program_free(&cp);
	sv_program_copy(&cp, w);
	assert_true(sv_program_equal(&cp, w));
	free(cp.after);
	cp.after = NULL;
	assert_false(sv_program_equal(&cp, w)); /* a new order restarts the program on reload */
	sv_program_free(&cp);
	assert_false(sv_program_equal(&c.progs[0], &c.progs[1]));
	sv_config_free(&c);
}

/* Continued lines and the list keys are not duplicates; a listen spec is kept normalised. */
static void
config_repeats_that_are_fine(void **state)
{
	(void)state;
	struct sv_config c;
	char err[600];
	const char *text = "[program:a]\ncommand = /bin/echo\n  one two\n\n  three\n"
	                   "environment = A=1\nenvironment = B=2\n  C=3\n"
	                   "restart_on = x\nrestart_on = y\n  z\nlisten = :8080\n"
	                   "[program:b]\ncommand = x\nlisten = [::1]:9\n";
	if (!sv_config_parse(text, "t", &c, err, sizeof err))
		fail_msg("%s", err);
	assert_string_equal(c.progs[0].command, "/bin/echo one two three");
	assert_int_equal(c.progs[0].nenv, 3);
	assert_int_equal(c.progs[0].npatterns, 3);
	assert_string_equal(c.progs[0].listen, "127.0.0.1:8080");
	assert_string_equal(c.progs[1].listen, "[::1]:9");
	sv_config_free(&c);
}

static void
config_defaults(void **state)
{
	(void)state;
	struct sv_config c;
	char err[600];
	assert_true(sv_config_parse("[program:a]\ncommand = sleep 1\n", "t", &c, err, sizeof err));
	struct sv_program *p = &c.progs[0];
	assert_int_equal(p->instances, 1);
	assert_int_equal(p->stop_signal, SIGTERM);
	assert_int_equal(p->stop_grace_ms, 10000);
	assert_int_equal(p->max_restarts, 5);
	assert_int_equal(p->restart_window_s, 60);
	assert_true(p->autorestart);
	assert_true(p->fd_raise);
	assert_null(p->log);
	assert_null(c.control);
	size_t n = 0;
	while (sv_default_patterns[n])
		n++;
	assert_int_equal(p->npatterns, n);
	assert_int_equal(p->restart_on_stream, SV_STREAM_STDERR); /* never request data by default */
	sv_config_free(&c);
}

static void
config_errors(void **state)
{
	(void)state;
	static const struct {
		const char *text, *msg;
	} bad[] = {
		{"[program:a]\ncommand = x\nnofile = lots\n", "t:3: [program:a] nofile"},
		{"[program:a]\ncommand = x\nwhat = 1\n", "unknown key 'what'"},
		{"[program:a]\ncommand = x\nrestart_on = (\n", "bad pattern"},
		{"[program:a]\ndirectory = /\n", "has no command"},
		{"[program:a]\ncommand = 'x\n", "unterminated quote"},
		{"[other]\nx = 1\n", "unknown section [other]"},
		{"[program:a b]\ncommand = x\n", "a program name is"},
		{"[program:a]\ncommand = x\nstop_signal = NOPE\n", "unknown signal"},
		{"[program:a]\ncommand = x\nrestart_on_stream = all\n",
		 "t:3: [program:a] restart_on_stream: expected stderr, stdout or both, got 'all'"},
		{"[program:a]\ncommand = x\nhealth = ftp://x\n", "expected mongodb://"},
		{"[program:a]\ncommand = x\nhealth = http://127.0.0.1:99999/\n",
		 "t:3: [program:a] health: '127.0.0.1:99999': port '99999' is not a number"},
		{"[program:a]\ncommand = x\nlisten = 127.0.0.1:99999\n",
		 "t:3: [program:a] listen: '127.0.0.1:99999': port '99999' is not a number from 1 to 65535"},
		{"[program:a]\ncommand = x\nlisten = localhost:80\n", "not a numeric IPv4 address"},
		/* One section per program, one line per key: neither is merged in silence. */
		{"[program:a]\ncommand = /bin/true\n[program:a]\ncommand = /bin/false\n",
		 "t:3: duplicate section [program:a] (first at line 1)"},
		{"[supervise]\n[supervise]\n[program:a]\ncommand = x\n",
		 "t:2: duplicate section [supervise] (first at line 1)"},
		{"[program:a]\ncommand = x\nnofile = 10\n\nnofile = 20\n",
		 "t:5: [program:a] duplicate key 'nofile' (first at line 3)"},
		{"[program:a]\ncommand = /bin/true\ncommand = /bin/false\n",
		 "t:3: [program:a] duplicate key 'command' (first at line 2)"},
		{"[program:a]\ncommand = x\nhealth_retries = 2\n  3\n",
		 "t:4: [program:a] 'health_retries' cannot be continued"},
		{"[program:a]\n\ncommand =\n", "t:3: program 'a': empty command"},
		{"[program:a]\ncommand = ' '\ncommand_x = 1\n", "t:3: [program:a] unknown key"},
		{"[program:a]\n\ncommand = 'x\n", "t:3: program 'a': cannot split the command"},
		/* A misspelt section is an error even with no key in it. */
		{"[progam:a]\n[program:b]\ncommand = x\n", "t:1: unknown section [progam:a]"},
		{"x = 1\n[program:b]\ncommand = x\n", "t:1: key 'x' outside a section"},
		{"[program:a]\ncommand = x\ninstances = 0\n", "instances"},
		{"[program:a]\ncommand = x\nnofile = 100\nnofile_hard = 50\n", "above nofile_hard"},
		{"[program:a]\ncommand = x\nenvironment = NOEQUALS\n", "KEY=VALUE"},
		{"[supervise]\ncontrol = /x\n", "no [program:NAME] section"},
		{"[program:a]\ncommand = x\nthis line is not ini\n", "t:3:"},
		/* Values that would defeat the restart limits. */
		{"[program:a]\ncommand = x\nmax_restarts = 100\n", "t:3: [program:a] max_restarts"},
		{"[program:a]\ncommand = x\nrestart_window = 0\n", "t:3: [program:a] restart_window"},
		{"[program:a]\ncommand = x\nbackoff_initial = 0\n", "t:3: [program:a] backoff_initial"},
		{"[program:a]\ncommand = x\nbackoff_initial = 5ms\n", "t:3: [program:a] backoff_initial"},
		/* The first error wins, with its own line and message. */
		{"[program:a]\ncommand = x\nnofile = lots\nbogus = 1\n", "t:3: [program:a] nofile"},
		{"[program:a]\nnot ini\nbogus = 1\n", "t:2: syntax error"},
		{"[program:a]\nbogus = 1\nnot ini\n", "t:2: [program:a] unknown key 'bogus'"},
		/* Whole-program checks point at the program's section. */
		{"[supervise]\nlogdir = /x\n\n[program:b]\ndirectory = /\n", "t:4: program 'b' has no command"},
		{"[program:a]\ncommand = x\nbackoff_initial = 2s\nbackoff_max = 1s\n", "t:1: program 'a'"},
		/* Start order: a name of this file, and no way back; the error is at the after line. */
		{"[program:a]\ncommand = x\n\nafter = nosuch\n",
		 "t:4: [program:a] after: no program 'nosuch' in this file"},
		{"[program:a]\ncommand = x\nafter = a\n", "t:3: [program:a] after: a cycle (a -> a)"},
		{"[program:a]\ncommand = x\nafter = b\n[program:b]\ncommand = y\nafter = c\n"
		 "[program:c]\ncommand = z\nafter = b\n",
		 "t:6: [program:b] after: a cycle (b -> c -> b)"},
		{"[program:a]\ncommand = x\nafter = b c\n",
		 "t:3: [program:a] after: expected a program name, got 'b c'"},
		{"[program:a]\ncommand = x\nafter = b\nafter = c\n",
		 "t:4: [program:a] duplicate key 'after' (first at line 3)"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct sv_config c;
		char err[600];
		assert_false(sv_config_parse(bad[i].text, "t", &c, err, sizeof err));
		if (!strstr(err, bad[i].msg))
			fail_msg("case %zu: '%s' does not contain '%s'", i, err, bad[i].msg);
	}
}

static void
config_long_line(void **state)
{
	(void)state;
	char text[600];
	snprintf(text, sizeof text, "[program:a]\ncommand = x\nenvironment = A=%0300d\nbogus = 1\n", 1);
	struct sv_config c;
	char err[600];
	assert_false(sv_config_parse(text, "t", &c, err, sizeof err));
	if (!strstr(err, "t:3: line longer than"))
		fail_msg("'%s'", err);
}

static void
redaction(void **state)
{
	(void)state;
	static const struct {
		const char *in, *out;
	} cases[] = {
		{"gridfsctl serve --uri mongodb://u:s3cret@h:27017/db", "gridfsctl serve --uri mongodb://u:***@h:27017/db"},
		{"x 'mongodb://u:p%40ss@a,b/?authSource=admin' y", "x 'mongodb://u:***@a,b/?authSource=admin' y"},
		{"x --a=http://u:p@h/ --b=mongodb+srv://v:q@c", "x --a=http://u:***@h/ --b=mongodb+srv://v:***@c"},
		{"x mongodb://user@h/db mongodb://h:27017/a@b", "x mongodb://user@h/db mongodb://h:27017/a@b"},
		{"x http://h:80 ://", "x http://h:80 ://"},
		{"x mongodb://u:@h", "x mongodb://u:***@h"},
		{"sleep 600", "sleep 600"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *r = sv_redact_command(cases[i].in);
		assert_string_equal(r, cases[i].out);
		free(r);
	}
}

static void
backoff_and_window(void **state)
{
	(void)state;
	assert_int_equal(sv_backoff_ms(1000, 30000, 0), 0);
	assert_int_equal(sv_backoff_ms(1000, 30000, 1), 1000);
	assert_int_equal(sv_backoff_ms(1000, 30000, 2), 2000);
	assert_int_equal(sv_backoff_ms(1000, 30000, 5), 16000);
	assert_int_equal(sv_backoff_ms(1000, 30000, 6), 30000);
	assert_int_equal(sv_backoff_ms(1000, 30000, 1000), 30000);
	double times[] = {10, 50, 69.5, 70, 71};
	assert_int_equal(sv_count_recent(times, 5, 70, 60), 3);  /* 50, 69.5, 70 */
	assert_int_equal(sv_count_recent(times, 5, 200, 60), 0);
	assert_int_equal(sv_count_recent(times, 0, 70, 60), 0);
}

static void
patterns(void **state)
{
	(void)state;
	size_t n = 0;
	while (sv_default_patterns[n])
		n++;
	struct sv_patterns p;
	char err[200];
	assert_true(sv_patterns_compile(&p, (char *const *)sv_default_patterns, n, err, sizeof err));
	assert_int_equal(sv_patterns_match(&p, "accept tcp [::]:27017: accept4: too many open files"), 0);
	assert_int_equal(sv_patterns_match(&p, "2026-01-01 E STORAGE [conn12] can not open file x"), 1);
	assert_int_equal(sv_patterns_match(&p, "cannot open file /data/WiredTiger.wt"), 1);
	assert_int_equal(sv_patterns_match(&p, "Out of file descriptors"), 2);
	assert_int_equal(sv_patterns_match(&p, "socket(): EMFILE"), 3);
	assert_int_equal(sv_patterns_match(&p, "open failed, errno: 24"), 4);
	assert_int_equal(sv_patterns_match(&p, "open failed errno=24"), 4);
	assert_int_equal(sv_patterns_match(&p, "open failed, errno: 243"), -1);
	assert_int_equal(sv_patterns_match(&p, "all is well"), -1);
	sv_patterns_free(&p);
	assert_true(sv_line_is_emfile("Too many open files"));
	assert_false(sv_line_is_emfile("connection refused"));
	char *bad[] = {"ok", "(unclosed"};
	assert_false(sv_patterns_compile(&p, bad, 2, err, sizeof err));
	assert_non_null(strstr(err, "(unclosed"));
}

static void
expect_literal(const char *re, const char *want)
{
	char *got = sv_required_literal(re);
	if (!want) {
		if (got)
			fail_msg("'%s': expected no literal, got '%s'", re, got);
		return;
	}
	if (!got || strcmp(got, want) != 0)
		fail_msg("'%s': expected '%s', got '%s'", re, want, got ? got : "(null)");
	free(got);
}

static void
required_literals(void **state)
{
	(void)state;
	expect_literal("Too many open files", "Too many open files");
	expect_literal("can ?not open file", "not open file");
	expect_literal("errno[ :=]+24([^0-9]|$)", "errno");
	expect_literal("EMFILE", "EMFILE");
	expect_literal("a|bcdef", NULL);           /* top-level alternative */
	expect_literal("(x|y)abcd", "abcd");
	expect_literal("ab+cde", "cde");           /* b repeats: 'abcde' need not occur */
	expect_literal("abcd*e", "abc");
	expect_literal("abc{0,2}de", NULL);        /* "ab" and "de": too short */
	expect_literal("abc{0,2}defg", "defg");
	expect_literal("fo.bar", "bar");
	expect_literal("x[[:alpha:]xyz]yzw", "yzw");
	expect_literal("[]abcd]efg", "efg");
	expect_literal("\\(abc\\)defg", "defg");
	expect_literal("^start", "start");
	expect_literal("ab", NULL);
	/* The prefilter never hides a match. */
	struct sv_patterns p;
	char *pats[] = {"can ?not open file", "x[[:alpha:]xyz]yzw"};
	char err[200];
	assert_true(sv_patterns_compile(&p, pats, 2, err, sizeof err));
	assert_int_equal(sv_patterns_match(&p, "CANNOT OPEN FILE"), 0);
	assert_int_equal(sv_patterns_match(&p, "xqyzw"), 1);
	assert_int_equal(sv_patterns_match(&p, "x yzw"), -1);
	sv_patterns_free(&p);
}

static void
limits_text(void **state)
{
	(void)state;
	const char *text =
	    "Limit                     Soft Limit           Hard Limit           Units     \n"
	    "Max cpu time              unlimited            unlimited            seconds   \n"
	    "Max open files            1024                 524288               files     \n";
	long soft, hard;
	assert_true(fdw_parse_limits(text, &soft, &hard));
	assert_int_equal(soft, 1024);
	assert_int_equal(hard, 524288);
	assert_true(fdw_parse_limits("Max open files  unlimited  unlimited  files\n", &soft, &hard));
	assert_int_equal(soft, -1);
	assert_int_equal(hard, -1);
	assert_false(fdw_parse_limits("Max processes 10 10\n", &soft, &hard));
	/* Our own process can be sampled. */
	struct fdw_counts c;
	assert_true(fdw_count(getpid(), &c));
	assert_true(c.total >= 3);
	assert_true(fdw_limits(getpid(), &soft, &hard));
}

static void
trend_and_decision(void **state)
{
	(void)state;
	struct fdw_trend tr;
	fdw_trend_reset(&tr);
	fdw_trend_add(&tr, 0, 10);
	fdw_trend_add(&tr, 1, 12);
	assert_true(fdw_trend_slope(&tr) == 0); /* too few samples */
	for (int i = 2; i < 30; i++)
		fdw_trend_add(&tr, i, 10 + 2 * i);
	double slope = fdw_trend_slope(&tr);
	assert_true(slope > 1.99 && slope < 2.01);
	fdw_trend_reset(&tr);
	for (int i = 0; i < 5; i++)
		fdw_trend_add(&tr, i, 100);
	assert_true(fdw_trend_slope(&tr) == 0);

	struct fdw_policy pol = {80, 60, true};
	double eta;
	/* Calm: well below the threshold and flat. */
	assert_int_equal(fdw_decide(100, 1024, 4096, 0, &pol, &eta), FDW_OK);
	assert_true(eta < 0);
	/* Rising 10/s with 924 left: exhausted in ~92 s, beyond the 60 s horizon. */
	assert_int_equal(fdw_decide(100, 1024, 4096, 10, &pol, &eta), FDW_OK);
	assert_true(eta > 92 && eta < 93);
	/* Rising 20/s: ~46 s, within the horizon: raise while the hard limit allows. */
	assert_int_equal(fdw_decide(100, 1024, 4096, 20, &pol, &eta), FDW_RAISE);
	/* Over the threshold, flat: raise too. */
	assert_int_equal(fdw_decide(900, 1024, 4096, 0, &pol, &eta), FDW_RAISE);
	/* At the hard limit: warn when flat, restart when full or still climbing. */
	assert_int_equal(fdw_decide(900, 1024, 1024, 0, &pol, &eta), FDW_WARN);
	assert_int_equal(fdw_decide(900, 1024, 1024, 5, &pol, &eta), FDW_RESTART);
	assert_int_equal(fdw_decide(1024, 1024, 1024, 0, &pol, &eta), FDW_RESTART);
	assert_int_equal(fdw_decide(100, 1024, 1024, 20, &pol, &eta), FDW_WARN);
	/* Raising not allowed: the same as being at the hard limit. */
	pol.raise = false;
	assert_int_equal(fdw_decide(900, 1024, 4096, 5, &pol, &eta), FDW_RESTART);
	/* Unlimited soft limit: nothing to watch. */
	assert_int_equal(fdw_decide(1000000, -1, -1, 100, &pol, &eta), FDW_OK);

	assert_int_equal(fdw_raise_target(64, 4096), 128);
	assert_int_equal(fdw_raise_target(3000, 4096), 4096);
	assert_int_equal(fdw_raise_target(16, 4096), 64);
	assert_int_equal(fdw_raise_target(1 << 20, -1), 1 << 20);
}

static void
rotation(void **state)
{
	(void)state;
	char dir[] = "/tmp/sv-unit-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[128], p1[140], p2[140], p3[140];
	snprintf(path, sizeof path, "%s/x.log", dir);
	snprintf(p1, sizeof p1, "%s.1", path);
	snprintf(p2, sizeof p2, "%s.2", path);
	snprintf(p3, sizeof p3, "%s.3", path);
	struct logfile *lf = logfile_open(path, 100, 2);
	assert_non_null(lf);
	char line[41];
	memset(line, 'a', 39);
	line[39] = '\n';
	line[40] = '\0';
	for (int i = 0; i < 10; i++)
		assert_true(logfile_write(lf, line, 40));
	logfile_close(lf);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_true(st.st_size <= 100 && st.st_size > 0);
	assert_int_equal(stat(p1, &st), 0);
	assert_int_equal(st.st_size, 80);
	assert_int_equal(stat(p2, &st), 0);
	assert_int_not_equal(stat(p3, &st), 0);
	/* Many lines in one write are split between files at line ends. */
	char many[400];
	for (int i = 0; i < 10; i++)
		memcpy(many + i * 40, line, 40);
	lf = logfile_open(path, 100, 2);
	assert_non_null(lf);
	assert_true(logfile_write(lf, many, sizeof many));
	logfile_close(lf);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, 80);
	assert_int_equal(stat(p1, &st), 0);
	assert_int_equal(st.st_size, 80);
	/* A single line longer than max still goes whole into a file of its own. */
	lf = logfile_open(path, 30, 1);
	assert_true(logfile_write(lf, line, 40));
	assert_true(logfile_write(lf, line, 40));
	logfile_close(lf);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, 40);
	unlink(path);
	unlink(p1);
	unlink(p2);
	rmdir(dir);
}

static void
fill_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static long
file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Takes every free descriptor under a low soft limit; returns how many (fds[] holds them). */
static int
exhaust_fds(int *fds, int max, struct rlimit *saved)
{
	getrlimit(RLIMIT_NOFILE, saved);
	struct rlimit low = *saved;
	low.rlim_cur = 64;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	int n = 0;
	while (n < max && (fds[n] = dup(0)) >= 0)
		n++;
	assert_true(n < max);
	return n;
}

static void
rotation_reopen_fails(void **state)
{
	(void)state;
	char dir[] = "/tmp/sv-unit-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[128], p1[140], p2[140];
	snprintf(path, sizeof path, "%s/x.log", dir);
	snprintf(p1, sizeof p1, "%s.1", path);
	snprintf(p2, sizeof p2, "%s.2", path);
	fill_file(p1, "backup one\n");
	struct logfile *lf = logfile_open(path, 20, 2);
	assert_non_null(lf);
	assert_true(logfile_write(lf, "0123456789012345\n", 17));
	/* Renaming works, but no descriptor is left to open the new file with. */
	int fds[128];
	struct rlimit saved;
	int n = exhaust_fds(fds, 128, &saved);
	assert_false(logfile_write(lf, "second line\n", 12));
	assert_int_equal(file_size(path), -1);
	assert_int_equal(file_size(p1), 17 + 12); /* kept writing where it was */
	assert_int_equal(file_size(p2), 11);      /* the old backup moved once */
	/* Backing off: later writes go on into the same file, and shift nothing again. */
	assert_true(logfile_write(lf, "third line\n", 11));
	assert_int_equal(file_size(p1), 17 + 12 + 11);
	assert_int_equal(file_size(p2), 11);
	while (n > 0)
		close(fds[--n]);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
	/* Once it can, the rotation makes FILE anew without shifting the backups again. */
	assert_true(logfile_rotate(lf));
	assert_true(logfile_write(lf, "fourth\n", 7));
	logfile_close(lf);
	assert_int_equal(file_size(path), 7);
	assert_int_equal(file_size(p1), 17 + 12 + 11);
	assert_int_equal(file_size(p2), 11);
	unlink(path);
	unlink(p1);
	unlink(p2);
	rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(split_words),
		cmocka_unit_test(durations_and_signals),
		cmocka_unit_test(config_all_keys),
		cmocka_unit_test(config_defaults),
		cmocka_unit_test(config_errors),
		cmocka_unit_test(config_repeats_that_are_fine),
		cmocka_unit_test(config_long_line),
		cmocka_unit_test(redaction),
		cmocka_unit_test(backoff_and_window),
		cmocka_unit_test(patterns),
		cmocka_unit_test(required_literals),
		cmocka_unit_test(limits_text),
		cmocka_unit_test(trend_and_decision),
		cmocka_unit_test(rotation),
		cmocka_unit_test(rotation_reopen_fails),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
