/*
 * mv: the GridFS spec's renameByName, made of its rename (one update by
 * _id a revision) in an order that keeps a name resolving to a complete
 * file at every moment.
 *
 * A reader of a name gets its newest revision. The revisions of OLD are
 * renamed oldest first, so OLD keeps resolving to its newest until that
 * one, the last, carries NEW; from the first rename on NEW resolves too.
 * What NEW held before (only with force) is removed after the last
 * rename, through gfs_delete_many, so NEW never lacks a complete file
 * either: until then it resolves to its own newest or to OLD's.
 */
#ifndef GFS_MV_H
#define GFS_MV_H

#include "gfs.h"
#include "select.h"

typedef struct gfs_mv_plan {
	gfs_revs from;   /* OLD's revisions, oldest first */
	gfs_revs onto;   /* NEW's, before the move */
} gfs_mv_plan;

/* Finds both names' revisions (two equality queries) into plan, zeroed first. */
bool gfs_mv_plan_load(gfs_session *s, const char *old_name, const char *new_name,
                      gfs_mv_plan *plan, gfs_error *err);
/*
 * Renames plan->from to new_name, oldest first, then removes plan->onto.
 * *renamed counts the revisions renamed (one removed meanwhile by another
 * process is passed over), *removed the files documents of NEW removed.
 */
bool gfs_mv_run(gfs_session *s, const gfs_mv_plan *plan, const char *new_name, size_t *renamed,
                int64_t *removed, gfs_error *err);
void gfs_mv_plan_free(gfs_mv_plan *plan);

#endif
