/*
 * dist.h - data-parallel training across processes on MPI (OpenMPI): the only
 * orchestrator module that includes <mpi.h>. The engine never sees MPI; this
 * module moves data through the engine's tensor tables and flat gradient
 * buffer (tensor_read/tensor_write, grads_read/grads_write).
 *
 * Launch: `mpirun -np N orch train ...` or `srun orch train ...` start N
 * ranks. dist_init looks at the launcher's environment (OMPI_COMM_WORLD_SIZE
 * from mpirun, PMI_SIZE from PMI launchers, SLURM_STEP_NUM_TASKS inside an
 * srun step) and initialises MPI only when it announces more than one
 * process. A plain `orch train` never touches MPI (a singleton MPI_Init
 * would cost ~0.3 s), so it behaves exactly as a build without MPI. A build without MPI
 * (ORCH_HAVE_MPI undefined) refuses a launcher world size > 1 with a message
 * naming the variable; so does an MPI build whose MPI_Init sees a world of a
 * different size (e.g. srun without --mpi=pmix starts N singletons).
 *
 * One step with N ranks (train.c): every rank draws the same N*micro_batch
 * windows from the shared-seed sampler and keeps its own micro_batch of them
 * (data_loader.h), runs forward_backward with grad_scale 1/(grad_accum*N),
 * then dist_allreduce_grads SUMS the flat gradient buffer over the ranks (so
 * it holds the mean over all N*grad_accum micro-batches) together with a few
 * scalars (the loss sum, the stop-signal flag), and every rank takes the same
 * optimizer step. 2 ranks x grad_accum 1 therefore equal 1 rank x grad_accum
 * 2 on the same windows. Rank 0 alone logs, writes metrics.jsonl, serves
 * --metrics-port and writes checkpoints (dist_share_status tells the others
 * how that went); weights and AdamW moments are broadcast from rank 0 at the
 * start (dist_bcast_model), so ranks cannot drift.
 *
 * Gradient all-reduce: the flat buffer is cut into buckets
 * (ORCH_DIST_BUCKET_MB, default 8 MiB of f32). Each bucket is copied out of
 * the engine (grads_read) in chunks into one of a few rotating host buffers
 * and handed to MPI_Iallreduce; while it reduces, the next bucket is copied,
 * and MPI_Test on the requests in flight between chunks lets MPI progress
 * them. A finished bucket is written back (grads_write).
 *
 * Failure: every collective runs under a watchdog thread. When one has not
 * completed after ORCH_DIST_TIMEOUT seconds (default 60; the start-up
 * broadcast, checkpoint hand-over and MPI_Finalize get
 * ORCH_DIST_SLOW_TIMEOUT, default max(600, 10 x ORCH_DIST_TIMEOUT)), the
 * watchdog prints one line naming the rank, the collective, the step and the
 * timeout to stderr and _exits with status 1; the launcher then stops the
 * other ranks (mpirun always, srun with --kill-on-bad-exit). MPI errors are
 * returned (MPI_ERRORS_RETURN) and turned into messages. A rank that fails on
 * its own (engine error) reports it and calls dist_finish, which aborts the
 * whole job (MPI_Abort) so nobody waits for it.
 *
 * Threads: every function must be called from the thread that called
 * dist_init (MPI_THREAD_FUNNELED); the watchdog thread never calls MPI.
 * With world size 1 every function is a cheap no-op that succeeds (reductions
 * leave their data unchanged).
 * Errors: 0 / -1 with a one-line message in err; nothing is printed except
 * by the watchdog (which then exits) and by MPI_Abort itself.
 * ZeRO-1 (train.zero = 1, engines of ABI 1.2): the flat parameter vector of
 * n elements is cut into world balanced shards (dist_shard_of); each engine
 * context keeps the AdamW moments of its rank's shard only
 * (optimizer_shard). A step reads the whole local gradient, reduce-scatters
 * it (MPI_Reduce_scatter, SUM: each rank receives its shard of the sum),
 * writes that shard back, sums the squares of every shard over the ranks
 * for the global norm (with the loss and stop scalars in the same
 * all-reduce), runs optimizer_step_range on its shard with that norm, and
 * all-gathers the updated parameters (MPI_Allgatherv, then param_write of
 * the other ranks' ranges). With 2 ranks every shard element is the same
 * a+b as the all-reduce's, so zero=1 differs from zero=0 only by the
 * summation order of the norm. Checkpoints stay world-size independent:
 * before rank 0 writes one, dist_zero_gather gathers the moment shards to
 * rank 0 (which holds the full moments while it writes; dist_zero_reshard
 * then drops them again); on load every rank reads the full checkpoint,
 * rank 0's tables are broadcast and each rank keeps its shard
 * (dist_zero_setup after dist_bcast_model). Host memory: one buffer of n
 * floats per rank (the gradient and parameter staging of the collectives).
 * Memory: the module keeps its buffers until dist_finish.
 */
