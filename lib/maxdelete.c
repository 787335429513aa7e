#include <string.h>

#include "maxdelete.h"
#include "util.h"

bool
gfs_max_delete_parse(const char *s, gfs_max_delete *out)
{
	size_t len = strlen(s);
	bool percent = len > 0 && s[len - 1] == '%';
	char digits[32];
	if (len == 0 || len - percent >= sizeof digits)
		return false;
	memcpy(digits, s, len - percent);
	digits[len - percent] = '\0';
	long v;
	/* strtol would take " 10", "+10" and "-0" as well */
	if (digits[0] < '0' || digits[0] > '9' || !gfs_parse_long(digits, 0, percent ? 100 : 1000000000L, &v))
		return false;
	*out = (gfs_max_delete){.set = true, .percent = percent, .limit = (uint64_t)v};
	return true;
}

bool
gfs_max_delete_check(const gfs_max_delete *m, uint64_t n, uint64_t managed, const char *what,
                     gfs_error *err)
{
	if (!m || !m->set)
		return true;
	/* n * 100 > limit * managed, in integers: no rounding lets one more through. */
	bool over = m->percent ? n * 100 > m->limit * managed : n > m->limit;
	if (!over)
		return true;
	if (m->percent)
		gfs_error_set(err, GFS_ELIMIT,
		              "%s would delete %llu of %llu files (%llu%%), more than --max-delete %llu%%: "
		              "nothing deleted", what, (unsigned long long)n, (unsigned long long)managed,
		              (unsigned long long)(managed ? n * 100 / managed : 100),
		              (unsigned long long)m->limit);
	else
		gfs_error_set(err, GFS_ELIMIT,
		              "%s would delete %llu files, more than --max-delete %llu: nothing deleted",
		              what, (unsigned long long)n, (unsigned long long)m->limit);
	return false;
}
