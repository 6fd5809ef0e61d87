/*
 * cpu_pool.h - the CPU engine's fork-join thread pool.
 *
 * A pool of n threads runs one job at a time: cpu_pool_run(pool, fn, arg)
 * calls fn(arg, tid, n) once for every tid in 0..n-1, tid 0 on the calling
 * thread and the others on the pool's workers, and returns when all have
 * finished. Work is split statically by tid (see cpu_pool_range), so a given
 * thread count always gives the same partition and, with fixed reduction
 * order, bit-identical results.
 *
 * Waiting: between jobs a worker spins briefly (a job usually follows within
 * microseconds during a forward pass), then sleeps on a futex, so the workers
 * are idle shortly after an engine call returns and never busy-wait for long
 * on a shared machine.
 *
 * Threads: a pool is driven by one thread at a time (the engine context's
 * caller); jobs must not call cpu_pool_run recursively.
 * Memory: cpu_pool_create allocates, cpu_pool_destroy joins and frees.
 * Errors: cpu_pool_create returns NULL when threads cannot be started.
 */
#ifndef ORCH_CPU_POOL_H
#define ORCH_CPU_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct cpu_pool cpu_pool;

typedef void (*cpu_pool_fn)(void *arg, int tid, int nth);

/* A pool of `threads` threads in total (the caller counts as one; threads>=1). */
cpu_pool *cpu_pool_create(int threads);

/* Stop and join the workers, free the pool. NULL is a no-op. */
void cpu_pool_destroy(cpu_pool *pool);

int cpu_pool_threads(const cpu_pool *pool);

/* Run fn(arg, tid, nth) on every thread; returns when all are done. */
void cpu_pool_run(cpu_pool *pool, cpu_pool_fn fn, void *arg);

/* Static partition of [0, n) into nth parts, multiples of `align` except the
 * last: part tid is [*lo, *hi). */
void cpu_pool_range(size_t n, int tid, int nth, size_t align, size_t *lo,
                    size_t *hi);

/* Number of CPUs this process may run on (at least 1). */
int cpu_pool_available_cpus(void);

#endif
