/*
 * test_server_render.c - the JSON the server sends (serve/render.h and
 * serve/api_error.h), byte for byte: final completion and chat bodies with
 * usage, echo and log-probabilities (null for the first prompt token, -9999
 * for -inf, text offsets), SSE streams built from sequences filled by the
 * scheduler's own output code (seq_output.h): the chat role chunk, a UTF-8
 * character split over two tokens merged into one event, a byte that can
 * never start a character (C0) sent at once as U+FFFD, the finish event,
 * echo and include_usage chunks, a stop string cut, the one error event of a
 * failed request, [DONE] exactly once; model objects and error objects.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/serve/api_error.h"
#include "orchestrator/serve/render.h"
#include "orchestrator/serve/seq_output.h"
#include "tests/test_util.h"

#define HEAD_CMPL \
    "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":7,\"model\":\"m\""
#define HEAD_CHUNK                                                               \
    "data: "                                                                     \
    "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":7," \
    "\"model\":\"m\""

static tokenizer *tok;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void setup(void) {
    char err[256];
    ck_assert_msg(tokenizer_open("byte", NULL, &tok, err, sizeof err) == 0, "%s", err);
}

static void teardown(void) { tokenizer_free(tok); }

static void parse(int chat, const char *body, gen_request *r) {
    request_limits lim = {
        .tok = tok, .model_name = "m", .vocab = 256, .context = 64, .max_seqs = 8
    };
    api_error e;
    ck_assert_msg(gen_request_parse(&lim, chat, body, strlen(body), r, &e) == 0, "%s",
                  e.msg);
}

static gen_response response(const gen_request *r, const sched_seq *q) {
    return (gen_response){ .req = r,
                           .seqs = q,
                           .tok = tok,
                           .model = "m",
                           .id = r->chat ? "chatcmpl-1" : "cmpl-1",
                           .created = 7 };
}

static void *copy(const void *p, size_t n) {
    void *d = malloc(n);
    memcpy(d, p, n);
    return d;
}

/* Outputs of a finished sequence, filled by hand. */
static void fill(sched_seq *q, const char *text, const int32_t *ids, const uint32_t *ends,
                 uint32_t n, int finish) {
    q->out_tokens = copy(ids, n * sizeof *ids);
    q->out_text_end = copy(ends, n * sizeof *ends);
    q->n_out = q->cap_out = n;
    q->text_len = strlen(text);
    q->text = copy(text, q->text_len + 1);
    q->text_cap = q->text_len + 1;
    q->finish = finish;
}

static void expect_final(const gen_response *r, const char *want) {
    strbuf b = { 0 };
    render_final(&b, r);
    ck_assert(!b.oom);
    ck_assert_msg(strcmp(b.p, want) == 0, "got\n%s\nwant\n%s", b.p, want);
    strbuf_free(&b);
}

START_TEST(final_completion_plain) {
    gen_request r;
    parse(0, "{\"prompt\":\"Hi\",\"max_tokens\":2}", &r);
    sched_seq q;
    memset(&q, 0, sizeof q);
    fill(&q, "ok", (int32_t[]){ 111, 107 }, (uint32_t[]){ 1, 2 }, 2, SCHED_FINISH_LENGTH);
    gen_response resp = response(&r, &q);
    expect_final(&resp, HEAD_CMPL
                 ",\"choices\":[{\"index\":0,\"text\":\"ok\",\"logprobs\":null,"
                 "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":2,"
                 "\"completion_tokens\":2,\"total_tokens\":4,\"prompt_tokens_details\":{"
                 "\"cached_tokens\":0}}}");
    sched_seq_free_outputs(&q);
    gen_request_free(&r);
}
END_TEST

