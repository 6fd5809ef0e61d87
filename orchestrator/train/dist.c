/*
 * dist.c - MPI data parallelism for `orch train`: launcher detection, start-up
 * broadcast of the model, bucketed and overlapped gradient all-reduce, small
 * agreements between ranks, and the collective watchdog. See dist.h.
 */
#include "orchestrator/train/dist.h"

#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/core/util.h"

#if defined(ORCH_HAVE_MPI) && ORCH_HAVE_MPI
#define DIST_MPI 1
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#else
#define DIST_MPI 0
#endif

#define DIST_DEFAULT_TIMEOUT_S 60.0
#define DIST_DEFAULT_BUCKET_MB 25.0 /* train.allreduce_bucket_mb's default */
#define DIST_MIN_BUCKET_FLOATS 256u
#define DIST_COPY_CHUNK        (1u << 16) /* floats per grads_read between polls */
#define DIST_N_BUCKET_BUFS     3          /* buckets in flight at most */
#define DIST_BCAST_CHUNK       (1u << 30) /* bytes per MPI_Bcast call */

/* ------------------------------------------------------------------------- */
/* Launcher environment                                                       */
/* ------------------------------------------------------------------------- */
static const char *const g_world_vars[] = {
    "OMPI_COMM_WORLD_SIZE", /* OpenMPI mpirun */
    "PMI_SIZE",             /* PMI-1/PMI-2 launchers (srun --mpi=pmi2, hydra) */
    "SLURM_STEP_NUM_TASKS", /* any srun step (also with --mpi=pmix) */
};

int dist_env_world_size(char *var, size_t var_cap) {
    if (var && var_cap) var[0] = '\0';
    for (size_t i = 0; i < sizeof g_world_vars / sizeof *g_world_vars; i++) {
        const char *v = getenv(g_world_vars[i]);
        uint64_t n;
        if (!v || !*v || util_parse_u64(v, &n) != 0 || n == 0) continue;
        if (var) snprintf(var, var_cap, "%s", g_world_vars[i]);
        return n > INT_MAX ? INT_MAX : (int)n;
    }
    return 1;
}

int dist_have_mpi(void) { return DIST_MPI; }

/* ------------------------------------------------------------------------- */
/* Module state                                                               */
/* ------------------------------------------------------------------------- */
static struct {
    int inited;
    int active; /* MPI initialised by dist_init (world > 1) */
    int rank;
    int world;
    double timeout_s;      /* step collectives */
    double slow_timeout_s; /* start-up, checkpoint hand-over, finalize */
    size_t bucket_floats;
    int bucket_env; /* ORCH_DIST_BUCKET_MB set: it wins over the config */
    int overlap;    /* train.overlap_allreduce (dist_set_allreduce) */
    dist_allreduce_stats stats;
    float *bufs[DIST_N_BUCKET_BUFS];
    size_t buf_floats;
    /* ZeRO-1 (dist_zero_setup): n flat elements, this rank's shard, every
     * rank's count and displacement, one host buffer of n floats. */
    int zero;
    uint64_t zero_n, zero_off, zero_cnt;
    int *zero_counts, *zero_displs;
    float *zero_buf;
#if DIST_MPI
    MPI_Comm comm;
    int have_comm;
    /* watchdog */
    pthread_t wd_thread;
    int wd_started;
    atomic_llong wd_deadline_ms; /* 0: disarmed */
    _Atomic(const char *) wd_what;
    atomic_ullong wd_step;
    atomic_int wd_slow;
    atomic_int wd_quit;
    uint64_t step; /* last step seen by dist_allreduce_grads (messages) */
#endif
} g = { .rank = 0, .world = 1 };

/* The overlapped all-reduce of one step (dist_overlap_forward_backward and
 * dist_overlap_finish): a host copy of the whole flat gradient, the copied
 * range not yet handed to MPI ([lo, hi), contiguous), the requests started
 * this step, and the first failure inside the engine's callback. */
static struct {
    const engine_handle *h;
    orch_engine_ctx *ctx;
    float *buf;
    uint64_t n, buf_cap; /* elements this step / allocated */
    uint64_t lo, hi;     /* pending bucket */
    uint64_t reported;   /* elements reported by the engine this step */
    uint64_t step;
    int failed;
    int in_call; /* inside forward_backward_notify */
    char err[1024];
#if DIST_MPI
    MPI_Request *req;
    size_t n_req, req_cap;
#endif
} ov;

static void overlap_free(void) {
    free(ov.buf);
#if DIST_MPI
    free(ov.req);
#endif
    memset(&ov, 0, sizeof ov);
}

int dist_rank(void) { return g.rank; }
int dist_world(void) { return g.world; }
int dist_is_root(void) { return g.rank == 0; }

static size_t bucket_floats_of(double mb) {
    size_t n = (size_t)(mb * 1048576.0 / sizeof(float));
    return n < DIST_MIN_BUCKET_FLOATS ? DIST_MIN_BUCKET_FLOATS : n;
}

void dist_set_allreduce(double bucket_mb, int overlap) {
    if (!g.bucket_env && bucket_mb > 0 && bucket_mb <= 1024)
        g.bucket_floats = bucket_floats_of(bucket_mb);
    g.overlap = overlap != 0;
}

int dist_overlap_enabled(const orch_engine_api *api) {
    return g.active && g.world > 1 && g.overlap && !g.zero &&
           ORCH_API_HAS(api, forward_backward_notify);
}

size_t dist_bucket_floats(void) { return g.bucket_floats; }

void dist_get_allreduce_stats(dist_allreduce_stats *out) { *out = g.stats; }

#if DIST_MPI
static int parse_seconds(const char *name, double def, double *out, char *err,
                         size_t cap) {
    const char *v = getenv(name);
    *out = def;
    if (!v || !*v) return 0;
    double d;
    if (util_parse_double(v, &d) != 0 || !(d > 0) || d > 1e7) {
        util_set_err(err, cap, "%s='%s': expected a positive number of seconds", name, v);
        return -1;
    }
    *out = d;
    return 0;
}