#ifndef ORCH_DIST_H
#define ORCH_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"

/* World size the launcher's environment announces (1 when none), and the
 * variable it came from (var may be NULL; "" when none). */
int dist_env_world_size(char *var, size_t var_cap);

/* 1 when this orch was built with MPI. */
int dist_have_mpi(void);

/* Initialise: with a launcher world size > 1, MPI (funneled threads) and the
 * watchdog; otherwise nothing. Call once, before any other dist_ function. */
int dist_init(char *err, size_t err_cap);

int dist_rank(void);    /* 0 .. world-1; 0 when not initialised */
int dist_world(void);   /* >= 1 */
int dist_is_root(void); /* rank 0 */

/* End of the process's MPI life. rc is the exit status the command is about
 * to return. When every rank reaches this point with an agreed outcome
 * (agreed != 0: the same rc everywhere, e.g. after train_run returned on all
 * ranks), MPI is finalised and rc returned. Otherwise (a failure on this rank
 * alone) stdout/stderr are flushed and MPI_Abort(rc) stops every rank; it
 * does not return. With world size 1 it just returns rc. */
int dist_finish(int rc, int agreed);

/* Broadcast n bytes from rank 0 to every rank (slow timeout). */
int dist_bcast_bytes(void *buf, size_t n, const char *what, char *err, size_t err_cap);

/* Check that every rank holds the same n bytes (a 64-bit hash compared by
 * MIN/MAX all-reduce). On a mismatch every rank returns -1 with
 * "ranks disagree on WHAT". */
int dist_check_same(const void *data, size_t n, const char *what, char *err,
                    size_t err_cap);

/* Broadcast the PARAM, ADAM_M and ADAM_V tables of ctx from rank 0, after
 * checking that every rank has the same tables (names, shapes). Slow
 * timeout. */
int dist_bcast_model(const engine_handle *h, orch_engine_ctx *ctx, char *err,
                     size_t err_cap);

/* SUM the flat gradient buffer of ctx over all ranks (bucketed, overlapped;
 * see above) and, in the same round, the n_scalars doubles in scalars (in
 * place). step is used in messages only. */
int dist_allreduce_grads(const engine_handle *h, orch_engine_ctx *ctx, double *scalars,
                         uint32_t n_scalars, uint64_t step, char *err, size_t err_cap);

/* ---- ZeRO-1 (see above) ---- */

/* The balanced shard of rank of world over n elements: the first n % world
 * ranks get one element more. */
void dist_shard_of(uint64_t n, int rank, int world, uint64_t *off, uint64_t *count);

/* 1 when api has every ABI 1.2 member ZeRO-1 calls; else 0 with the one-line
 * refusal in err. */
int dist_zero_supported(const orch_engine_api *api, char *err, size_t err_cap);

/* Shard the moments of ctx (n_params flat elements) over the ranks: this
 * rank's range goes to *off and *count and to the engine (optimizer_shard).
 * Works with world size 1 (one shard: everything). Call after
 * dist_bcast_model. */
int dist_zero_setup(const engine_handle *h, orch_engine_ctx *ctx, uint64_t n_params,
                    uint64_t *off, uint64_t *count, char *err, size_t err_cap);

/* One ZeRO-1 optimizer step after the micro-batches' forward_backward: the
 * reduce-scatter, global norm (into *out_norm), ranged AdamW and parameter
 * all-gather described above. scalars (at most 15) are SUMMED over the ranks
 * in the same round. On failure *diverged is 1 when the gradient norm was not
 * finite (the step changed nothing). */
int dist_zero_step(const engine_handle *h, orch_engine_ctx *ctx,
                   const orch_adamw_params *ap, double *scalars, uint32_t n_scalars,
                   uint64_t step, float *out_norm, int *diverged, char *err,
                   size_t err_cap);

/* Collective: gather every rank's moment shard into rank 0's context, which
 * afterwards holds all moments (so its tensor tables can be saved). No-op
 * without ZeRO-1 or with one rank. */
int dist_zero_gather(const engine_handle *h, orch_engine_ctx *ctx, char *err,
                     size_t err_cap);

/* Rank 0, after dist_zero_gather and the save: keep its own shard again. */
int dist_zero_reshard(const engine_handle *h, orch_engine_ctx *ctx, char *err,
                      size_t err_cap);

/* SUM n doubles over all ranks, in place. */
int dist_allreduce_sum(double *v, size_t n, const char *what, char *err, size_t err_cap);

/* Rank 0's outcome of something only it does (e.g. writing a checkpoint):
 * *rc and the text in msg (a path on success, the error on failure) are
 * broadcast from rank 0 (slow timeout). Returns 0 when the broadcast itself
 * worked. */
int dist_share_status(int *rc, char *msg, size_t msg_cap, char *err, size_t err_cap);

#endif
