/*
 * Lines for human eyes, and the one escaping rule of gridfsctl(1).
 *
 * Every line written for human eyes goes through printable(): names and
 * messages carry bytes from anyone who could write to the bucket or the
 * disk, and printed raw a newline in one would forge an output line and an
 * ESC would drive the terminal. JSON output needs none of this: its own
 * escaping already keeps every byte exact and inert.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "../lib/filename.h"

const char *
shown_name(char buf[GFS_NAME_SHOWN_MAX], const char *name)
{
	size_t len = strlen(name);
	char mark[48];
	snprintf(mark, sizeof mark, "...(%zu bytes)...", len);
	return gfs_shorten_with(buf, GFS_NAME_SHOWN_MAX, name, len, mark);
}

/*
 * Length of the printable character at s[0..len), 0 when it is a control
 * character (C0, DEL or C1) or not valid UTF-8.
 */
static size_t
printable_len(const char *s, size_t len)
{
	unsigned char c = (unsigned char)s[0];
	if (c >= 0x20 && c < 0x7f)
		return 1;
	size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
	if (n == 0 || n > len || !gfs_utf8_valid(s, n))
		return 0;
	if (c == 0xc2 && (unsigned char)s[1] < 0xa0)
		return 0; /* U+0080 to U+009F, the C1 controls */
	return n;
}

char *
printable(const char *s, size_t len)
{
	char *out = gfs_xmalloc(len * 4 + 1);
	size_t o = 0;
	for (size_t i = 0; i < len;) {
		size_t n = printable_len(s + i, len - i);
		if (n > 0) {
			memcpy(out + o, s + i, n);
			o += n;
			i += n;
			continue;
		}
		snprintf(out + o, 5, "\\x%02x", (unsigned char)s[i]);
		o += 4;
		i++;
	}
	out[o] = '\0';
	return out;
}

static void
put_human(FILE *out, const char *line, const char *mark)
{
	char *safe = printable(line, strlen(line));
	flockfile(out);
	fputs(safe, out);
	fputs(mark, out);
	fputc('\n', out);
	funlockfile(out);
	free(safe);
}

void
human_line(FILE *out, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *line = bson_strdupv_printf(fmt, ap);
	va_end(ap);
	put_human(out, line, "");
	bson_free(line);
}

void
action_line(FILE *out, bool dry_run, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *line = bson_strdupv_printf(fmt, ap);
	va_end(ap);
	put_human(out, line, dry_run ? " " DRY_RUN_MARK : "");
	bson_free(line);
}
