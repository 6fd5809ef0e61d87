/*
 * cmd_route.c - `orch route`: a cache-aware router in front of several
 * `orch serve` workers (orchestrator/route/). Flags -> the worker set, the
 * policy and the HTTP front; runs until SIGTERM/SIGINT, drains, exits 0. This file
 * owns the flags, the signals and the output lines.
 */
#include <curl/curl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/core/metrics.h"
#include "orchestrator/core/util.h"
#include "orchestrator/route/route.h"
#include "orchestrator/route/route_policy.h"
#include "orchestrator/route/route_workers.h"

#define ROUTE_MAX_WORKERS 256
#define ROUTE_MAX_LIST    64

static const char usage_text[] =
    "usage: orch route --worker URL [--worker URL ...] [options]\n"
    "\n"
    "Route OpenAI-compatible requests (/v1/completions, /v1/chat/completions,\n"
    "/tokenize, /detokenize) to several `orch serve` workers; answers,\n"
    "streams (event by event) and errors are passed on untouched. /v1/models\n"
    "is the union of the workers' models; a request goes to a worker that\n"
    "serves its \"model\". The cache_aware policy keeps, per worker, a radix\n"
    "tree of the request texts sent there and sends a request where its\n"
    "longest prefix lives (past --cache-threshold), else to the worker with\n"
    "the smallest tree, unless the load is imbalanced (then the least\n"
    "loaded). Workers are health-checked (/health); a failing one is taken\n"
    "out and retried with back-off; a request whose worker fails before its\n"
    "answer started goes to another worker. GET/POST /workers and\n"
    "DELETE /workers/URL change the set at run time; GET /metrics. SIGTERM\n"
    "drains: no new requests, those running get --drain-timeout; exit 0.\n"
    "\noptions:\n";

