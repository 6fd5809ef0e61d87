/*
 * metrics.h - a small Prometheus metrics registry: counters, gauges and
 * histograms, each a family with fixed label names and one series per label
 * value combination; rendered in the Prometheus text exposition format
 * (version 0.0.4), and an optional tiny HTTP endpoint that serves GET /metrics
 * (used by `orch train --metrics-port`; `orch serve` renders into its own
 * server instead).
 *
 * Usage:
 *   metrics_registry *r = metrics_registry_create();
 *   metrics_family *req = metrics_counter(r, "orch_requests_total",
 *       "Requests by endpoint and status.", 2, (const char *[]){"endpoint","status"});
 *   metrics_counter_add(metrics_series_get(req, (const char *[]){"/v1/completions","200"}), 1);
 *   metrics_family *loss = metrics_gauge(r, "orch_train_loss", "Training loss.", 0, NULL);
 *   metrics_gauge_set(metrics_series_get(loss, NULL), 3.2);
 *   char *text; size_t len; metrics_render(r, &text, &len); ... free(text);
 *
 * Memory: the registry owns every family and series; pointers returned by
 * metrics_counter/gauge/histogram and metrics_series_get stay valid until
 * metrics_registry_free. Names and label names/values are copied.
 * Threads: everything is thread-safe. Updates to a series are lock-free for
 * counters/gauges and take a per-series lock for histograms; creating a
 * series or rendering takes the registry lock. Resolve series once and keep
 * the pointer on hot paths.
 * Errors: registration returns NULL on an invalid name (must match
 * [a-zA-Z_:][a-zA-Z0-9_:]*, labels [a-zA-Z_][a-zA-Z0-9_]* and not starting with
 * "__"), a duplicate name with a different type/labels, or out of memory.
 * Registering the same name again with the same type and labels returns the
 * existing family. Update functions accept a NULL series as a no-op, so a
 * failed registration never crashes a caller.
 */
#ifndef ORCH_METRICS_H
#define ORCH_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct metrics_registry metrics_registry;
typedef struct metrics_family metrics_family;
typedef struct metrics_series metrics_series;

#define METRICS_MAX_LABELS 8

metrics_registry *metrics_registry_create(void);
void metrics_registry_free(metrics_registry *r); /* NULL is a no-op */

/* Register families. n_labels <= METRICS_MAX_LABELS; label_names may be NULL
 * when n_labels is 0. Counter names should end in _total (not enforced). */
metrics_family *metrics_counter(metrics_registry *r, const char *name, const char *help,
                                size_t n_labels, const char *const *label_names);
metrics_family *metrics_gauge(metrics_registry *r, const char *name, const char *help,
                              size_t n_labels, const char *const *label_names);
/* buckets: strictly increasing finite upper bounds (the +Inf bucket is
 * implicit); NULL/0 gives Prometheus' defaults
 * {.005,.01,.025,.05,.1,.25,.5,1,2.5,5,10}. At most 64 buckets. */
metrics_family *metrics_histogram(metrics_registry *r, const char *name, const char *help,
                                  size_t n_labels, const char *const *label_names,
                                  const double *buckets, size_t n_buckets);

/* The series of `f` for these label values (n_labels strings, in the order of
 * the label names; NULL for a family without labels). Created on first use.
 * NULL on bad arguments or out of memory. */
metrics_series *metrics_series_get(metrics_family *f, const char *const *label_values);

/* Counter: add v >= 0 (negative or non-finite v is ignored). */
void metrics_counter_add(metrics_series *s, double v);
/* Gauge: set / add (v may be negative). */
void metrics_gauge_set(metrics_series *s, double v);
void metrics_gauge_add(metrics_series *s, double v);
/* Histogram: record one observation (non-finite values are ignored). */
void metrics_histogram_observe(metrics_series *s, double v);

/* Current value of a counter or gauge series (0 for NULL or a histogram);
 * for tests and callers that read their own metrics. */
double metrics_series_value(const metrics_series *s);
/* Histogram observation count and sum (0 for NULL or other types). */
uint64_t metrics_histogram_count(const metrics_series *s);
double metrics_histogram_sum(const metrics_series *s);

/* Render every family (registration order; series in creation order) as
 * Prometheus text. *out is malloc'd and NUL-terminated (caller frees); *len
 * excludes the NUL. Returns 0, or -1 when out of memory. */
int metrics_render(metrics_registry *r, char **out, size_t *len);

/* Content-Type of the rendered text. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* A minimal HTTP server (libmicrohttpd, its own thread) answering
 * GET /metrics with metrics_render(r) and 404 elsewhere. host NULL means
 * "127.0.0.1"; port 0 picks a free port (see metrics_http_port). Returns NULL
 * with a message in err when the address cannot be bound. Stop with
 * metrics_http_stop (NULL is a no-op) before freeing the registry. */
typedef struct metrics_http metrics_http;
metrics_http *metrics_http_start(metrics_registry *r, const char *host, uint16_t port,
                                 char *err, size_t err_cap);
uint16_t metrics_http_port(const metrics_http *h);
void metrics_http_stop(metrics_http *h);

#endif
