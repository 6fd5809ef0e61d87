/*
 * work_pool.h - a few worker threads that take the expensive steps of
 * serving a request off the HTTP threads (parsing and tokenizing a large
 * body, rendering a large answer), so the threads that accept and answer
 * connections (/health included) stay responsive.
 *
 * Jobs are intrusive: the caller embeds a work_item in its own object and
 * recovers the object in fn. Jobs run in submission order, each on one of
 * the threads.
 *
 * Memory: the pool owns its threads; items are borrowed until fn is called.
 * Threads: work_pool_submit is thread-safe; fn runs on a worker thread.
 * Errors: work_pool_create returns NULL (out of memory or threads);
 * work_pool_submit returns -1 once the pool is being destroyed (fn is not
 * called).
 */
#ifndef ORCH_WORK_POOL_H
#define ORCH_WORK_POOL_H

#include <stdint.h>

typedef struct work_item work_item;
struct work_item {
    void (*fn)(work_item *item);
    work_item *next; /* the pool's */
};

typedef struct work_pool work_pool;

/* threads >= 1 workers. */
work_pool *work_pool_create(uint32_t threads);
int work_pool_submit(work_pool *p, work_item *item);
/* Run every job still queued, stop and join the threads, free the pool. NULL
 * is a no-op. */
void work_pool_destroy(work_pool *p);

#endif