static int read_settings(char *err, size_t cap) {
    if (parse_seconds("ORCH_DIST_TIMEOUT", DIST_DEFAULT_TIMEOUT_S, &g.timeout_s, err,
                      cap) != 0)
        return -1;
    double slow_def = g.timeout_s * 10 > 600 ? g.timeout_s * 10 : 600;
    if (parse_seconds("ORCH_DIST_SLOW_TIMEOUT", slow_def, &g.slow_timeout_s, err, cap) !=
        0)
        return -1;
    double mb = DIST_DEFAULT_BUCKET_MB;
    const char *v = getenv("ORCH_DIST_BUCKET_MB");
    if (v && *v && (util_parse_double(v, &mb) != 0 || !(mb > 0) || mb > 1024)) {
        util_set_err(err, cap,
                     "ORCH_DIST_BUCKET_MB='%s': expected a size in MiB in "
                     "(0, 1024]",
                     v);
        return -1;
    }
    g.bucket_env = v && *v;
    g.bucket_floats = bucket_floats_of(mb);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Watchdog                                                                   */
/* ------------------------------------------------------------------------- */
static long long now_ms(void) { return (long long)(util_now() * 1000.0); }

static void *watchdog_main(void *arg) {
    (void)arg;
    struct timespec nap = { 0, 50 * 1000 * 1000 }; /* 50 ms */
    while (!atomic_load(&g.wd_quit)) {
        nanosleep(&nap, NULL);
        long long d = atomic_load(&g.wd_deadline_ms);
        if (!d || now_ms() < d) continue;
        const char *what = atomic_load(&g.wd_what);
        int slow = atomic_load(&g.wd_slow);
        unsigned long long step = atomic_load(&g.wd_step);
        char at[48] = "";
        if (step) snprintf(at, sizeof at, " at step %llu", step);
        char line[512];
        int n =
            snprintf(line, sizeof line,
                     "orch: error: rank %d of %d: %s%s has not completed after %g s "
                     "(%s): another rank died or hangs; exiting so the launcher stops "
                     "the job (the last checkpoint is kept)\n",
                     g.rank, g.world, what ? what : "collective", at,
                     slow ? g.slow_timeout_s : g.timeout_s,
                     slow ? "ORCH_DIST_SLOW_TIMEOUT" : "ORCH_DIST_TIMEOUT");
        if (n > 0) {
            ssize_t w = write(STDERR_FILENO, line,
                              (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
            (void)w;
        }
        _exit(ORCH_EXIT_FAILURE);
    }
    return NULL;
}

static int watchdog_start(char *err, size_t cap) {
    atomic_store(&g.wd_deadline_ms, 0);
    atomic_store(&g.wd_quit, 0);
    if (util_thread_start_nosignals(&g.wd_thread, watchdog_main, NULL) != 0) {
        util_set_err(err, cap, "dist: cannot start the watchdog thread");
        return -1;
    }
    g.wd_started = 1;
    return 0;
}

static void watchdog_stop(void) {
    if (!g.wd_started) return;
    atomic_store(&g.wd_quit, 1);
    pthread_join(g.wd_thread, NULL);
    g.wd_started = 0;
}

/* what must be a string literal (the watchdog may read it at any time). */
static void wd_arm(const char *what, uint64_t step, int slow) {
    if (step) g.step = step;
    atomic_store(&g.wd_what, what);
    atomic_store(&g.wd_step, (unsigned long long)g.step);
    atomic_store(&g.wd_slow, slow);
    double t = slow ? g.slow_timeout_s : g.timeout_s;
    atomic_store(&g.wd_deadline_ms, now_ms() + (long long)(t * 1000.0) + 1);
}

static void wd_disarm(void) { atomic_store(&g.wd_deadline_ms, 0); }

/* ------------------------------------------------------------------------- */
/* MPI helpers                                                                */
/* ------------------------------------------------------------------------- */
static int mpi_fail(int code, const char *what, char *err, size_t cap) {
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(code, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "code %d", code);
    util_set_err(err, cap, "rank %d of %d: %s failed: %s", g.rank, g.world, what, s);
    return -1;
}

static int bcast_raw(void *buf, size_t n, const char *what, char *err, size_t cap) {
    unsigned char *p = buf;
    while (n > 0) {
        size_t c = n < DIST_BCAST_CHUNK ? n : DIST_BCAST_CHUNK;
        int rc = MPI_Bcast(p, (int)c, MPI_BYTE, 0, g.comm);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, what, err, cap);
        p += c;
        n -= c;
    }
    return 0;
}
#endif /* DIST_MPI */

/* ------------------------------------------------------------------------- */
/* Life cycle                                                                 */
/* ------------------------------------------------------------------------- */
int dist_init(char *err, size_t err_cap) {
    if (g.inited) return 0;
    char var[64];
    int env_world = dist_env_world_size(var, sizeof var);
    if (env_world <= 1) {
        g.inited = 1;
        return 0;
    }
#if !DIST_MPI
    util_set_err(err, err_cap,
                 "the launcher started %d processes (%s=%d) but this orch was "
                 "built without MPI, so it cannot train data-parallel: rebuild "
                 "with OpenMPI (apt-get install libopenmpi-dev openmpi-bin; "
                 "make) or run a single process",
                 env_world, var, env_world);
    return -1;
#else
    if (read_settings(err, err_cap) != 0) return -1;
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread", err, err_cap);
    g.active = 1;
    g.inited = 1;
    if (provided < MPI_THREAD_FUNNELED) {
        util_set_err(err, err_cap,
                     "MPI provides thread level %d, orch needs "
                     "MPI_THREAD_FUNNELED (%d)",
                     provided, MPI_THREAD_FUNNELED);
        return -1;
    }
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &g.comm);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_dup", err, err_cap);
    g.have_comm = 1;
    MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g.comm, &g.rank);
    MPI_Comm_size(g.comm, &g.world);
    if (g.world != env_world) {
        util_set_err(err, err_cap,
                     "the launcher started %d processes (%s=%d) but MPI sees "
                     "a world of %d: the processes did not find each other "
                     "(with srun, pass --mpi=pmix or --mpi=pmi2 as your Slurm "
                     "and OpenMPI support; see tools/slurm/train.sbatch)",
                     env_world, var, env_world, g.world);
        return -1;
    }
    if (watchdog_start(err, err_cap) != 0) return -1;
    return 0;
#endif
}

