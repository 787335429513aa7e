/*
 * --max-delete N|P%: the guard rail import, mirror and watch share. A run
 * that would delete more than N files, or more than P percent of the files
 * it manages, deletes nothing: the check comes before the first deletion,
 * on the count of everything the run would delete.
 */
#ifndef GFS_MAXDELETE_H
#define GFS_MAXDELETE_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"

typedef struct gfs_max_delete {
	bool set;           /* false: no limit */
	bool percent;       /* limit is a percentage of what the run manages */
	uint64_t limit;
} gfs_max_delete;

/* "N" (0 or more files) or "P%" (0 to 100); false on anything else. */
bool gfs_max_delete_parse(const char *s, gfs_max_delete *out);

/*
 * Whether deleting n of the managed files stays within m. When it does
 * not, false with GFS_ELIMIT and a message that starts with what ("mirror
 * --delete", say) and gives both counts.
 */
bool gfs_max_delete_check(const gfs_max_delete *m, uint64_t n, uint64_t managed, const char *what,
                          gfs_error *err);

#endif
