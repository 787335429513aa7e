/*
 * A bounded first-in first-out queue between threads: producers push,
 * workers pop, and closing tells the workers that nothing more will come.
 * Import's walk feeds its upload workers through one, verify's reader its
 * hashing threads, serve's request threads its backend workers.
 *
 * Items are opaque pointers; the queue never looks inside them. Each comes
 * with a weight in bytes, so that a queue can be bounded by what its items
 * hold as well as by their number. A push that would pass either bound
 * waits (or, offered, is refused) while the queue holds anything: an empty
 * queue takes one item of any weight, so that a large item cannot wait
 * forever for room that never comes.
 *
 * Closing is for good: pushes fail from then on (a producer blocked at the
 * bound wakes and fails too), and pops hand out what is left, then NULL.
 * So a worker loop is `while ((item = gfs_workq_pop(q)))`, and the owner
 * stops its workers by closing the queue and joining them; whatever a
 * worker should not do after a stop it decides itself, item by item.
 *
 * One mutex and two condition variables; items are kept in a ring that
 * grows as needed up to the bound, so a push allocates nothing most of the
 * time.
 */
#ifndef GFS_WORKQ_H
#define GFS_WORKQ_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gfs_workq gfs_workq;

/* A queue of at most max_items (at least 1) and max_bytes of weight (0: no byte bound). */
gfs_workq *gfs_workq_new(size_t max_items, size_t max_bytes);
/* Frees q, with no thread left using it; drop (if not NULL) gets each item still queued. */
void gfs_workq_free(gfs_workq *q, void (*drop)(void *item));
/* Appends item, waiting for room at the bound; false (item still the caller's) once closed. */
bool gfs_workq_push(gfs_workq *q, void *item, size_t bytes);
/* Appends item if there is room now; false (item still the caller's) when full or closed. */
bool gfs_workq_offer(gfs_workq *q, void *item, size_t bytes);
/* The oldest item, waiting for one; NULL once q is closed and empty. */
void *gfs_workq_pop(gfs_workq *q);
/* No more pushes; wakes every thread waiting in push or pop. Closing twice is harmless. */
void gfs_workq_close(gfs_workq *q);
/* Items queued now (taken by no worker yet): for metrics, stale as soon as it returns. */
size_t gfs_workq_count(gfs_workq *q);

#endif