int dist_finish(int rc, int agreed) {
#if DIST_MPI
    if (!g.active) return rc;
    if (!agreed) {
        fflush(stdout);
        fflush(stderr);
        watchdog_stop();
        MPI_Abort(MPI_COMM_WORLD, rc ? rc : ORCH_EXIT_FAILURE);
        _exit(rc ? rc : ORCH_EXIT_FAILURE); /* MPI_Abort should not return */
    }
    fflush(stdout);
    wd_arm("MPI_Finalize", 0, 1);
    if (g.have_comm) MPI_Comm_free(&g.comm);
    g.have_comm = 0;
    MPI_Finalize();
    wd_disarm();
    watchdog_stop();
    g.active = 0;
#else
    (void)agreed;
#endif
    for (int i = 0; i < DIST_N_BUCKET_BUFS; i++) {
        free(g.bufs[i]);
        g.bufs[i] = NULL;
    }
    g.buf_floats = 0;
    free(g.zero_counts);
    free(g.zero_displs);
    free(g.zero_buf);
    g.zero_counts = g.zero_displs = NULL;
    g.zero_buf = NULL;
    g.zero = 0;
    overlap_free();
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Small collectives                                                          */
/* ------------------------------------------------------------------------- */
int dist_bcast_bytes(void *buf, size_t n, const char *what, char *err, size_t err_cap) {
#if DIST_MPI
    if (!g.active) return 0;
    wd_arm("broadcast from rank 0", 0, 1);
    int rc = bcast_raw(buf, n, what, err, err_cap);
    wd_disarm();
    return rc;
#else
    (void)buf, (void)n, (void)what, (void)err, (void)err_cap;
    return 0;
#endif
}

#if DIST_MPI
static uint64_t fnv1a(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
#endif

int dist_check_same(const void *data, size_t n, const char *what, char *err,
                    size_t err_cap) {
#if DIST_MPI
    if (!g.active) return 0;
    uint64_t h = fnv1a(data, n, 0xcbf29ce484222325ull);
    uint64_t v[2] = { h, ~h }, r[2];
    wd_arm("agreement between ranks", 0, 1);
    int rc = MPI_Allreduce(v, r, 2, MPI_UINT64_T, MPI_MAX, g.comm);
    wd_disarm();
    if (rc != MPI_SUCCESS) return mpi_fail(rc, what, err, err_cap);
    if (r[0] != ~r[1]) { /* max(h) != min(h) */
        util_set_err(err, err_cap,
                     "ranks disagree on %s (every rank must run the same "
                     "command on the same files)",
                     what);
        return -1;
    }
    return 0;
#else
    (void)data, (void)n, (void)what, (void)err, (void)err_cap;
    return 0;
#endif
}

int dist_allreduce_sum(double *v, size_t n, const char *what, char *err, size_t err_cap) {
#if DIST_MPI
    if (!g.active || n == 0) return 0;
    if (n > INT_MAX) {
        util_set_err(err, err_cap, "%s: too many values", what);
        return -1;
    }
    wd_arm("sum over ranks", 0, 0);
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_DOUBLE, MPI_SUM, g.comm);
    wd_disarm();
    if (rc != MPI_SUCCESS) return mpi_fail(rc, what, err, err_cap);
    return 0;
#else
    (void)v, (void)n, (void)what, (void)err, (void)err_cap;
    return 0;
#endif
}

int dist_share_status(int *rc_io, char *msg, size_t msg_cap, char *err, size_t err_cap) {
#if DIST_MPI
    if (!g.active) return 0;
    int32_t head[2] = { 0, 0 };
    if (g.rank == 0) {
        size_t len = msg ? strnlen(msg, msg_cap) : 0;
        head[0] = *rc_io;
        head[1] = (int32_t)(len > INT32_MAX ? INT32_MAX : len);
    }
    wd_arm("hand-over from rank 0 (checkpoint)", 0, 1);
    int rc = bcast_raw(head, sizeof head, "status broadcast", err, err_cap);
    size_t len = (size_t)(head[1] < 0 ? 0 : head[1]);
    char *text = NULL;
    if (rc == 0) {
        text = malloc(len + 1);
        if (!text) {
            wd_disarm();
            util_set_err(err, err_cap, "status broadcast: out of memory");
            return -1;
        }
        if (g.rank == 0 && len) memcpy(text, msg, len);
        rc = len ? bcast_raw(text, len, "status broadcast", err, err_cap) : 0;
        text[len] = '\0';
    }
    wd_disarm();
    if (rc == 0 && g.rank != 0) {
        *rc_io = head[0];
        if (msg && msg_cap) snprintf(msg, msg_cap, "%s", text);
    }
    free(text);
    return rc;
#else
    (void)rc_io, (void)msg, (void)msg_cap, (void)err, (void)err_cap;
    return 0;
#endif
}

/* ------------------------------------------------------------------------- */
/* Model broadcast                                                            */
/* ------------------------------------------------------------------------- */
#if DIST_MPI
static int engine_err(const engine_handle *h, orch_engine_ctx *ctx, int32_t st,
                      const char *what, char *err, size_t cap) {
    char m[1024];
    engine_format_error(h, ctx, st, m, sizeof m);
    util_set_err(err, cap, "rank %d of %d: engine %s: %s failed: %s", g.rank, g.world,
                 h->api->name, what, m);
    return -1;
}

static size_t dtype_size(uint32_t dt) {
    switch (dt) {
    case ORCH_DTYPE_F16:
    case ORCH_DTYPE_BF16: return 2;
    default: return 4;
    }
}

static int bcast_table(const engine_handle *h, orch_engine_ctx *ctx, uint32_t kind,
                       char *err, size_t cap) {
    const orch_engine_api *api = h->api;
    uint32_t count = 0;
    int32_t st = api->tensor_count(ctx, kind, &count);
    if (st != ORCH_OK) return engine_err(h, ctx, st, "tensor_count", err, cap);
    orch_tensor_info *info = calloc(count ? count : 1, sizeof *info);
    if (!info) {
        util_set_err(err, cap, "model broadcast: out of memory");
        return -1;
    }
    uint64_t fp = 0xcbf29ce484222325ull;
    size_t max_bytes = 0;
    int rc = 0;
    fp = fnv1a(&count, sizeof count, fp);
    for (uint32_t i = 0; i < count && rc == 0; i++) {
        info[i].struct_size = sizeof info[i];
        st = api->tensor_info(ctx, kind, i, &info[i]);
        if (st != ORCH_OK) {
            rc = engine_err(h, ctx, st, "tensor_info", err, cap);
            break;
        }
        info[i].name[ORCH_TENSOR_NAME_MAX - 1] = '\0';
        fp = fnv1a(info[i].name, strlen(info[i].name), fp);
        fp = fnv1a(&info[i].dtype, sizeof info[i].dtype, fp);
        fp = fnv1a(&info[i].numel, sizeof info[i].numel, fp);
        fp = fnv1a(info[i].shape, sizeof info[i].shape, fp);
        size_t b = (size_t)info[i].numel * dtype_size(info[i].dtype);
        if (b > max_bytes) max_bytes = b;
    }
    if (rc == 0)
        rc = dist_check_same(&fp, sizeof fp,
                             "the engine's tensor tables (same engine and "
                             "model on every rank?)",
                             err, cap);
    void *buf = rc == 0 ? malloc(max_bytes ? max_bytes : 1) : NULL;
    if (rc == 0 && !buf) {
        util_set_err(err, cap, "model broadcast: out of memory (%zu bytes)", max_bytes);
        rc = -1;
    }
    for (uint32_t i = 0; i < count && rc == 0; i++) {
        size_t b = (size_t)info[i].numel * dtype_size(info[i].dtype);
        if (g.rank == 0) {
            st = api->tensor_read(ctx, kind, i, buf, b);
            if (st != ORCH_OK) {
                rc = engine_err(h, ctx, st, "tensor_read", err, cap);
                break;
            }
        }
        wd_arm("model broadcast from rank 0", 0, 1);
        rc = bcast_raw(buf, b, "model broadcast", err, cap);
        wd_disarm();
        if (rc == 0 && g.rank != 0) {
            st = api->tensor_write(ctx, kind, i, buf, b);
            if (st != ORCH_OK) rc = engine_err(h, ctx, st, "tensor_write", err, cap);
        }
    }
    free(buf);
    free(info);
    return rc;
}
#endif

int dist_bcast_model(const engine_handle *h, orch_engine_ctx *ctx, char *err,
                     size_t err_cap) {
#if DIST_MPI
    if (!g.active) return 0;
    static const uint32_t kinds[3] = { ORCH_TENSOR_PARAM, ORCH_TENSOR_ADAM_M,
                                       ORCH_TENSOR_ADAM_V };
    for (int k = 0; k < 3; k++)
        if (bcast_table(h, ctx, kinds[k], err, err_cap) != 0) return -1;
    return 0;
#else
    (void)h, (void)ctx, (void)err, (void)err_cap;
    return 0;
#endif
}

/* ------------------------------------------------------------------------- */
/* Gradient all-reduce                                                        */
/* ------------------------------------------------------------------------- */
#if DIST_MPI
static int param_count(const engine_handle *h, orch_engine_ctx *ctx, uint64_t *out,
                       char *err, size_t cap) {
    uint32_t count = 0;
    int32_t st = h->api->tensor_count(ctx, ORCH_TENSOR_PARAM, &count);
    if (st != ORCH_OK) return engine_err(h, ctx, st, "tensor_count", err, cap);
    uint64_t n = 0;
    for (uint32_t i = 0; i < count; i++) {
        orch_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        st = h->api->tensor_info(ctx, ORCH_TENSOR_PARAM, i, &ti);
        if (st != ORCH_OK) return engine_err(h, ctx, st, "tensor_info", err, cap);
        n += ti.numel;
    }
    *out = n;
    return 0;
}

/* Let MPI progress the requests in flight (libnbc progresses only inside MPI
 * calls). A finished request becomes MPI_REQUEST_NULL. */
static int poll_requests(MPI_Request *req, int n, char *err, size_t cap) {
    for (int i = 0; i < n; i++) {
        if (req[i] == MPI_REQUEST_NULL) continue;
        int done = 0;
        int rc = MPI_Test(&req[i], &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "gradient all-reduce (MPI_Test)", err, cap);
    }
    return 0;
}

/* Copy count floats from/to the engine's flat gradient buffer in chunks,
 * polling the requests in flight between chunks. */
static int copy_grads(const engine_handle *h, orch_engine_ctx *ctx, int write,
                      uint64_t off, uint64_t count, float *buf, MPI_Request *req,
                      int n_req, char *err, size_t cap) {
    for (uint64_t c = 0; c < count; c += DIST_COPY_CHUNK) {
        uint64_t k = count - c < DIST_COPY_CHUNK ? count - c : DIST_COPY_CHUNK;
        int32_t st = write ? h->api->grads_write(ctx, off + c, k, buf + c)
                           : h->api->grads_read(ctx, off + c, k, buf + c);
        if (st != ORCH_OK)
            return engine_err(h, ctx, st, write ? "grads_write" : "grads_read", err, cap);
        if (poll_requests(req, n_req, err, cap) != 0) return -1;
    }
    return 0;
}
#endif

int dist_allreduce_grads(const engine_handle *h, orch_engine_ctx *ctx, double *scalars,
                         uint32_t n_scalars, uint64_t step, char *err, size_t err_cap) {
#if DIST_MPI
    if (!g.active) return 0;
    uint64_t n = 0;
    if (param_count(h, ctx, &n, err, err_cap) != 0) return -1;
    size_t bucket = g.bucket_floats;
    if (bucket > n && n > 0) bucket = (size_t)n;
    if (bucket > (size_t)INT_MAX) bucket = (size_t)INT_MAX;
    if (g.buf_floats < bucket) {
        for (int i = 0; i < DIST_N_BUCKET_BUFS; i++) {
            free(g.bufs[i]);
            g.bufs[i] = malloc(bucket * sizeof(float));
            if (!g.bufs[i]) {
                g.buf_floats = 0;
                util_set_err(err, err_cap,
                             "gradient all-reduce: out of memory (%zu bytes)",
                             bucket * sizeof(float));
                return -1;
            }
        }
        g.buf_floats = bucket;
    }

    /* req[0..K-1]: bucket buffers; req[K]: the scalars. */
    MPI_Request req[DIST_N_BUCKET_BUFS + 1];
    int pending[DIST_N_BUCKET_BUFS] = { 0 };
    uint64_t b_off[DIST_N_BUCKET_BUFS] = { 0 }, b_cnt[DIST_N_BUCKET_BUFS] = { 0 };
    for (int i = 0; i <= DIST_N_BUCKET_BUFS; i++) req[i] = MPI_REQUEST_NULL;
    const int n_req = DIST_N_BUCKET_BUFS + 1;
    int rc;

    const double t0 = util_now();
    wd_arm("gradient all-reduce", step, 0);
    if (n_scalars) {
        rc = MPI_Iallreduce(MPI_IN_PLACE, scalars, (int)n_scalars, MPI_DOUBLE, MPI_SUM,
                            g.comm, &req[DIST_N_BUCKET_BUFS]);
        if (rc != MPI_SUCCESS) goto mpi_error;
    }
    uint64_t n_buckets = n ? (n + bucket - 1) / bucket : 0;
    for (uint64_t b = 0; b < n_buckets + DIST_N_BUCKET_BUFS; b++) {
        int s = (int)(b % DIST_N_BUCKET_BUFS);
        if (pending[s]) { /* the bucket that used this buffer: finish it */
            rc = MPI_Wait(&req[s], MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) goto mpi_error;
            pending[s] = 0;
            if (copy_grads(h, ctx, 1, b_off[s], b_cnt[s], g.bufs[s], req, n_req, err,
                           err_cap) != 0)
                goto fail;
        }
        if (b >= n_buckets) continue; /* draining */
        b_off[s] = b * bucket;
        b_cnt[s] = n - b_off[s] < bucket ? n - b_off[s] : bucket;
        if (copy_grads(h, ctx, 0, b_off[s], b_cnt[s], g.bufs[s], req, n_req, err,
                       err_cap) != 0)
            goto fail;
        rc = MPI_Iallreduce(MPI_IN_PLACE, g.bufs[s], (int)b_cnt[s], MPI_FLOAT, MPI_SUM,
                            g.comm, &req[s]);
        if (rc != MPI_SUCCESS) goto mpi_error;
        pending[s] = 1;
    }
    rc = MPI_Wait(&req[DIST_N_BUCKET_BUFS], MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) goto mpi_error;
    wd_disarm();
    g.stats.steps++;
    g.stats.buckets += n_buckets;
    g.stats.wait_s += util_now() - t0;
    return 0;
mpi_error:
    mpi_fail(rc, "gradient all-reduce", err, err_cap);
fail:
    /* Requests may still be in flight: the caller ends the job (dist_finish
     * without agreement), so nothing is reused. */
    wd_disarm();
    return -1;
#else
    (void)h, (void)ctx, (void)scalars, (void)n_scalars, (void)step, (void)err,
        (void)err_cap;
    return 0;
#endif
}

/* ------------------------------------------------------------------------- */
/* Overlapped gradient all-reduce (forward_backward_notify, ABI 1.3)          */
/* ------------------------------------------------------------------------- */
#if DIST_MPI
static void ov_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void ov_fail(const char *fmt, ...) {
    if (ov.failed) return;
    ov.failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ov.err, sizeof ov.err, fmt, ap);
    va_end(ap);
}

