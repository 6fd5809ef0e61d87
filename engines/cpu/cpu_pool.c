/*
 * cpu_pool.c - fork-join thread pool with spin-then-futex waiting (see
 * cpu_pool.h). Linux futexes where available, a condition variable otherwise.
 */
#include "engines/cpu/cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#define POOL_HAVE_FUTEX 1
#else
#define POOL_HAVE_FUTEX 0
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_RELAX() _mm_pause()
#else
#define POOL_RELAX() ((void)0)
#endif

/* Spin iterations (a pause is ~25 ns here) before sleeping: about 40 us.
 * Jobs of a forward pass follow each other within microseconds; a longer
 * spin only burns a core that another process (or our own descheduled
 * thread) could use. */
#define POOL_SPIN 1600

typedef struct pool_worker {
    cpu_pool *pool;
    int tid;
} pool_worker;

struct cpu_pool {
    int nth;
    pthread_t *threads;
    pool_worker *workers;
    int started;
    /* The job; written by the driver before gen is bumped. */
    cpu_pool_fn fn;
    void *arg;
    int stop;
    _Atomic uint32_t gen;             /* job generation (workers wait on it) */
    _Atomic uint32_t remaining;       /* workers still running the job */
    _Atomic uint32_t sleepers;        /* workers asleep on gen */
    _Atomic uint32_t driver_sleeping; /* driver asleep on remaining */
    _Atomic uint32_t parked;          /* 1: workers sleep without spinning */
#if !POOL_HAVE_FUTEX
    pthread_mutex_t mu;
    pthread_cond_t cv;
#endif
};

#if POOL_HAVE_FUTEX
static void pool_wait(cpu_pool *p, _Atomic uint32_t *word, uint32_t val) {
    (void)p;
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void pool_wake(cpu_pool *p, _Atomic uint32_t *word) {
    (void)p;
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}
#else
static void pool_wait(cpu_pool *p, _Atomic uint32_t *word, uint32_t val) {
    pthread_mutex_lock(&p->mu);
    if (atomic_load(word) == val) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
static void pool_wake(cpu_pool *p, _Atomic uint32_t *word) {
    (void)word;
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}
#endif

static void *pool_main(void *varg) {
    pool_worker *w = varg;
    cpu_pool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (spins < POOL_SPIN &&
                !atomic_load_explicit(&p->parked, memory_order_relaxed)) {
                POOL_RELAX();
                spins++;
                continue;
            }
            atomic_fetch_add(&p->sleepers, 1);
            pool_wait(p, &p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
        }
        seen = g;
        if (p->stop) break;
        p->fn(p->arg, w->tid, p->nth);
        if (atomic_fetch_sub(&p->remaining, 1) == 1 && atomic_load(&p->driver_sleeping))
            pool_wake(p, &p->remaining);
    }
    return NULL;
}

int cpu_pool_available_cpus(void) {
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

cpu_pool *cpu_pool_create(int threads) {
    if (threads < 1) threads = 1;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nth = threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->remaining, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->driver_sleeping, 0);
    atomic_init(&p->parked, 1);
#if !POOL_HAVE_FUTEX
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
#endif
    if (threads > 1) {
        p->threads = calloc((size_t)threads, sizeof *p->threads);
        p->workers = calloc((size_t)threads, sizeof *p->workers);
        if (!p->threads || !p->workers) {
            cpu_pool_destroy(p);
            return NULL;
        }
        for (int t = 1; t < threads; t++) {
            p->workers[t].pool = p;
            p->workers[t].tid = t;
            if (pthread_create(&p->threads[t], NULL, pool_main, &p->workers[t]) != 0) {
                cpu_pool_destroy(p);
                return NULL;
            }
            p->started = t;
        }
    }
    return p;
}

static void pool_stop_fn(void *arg, int tid, int nth) {
    (void)arg;
    (void)tid;
    (void)nth;
}

void cpu_pool_destroy(cpu_pool *p) {
    if (!p) return;
    if (p->started > 0) {
        /* Wake every started worker with the stop flag set. Workers that
         * were never started do not count in `remaining`. */
        p->stop = 1;
        p->fn = pool_stop_fn;
        atomic_store(&p->remaining, (uint32_t)p->started);
        atomic_fetch_add(&p->gen, 1);
        pool_wake(p, &p->gen);
        for (int t = 1; t <= p->started; t++) pthread_join(p->threads[t], NULL);
    }
#if !POOL_HAVE_FUTEX
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
#endif
    free(p->threads);
    free(p->workers);
    free(p);
}

int cpu_pool_threads(const cpu_pool *p) { return p->nth; }

void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *arg) {
    if (p->nth == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->parked, 0, memory_order_relaxed);
    atomic_store(&p->remaining, (uint32_t)(p->nth - 1));
    atomic_fetch_add(&p->gen, 1); /* release: publishes fn/arg */
    if (atomic_load(&p->sleepers) > 0) pool_wake(p, &p->gen);
    fn(arg, 0, p->nth);
    int spins = 0;
    uint32_t r;
    while ((r = atomic_load_explicit(&p->remaining, memory_order_acquire)) != 0) {
        if (spins < POOL_SPIN) {
            POOL_RELAX();
            spins++;
            continue;
        }
        atomic_store(&p->driver_sleeping, 1);
        r = atomic_load(&p->remaining);
        if (r != 0) pool_wait(p, &p->remaining, r);
        atomic_store(&p->driver_sleeping, 0);
    }
}

typedef struct for_job {
    cpu_chunk_fn fn;
    void *arg;
    size_t n;
    _Atomic size_t next;
} for_job;

static void for_run(void *varg, int tid, int nth) {
    (void)nth;
    for_job *j = varg;
    for (;;) {
        size_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= j->n) break;
        j->fn(j->arg, c, tid);
    }
}

void cpu_pool_for(cpu_pool *p, size_t n_chunks, cpu_chunk_fn fn, void *arg) {
    if (n_chunks == 0) return;
    if (p->nth == 1 || n_chunks == 1) {
        for (size_t c = 0; c < n_chunks; c++) fn(arg, c, 0);
        return;
    }
    for_job j = { fn, arg, n_chunks, 0 };
    atomic_init(&j.next, 0);
    cpu_pool_run(p, for_run, &j);
}

size_t cpu_pool_chunks(const cpu_pool *p, size_t n, size_t min_items, size_t per_thread) {
    if (min_items == 0) min_items = 1;
    size_t k = (n + min_items - 1) / min_items;
    size_t cap = per_thread * (size_t)p->nth;
    if (k > cap) k = cap;
    return k ? k : 1;
}

void cpu_pool_park(cpu_pool *p) {
    if (p) atomic_store(&p->parked, 1);
}

void cpu_pool_range(size_t n, int tid, int nth, size_t align, size_t *lo, size_t *hi) {
    if (align == 0) align = 1;
    size_t units = (n + align - 1) / align;
    size_t a = units * (size_t)tid / (size_t)nth * align;
    size_t b = units * (size_t)(tid + 1) / (size_t)nth * align;
    if (a > n) a = n;
    if (b > n) b = n;
    *lo = a;
    *hi = b;
}
