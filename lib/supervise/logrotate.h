/* An append-only log file rotated by size: FILE, FILE.1 (newest) ... FILE.N. */
#ifndef GFS_LOGROTATE_H
#define GFS_LOGROTATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct logfile {
	char *path;
	int fd;
	uint64_t size;
	uint64_t max;   /* 0: never rotate */
	int backups;    /* rotated files kept; 0: truncate instead */
	bool shifted;   /* FILE went to FILE.1 but could not be made anew: fd still writes FILE.1 */
	double retry_at; /* after a failed rotation, none is tried before then (monotonic s) */
};

/* Opens (creating, appending) path. Returns NULL with errno set. */
struct logfile *logfile_open(const char *path, uint64_t max, int backups);
/* Appends whole lines, rotating between lines so that no file passes max. False with errno set. */
bool logfile_write(struct logfile *lf, const char *data, size_t len);
/* Rotates now (whatever the backoff after a failure). */
bool logfile_rotate(struct logfile *lf);
void logfile_close(struct logfile *lf);

#endif