/* MPI_Testall over this step's requests: lets MPI progress them (libnbc
 * moves only inside MPI calls); finished ones become MPI_REQUEST_NULL. */
static void ov_progress(void) {
    if (ov.failed || ov.n_req == 0) return;
    int done = 0;
    int rc = MPI_Testall((int)ov.n_req, ov.req, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        char m[512];
        mpi_fail(rc, "gradient all-reduce (MPI_Testall)", m, sizeof m);
        ov_fail("%s", m);
    }
}

/* Start the all-reduce (SUM, in place) of buf[off, off+count). */
static void ov_launch(uint64_t off, uint64_t count) {
    if (ov.failed || count == 0) return;
    if (ov.n_req == ov.req_cap) {
        size_t cap = ov.req_cap ? 2 * ov.req_cap : 64;
        MPI_Request *r = realloc(ov.req, cap * sizeof *r);
        if (!r) {
            ov_fail("gradient all-reduce: out of memory (%zu requests)", cap);
            return;
        }
        ov.req = r;
        ov.req_cap = cap;
    }
    int rc = MPI_Iallreduce(MPI_IN_PLACE, ov.buf + off, (int)count, MPI_FLOAT, MPI_SUM,
                            g.comm, &ov.req[ov.n_req]);
    if (rc != MPI_SUCCESS) {
        char m[512];
        mpi_fail(rc, "gradient all-reduce (MPI_Iallreduce)", m, sizeof m);
        ov_fail("%s", m);
        return;
    }
    ov.n_req++;
    g.stats.buckets++;
    if (ov.in_call) g.stats.buckets_early++;
}

