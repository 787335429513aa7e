/*
 * The JSON vocabulary of gridfsctl(1), section JSON OUTPUT, in one place.
 *
 * Every --json line is written by json_write(): compact, one object per
 * line, dates as ISO 8601 UTC strings and doubles in their shortest exact
 * form (libbson's relaxed extended JSON would print 0.579 as
 * 0.57899999999999995914 and a date as {"$date": ...}). Event lines and
 * summary lines get their common fields from the builders below, so no
 * verb spells "time", "event" or "summary" its own way.
 */
#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "../lib/filename.h"
#include "../lib/util.h"

static void put_element(bson_string_t *b, const bson_iter_t *it);

static void
put_string(bson_string_t *b, const char *s, size_t len)
{
	bson_string_append_c(b, '"');
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\') {
			bson_string_append_c(b, '\\');
			bson_string_append_c(b, (char)c);
		} else if (c == '\n') {
			bson_string_append(b, "\\n");
		} else if (c == '\t') {
			bson_string_append(b, "\\t");
		} else if (c < 0x20 || c == 0x7f) {
			bson_string_append_printf(b, "\\u%04x", c);
		} else if (c == 0xc2 && i + 1 < len && (unsigned char)s[i + 1] < 0xa0) {
			/* C1 controls: U+0085 ends a line for many line splitters */
			bson_string_append_printf(b, "\\u%04x", (unsigned char)s[++i]);
		} else if (c == 0xe2 && i + 2 < len && (unsigned char)s[i + 1] == 0x80 &&
		           ((unsigned char)s[i + 2] == 0xa8 || (unsigned char)s[i + 2] == 0xa9)) {
			bson_string_append(b, (unsigned char)s[i + 2] == 0xa8 ? "\\u2028" : "\\u2029");
			i += 2;
		} else {
			bson_string_append_c(b, (char)c);
		}
	}
	bson_string_append_c(b, '"');
}

/* The shortest of %.15g, %.16g, %.17g that reads back as d, with '.' whatever the locale. */
static void
put_double(bson_string_t *b, double d)
{
	if (!isfinite(d)) {
		bson_string_append(b, "null");
		return;
	}
	char s[40];
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(s, sizeof s, "%.*g", prec, d);
		if (strtod(s, NULL) == d)
			break;
	}
	const char *point = localeconv()->decimal_point;
	char *p = point && point[0] && strcmp(point, ".") != 0 ? strstr(s, point) : NULL;
	if (p) {
		*p = '.';
		memmove(p + 1, p + strlen(point), strlen(p + strlen(point)) + 1);
	}
	bson_string_append(b, s);
	if (!strpbrk(s, ".eE"))
		bson_string_append(b, ".0"); /* still a double to a typed reader */
}

/* Types no verb emits itself (a binary in stored metadata, say): libbson's relaxed form. */
static void
put_other(bson_string_t *b, const bson_iter_t *it)
{
	bson_t one = BSON_INITIALIZER;
	BSON_APPEND_VALUE(&one, "v", bson_iter_value((bson_iter_t *)it));
	size_t len;
	char *s = bson_as_relaxed_extended_json(&one, &len);
	bson_destroy(&one);
	/* s is { "v" : VALUE }: keep VALUE */
	const char *v = s ? strstr(s, ": ") : NULL;
	if (v && len >= 2 && s[len - 1] == '}') {
		v += 2;
		bson_string_append_printf(b, "%.*s", (int)(s + len - 2 - v), v);
	} else {
		bson_string_append(b, "null");
	}
	bson_free(s);
}

/* The elements under sub, as an object or an array. */
static void
put_members(bson_string_t *b, bson_iter_t *sub, bool array)
{
	bson_string_append_c(b, array ? '[' : '{');
	bool first = true;
	while (bson_iter_next(sub)) {
		if (!first)
			bson_string_append_c(b, ',');
		first = false;
		if (!array) {
			put_string(b, bson_iter_key(sub), bson_iter_key_len(sub));
			bson_string_append_c(b, ':');
		}
		put_element(b, sub);
	}
	bson_string_append_c(b, array ? ']' : '}');
}

static void
put_container(bson_string_t *b, const bson_iter_t *it, bool array)
{
	bson_iter_t sub;
	if (bson_iter_recurse(it, &sub))
		put_members(b, &sub, array);
	else
		bson_string_append(b, array ? "[]" : "{}");
}

static void
put_element(bson_string_t *b, const bson_iter_t *it)
{
	uint32_t len;
	char date[32];
	switch (bson_iter_type(it)) {
	case BSON_TYPE_UTF8: {
		const char *s = bson_iter_utf8(it, &len);
		put_string(b, s, len);
		return;
	}
	case BSON_TYPE_DOUBLE: put_double(b, bson_iter_double(it)); return;
	case BSON_TYPE_INT32: bson_string_append_printf(b, "%d", bson_iter_int32(it)); return;
	case BSON_TYPE_INT64: bson_string_append_printf(b, "%lld", (long long)bson_iter_int64(it)); return;
	case BSON_TYPE_BOOL: bson_string_append(b, bson_iter_bool(it) ? "true" : "false"); return;
	case BSON_TYPE_NULL: bson_string_append(b, "null"); return;
	case BSON_TYPE_DATE_TIME:
		gfs_iso8601(bson_iter_date_time(it), date);
		put_string(b, date, strlen(date));
		return;
	case BSON_TYPE_DOCUMENT: put_container(b, it, false); return;
	case BSON_TYPE_ARRAY: put_container(b, it, true); return;
	default: put_other(b, it); return;
	}
}

