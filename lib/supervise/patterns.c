/*
 * restart_on: the patterns a program's output is matched against, and
 * what a command line may show. Every line of every child goes through
 * sv_patterns_match, so each pattern carries a literal that any match must
 * contain (sv_required_literal), and strcasestr rules most lines out
 * before regexec runs. Redaction hides the password of any URL in a
 * command before it reaches an event line or --check.
 */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gfs.h"
#include "internal.h"

/* Skips a bracket expression starting at p ('['); returns its closing ']' (or the end). */
static const char *
skip_bracket(const char *p)
{
	p++;
	if (*p == '^')
		p++;
	if (*p == ']')
		p++;
	for (; *p && *p != ']'; p++) {
		if (*p == '[' && (p[1] == ':' || p[1] == '.' || p[1] == '=')) {
			char close = p[1];
			for (p += 2; *p && !(p[0] == close && p[1] == ']'); p++)
				;
			if (!*p)
				return p - 1;
			p++;
		}
	}
	return *p ? p : p - 1;
}

static void
keep_longest(char *best, size_t *blen, const char *cur, size_t *clen)
{
	if (*clen > *blen) {
		memcpy(best, cur, *clen);
		*blen = *clen;
	}
	*clen = 0;
}

char *
sv_required_literal(const char *re)
{
	char best[256], cur[256];
	size_t blen = 0, clen = 0;
	int depth = 0;
	for (const char *p = re; *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '|' && depth == 0)
			return NULL; /* an alternative: nothing is required */
		if (c == '[') {
			p = skip_bracket(p);
		} else if (c == '\\') {
			if (p[1])
				p++;
		} else if (c == '{') {
			while (p[1] && *p != '}')
				p++;
		} else if (c == '(') {
			depth++;
		} else if (c == ')') {
			if (depth)
				depth--;
		} else if (depth == 0 && c < 0x80 && !strchr(".*+?{}^$", c)) {
			/* A character that may occur zero times is not required. */
			if (p[1] != '?' && p[1] != '*' && p[1] != '{') {
				if (clen < sizeof cur)
					cur[clen++] = (char)c;
				continue;
			}
		}
		keep_longest(best, &blen, cur, &clen);
	}
	keep_longest(best, &blen, cur, &clen);
	return blen >= 3 ? strndup(best, blen) : NULL;
}

bool
sv_patterns_compile(struct sv_patterns *p, char *const *patterns, size_t n, char *err,
                    size_t errlen)
{
	p->re = gfs_xcalloc(n ? n : 1, sizeof *p->re);
	p->lit = gfs_xcalloc(n ? n : 1, sizeof *p->lit);
	p->n = 0;
	for (size_t i = 0; i < n; i++) {
		int rc = regcomp(&p->re[i], patterns[i], REG_EXTENDED | REG_ICASE | REG_NOSUB);
		if (rc != 0) {
			char msg[128];
			regerror(rc, &p->re[i], msg, sizeof msg);
			snprintf(err, errlen, "bad pattern '%s': %s", patterns[i], msg);
			sv_patterns_free(p);
			return false;
		}
		p->lit[i] = sv_required_literal(patterns[i]);
		p->n++;
	}
	return true;
}

int
sv_patterns_match(const struct sv_patterns *p, const char *line)
{
	/* glibc's regexec costs ~0.4 us a line per pattern; strcasestr rules most lines out first. */
	for (size_t i = 0; i < p->n; i++)
		if ((!p->lit[i] || strcasestr(line, p->lit[i])) && regexec(&p->re[i], line, 0, NULL, 0) == 0)
			return (int)i;
	return -1;
}

void
sv_patterns_free(struct sv_patterns *p)
{
	for (size_t i = 0; i < p->n; i++) {
		regfree(&p->re[i]);
		free(p->lit[i]);
	}
	free(p->re);
	free(p->lit);
	p->re = NULL;
	p->lit = NULL;
	p->n = 0;
}

bool
sv_line_is_emfile(const char *line)
{
	static bool compiled;
	static struct sv_patterns pats;
	if (!compiled) {
		size_t n = 0;
		while (sv_default_patterns[n])
			n++;
		char err[200];
		if (!sv_patterns_compile(&pats, (char *const *)sv_default_patterns, n, err, sizeof err))
			return false;
		compiled = true;
	}
	return sv_patterns_match(&pats, line) >= 0;
}

/* Where the password of the URL whose authority starts at a ends, or NULL when it has none. */
static const char *
password_span(const char *a, const char **pw)
{
	size_t n;
	*pw = gfs_uri_password(a, strcspn(a, "/?# \t\n'\""), &n);
	return *pw ? *pw + n : NULL;
}

char *
sv_redact_command(const char *cmd)
{
	/* Each "***" is at most 3 bytes longer than what it stands for, and needs a "://". */
	size_t len = strlen(cmd);
	char *out = gfs_xcalloc(2 * len + 4, 1);
	char *o = out;
	const char *p = cmd, *scheme;
	while ((scheme = strstr(p, "://")) != NULL) {
		const char *a = scheme + 3, *pw = NULL;
		const char *at = password_span(a, &pw);
		const char *upto = at ? pw : a;
		memcpy(o, p, (size_t)(upto - p));
		o += upto - p;
		if (at) {
			memcpy(o, "***", 3);
			o += 3;
		}
		p = at ? at : a;
	}
	strcpy(o, p);
	return out;
}