/* Hand the pending bucket [lo, hi) to MPI in pieces of at most a bucket:
 * all of it (flush) or only whole buckets, cut from the end that will not
 * grow (from the top when the ranges come in descending order, as the
 * header's typical order is; from the bottom otherwise). */
static void ov_launch_pending(int flush, int descending) {
    const uint64_t b = g.bucket_floats;
    while (!ov.failed && ov.hi - ov.lo >= (flush ? 1 : b)) {
        uint64_t c = ov.hi - ov.lo < b ? ov.hi - ov.lo : b;
        if (descending) {
            ov_launch(ov.hi - c, c);
            ov.hi -= c;
        } else {
            ov_launch(ov.lo, c);
            ov.lo += c;
        }
    }
}

/* The engine's orch_grad_ready_fn: copy the final range out (grads_read,
 * in chunks with MPI progress between), merge it into the pending bucket
 * when adjacent (else send the pending one first), start whole buckets. */
static void ov_ready(void *user, uint64_t offset, uint64_t count) {
    (void)user;
    if (ov.failed || count == 0) return;
    if (offset > ov.n || count > ov.n - offset) {
        ov_fail("engine %s: forward_backward_notify reported [%llu, %llu), outside "
                "the %llu gradient elements",
                ov.h->api->name, (unsigned long long)offset,
                (unsigned long long)(offset + count), (unsigned long long)ov.n);
        return;
    }
    const int below = ov.hi > ov.lo && offset + count == ov.lo;
    const int above = ov.hi > ov.lo && offset == ov.hi;
    if (ov.hi > ov.lo && !below && !above) ov_launch_pending(1, 1);
    for (uint64_t c = 0; c < count && !ov.failed; c += DIST_COPY_CHUNK) {
        uint64_t k = count - c < DIST_COPY_CHUNK ? count - c : DIST_COPY_CHUNK;
        int32_t st = ov.h->api->grads_read(ov.ctx, offset + c, k, ov.buf + offset + c);
        if (st != ORCH_OK) {
            char m[512];
            engine_err(ov.h, ov.ctx, st, "grads_read (in the gradient-ready callback)", m,
                       sizeof m);
            ov_fail("%s", m);
            return;
        }
        ov_progress();
    }
    if (ov.hi == ov.lo) {
        ov.lo = offset;
        ov.hi = offset + count;
    } else if (below) {
        ov.lo = offset;
    } else {
        ov.hi = offset + count;
    }
    ov.reported += count;
    ov_launch_pending(0, !above);
    ov_progress();
}
#endif