int cmd_route(int argc, char **argv) {
    const char *workers[ROUTE_MAX_WORKERS];
    size_t n_workers = 0;
    const char *allowed[ROUTE_MAX_LIST], *cors[ROUTE_MAX_LIST];
    size_t n_allowed = 0, n_cors = 0;
    const char *host = NULL, *policy = "cache_aware";
    const char *api_key = getenv("ORCH_API_KEY"), *worker_key = NULL;
    uint64_t port = 8000, max_body = 4u << 20, max_conns = 4096, max_conns_ip = 1024;
    uint64_t max_tree = (uint64_t)1 << 24, header_to = 10, body_to = 60, idle_to = 15;
    uint32_t balance_abs = 32, max_retries = 3;
    double threshold = 0.5, balance_rel = 1.0001, interval = 1.0, backoff_max = 30.0;
    double request_to = 0, connect_to = 2.0, drain_to = 30.0;
    const flag_spec flags[] = {
        { "--worker", FLAG_LIST, workers, "URL",
          .help = "an `orch serve` worker, http://HOST:PORT\n(repeatable; at least one)",
          .max = ROUTE_MAX_WORKERS, .count = &n_workers },
        { "--host", FLAG_STRING, &host, "ADDR",
          .help = "IPv4 address to bind (default 127.0.0.1)" },
        { "--port", FLAG_U64, &port, "N",
          .help = "TCP port (default 8000; 0 = any free port)", .min = 0, .max = 65535 },
        { "--policy", FLAG_STRING, &policy, "P",
          .help = "cache_aware (default), round_robin, least_load\nor power_of_two" },
        { "--cache-threshold", FLAG_DOUBLE, &threshold, "F",
          .help = "cache_aware: the match must cover more than F of\nthe request "
                  "(default 0.5)",
          .dmin = 0, .dmax = 1 },
        { "--balance-abs", FLAG_U32, &balance_abs, "N",
          .help = "cache_aware: imbalanced when max - min load > N\n(default 32)" },
        { "--balance-rel", FLAG_DOUBLE, &balance_rel, "F",
          .help = "... and max > F x min (default 1.0001)", .dmin = 1, .dmax = HUGE_VAL },
        { "--max-tree-size", FLAG_U64, &max_tree, "BYTES",
          .help = "radix tree bytes per worker; past it the least\nrecently used "
                  "leaves go (default 16777216)",
          .min = 1024 },
        { "--health-interval-s", FLAG_DOUBLE, &interval, "S",
          .help = "between health checks of a worker (default 1)", .dmin = 0.01,
          .dmax = 3600 },
        { "--backoff-max-s", FLAG_DOUBLE, &backoff_max, "S",
          .help = "longest wait before re-checking a failed worker\n(the wait "
                  "doubles from the interval; default 30)",
          .dmin = 0.01, .dmax = 86400 },
        { "--max-retries", FLAG_U32, &max_retries, "N",
          .help = "other workers tried for a request that failed\nbefore its "
                  "answer started (default 3)",
          .max = 15 },
        { "--request-timeout-s", FLAG_DOUBLE, &request_to, "S",
          .help = "limit on one forwarded request (default 0: none)", .dmin = 0,
          .dmax = 86400 },
        { "--connect-timeout-s", FLAG_DOUBLE, &connect_to, "S",
          .help = "limit on connecting to a worker (default 2)", .dmin = 0.01,
          .dmax = 600 },
        { "--drain-timeout", FLAG_DOUBLE, &drain_to, "S",
          .help = "seconds the requests in progress get after\nSIGTERM (default 30)",
          .dmin = 0, .dmax = 86400 },
        { "--api-key", FLAG_STRING, &api_key, "KEY",
          .help = "require 'Authorization: Bearer KEY' on /v1/ and\n/workers "
                  "(default: $ORCH_API_KEY; none when unset)" },
        { "--worker-api-key", FLAG_STRING, &worker_key, "KEY",
          .help = "send 'Authorization: Bearer KEY' to the workers\n(default: "
                  "the client's Authorization, passed on)" },
        { "--max-body", FLAG_U64, &max_body, "BYTES",
          .help = "request body limit (default 4194304)", .min = 64,
          .max = (int64_t)1 << 32 },
        { "--max-connections", FLAG_U64, &max_conns, "N",
          .help = "open client connections; past it 503 at once\n(default 4096)",
          .min = 1, .max = 1 << 20 },
        { "--max-connections-per-ip", FLAG_U64, &max_conns_ip, "N",
          .help = "of them from one address (default 1024)", .min = 1, .max = 1 << 20 },
        { "--header-timeout-s", FLAG_U64, &header_to, "S",
          .help = "deadline of a request head (default 10)", .min = 1, .max = 86400 },
        { "--body-timeout-s", FLAG_U64, &body_to, "S",
          .help = "deadline of a body after its head (default 60)", .min = 1,
          .max = 86400 },
        { "--idle-timeout-s", FLAG_U64, &idle_to, "S",
          .help = "keep-alive wait for the next request (default 15)", .min = 1,
          .max = 86400 },
        { "--allowed-host", FLAG_LIST, allowed, "NAME",
          .help = "also accept this Host name (repeatable)", .max = ROUTE_MAX_LIST,
          .count = &n_allowed },
        { "--cors-origin", FLAG_LIST, cors, "ORIGIN",
          .help = "send CORS headers to this Origin ('*' = any;\nrepeatable)",
          .max = ROUTE_MAX_LIST, .count = &n_cors },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "route",
        .usage = usage_text,
        .flags = flags,
        .footer = "\nexit status: 0 after SIGTERM/SIGINT, 1 runtime failure, 2 bad "
                  "usage.\n",
    };
    int st;
    if (flags_parse(&cmd, argc, argv, &st)) return st;
    route_policy_params pp = { .cache_threshold = threshold,
                               .balance_abs = balance_abs,
                               .balance_rel = balance_rel };
    if (route_policy_parse(policy, &pp.kind) != 0) {
        util_error("route: --policy '%s': expected cache_aware, round_robin, least_load "
                   "or power_of_two",
                   policy);
        return ORCH_EXIT_USAGE;
    }
    if (n_workers == 0) {
        util_error("route: at least one --worker URL is needed");
        return ORCH_EXIT_USAGE;
    }
    char err[1024];
    for (size_t i = 0; i < n_workers; i++) {
        char norm[ROUTE_URL_MAX];
        if (route_url_normalize(workers[i], norm, err, sizeof err) != 0) {
            util_error("route: --worker: %s", err);
            return ORCH_EXIT_USAGE;
        }
    }
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        util_error("route: cannot initialise libcurl");
        return ORCH_EXIT_FAILURE;
    }
    metrics_registry *reg = metrics_registry_create();
    char bearer[1024];
    if (worker_key && *worker_key)
        snprintf(bearer, sizeof bearer, "Bearer %s", worker_key);
    route_workers_config wc = { .policy = pp,
                                .max_tree_size = (size_t)max_tree,
                                .health_interval_s = interval,
                                .backoff_max_s = backoff_max,
                                .health_timeout_s = 2.0,
                                .worker_auth = worker_key && *worker_key ? bearer : NULL,
                                .metrics = reg };
    route_workers *ws = reg ? route_workers_create(&wc, err, sizeof err) : NULL;
    int rc = ORCH_EXIT_FAILURE;
    route_server *srv = NULL;
    if (!ws) {
        util_error("route: %s", reg ? err : "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n_workers; i++)
        if (route_workers_add(ws, workers[i], err, sizeof err) < 0) {
            util_error("route: %s", err);
            goto out;
        }
    route_workers_check_all(ws);
    if (route_workers_start(ws) != 0) {
        util_error("route: cannot start the health thread");
        goto out;
    }
    route_server_config sc = { .host = host,
                               .port = (uint16_t)port,
                               .api_key = api_key,
                               .worker_api_key = worker_key,
                               .allowed_hosts = allowed,
                               .n_allowed_hosts = n_allowed,
                               .cors_origins = cors,
                               .n_cors_origins = n_cors,
                               .max_body = (size_t)max_body,
                               .max_connections = (uint32_t)max_conns,
                               .max_connections_per_ip = (uint32_t)max_conns_ip,
                               .header_timeout_s = (uint32_t)header_to,
                               .body_timeout_s = (uint32_t)body_to,
                               .idle_timeout_s = (uint32_t)idle_to,
                               .max_retries = max_retries,
                               .request_timeout_s = request_to,
                               .connect_timeout_s = connect_to,
                               .workers = ws,
                               .metrics = reg };
    if (route_server_start(&sc, &srv, err, sizeof err) != 0) {
        util_error("route: %s", err);
        rc = strstr(err, "listen") || strstr(err, "IPv4") ? ORCH_EXIT_USAGE
                                                          : ORCH_EXIT_FAILURE;
        goto out;
    }
    fprintf(stderr,
            "orch route: listening on http://%s:%u (policy %s, %zu workers, %u up)\n",
            host ? host : "127.0.0.1", route_server_port(srv), route_policy_name(pp.kind),
            n_workers, route_workers_up(ws));
    fprintf(stderr, "orch route: ready\n");
    for (;;) {
        int sig = sigwaitinfo(&sigs, NULL);
        if (sig == SIGTERM || sig == SIGINT) break;
    }
    fprintf(stderr, "orch route: draining\n");
    uint32_t left = route_server_drain(srv, drain_to);
    if (left)
        fprintf(stderr, "orch route: %u requests still running after %.0f s: ended\n",
                left, drain_to);
    fprintf(stderr, "orch route: stopped\n");
    rc = ORCH_EXIT_OK;
out:
    route_server_stop(srv);
    route_workers_destroy(ws);
    metrics_registry_free(reg);
    curl_global_cleanup();
    return rc;
}
