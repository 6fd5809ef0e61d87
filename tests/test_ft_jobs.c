/*
 * test_ft_jobs.c - Check suite for orchestrator/serve/ft_jobs.{c,h}: a job
 * created from an OpenAI-shaped request (both hyperparameter forms, "auto"),
 * every refusal of a bad request with its param and message, the job object
 * and the list with pagination, cancel (and cancelling an ended job),
 * the runner's transitions, events and checkpoints newest first, and a
 * restart: jobs read back, a running one queued again.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/serve/ft_jobs.h"
#include "tests/test_util.h"

static char dir[256];
static char err[1024];
static file_store *fs;
static char file_id[FILE_STORE_ID_MAX];
static const char *const models[] = { "base-a", "base-b" };

static void setup(void) {
    test_tmpdir(dir, sizeof dir, "jobs");
    fs = file_store_open(dir, 0, err, sizeof err);
    ck_assert_msg(fs != NULL, "%s", err);
    file_upload *u = file_store_upload_begin(fs, err, sizeof err);
    const char *t = "{\"text\":\"x\"}\n";
    ck_assert_int_eq(file_upload_write(u, t, strlen(t), err, sizeof err), 0);
    file_info fi;
    ck_assert_msg(file_store_upload_commit(fs, u, "t.jsonl", "fine-tune", &fi, err,
                                           sizeof err) == 0,
                  "%s", err);
    snprintf(file_id, sizeof file_id, "%s", fi.id);
}

static void teardown(void) {
    file_store_close(fs);
    test_rmdir(dir);
}

/* Create from JSON text (with %s = the file id); returns the status. */
static int create(ft_jobs *j, const char *fmt, ft_job *out, api_error *e) {
    char text[2048];
    snprintf(text, sizeof text, fmt, file_id, file_id);
    cJSON *req = cJSON_Parse(text);
    ck_assert_msg(req != NULL, "bad test JSON %s", text);
    int rc = ft_jobs_create(j, req, models, 2, fs, out, e);
    cJSON_Delete(req);
    return rc;
}

START_TEST(test_create_and_object) {
    ft_jobs *j = ft_jobs_open(dir, err, sizeof err);
    ck_assert_msg(j != NULL, "%s", err);
    ft_job job;
    api_error e;
    ck_assert_msg(create(j,
                         "{\"model\":\"base-b\",\"training_file\":\"%s\","
                         "\"hyperparameters\":{\"n_epochs\":2,\"batch_size\":\"auto\","
                         "\"learning_rate_multiplier\":0.5},\"suffix\":\"my-run.1\","
                         "\"seed\":7}",
                         &job, &e) == 0,
                  "%s", e.msg);
    ck_assert_int_eq(strncmp(job.id, "ftjob-", 6), 0);
    ck_assert_int_eq(job.status, FT_JOB_VALIDATING);
    ck_assert_uint_eq(job.hp.n_epochs, 2);
    ck_assert_uint_eq(job.hp.batch_size, 0);
    ck_assert(job.hp.lr_multiplier == 0.5);
    ck_assert_uint_eq(job.seed, 7);
    strbuf b = { 0 };
    ft_job_json(&b, &job);
    cJSON *o = cJSON_Parse(b.p);
    ck_assert_msg(o != NULL, "%s", b.p);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "object")->valuestring, "fine_tuning.job");
    ck_assert_str_eq(cJSON_GetObjectItem(o, "status")->valuestring, "validating_files");
    ck_assert_str_eq(cJSON_GetObjectItem(o, "training_file")->valuestring, file_id);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "validation_file")));
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "fine_tuned_model")));
    const cJSON *hp = cJSON_GetObjectItem(o, "hyperparameters");
    ck_assert_int_eq(cJSON_GetObjectItem(hp, "n_epochs")->valueint, 2);
    ck_assert_str_eq(cJSON_GetObjectItem(hp, "batch_size")->valuestring, "auto");
    ck_assert_str_eq(cJSON_GetObjectItem(o, "user_provided_suffix")->valuestring,
                     "my-run.1");
    cJSON_Delete(o);
    strbuf_free(&b);
    /* the method form */
    ck_assert_msg(create(j,
                         "{\"model\":\"base-a\",\"training_file\":\"%s\","
                         "\"validation_file\":\"%s\",\"method\":{\"type\":\"supervised\","
                         "\"supervised\":{\"hyperparameters\":{\"lora_rank\":4,"
                         "\"lora_alpha\":8}}}}",
                         &job, &e) == 0,
                  "%s", e.msg);
    ck_assert_uint_eq(job.hp.lora_rank, 4);
    ck_assert_str_eq(job.validation_file, file_id);
    ft_jobs_close(j);
}
END_TEST