int dist_overlap_forward_backward(const engine_handle *h, orch_engine_ctx *ctx,
                                  const int32_t *tokens, const int32_t *targets,
                                  uint32_t batch, uint32_t seq_len, float grad_scale,
                                  float *out_loss, int32_t *engine_status, uint64_t step,
                                  char *err, size_t err_cap) {
    *engine_status = ORCH_OK;
#if DIST_MPI
    if (!dist_overlap_enabled(h->api)) {
        util_set_err(err, err_cap, "overlapped all-reduce is not enabled");
        return -1;
    }
    uint64_t n = 0;
    if (param_count(h, ctx, &n, err, err_cap) != 0) return -1;
    if (n > ov.buf_cap) {
        free(ov.buf);
        ov.buf_cap = 0;
        ov.buf = malloc((size_t)(n ? n : 1) * sizeof(float));
        if (!ov.buf) {
            util_set_err(err, err_cap,
                         "overlapped gradient all-reduce: out of memory (%llu bytes)",
                         (unsigned long long)(n * sizeof(float)));
            return -1;
        }
        ov.buf_cap = n;
    }
    ov.h = h;
    ov.ctx = ctx;
    ov.n = n;
    ov.lo = ov.hi = 0;
    ov.reported = 0;
    ov.n_req = 0;
    ov.step = step;
    ov.failed = 0;
    ov.err[0] = '\0';
    g.step = step;
    ov.in_call = 1;
    int32_t st = h->api->forward_backward_notify(ctx, tokens, targets, batch, seq_len,
                                                 grad_scale, out_loss, ov_ready, NULL);
    ov.in_call = 0;
    if (st != ORCH_OK) {
        *engine_status = st;
        return -1;
    }
    if (ov.failed) {
        util_set_err(err, err_cap, "%s", ov.err);
        return -1;
    }
    return 0;
#else
    (void)h, (void)ctx, (void)tokens, (void)targets, (void)batch, (void)seq_len,
        (void)grad_scale, (void)out_loss, (void)step;
    util_set_err(err, err_cap, "overlapped all-reduce needs an MPI build");
    return -1;
#endif
}

