/*
 * ft_jobs.h - the fine-tuning jobs of `orch serve` (OpenAI's
 * /v1/fine_tuning/jobs), kept in the server's state directory so they
 * survive a restart:
 *   STATE/jobs/ID/job.json        the job object (rewritten atomically on
 *                                 every change of status or progress)
 *   STATE/jobs/ID/events.jsonl    its events, appended, oldest first
 *   STATE/jobs/ID/checkpoints.jsonl  its checkpoints, appended
 * Ids are "ftjob-" and 24 hex digits. Statuses: validating_files -> queued
 * -> running -> succeeded | failed | cancelled (a cancel is possible until
 * the job ends). A job found validating, queued or running when the store
 * opens (the server stopped) is queued again: its runner resumes it from its
 * last checkpoint.
 *
 * This module is the jobs' record and the API's shapes; whoever runs jobs
 * (the co-serving runner) claims them (ft_jobs_claim), reports progress,
 * events and checkpoints, and finishes them.
 *
 * Threads: every function is thread-safe. Memory: the store owns its jobs;
 * JSON goes into the caller's strbuf; ft_job copies are the caller's.
 * Errors: -1 with an api_error (HTTP status, param, code, one-line message).
 */
#ifndef ORCH_FT_JOBS_H
#define ORCH_FT_JOBS_H

#include <cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/strbuf.h"
#include "orchestrator/serve/api_error.h"
#include "orchestrator/serve/file_store.h"

#define FT_JOB_ID_MAX     40
#define FT_JOB_MODEL_MAX  256
#define FT_JOB_SUFFIX_MAX 65 /* OpenAI: at most 64 characters */
#define FT_JOB_NAME_MAX   (FT_JOB_MODEL_MAX + FT_JOB_SUFFIX_MAX + 32)

typedef enum ft_job_status {
    FT_JOB_VALIDATING = 0,
    FT_JOB_QUEUED,
    FT_JOB_RUNNING,
    FT_JOB_SUCCEEDED,
    FT_JOB_FAILED,
    FT_JOB_CANCELLED
} ft_job_status;

/* Hyper-parameters: 0 (or 0.0) = "auto", decided by the runner once the
 * data is known and then recorded. */
typedef struct ft_job_hparams {
    uint32_t n_epochs;    /* 1..50 */
    uint32_t batch_size;  /* examples (rows) per optimizer step, 1..256 */
    double lr_multiplier; /* > 0, <= 10: times the server's base learning rate */
    uint32_t lora_rank;   /* orch extension; 0 = the server's default */
    double lora_alpha;    /* orch extension; 0 = the server's default */
} ft_job_hparams;

typedef struct ft_job {
    char id[FT_JOB_ID_MAX];
    char model[FT_JOB_MODEL_MAX]; /* the base: a model this server serves */
    char training_file[FILE_STORE_ID_MAX];
    char validation_file[FILE_STORE_ID_MAX]; /* "" = none */
    char suffix[FT_JOB_SUFFIX_MAX];          /* "" = none */
    uint64_t seed;
    ft_job_hparams hp;
    int status;                      /* ft_job_status */
    int64_t created_at, finished_at; /* Unix seconds; finished 0 = not yet */
    uint64_t trained_tokens;
    char fine_tuned_model[FT_JOB_NAME_MAX];                   /* "" until succeeded */
    char error_code[64], error_param[64], error_message[512]; /* failed */
    int cancel_requested;
    uint64_t seq; /* creation order in this store ("orch_seq"; one second
                     holds many jobs) */
} ft_job;

typedef struct ft_jobs ft_jobs;

/* Open (creating STATE/jobs) and read every job. The caller owns it. */
ft_jobs *ft_jobs_open(const char *state_dir, char *err, size_t err_cap);
void ft_jobs_close(ft_jobs *j);

/* POST /v1/fine_tuning/jobs: validate the request (fields and types as
 * OpenAI's; "model" must be one of the n_models served names; the files
 * must exist in fs with purpose fine-tune; unknown fields are refused) and
 * create the job (status validating_files). *out receives a copy. */
int ft_jobs_create(ft_jobs *j, const cJSON *req, const char *const *models,
                   size_t n_models, file_store *fs, ft_job *out, api_error *e);

/* GET: one job / the list (newest first; after = a job id to continue
 * after, NULL = from the start; limit 1..100, 0 = 20). */
int ft_jobs_get(ft_jobs *j, const char *id, ft_job *out);
void ft_job_json(strbuf *b, const ft_job *job);
int ft_jobs_list_json(ft_jobs *j, strbuf *b, const char *after, uint32_t limit,
                      api_error *e);

/* POST .../cancel: a job that has not ended becomes cancelled (a running
 * one is stopped by its runner at its next step: cancel_requested). */
int ft_jobs_cancel(ft_jobs *j, const char *id, ft_job *out, api_error *e);

/* GET .../events and .../checkpoints: newest first, paginated as the list. */
int ft_jobs_events_json(ft_jobs *j, const char *id, strbuf *b, const char *after,
                        uint32_t limit, api_error *e);
int ft_jobs_checkpoints_json(ft_jobs *j, const char *id, strbuf *b, const char *after,
                             uint32_t limit, api_error *e);

/* ---- the runner's side ---- */

/* The oldest job in `status` (VALIDATING or QUEUED) into *out; 0, or -1 when
 * there is none. */
int ft_jobs_oldest(ft_jobs *j, int status, ft_job *out);
/* Move job id from status `from` to `to` (0; -1 when it is not in `from`,
 * e.g. cancelled meanwhile), recording hp when not NULL. */
int ft_jobs_transition(ft_jobs *j, const char *id, int from, int to,
                       const ft_job_hparams *hp);
/* Append an event ("info" / "warn" / "error"; data: a JSON object text or
 * NULL) with a new event id. */
int ft_jobs_event(ft_jobs *j, const char *id, const char *level, const char *message,
                  const char *data_json);
/* Progress of a running job (persisted). */
int ft_jobs_progress(ft_jobs *j, const char *id, uint64_t trained_tokens);
/* A checkpoint: step, the model name it is served under (may be ""), and
 * metrics (a JSON object text). */
int ft_jobs_checkpoint(ft_jobs *j, const char *id, uint64_t step, const char *model,
                       const char *metrics_json);
/* The end: SUCCEEDED (fine_tuned_model set), FAILED (error fields) or
 * CANCELLED. */
int ft_jobs_finish(ft_jobs *j, const char *id, int status, const char *fine_tuned_model,
                   const char *error_code, const char *error_message);
/* Copies of up to cap jobs in `status`, oldest first; returns how many. */
size_t ft_jobs_in_status(ft_jobs *j, int status, ft_job *out, size_t cap);

/* Jobs in each status (for metrics): counts[FT_JOB_CANCELLED + 1]. */
void ft_jobs_counts(ft_jobs *j, uint64_t counts[FT_JOB_CANCELLED + 1]);

const char *ft_job_status_name(int status);

#endif
