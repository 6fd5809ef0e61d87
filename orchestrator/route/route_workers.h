/*
 * route_workers.h - the worker set of `orch route`: the `orch serve` replicas
 * requests are forwarded to, their health, load, models and radix trees.
 *
 * Each worker is a base URL "http://HOST:PORT" (a trailing '/' is dropped).
 * A thread checks every worker: GET /health (up when 200) and, when up,
 * GET /v1/models (the ids it serves). A worker that fails a check, or a
 * request (route_workers_done with failed=1), is taken out and checked again
 * after a back-off that doubles from the health interval up to backoff_max_s;
 * a check that passes puts it back. A worker added at run time starts out
 * down and is checked at once.
 *
 * Choosing (route_workers_pick): eligible workers are those up and not tried
 * for this request already, and, when the request names a model, those that
 * list it (a worker whose /v1/models could not be read counts as serving
 * every model). The policy (route_policy.h) picks among them;
 * the request's text is then inserted into the chosen worker's radix tree,
 * which is trimmed to 90% of max_tree_size when it grows past it, and the
 * worker's load (requests in flight) counts the request until
 * route_workers_done.
 *
 * Metrics (registry given): orch_route_requests_total{worker},
 * orch_route_worker_up{worker}, orch_route_worker_load{worker},
 * orch_route_cache_match_ratio (histogram of the chosen worker's tree match /
 * request length, per pick: the router's estimate of the prefix the worker
 * has cached), orch_route_health_checks_total{result}.
 *
 * Memory: the set owns its workers; a picked worker is referenced until
 * route_workers_done, so a worker removed meanwhile stays valid for its
 * requests. Threads: every function is thread-safe. Errors: create returns
 * NULL with a message; add returns -1 with a message (bad URL, out of
 * memory) or 1 when the URL is already in the set.
 */
#ifndef ORCH_ROUTE_WORKERS_H
#define ORCH_ROUTE_WORKERS_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/metrics.h"
#include "orchestrator/core/strbuf.h"
#include "orchestrator/route/route_policy.h"

#define ROUTE_URL_MAX 256

typedef struct route_worker route_worker;
typedef struct route_workers route_workers;

typedef struct route_workers_config {
    route_policy_params policy;
    size_t max_tree_size;     /* bytes per worker tree (> 0) */
    double health_interval_s; /* between checks of an up worker (> 0) */
    double backoff_max_s;     /* longest wait before re-checking a down one */
    double health_timeout_s;  /* per check request */
    const char *worker_auth;  /* "Bearer KEY" for /v1/models, or NULL */
    metrics_registry *metrics;
} route_workers_config;

route_workers *route_workers_create(const route_workers_config *c, char *err,
                                    size_t err_cap);
/* Stop the health thread and free the set (workers still referenced are
 * freed when done). NULL is a no-op. */
void route_workers_destroy(route_workers *s);

/* Start the health thread (after the first workers are added). 0 or -1. */
int route_workers_start(route_workers *s);
/* Check every worker once now, synchronously (start-up). */
void route_workers_check_all(route_workers *s);

int route_workers_add(route_workers *s, const char *url, char *err, size_t err_cap);
/* 0, or -1 when url is not in the set. */
int route_workers_remove(route_workers *s, const char *url);

/* Choose a worker for a request of model (NULL: any) with text[0..len),
 * not one of tried[0..n_tried); *pick gets the decision. The worker is
 * referenced; NULL when none is eligible, with *unknown_model (may be NULL)
 * set to 1 when that is because every up worker lists its models and none
 * lists model. */
route_worker *route_workers_pick(route_workers *s, const char *model, const char *text,
                                 size_t len, route_worker *const *tried, size_t n_tried,
                                 route_pick *pick, int *unknown_model);
/* The request on w ended; failed: w failed it (transport error), so it is
 * taken out until a check passes. Drops the reference. */
void route_workers_done(route_workers *s, route_worker *w, int failed);

/* The worker's base URL (valid while referenced). */
const char *route_worker_url(const route_worker *w);

/* Workers up now. */
uint32_t route_workers_up(route_workers *s);
/* {"object":"list","data":[...]}: the union of the models the up workers
 * list (each id once, the object as the first worker listing it gave it). */
void route_workers_models_json(route_workers *s, strbuf *b);
/* The model object of id into b; 0, or -1 when no up worker lists it. */
int route_workers_model_json(route_workers *s, const char *id, strbuf *b);
/* {"workers":[{"url","up","load","requests","tree_bytes","models"}...]} */
void route_workers_list_json(route_workers *s, strbuf *b);

/* Normalize a worker URL into out (ROUTE_URL_MAX): "http://HOST:PORT" with
 * an optional trailing '/' removed. 0, or -1 with a message. */
int route_url_normalize(const char *url, char *out, char *err, size_t err_cap);

#endif