int dist_overlap_finish(const engine_handle *h, orch_engine_ctx *ctx, double *scalars,
                        uint32_t n_scalars, uint64_t step, char *err, size_t err_cap) {
#if DIST_MPI
    if (ov.h != h || ov.ctx != ctx || ov.step != step) {
        util_set_err(err, err_cap, "dist_overlap_finish without its forward_backward");
        return -1;
    }
    const double t0 = util_now();
    ov_launch_pending(1, 1);
    if (!ov.failed && ov.reported != ov.n)
        ov_fail("engine %s: forward_backward_notify reported %llu of %llu gradient "
                "elements (the ranges must cover the buffer exactly once)",
                h->api->name, (unsigned long long)ov.reported, (unsigned long long)ov.n);
    MPI_Request sreq = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    if (!ov.failed && n_scalars)
        rc = MPI_Iallreduce(MPI_IN_PLACE, scalars, (int)n_scalars, MPI_DOUBLE, MPI_SUM,
                            g.comm, &sreq);
    if (ov.failed) { /* requests may be in flight: the caller ends the job */
        util_set_err(err, err_cap, "%s", ov.err);
        return -1;
    }
    wd_arm("gradient all-reduce", step, 0);
    if (rc == MPI_SUCCESS && ov.n_req)
        rc = MPI_Waitall((int)ov.n_req, ov.req, MPI_STATUSES_IGNORE);
    if (rc == MPI_SUCCESS) rc = MPI_Wait(&sreq, MPI_STATUS_IGNORE);
    wd_disarm();
    ov.h = NULL;
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "gradient all-reduce", err, err_cap);
    /* The summed gradient back into the engine, as dist_allreduce_grads. */
    for (uint64_t c = 0; c < ov.n; c += DIST_COPY_CHUNK) {
        uint64_t k = ov.n - c < DIST_COPY_CHUNK ? ov.n - c : DIST_COPY_CHUNK;
        int32_t st = h->api->grads_write(ctx, c, k, ov.buf + c);
        if (st != ORCH_OK) return engine_err(h, ctx, st, "grads_write", err, err_cap);
    }
    g.stats.steps++;
    g.stats.wait_s += util_now() - t0;
    return 0;
#else
    (void)h, (void)ctx, (void)scalars, (void)n_scalars, (void)step;
    util_set_err(err, err_cap, "overlapped all-reduce needs an MPI build");
    return -1;
#endif
}

/* ------------------------------------------------------------------------- */
/* ZeRO-1: sharded AdamW moments                                              */
/* ------------------------------------------------------------------------- */
void dist_shard_of(uint64_t n, int rank, int world, uint64_t *off, uint64_t *count) {
    uint64_t w = world > 0 ? (uint64_t)world : 1, r = (uint64_t)(rank > 0 ? rank : 0);
    uint64_t base = n / w, extra = n % w;
    *count = base + (r < extra ? 1 : 0);
    *off = r * base + (r < extra ? r : extra);
}

static int zero_engine_err(const engine_handle *h, orch_engine_ctx *ctx, int32_t st,
                           const char *what, char *err, size_t cap) {
    char m[1024];
    engine_format_error(h, ctx, st, m, sizeof m);
    util_set_err(err, cap, "rank %d of %d: engine %s: %s failed: %s", g.rank, g.world,
                 h->api->name, what, m);
    return -1;
}

int dist_zero_supported(const orch_engine_api *api, char *err, size_t err_cap) {
    if (ORCH_API_HAS(api, param_read) && ORCH_API_HAS(api, param_write) &&
        ORCH_API_HAS(api, optimizer_shard) && ORCH_API_HAS(api, moments_read) &&
        ORCH_API_HAS(api, moments_write) && ORCH_API_HAS(api, optimizer_step_range) &&
        ORCH_API_HAS(api, optimizer_bytes))
        return 1;
    util_set_err(err, err_cap,
                 "train.zero = 1: engine %s has ABI %u.%u without the ranged optimizer "
                 "step (ZeRO-1 needs ABI 1.2: optimizer_step_range, optimizer_shard, "
                 "moments_read/write, param_read/write); set train.zero = 0",
                 api->name, api->abi_major, api->abi_minor);
    return 0;
}

int dist_zero_setup(const engine_handle *h, orch_engine_ctx *ctx, uint64_t n_params,
                    uint64_t *off, uint64_t *count, char *err, size_t err_cap) {
    if (!dist_zero_supported(h->api, err, err_cap)) return -1;
    if (n_params == 0 || n_params > (uint64_t)INT_MAX) {
        util_set_err(err, err_cap,
                     "train.zero = 1: %llu parameters; MPI counts this implementation "
                     "uses hold 1 .. %d",
                     (unsigned long long)n_params, INT_MAX);
        return -1;
    }
    free(g.zero_counts);
    free(g.zero_displs);
    free(g.zero_buf);
    g.zero_counts = calloc((size_t)g.world, sizeof(int));
    g.zero_displs = calloc((size_t)g.world, sizeof(int));
    g.zero_buf = malloc((size_t)n_params * sizeof(float));
    if (!g.zero_counts || !g.zero_displs || !g.zero_buf) {
        util_set_err(err, err_cap, "train.zero = 1: out of memory (%llu bytes)",
                     (unsigned long long)(n_params * sizeof(float)));
        return -1;
    }
    for (int r = 0; r < g.world; r++) {
        uint64_t o, c;
        dist_shard_of(n_params, r, g.world, &o, &c);
        g.zero_counts[r] = (int)c;
        g.zero_displs[r] = (int)o;
    }
    g.zero_n = n_params;
    dist_shard_of(n_params, g.rank, g.world, &g.zero_off, &g.zero_cnt);
    int32_t st = h->api->optimizer_shard(ctx, g.zero_off, g.zero_cnt);
    if (st != ORCH_OK)
        return zero_engine_err(h, ctx, st, "optimizer_shard", err, err_cap);
    g.zero = 1;
    *off = g.zero_off;
    *count = g.zero_cnt;
    return 0;
}

