/*
 * http_ft.c - OpenAI's fine-tuning API on `orch serve` (ft_jobs.h keeps the
 * jobs, ft_runner.h runs them inside the server):
 *   POST /v1/fine_tuning/jobs                 create (JSON body)
 *   GET  /v1/fine_tuning/jobs                 list (?after=ID&limit=N)
 *   GET  /v1/fine_tuning/jobs/ID              one job
 *   POST /v1/fine_tuning/jobs/ID/cancel       cancel (no body needed)
 *   GET  /v1/fine_tuning/jobs/ID/events       its events (?after, limit)
 *   GET  /v1/fine_tuning/jobs/ID/checkpoints  its checkpoints
 * Without --state-dir (or on an engine without LoRA adapters) these routes
 * answer 404 saying why. The create body is small: it is parsed on the MHD
 * thread, as the answers are rendered there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"
#include "orchestrator/serve/ft_runner.h"
#include "orchestrator/serve/http_internal.h"

static enum MHD_Result disabled(http_req *hr) {
    const char *why = atomic_load(&hr->srv->ft_disabled_p);
    if (!why) why = "start orch serve with --state-dir DIR";
    char msg[512];
    snprintf(msg, sizeof msg, "the fine-tuning API is off: %s", why);
    return http_queue_err(hr, 404, NULL, "not_found", msg);
}

/* ?after= and ?limit= */
static int paging(http_req *hr, const char **after, uint32_t *limit, api_error *e) {
    *after = MHD_lookup_connection_value(hr->conn, MHD_GET_ARGUMENT_KIND, "after");
    const char *l = MHD_lookup_connection_value(hr->conn, MHD_GET_ARGUMENT_KIND, "limit");
    *limit = 0;
    if (l) {
        uint64_t v;
        if (util_parse_u64(l, &v) != 0 || v < 1 || v > 100)
            return api_error_set(e, 400, "limit", "invalid_value",
                                 "limit must be an integer from 1 to 100");
        *limit = (uint32_t)v;
    }
    return 0;
}

/* The job id in /v1/fine_tuning/jobs/ID[/what] into id. */
static int job_id(const char *url, char *id, size_t cap) {
    const char *p = url + strlen("/v1/fine_tuning/jobs/");
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (n == 0 || n >= cap) return -1;
    memcpy(id, p, n);
    id[n] = '\0';
    return 0;
}

static enum MHD_Result create(http_req *hr) {
    http_server *s = hr->srv;
    api_error e;
    if (hr->too_big || hr->over_budget) return http_body_refused(hr);
    cJSON *req = cJSON_ParseWithLength(hr->body ? hr->body : "", hr->body_len);
    http_body_release(hr);
    if (!req)
        return http_queue_err(hr, 400, NULL, "invalid_json",
                              "the request body is not valid JSON");
    const char *models[1] = { s->model_name };
    ft_job job;
    int rc = ft_jobs_create(srv_jobs(s), req, models, 1, s->cfg.files, &job, &e);
    cJSON_Delete(req);
    if (rc != 0) return http_queue_error(hr, &e);
    ft_jobs_event(srv_jobs(s), job.id, "info", "Validating training file", NULL);
    if (srv_runner(s)) ft_runner_notify(srv_runner(s));
    strbuf b = { 0 };
    ft_job_json(&b, &job);
    return http_queue_json(hr, 200, &b);
}

enum MHD_Result http_ft_answer(http_req *hr, const char *url) {
    http_server *s = hr->srv;
    if (atomic_load(&s->state) == ST_LOADING)
        return http_queue_err(hr, 503, NULL, "server_loading",
                              "the model is still loading; retry shortly");
    if (!srv_jobs(s)) return disabled(hr);
    api_error e;
    strbuf b = { 0 };
    const char *after;
    uint32_t limit;
    if (hr->route == R_FT_JOBS) {
        if (hr->method == HTTP_M_POST) return create(hr);
        if (paging(hr, &after, &limit, &e) != 0 ||
            ft_jobs_list_json(srv_jobs(s), &b, after, limit, &e) != 0) {
            free(b.p);
            return http_queue_error(hr, &e);
        }
        return http_queue_json(hr, 200, &b);
    }
    char id[64];
    if (job_id(url, id, sizeof id) != 0)
        return http_queue_err(hr, 404, NULL, "not_found", "no such route");
    ft_job job;
    int rc = 0;
    switch (hr->route) {
    case R_FT_JOB:
        if (ft_jobs_get(srv_jobs(s), id, &job) != 0) {
            api_error_set(&e, 404, "fine_tuning_job_id", "not_found",
                          "no fine-tuning job '%.64s'", id);
            return http_queue_error(hr, &e);
        }
        ft_job_json(&b, &job);
        return http_queue_json(hr, 200, &b);
    case R_FT_CANCEL:
        if (ft_jobs_cancel(srv_jobs(s), id, &job, &e) != 0)
            return http_queue_error(hr, &e);
        if (srv_runner(s)) ft_runner_notify(srv_runner(s));
        ft_job_json(&b, &job);
        return http_queue_json(hr, 200, &b);
    case R_FT_EVENTS:
    case R_FT_CKPTS:
        rc = paging(hr, &after, &limit, &e);
        if (rc == 0)
            rc = hr->route == R_FT_EVENTS
                     ? ft_jobs_events_json(srv_jobs(s), id, &b, after, limit, &e)
                     : ft_jobs_checkpoints_json(srv_jobs(s), id, &b, after, limit, &e);
        if (rc != 0) {
            free(b.p);
            return http_queue_error(hr, &e);
        }
        return http_queue_json(hr, 200, &b);
    default: return http_queue_err(hr, 404, NULL, "not_found", "no such route");
    }
}