bool
json_write(FILE *out, const bson_t *doc)
{
	bson_iter_t it;
	if (!bson_iter_init(&it, doc))
		return false;
	bson_string_t *b = bson_string_new(NULL);
	put_members(b, &it, false);
	bson_string_append_c(b, '\n');
	fwrite(b->str, 1, b->len, out);
	bson_string_free(b, true);
	return true;
}

void
json_event(bson_t *doc, const char *event)
{
	bson_init(doc);
	BSON_APPEND_DATE_TIME(doc, "time", gfs_now_ms());
	BSON_APPEND_UTF8(doc, "event", event);
}

void
json_filename(bson_t *doc, const char *name)
{
	if (name)
		BSON_APPEND_UTF8(doc, "filename", name);
	else
		BSON_APPEND_NULL(doc, "filename");
}

/* What libraries and human lines say, in the past tense, and the one event word for it. */
static const struct {
	const char *said, *event;
} action_words[] = {
	{"uploaded", "upload"}, {"replaced", "replace"}, {"deleted", "delete"},
	{"moved", "move"}, {"written", "write"}, {"deleted-folder", "delete-folder"},
	{"moved-folder", "move-folder"},
};

const char *
json_action(const char *said)
{
	for (size_t i = 0; i < sizeof action_words / sizeof action_words[0]; i++)
		if (strcmp(action_words[i].said, said) == 0)
			return action_words[i].event;
	return said;
}

void
json_path(bson_t *doc, const char *rel, size_t len)
{
	bool escaped;
	char *path = gfs_name_from_bytes(rel, len, &escaped);
	BSON_APPEND_UTF8(doc, "path", path);
	free(path);
}

void
json_seconds(bson_t *doc, const char *key, double seconds)
{
	int64_t ms = (int64_t)(seconds * 1000 + (seconds < 0 ? -0.5 : 0.5));
	BSON_APPEND_DOUBLE(doc, key, (double)ms / 1000);
}

void
json_summary_begin(struct json_summary *s, const char *verb, bool dry_run)
{
	s->interrupted = false;
	bson_init(&s->doc);
	BSON_APPEND_DATE_TIME(&s->doc, "time", gfs_now_ms());
	BSON_APPEND_DOCUMENT_BEGIN(&s->doc, "summary", &s->body);
	BSON_APPEND_UTF8(&s->body, "verb", verb);
	if (dry_run)
		BSON_APPEND_BOOL(&s->body, "dryRun", true);
}

void
json_summary_end(FILE *out, struct json_summary *s, double seconds, const char *error)
{
	BSON_APPEND_BOOL(&s->body, "interrupted", s->interrupted || atomic_load(&stop_signal) != 0);
	json_seconds(&s->body, "seconds", seconds);
	if (error && error[0])
		BSON_APPEND_UTF8(&s->body, "error", error);
	bson_append_document_end(&s->doc, &s->body);
	print_json(out, &s->doc);
	bson_destroy(&s->doc);
}

/* text as valid UTF-8 without NUL: any other byte is written as %XX, as names are stored. */
static char *
utf8_or_escaped(const char *text, size_t len)
{
	bool escaped;
	return gfs_name_from_bytes(text, len, &escaped);
}

static void sanitize_value(bson_iter_t *it, const char *key, bson_t *out);

/* Copies the elements under it into out, keys and strings made valid. */
static void
sanitize_elements(bson_iter_t *it, bson_t *out)
{
	while (bson_iter_next(it)) {
		char *k = utf8_or_escaped(bson_iter_key(it), bson_iter_key_len(it));
		sanitize_value(it, k, out);
		free(k);
	}
}

static void
sanitize_value(bson_iter_t *it, const char *key, bson_t *out)
{
	bson_iter_t sub;
	bson_t child;
	uint32_t len;
	switch (bson_iter_type(it)) {
	case BSON_TYPE_UTF8: {
		const char *v = bson_iter_utf8(it, &len);
		char *clean = utf8_or_escaped(v, len);
		BSON_APPEND_UTF8(out, key, clean);
		free(clean);
		return;
	}
	case BSON_TYPE_DOCUMENT:
		if (!bson_iter_recurse(it, &sub))
			return;
		BSON_APPEND_DOCUMENT_BEGIN(out, key, &child);
		sanitize_elements(&sub, &child);
		bson_append_document_end(out, &child);
		return;
	case BSON_TYPE_ARRAY:
		if (!bson_iter_recurse(it, &sub))
			return;
		BSON_APPEND_ARRAY_BEGIN(out, key, &child);
		sanitize_elements(&sub, &child);
		bson_append_array_end(out, &child);
		return;
	default:
		BSON_APPEND_VALUE(out, key, bson_iter_value(it));
		return;
	}
}

/*
 * File names and paths need not be UTF-8 (another client may have stored
 * raw bytes, and put --json prints the local path), but libbson gives up on
 * a whole document with one bad string. Escape such bytes first.
 */
static void
sanitize_doc(const bson_t *in, bson_t *out)
{
	bson_iter_t it;
	if (bson_iter_init(&it, in))
		sanitize_elements(&it, out);
}

void
print_json(FILE *out, const bson_t *doc)
{
	bson_t clean = BSON_INITIALIZER;
	sanitize_doc(doc, &clean);
	if (!json_write(out, &clean))
		warnx_("a document could not be written as JSON");
	bson_destroy(&clean);
}