int dist_zero_step(const engine_handle *h, orch_engine_ctx *ctx,
                   const orch_adamw_params *ap, double *scalars, uint32_t n_scalars,
                   uint64_t step, float *out_norm, int *diverged, char *err,
                   size_t err_cap) {
    const orch_engine_api *api = h->api;
    const uint64_t n = g.zero_n, off = g.zero_off, cnt = g.zero_cnt;
    float *buf = g.zero_buf;
    *diverged = 0;
    if (!g.zero || n_scalars > 15) {
        util_set_err(err, err_cap, "ZeRO-1 step without dist_zero_setup");
        return -1;
    }
    /* 1. Reduce-scatter: this rank's shard of the summed gradient. */
    int32_t st = api->grads_read(ctx, 0, n, buf);
    if (st != ORCH_OK) return zero_engine_err(h, ctx, st, "grads_read", err, err_cap);
    double sums[16] = { 0 };
#if DIST_MPI
    if (g.active) {
        wd_arm("gradient reduce-scatter (ZeRO-1)", step, 0);
        int rc = MPI_Reduce_scatter(MPI_IN_PLACE, buf, g.zero_counts, MPI_FLOAT, MPI_SUM,
                                    g.comm);
        wd_disarm();
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "gradient reduce-scatter", err, err_cap);
        /* the result is at the start of buf: move it to the shard's place */
        if (off) memmove(buf + off, buf, (size_t)cnt * sizeof(float));
        st = api->grads_write(ctx, off, cnt, buf + off);
        if (st != ORCH_OK)
            return zero_engine_err(h, ctx, st, "grads_write", err, err_cap);
    }
#endif
    /* 2. The global gradient norm: squares of each shard, summed over ranks
     * together with the caller's scalars. */
    for (uint64_t i = off; i < off + cnt; i++) sums[0] += (double)buf[i] * (double)buf[i];
    for (uint32_t i = 0; i < n_scalars; i++) sums[1 + i] = scalars[i];
#if DIST_MPI
    if (g.active) {
        wd_arm("gradient norm (ZeRO-1)", step, 0);
        int rc = MPI_Allreduce(MPI_IN_PLACE, sums, (int)(1 + n_scalars), MPI_DOUBLE,
                               MPI_SUM, g.comm);
        wd_disarm();
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "gradient norm sum", err, err_cap);
    }
#endif
    for (uint32_t i = 0; i < n_scalars; i++) scalars[i] = sums[1 + i];
    double norm = sqrt(sums[0]);
    if (!isfinite(norm)) {
        *diverged = 1;
        util_set_err(err, err_cap, "the global gradient norm is not finite");
        return -1;
    }
    /* 3. AdamW on this rank's shard. */
    st = api->optimizer_step_range(ctx, ap, off, cnt, (float)norm);
    if (st != ORCH_OK) {
        *diverged = st == ORCH_ERR_NUMERIC;
        return zero_engine_err(h, ctx, st, "optimizer_step_range", err, err_cap);
    }
    /* 4. All-gather the updated parameters. */
#if DIST_MPI
    if (g.active) {
        st = api->param_read(ctx, off, cnt, buf + off);
        if (st != ORCH_OK) return zero_engine_err(h, ctx, st, "param_read", err, err_cap);
        wd_arm("parameter all-gather (ZeRO-1)", step, 0);
        int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, g.zero_counts,
                                g.zero_displs, MPI_FLOAT, g.comm);
        wd_disarm();
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "parameter all-gather", err, err_cap);
        if ((off && (st = api->param_write(ctx, 0, off, buf)) != ORCH_OK) ||
            (off + cnt < n && (st = api->param_write(ctx, off + cnt, n - off - cnt,
                                                     buf + off + cnt)) != ORCH_OK))
            return zero_engine_err(h, ctx, st, "param_write", err, err_cap);
    }
#else
    (void)step;
#endif
    if (out_norm) *out_norm = (float)norm;
    return 0;
}

int dist_zero_gather(const engine_handle *h, orch_engine_ctx *ctx, char *err,
                     size_t err_cap) {
    if (!g.zero || g.world <= 1) return 0;
#if DIST_MPI
    const orch_engine_api *api = h->api;
    float *buf = g.zero_buf;
    int32_t st;
    if (g.rank == 0 && (st = api->optimizer_shard(ctx, 0, g.zero_n)) != ORCH_OK)
        return zero_engine_err(h, ctx, st, "optimizer_shard", err, err_cap);
    static const uint32_t kinds[2] = { ORCH_TENSOR_ADAM_M, ORCH_TENSOR_ADAM_V };
    for (int k = 0; k < 2; k++) {
        st = api->moments_read(ctx, kinds[k], g.zero_off, g.zero_cnt, buf + g.zero_off);
        if (st != ORCH_OK)
            return zero_engine_err(h, ctx, st, "moments_read", err, err_cap);
        wd_arm("moment gather to rank 0 (ZeRO-1 checkpoint)", 0, 1);
        int rc = g.rank == 0
                     ? MPI_Gatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, g.zero_counts,
                                   g.zero_displs, MPI_FLOAT, 0, g.comm)
                     : MPI_Gatherv(buf + g.zero_off, (int)g.zero_cnt, MPI_FLOAT, NULL,
                                   NULL, NULL, MPI_FLOAT, 0, g.comm);
        wd_disarm();
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "moment gather", err, err_cap);
        if (g.rank == 0 &&
            (st = api->moments_write(ctx, kinds[k], 0, g.zero_n, buf)) != ORCH_OK)
            return zero_engine_err(h, ctx, st, "moments_write", err, err_cap);
    }
    return 0;
#else
    (void)h, (void)ctx, (void)err, (void)err_cap;
    return 0;
#endif
}

int dist_zero_reshard(const engine_handle *h, orch_engine_ctx *ctx, char *err,
                      size_t err_cap) {
    if (!g.zero || g.world <= 1 || g.rank != 0) return 0;
    int32_t st = h->api->optimizer_shard(ctx, g.zero_off, g.zero_cnt);
    if (st != ORCH_OK)
        return zero_engine_err(h, ctx, st, "optimizer_shard", err, err_cap);
    return 0;
}
