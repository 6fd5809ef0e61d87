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
 * (train.allreduce_bucket_mb, default 25 MiB of f32 as PyTorch DDP's
 * bucket_cap_mb; the variable ORCH_DIST_BUCKET_MB, when set, wins). Each
 * bucket is copied out of the engine (grads_read) in chunks into one of a
 * few rotating host buffers and handed to MPI_Iallreduce; while it reduces,
 * the next bucket is copied, and MPI_Test on the requests in flight between
 * chunks lets MPI progress them. A finished bucket is written back
 * (grads_write).
 *
 * Overlapped with the backward (train.overlap_allreduce, default true; with
 * world > 1, ZeRO-1 off and an engine of ABI 1.3 forward_backward_notify):
 * the step's LAST micro-batch runs forward_backward_notify. As the engine
 * reports a range of the flat gradient final (final norm and head, layers
 * last to first, embeddings), the callback copies it (grads_read) into a
 * host buffer of the whole gradient, merges adjacent ranges into a pending
 * bucket and starts MPI_Iallreduce on each whole bucket (MPI_Testall on the
 * requests in flight between copies lets MPI progress them while the engine
 * computes the next layer). After the call the rest is started, the scalars
 * too, MPI_Waitall waits (watchdog armed) and the sum is written back.
 * Collectives are matched by order, so every rank must see the same ranges
 * in the same order: the same engine, model and bucket size (an engine's
 * ranges depend only on the model). Result: each element is the same SUM of
 * the same per-rank values as without overlap; only the cut into buckets
 * differs. With 2 ranks that is bit-identical (a + b is a + b whatever the
 * algorithm or the bucket; tests/dist_overlap.sh checks it); with more ranks
 * OpenMPI's algorithms may pick a different summation order per element for
 * a different bucket size or offset (the non-overlapped path already
 * depends on the bucket size in the same way), so results agree to rounding.
 * Host memory: one buffer of n floats (kept until dist_finish).
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

/* ---- Overlapped all-reduce (see above) ---- */

/* The config's all-reduce settings: train.allreduce_bucket_mb (MiB of f32
 * per bucket, both paths; ORCH_DIST_BUCKET_MB, when set, wins) and
 * train.overlap_allreduce. Call after dist_init; harmless with one rank. */
void dist_set_allreduce(double bucket_mb, int overlap);

/* Floats per all-reduce bucket (0 before dist_init set up MPI). */
size_t dist_bucket_floats(void);

/* What the gradient all-reduces of this process did so far (both paths):
 * steps reduced, buckets started (of them during the backward), and the
 * seconds the training loop waited for them after the backward (the whole
 * dist_allreduce_grads; dist_overlap_finish: the rest of the buckets, the
 * wait and the write-back), i.e. the all-reduce time not hidden. */
typedef struct dist_allreduce_stats {
    uint64_t steps, buckets, buckets_early;
    double wait_s;
} dist_allreduce_stats;
void dist_get_allreduce_stats(dist_allreduce_stats *out);

/* 1 when a step's last micro-batch goes through dist_overlap_forward_backward:
 * world > 1, train.overlap_allreduce on, ZeRO-1 off and api has
 * forward_backward_notify (ABI 1.3). */
int dist_overlap_enabled(const orch_engine_api *api);

/* The step's last micro-batch: forward_backward_notify with a callback that
 * copies each ready range into the host buffer (grads_read), merges adjacent
 * ranges into buckets and starts their MPI_Iallreduce (SUM), calling
 * MPI_Testall between copies. On an engine failure returns -1 with the
 * status in *engine_status (err untouched; the caller formats it); other
 * failures return -1 with a message and *engine_status ORCH_OK. After a
 * failure requests may be in flight: the caller ends the job. */
int dist_overlap_forward_backward(const engine_handle *h, orch_engine_ctx *ctx,
                                  const int32_t *tokens, const int32_t *targets,
                                  uint32_t batch, uint32_t seq_len, float grad_scale,
                                  float *out_loss, int32_t *engine_status, uint64_t step,
                                  char *err, size_t err_cap);

/* After dist_overlap_forward_backward: checks the ranges covered the buffer,
 * SUMs the n_scalars doubles in scalars, waits for every bucket
 * (MPI_Waitall under the watchdog) and writes the summed gradient back
 * (grads_write): the same result as dist_allreduce_grads. */
int dist_overlap_finish(const engine_handle *h, orch_engine_ctx *ctx, double *scalars,
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