START_TEST(test_refusals) {
    ft_jobs *j = ft_jobs_open(dir, err, sizeof err);
    ck_assert_ptr_nonnull(j);
    static const struct {
        const char *req, *param, *want;
    } bad[] = {
        { "{\"training_file\":\"%s\"}", "model", "'model' is required" },
        { "{\"model\":\"gpt-4o\",\"training_file\":\"%s\"}", "model",
          "model 'gpt-4o' is not served here" },
        { "{\"model\":\"base-a\"}", "training_file", "'training_file' is required" },
        { "{\"model\":\"base-a\",\"training_file\":\"file-nope\"}", "training_file",
          "training_file 'file-nope' is not an uploaded file" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"validation_file\":7}",
          "validation_file", "'validation_file' must be a file id" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"bogus\":1}", NULL,
          "unknown field 'bogus'" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"hyperparameters\":{"
          "\"n_epochs\":0}}",
          "hyperparameters", "hyperparameters.n_epochs must be \"auto\" or an integer" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"hyperparameters\":{"
          "\"batch_size\":2.5}}",
          "hyperparameters", "batch_size must be" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"hyperparameters\":{"
          "\"learning_rate_multiplier\":-1}}",
          "hyperparameters", "learning_rate_multiplier must be" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"hyperparameters\":{"
          "\"warmup\":1}}",
          "hyperparameters", "warmup is not a known hyperparameter" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"method\":{\"type\":\"dpo\"}}",
          "method", "method.type 'dpo' is not supported" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"hyperparameters\":{},"
          "\"method\":{\"type\":\"supervised\",\"supervised\":{\"hyperparameters\":{}}}}",
          "hyperparameters", "not both" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"suffix\":\"a/b\"}", "suffix",
          "'suffix' may hold letters" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"seed\":-3}", "seed",
          "'seed' must be an integer" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"integrations\":[{}]}",
          "integrations", "integrations are not supported" },
        { "{\"model\":\"base-a\",\"training_file\":\"%s\",\"metadata\":{\"a\":\"b\"}}",
          "metadata", "metadata is not supported" },
        { "[]", NULL, "must be a JSON object" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        api_error e;
        memset(&e, 0, sizeof e);
        ck_assert_int_eq(create(j, bad[i].req, NULL, &e), -1);
        ck_assert_uint_eq(e.status, 400);
        ck_assert_msg(strstr(e.msg, bad[i].want), "case %zu: '%s' lacks '%s'", i, e.msg,
                      bad[i].want);
        if (bad[i].param)
            ck_assert_msg(e.param && strcmp(e.param, bad[i].param) == 0,
                          "case %zu: param %s", i, e.param ? e.param : "(null)");
    }
    strbuf b = { 0 };
    api_error e;
    ck_assert_int_eq(ft_jobs_list_json(j, &b, NULL, 0, &e), 0);
    ck_assert_msg(strstr(b.p, "\"data\":[]"), "refused requests made jobs: %s", b.p);
    strbuf_free(&b);
    ft_jobs_close(j);
}
END_TEST

START_TEST(test_list_cancel_runner_restart) {
    ft_jobs *j = ft_jobs_open(dir, err, sizeof err);
    ck_assert_ptr_nonnull(j);
    ft_job a, b, c;
    api_error e;
    const char *req = "{\"model\":\"base-a\",\"training_file\":\"%s\"}";
    ck_assert_int_eq(create(j, req, &a, &e), 0);
    ck_assert_int_eq(create(j, req, &b, &e), 0);
    ck_assert_int_eq(create(j, req, &c, &e), 0);
    /* newest first, two per page */
    strbuf s = { 0 };
    ck_assert_int_eq(ft_jobs_list_json(j, &s, NULL, 2, &e), 0);
    ck_assert_msg(strstr(s.p, "\"has_more\":true"), "%s", s.p);
    ck_assert_msg(strstr(s.p, c.id) && strstr(s.p, b.id) && !strstr(s.p, a.id), "%s",
                  s.p);
    ck_assert(strstr(s.p, c.id) < strstr(s.p, b.id));
    strbuf_free(&s);
    ck_assert_int_eq(ft_jobs_list_json(j, &s, b.id, 2, &e), 0);
    ck_assert_msg(strstr(s.p, a.id) && strstr(s.p, "\"has_more\":false"), "%s", s.p);
    strbuf_free(&s);
    ck_assert_int_eq(ft_jobs_list_json(j, &s, "ftjob-nope", 2, &e), -1);
    ck_assert_uint_eq(e.status, 404);
    ck_assert_int_eq(ft_jobs_list_json(j, &s, NULL, 101, &e), -1);
    strbuf_free(&s);

    /* the runner: a validated, claimed, progressing job */
    ft_job got;
    ck_assert_int_eq(ft_jobs_oldest(j, FT_JOB_VALIDATING, &got), 0);
    ck_assert_str_eq(got.id, a.id);
    ft_job_hparams hp = { .n_epochs = 3, .batch_size = 4, .lr_multiplier = 1.0 };
    ck_assert_int_eq(ft_jobs_transition(j, a.id, FT_JOB_VALIDATING, FT_JOB_QUEUED, &hp),
                     0);
    ck_assert_int_eq(ft_jobs_transition(j, a.id, FT_JOB_VALIDATING, FT_JOB_QUEUED, NULL),
                     -1);
    ck_assert_int_eq(ft_jobs_transition(j, a.id, FT_JOB_QUEUED, FT_JOB_RUNNING, NULL), 0);
    ck_assert_int_eq(ft_jobs_progress(j, a.id, 1234), 0);
    ck_assert_int_eq(ft_jobs_event(j, a.id, "info", "step 1: loss 2.5",
                                   "{\"step\":1,\"train_loss\":2.5}"),
                     0);
    ck_assert_int_eq(ft_jobs_event(j, a.id, "info", "step 2: loss \"2.0\"", NULL), 0);
    ck_assert_int_eq(ft_jobs_checkpoint(j, a.id, 2, "ft:base-a:orch:x:ckpt-step-2",
                                        "{\"train_loss\":2.0}"),
                     0);
    ck_assert_int_eq(ft_jobs_events_json(j, a.id, &s, NULL, 0, &e), 0);
    cJSON *o = cJSON_Parse(s.p);
    ck_assert_msg(o != NULL, "%s", s.p);
    const cJSON *data = cJSON_GetObjectItem(o, "data");
    ck_assert_int_eq(cJSON_GetArraySize(data), 2);
    ck_assert_str_eq(
        cJSON_GetObjectItem(cJSON_GetArrayItem(data, 0), "message")->valuestring,
        "step 2: loss \"2.0\"");
    ck_assert_str_eq(
        cJSON_GetObjectItem(cJSON_GetArrayItem(data, 1), "type")->valuestring, "metrics");
    char first[64];
    snprintf(first, sizeof first, "%s",
             cJSON_GetObjectItem(cJSON_GetArrayItem(data, 0), "id")->valuestring);
    cJSON_Delete(o);
    strbuf_free(&s);
    ck_assert_int_eq(ft_jobs_events_json(j, a.id, &s, first, 10, &e), 0);
    ck_assert_msg(strstr(s.p, "step 1: loss 2.5") && !strstr(s.p, "step 2"), "%s", s.p);
    strbuf_free(&s);
    ck_assert_int_eq(ft_jobs_checkpoints_json(j, a.id, &s, NULL, 0, &e), 0);
    ck_assert_msg(strstr(s.p, "\"step_number\":2") &&
                      strstr(s.p, "\"fine_tuning.job.checkpoint\""),
                  "%s", s.p);
    strbuf_free(&s);
    ck_assert_int_eq(
        ft_jobs_events_json(j, "ftjob-000000000000000000000000", &s, NULL, 0, &e), -1);
    ck_assert_uint_eq(e.status, 404);
    strbuf_free(&s);

    /* cancel b; c succeeds; cancelling c then fails */
    ck_assert_int_eq(ft_jobs_cancel(j, b.id, &got, &e), 0);
    ck_assert_int_eq(got.status, FT_JOB_CANCELLED);
    ck_assert_int_eq(ft_jobs_finish(j, b.id, FT_JOB_SUCCEEDED, "x", NULL, NULL), -1);
    ck_assert_int_eq(
        ft_jobs_finish(j, c.id, FT_JOB_SUCCEEDED, "ft:base-a:orch:c", NULL, NULL), 0);
    ck_assert_int_eq(ft_jobs_cancel(j, c.id, &got, &e), -1);
    ck_assert_msg(strstr(e.msg, "has already ended (succeeded)"), "%s", e.msg);
    ck_assert_int_eq(ft_jobs_cancel(j, "ftjob-zz", &got, &e), -1);
    ck_assert_uint_eq(e.status, 404);
    uint64_t counts[FT_JOB_CANCELLED + 1];
    ft_jobs_counts(j, counts);
    ck_assert_uint_eq(counts[FT_JOB_RUNNING], 1);
    ck_assert_uint_eq(counts[FT_JOB_CANCELLED], 1);
    ck_assert_uint_eq(counts[FT_JOB_SUCCEEDED], 1);
    ft_jobs_close(j);

    /* restart: everything read back, in creation order; the running job is
     * queued again */
    j = ft_jobs_open(dir, err, sizeof err);
    ck_assert_msg(j != NULL, "%s", err);
    ck_assert_int_eq(ft_jobs_list_json(j, &s, NULL, 0, &e), 0);
    ck_assert_msg(strstr(s.p, c.id) < strstr(s.p, b.id) &&
                      strstr(s.p, b.id) < strstr(s.p, a.id),
                  "%s", s.p);
    strbuf_free(&s);
    ck_assert_int_eq(ft_jobs_get(j, a.id, &got), 0);
    ck_assert_int_eq(got.status, FT_JOB_QUEUED);
    ck_assert_uint_eq(got.trained_tokens, 1234);
    ck_assert_uint_eq(got.hp.batch_size, 4);
    ck_assert_int_eq(ft_jobs_get(j, c.id, &got), 0);
    ck_assert_int_eq(got.status, FT_JOB_SUCCEEDED);
    ck_assert_str_eq(got.fine_tuned_model, "ft:base-a:orch:c");
    ck_assert_int_ne(got.finished_at, 0);
    ck_assert_int_eq(ft_jobs_get(j, b.id, &got), 0);
    ck_assert_int_eq(got.status, FT_JOB_CANCELLED);
    ck_assert_int_eq(
        ft_jobs_finish(j, a.id, FT_JOB_FAILED, NULL, "invalid_file", "line 3: bad"), 0);
    ft_jobs_get(j, a.id, &got);
    strbuf_free(&s);
    ft_job_json(&s, &got);
    ck_assert_msg(strstr(s.p,
                         "\"error\":{\"code\":\"invalid_file\",\"message\":\"line 3: "
                         "bad\""),
                  "%s", s.p);
    strbuf_free(&s);
    ft_jobs_close(j);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ft_jobs");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_create_and_object);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_list_cancel_runner_restart);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
