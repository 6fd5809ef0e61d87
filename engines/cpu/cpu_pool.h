/*
 * cpu_pool.h - the CPU engine's fork-join thread pool.
 *
 * A pool of n threads runs one job at a time. cpu_pool_for(pool, k, fn, arg)
 * calls fn(arg, chunk, tid) once for every chunk in 0..k-1; the threads
 * (the caller is tid 0) take chunks from a shared counter, so a thread that
 * the OS deschedules (the machine is shared) does not hold up the others.
 * Chunk boundaries are fixed by the job's size and the thread count, never
 * by which thread runs a chunk, so with per-chunk partial results combined in
 * chunk order, a given thread count gives bit-identical results.
 * cpu_pool_run(pool, fn, arg) calls fn(arg, tid, n) once per thread.
 *
 * Waiting: between jobs a worker spins briefly (a job usually follows within
 * microseconds during a forward pass), then sleeps on a futex. At the end of
 * an engine call the driver parks the pool (cpu_pool_park): the workers stop
 * spinning and sleep at once, so they are idle when the call returns.
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
typedef void (*cpu_chunk_fn)(void *arg, size_t chunk, int tid);

/* A pool of `threads` threads in total (the caller counts as one; threads>=1). */
cpu_pool *cpu_pool_create(int threads);

/* Stop and join the workers, free the pool. NULL is a no-op. */
void cpu_pool_destroy(cpu_pool *pool);

int cpu_pool_threads(const cpu_pool *pool);

/* Run fn(arg, tid, nth) on every thread; returns when all are done. */
void cpu_pool_run(cpu_pool *pool, cpu_pool_fn fn, void *arg);

/* Run fn(arg, chunk, tid) for chunk = 0..n_chunks-1, chunks handed out
 * dynamically; returns when all are done. */
void cpu_pool_for(cpu_pool *pool, size_t n_chunks, cpu_chunk_fn fn, void *arg);

/* How many chunks to cut n items into: about per_thread per thread, none
 * smaller than min_items (at least 1). Depends only on n and the pool's
 * thread count. */
size_t cpu_pool_chunks(const cpu_pool *pool, size_t n, size_t min_items,
                       size_t per_thread);

/* Send the workers to sleep now (they are woken by the next run). */
void cpu_pool_park(cpu_pool *pool);

/* Partition of [0, n) into nth parts, multiples of `align` except the
 * last: part tid is [*lo, *hi) (used for chunks too: tid = chunk,
 * nth = number of chunks). */
void cpu_pool_range(size_t n, int tid, int nth, size_t align, size_t *lo, size_t *hi);

/* Number of CPUs this process may run on (at least 1). */
int cpu_pool_available_cpus(void);

#endif
