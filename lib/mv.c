/* mv: renaming every revision of a name, never leaving neither name resolving (mv.h). */
#include <stdlib.h>
#include <string.h>

#include "mv.h"

bool
gfs_mv_plan_load(gfs_session *s, const char *old_name, const char *new_name, gfs_mv_plan *plan,
                 gfs_error *err)
{
	memset(plan, 0, sizeof *plan);
	return gfs_revs_of_name(s, old_name, &plan->from, err) &&
	       gfs_revs_of_name(s, new_name, &plan->onto, err);
}

bool
gfs_mv_run(gfs_session *s, const gfs_mv_plan *plan, const char *new_name, size_t *renamed,
           int64_t *removed, gfs_error *err)
{
	*renamed = 0;
	*removed = 0;
	for (size_t i = 0; i < plan->from.n; i++) {
		gfs_error rerr;
		if (gfs_rename(s, &plan->from.v[i].id, new_name, &rerr)) {
			(*renamed)++;
		} else if (rerr.code != GFS_ENOTFOUND) {
			*err = rerr;
			return false;
		}
	}
	/* Nothing moved (removed meanwhile): what NEW holds is all there is of either. */
	if (*renamed == 0 && plan->from.n > 0) {
		gfs_error_set(err, GFS_ENOTFOUND, "%s: removed by another process during the move; "
		              "nothing renamed", plan->from.v[0].filename);
		return false;
	}
	if (plan->onto.n == 0)
		return true;
	bson_value_t *ids = gfs_xcalloc(plan->onto.n, sizeof *ids);
	for (size_t i = 0; i < plan->onto.n; i++)
		ids[i] = plan->onto.v[i].id; /* shallow: the plan keeps them */
	bool ok = gfs_delete_many(s, ids, plan->onto.n, NULL, removed, err);
	free(ids);
	return ok;
}

void
gfs_mv_plan_free(gfs_mv_plan *plan)
{
	gfs_revs_free(&plan->from);
	gfs_revs_free(&plan->onto);
}