START_TEST(final_completion_echo_logprobs) {
    gen_request r;
    parse(0, "{\"prompt\":\"Hi\",\"max_tokens\":2,\"echo\":true,\"logprobs\":1}", &r);
    sched_seq q;
    memset(&q, 0, sizeof q);
    fill(&q, "ok", (int32_t[]){ 111, 107 }, (uint32_t[]){ 1, 2 }, 2, SCHED_FINISH_STOP);
    q.out_logprob = copy((double[]){ -0.5, -INFINITY }, 2 * sizeof(double));
    q.out_top_ids = copy((int32_t[]){ 111, -1 }, 2 * sizeof(int32_t));
    q.out_top_lp = copy((double[]){ -0.5, -INFINITY }, 2 * sizeof(double));
    q.prompt_logprob = copy((double[]){ NAN, -1.25 }, 2 * sizeof(double));
    q.prompt_top_ids = copy((int32_t[]){ -1, 104 }, 2 * sizeof(int32_t));
    q.prompt_top_lp = copy((double[]){ -INFINITY, -0.75 }, 2 * sizeof(double));
    gen_response resp = response(&r, &q);
    expect_final(&resp, HEAD_CMPL
                 ",\"choices\":[{\"index\":0,\"text\":\"Hiok\",\"logprobs\":{"
                 "\"tokens\":[\"H\",\"i\",\"o\",\"k\"],"
                 "\"token_logprobs\":[null,-1.25,-0.5,-9999],"
                 "\"top_logprobs\":[null,{\"h\":-0.75},{\"o\":-0.5},{}],"
                 "\"text_offset\":[0,1,2,3]},\"finish_reason\":\"stop\"}],"
                 "\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2,\"total_"
                 "tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    sched_seq_free_outputs(&q);
    gen_request_free(&r);
}
END_TEST

START_TEST(final_chat_logprobs_and_choices) {
    gen_request r;
    parse(1,
          "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
          "\"top_logprobs\":1,\"n\":2}",
          &r);
    sched_seq q[2];
    memset(q, 0, sizeof q);
    fill(&q[0], "y", (int32_t[]){ 121 }, (uint32_t[]){ 1 }, 1, SCHED_FINISH_STOP);
    q[0].out_logprob = copy((double[]){ -0.25 }, sizeof(double));
    q[0].out_top_ids = copy((int32_t[]){ 122 }, sizeof(int32_t));
    q[0].out_top_lp = copy((double[]){ -0.125 }, sizeof(double));
    fill(&q[1], "\"", (int32_t[]){ 34 }, (uint32_t[]){ 1 }, 1, SCHED_FINISH_LENGTH);
    q[1].out_logprob = copy((double[]){ -1 }, sizeof(double));
    q[1].out_top_ids = copy((int32_t[]){ -1 }, sizeof(int32_t));
    q[1].out_top_lp = copy((double[]){ -INFINITY }, sizeof(double));
    q[0].cached_tokens = 16; /* usage counts the prompt's first choice */
    q[1].cached_tokens = 17;
    gen_response resp = response(&r, q);
    expect_final(
        &resp,
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":7,\"model\":"
        "\"m\","
        "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"y\"}"
        ","
        "\"logprobs\":{\"content\":[{\"token\":\"y\",\"logprob\":-0.25,\"bytes\":[121],"
        "\"top_logprobs\":[{\"token\":\"z\",\"logprob\":-0.125,\"bytes\":[122]}]}]},"
        "\"finish_reason\":\"stop\"},"
        "{\"index\":1,\"message\":{\"role\":\"assistant\",\"content\":\"\\\"\"},"
        "\"logprobs\":{\"content\":[{\"token\":\"\\\"\",\"logprob\":-1,\"bytes\":[34],"
        "\"top_logprobs\":[]}]},\"finish_reason\":\"length\"}],"
        "\"usage\":{\"prompt_tokens\":18,\"completion_tokens\":2,\"total_tokens\":20,"
        "\"prompt_tokens_details\":{\"cached_tokens\":16}}}");
    for (int i = 0; i < 2; i++) sched_seq_free_outputs(&q[i]);
    gen_request_free(&r);
}
END_TEST

/* A sequence of request r ready to receive tokens through seq_output. */
static void live_seq(const gen_request *r, uint32_t i, sched_seq *q) {
    memset(q, 0, sizeof *q);
    gen_request_seq(r, i, 1, q);
    q->lock = &mu;
}

/* Append token bytes as the scheduler does; fin_length ends with LENGTH. */
static int add(sched_seq *q, const char *bytes, size_t n) {
    seq_token t = {
        .id = n ? (unsigned char)bytes[0] : 0, .bytes = bytes, .n_bytes = n, .vocab = 256
    };
    int reason = seq_output_append(q, &t);
    if (reason > 0) q->finish = reason;
    return reason;
}

/* The events ready now must be exactly want. */
static void expect_events(const gen_response *r, render_stream *st, const char *want,
                          int want_failed) {
    strbuf b = { 0 };
    strbuf_puts(&b, "");
    int failed = render_stream_events(&b, r, st);
    ck_assert(!b.oom);
    ck_assert_msg(strcmp(b.p, want) == 0, "got\n%s\nwant\n%s", b.p, want);
    ck_assert_int_eq(failed, want_failed);
    strbuf_free(&b);
}

START_TEST(stream_chat_utf8_merge_and_c0) {
    gen_request r;
    parse(1,
          "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,\"max_"
          "tokens\":4}",
          &r);
    sched_seq q;
    live_seq(&r, 0, &q);
    gen_response resp = response(&r, &q);
    render_stream st;
    ck_assert_int_eq(render_stream_init(&st, 1), 0);
    const char *tail = ",\"logprobs\":null,\"finish_reason\":null}]}\n\n";
    char want[1024];
    snprintf(want, sizeof want,
             "%s,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
             "\"content\":\"\"}%s",
             HEAD_CHUNK, tail);
    expect_events(&resp, &st, want, 0);
    ck_assert_int_eq(add(&q, "\xC3", 1), SCHED_FINISH_NONE); /* half of e-acute: held */
    ck_assert_uint_eq(q.text_ready, 0);
    expect_events(&resp, &st, "", 0);
    ck_assert_int_eq(add(&q, "\xA9", 1),
                     SCHED_FINISH_NONE); /* both tokens in one event */
    snprintf(want, sizeof want,
             "%s,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xC3\xA9\"}%s",
             HEAD_CHUNK, tail);
    expect_events(&resp, &st, want, 0);
    ck_assert_int_eq(add(&q, "\xC0", 1), SCHED_FINISH_NONE); /* never valid: not held */
    ck_assert_uint_eq(q.text_ready, 3);
    snprintf(want, sizeof want,
             "%s,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xEF\xBF\xBD\"}%s",
             HEAD_CHUNK, tail);
    expect_events(&resp, &st, want, 0);
    ck_assert_int_eq(add(&q, "!", 1), SCHED_FINISH_LENGTH);
    snprintf(want, sizeof want,
             "%s,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},"
             "\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n",
             HEAD_CHUNK);
    expect_events(&resp, &st, want, 0);
    ck_assert_int_eq(st.done, 1);
    expect_events(&resp, &st, "", 0); /* [DONE] once */
    render_stream_free(&st);
    sched_seq_free_outputs(&q);
    gen_request_free(&r);
}
END_TEST

START_TEST(stream_completion_echo_usage_and_stop) {
    gen_request r;
    parse(0,
          "{\"prompt\":\"Hi\",\"stream\":true,\"echo\":true,\"stop\":\"x\","
          "\"stream_options\":{\"include_usage\":true}}",
          &r);
    sched_seq q;
    live_seq(&r, 0, &q);
    gen_response resp = response(&r, &q);
    render_stream st;
    ck_assert_int_eq(render_stream_init(&st, 1), 0);
    expect_events(&resp, &st, "", 0); /* the echo waits for the first token */
    ck_assert_int_eq(add(&q, "o", 1), SCHED_FINISH_NONE);
    const char *ev =
        "data: " HEAD_CMPL ",\"choices\":[{\"index\":0,\"text\":\"%s\",\"logprobs\":null,"
        "\"finish_reason\":%s}],\"usage\":null}\n\n";
    char want[2048], one[512];
    snprintf(want, sizeof want, ev, "Hi", "null");
    snprintf(one, sizeof one, ev, "o", "null");
    strcat(want, one);
    expect_events(&resp, &st, want, 0);
    ck_assert_int_eq(add(&q, "x", 1), SCHED_FINISH_STOP); /* stop string: cut */
    ck_assert_uint_eq(q.text_len, 1);
    snprintf(want, sizeof want, ev, "", "\"stop\"");
    strcat(want, "data: " HEAD_CMPL ",\"choices\":[],\"usage\":{\"prompt_tokens\":2,"
                 "\"completion_tokens\":2,\"total_tokens\":4,\"prompt_tokens_details\":{"
                 "\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n");
    expect_events(&resp, &st, want, 0);
    render_stream_free(&st);
    sched_seq_free_outputs(&q);
    gen_request_free(&r);
}
END_TEST

START_TEST(stream_error_event_once) {
    gen_request r;
    parse(0, "{\"prompt\":\"Hi\",\"stream\":true,\"n\":2,\"max_tokens\":3}", &r);
    sched_seq q[2];
    live_seq(&r, 0, &q[0]);
    live_seq(&r, 1, &q[1]);
    gen_response resp = response(&r, q);
    render_stream st;
    ck_assert_int_eq(render_stream_init(&st, 2), 0);
    ck_assert_int_eq(add(&q[1], "a", 1), SCHED_FINISH_NONE);
    q[0].finish = SCHED_FINISH_ERROR;
    q[0].http_status = 500;
    snprintf(q[0].error, sizeof q[0].error, "engine error: x");
    expect_events(
        &resp, &st,
        "data: {\"error\":{\"message\":\"engine error: x\",\"type\":\"server_error\","
        "\"param\":null,\"code\":null}}\n\n",
        1);
    ck_assert_int_eq(st.done, 0);
    q[1].finish = SCHED_FINISH_CANCELLED; /* cancelled after the error: no second event */
    q[1].http_status = 499;
    expect_events(&resp, &st, "data: [DONE]\n\n", 0);
    render_stream_free(&st);
    for (int i = 0; i < 2; i++) sched_seq_free_outputs(&q[i]);
    gen_request_free(&r);
}
END_TEST

START_TEST(model_and_error_objects) {
    strbuf b = { 0 };
    render_model_object(&b, "m\"1", 7, 64, NULL); /* loading: no architecture yet */
    ck_assert_str_eq(
        b.p,
        "{\"id\":\"m\\\"1\",\"object\":\"model\",\"created\":7,\"owned_by\":\"orch\","
        "\"max_model_len\":64}");
    strbuf_free(&b);
    render_model_object(&b, "m", 7, 4096, "llama");
    ck_assert_str_eq(b.p, "{\"id\":\"m\",\"object\":\"model\",\"created\":7,\"owned_by\":"
                          "\"orch\",\"max_model_len\":4096,\"architecture\":\"llama\"}");
    static const struct {
        unsigned status;
        const char *type;
    } types[] = { { 400, "invalid_request_error" },    { 401, "authentication_error" },
                  { 404, "not_found_error" },          { 413, "invalid_request_error" },
                  { 429, "rate_limit_error" },         { 500, "server_error" },
                  { 503, "service_unavailable_error" } };
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        api_error e;
        ck_assert_int_eq(api_error_set(&e, types[i].status, NULL, NULL, "x"), -1);
        ck_assert_str_eq(e.type, types[i].type);
    }
    api_error e;
    api_error_set(&e, 429, "n", "queue_full", "say \"%s\" %d", "hi", 3);
    b.len = 0;
    api_error_json(&b, &e);
    ck_assert_str_eq(
        b.p, "{\"error\":{\"message\":\"say \\\"hi\\\" 3\",\"type\":\"rate_limit_error\","
             "\"param\":\"n\",\"code\":\"queue_full\"}}");
    strbuf_free(&b);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("server_render");
    TCase *tc = tcase_create("render");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, final_completion_plain);
    tcase_add_test(tc, final_completion_echo_logprobs);
    tcase_add_test(tc, final_chat_logprobs_and_choices);
    tcase_add_test(tc, stream_chat_utf8_merge_and_c0);
    tcase_add_test(tc, stream_completion_echo_usage_and_stop);
    tcase_add_test(tc, stream_error_event_once);
    tcase_add_test(tc, model_and_error_objects);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
