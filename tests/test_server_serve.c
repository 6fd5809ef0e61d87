/*
 * test_server_serve.c - the serve module (serve/serve.h): option defaults
 * (connection limits and deadlines included),
 * default model names, the mock's built-in model, KV pool sizing (budget,
 * cap at max_seqs full contexts, INT32_MAX, too small), and serve_run's
 * whole life on the mock engine driven through its hooks: the exact progress
 * lines of start, ready, drain and stop, one real HTTP completion whose text
 * is predicted from the mock's rule, a stop request before the model is
 * ready, and start failures with their exit status and message (a bad
 * --chat-template among them; the chosen template is a progress line).
 */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/core/util.h"
#include "orchestrator/serve/block_manager.h"
#include "orchestrator/serve/serve.h"
#include "tests/test_util.h"

START_TEST(defaults_names_and_mock_model) {
    serve_options o;
    serve_options_default(&o);
    ck_assert_ptr_null(o.ckpt);
    ck_assert_ptr_null(o.api_key);
    ck_assert_ptr_null(o.chat_template);
    ck_assert_int_eq(o.threads, -1);
    ck_assert_uint_eq(o.port, 8080);
    ck_assert_uint_eq(o.max_seqs, 64);
    ck_assert_uint_eq(o.max_batch_tokens, 2048);
    ck_assert_uint_eq(o.max_waiting, 1024);
    ck_assert_uint_eq(o.kv_blocks, 0);
    ck_assert_uint_eq(o.kv_memory_mib, 1024);
    ck_assert_uint_eq(o.max_body, 4u << 20);
    ck_assert_uint_eq(o.http_threads, 1);
    ck_assert_uint_eq(o.drain_timeout, 30);
    ck_assert_uint_eq(o.max_body_memory_mib, 256);
    ck_assert_uint_eq(o.http_workers, 2);
    ck_assert_uint_eq(o.max_connections, 4096);
    ck_assert_uint_eq(o.max_connections_per_ip, 1024);
    ck_assert_uint_eq(o.header_timeout_s, 10);
    ck_assert_uint_eq(o.body_timeout_s, 60);
    ck_assert_uint_eq(o.idle_timeout_s, 15);
    ck_assert_uint_eq(o.n_allowed_hosts, 0);
    ck_assert_uint_eq(o.n_cors_origins, 0);
    ck_assert_int_eq(o.trust_config_engine, 0);
    static const char *const names[][2] = {
        { "runs/default", "default" },
        { "runs/default/", "default" },
        { "runs/default/ckpt-000100", "default" },
        { "runs/default/ckpt-000100//", "default" },
        { "ckpt-5", "ckpt-5" },
        { "/abs/run", "run" },
        { ".", "orch-model" },
        { "a/.", "orch-model" },
        { "/", "orch-model" },
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char out[256];
        serve_default_model_name(names[i][0], out, sizeof out);
        ck_assert_msg(strcmp(out, names[i][1]) == 0, "%s -> %s", names[i][0], out);
    }
    orch_model_desc d = serve_mock_model_desc();
    ck_assert_uint_eq(d.struct_size, sizeof d);
    ck_assert_uint_eq(d.arch, ORCH_ARCH_GPT2);
    ck_assert_uint_eq(d.vocab_size, 256);
    ck_assert_uint_eq(d.context, 1024);
    ck_assert_uint_eq(d.layers, 2);
    ck_assert_uint_eq(d.heads, 2);
    ck_assert_uint_eq(d.width, 64);
    ck_assert_uint_eq(d.mlp_width, 256);
}
END_TEST

START_TEST(kv_pool_sizing) {
    ck_assert_uint_eq(ORCH_KV_BLOCK_TOKENS, 16);
    uint64_t blocks = 0;
    char err[256];
    /* budget 1024 MiB / 8 KiB = 131072, capped at 64 contexts x 64 blocks */
    ck_assert_int_eq(serve_kv_pool_blocks(1024, 8192, 1024, 64, &blocks, err, sizeof err),
                     0);
    ck_assert_uint_eq(blocks, 4096);
    /* the budget decides: 1 MiB / 4 KiB = 256 */
    ck_assert_int_eq(serve_kv_pool_blocks(1, 4096, 1000, 64, &blocks, err, sizeof err),
                     0);
    ck_assert_uint_eq(blocks, 256);
    /* exactly one context (63 blocks for 1000 tokens) */
    ck_assert_int_eq(
        serve_kv_pool_blocks(63, 1 << 20, 1000, 64, &blocks, err, sizeof err), 0);
    ck_assert_uint_eq(blocks, 63);
    /* never above INT32_MAX */
    ck_assert_int_eq(
        serve_kv_pool_blocks(1ull << 20, 1, 16, 1ull << 32, &blocks, err, sizeof err), 0);
    ck_assert_uint_eq(blocks, INT32_MAX);
    blocks = 7;
    ck_assert_int_eq(serve_kv_pool_blocks(1, 65536, 1024, 64, &blocks, err, sizeof err),
                     -1);
    ck_assert_str_eq(err,
                     "--kv-memory 1 MiB holds 16 KV blocks of 65536 bytes, but one full "
                     "context (1024 tokens) needs 64 blocks");
    ck_assert_uint_eq(blocks, 7);
}
END_TEST

/* ---- serve_run through its hooks ---------------------------------------- */
typedef struct run_ctl {
    pthread_mutex_t mu;
    char log[4096];
    atomic_int stop;      /* a stop request is pending */
    atomic_int stop_at_0; /* answer the first wait (ms == 0) with a stop */
    serve_options o;
    char err[512];
    int rc;
} run_ctl;

static void hook_log(void *arg, int warning, const char *msg) {
    run_ctl *c = arg;
    pthread_mutex_lock(&c->mu);
    size_t n = strlen(c->log);
    snprintf(c->log + n, sizeof c->log - n, "%s%s\n", warning ? "warning: " : "", msg);
    pthread_mutex_unlock(&c->mu);
}

static int hook_wait(void *arg, long ms) {
    run_ctl *c = arg;
    if (ms == 0 && atomic_load(&c->stop_at_0)) return 1;
    for (long waited = 0;; waited++) {
        if (atomic_exchange(&c->stop, 0)) return 1;
        if (waited >= ms) return 0;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
}

static void *run_thread(void *arg) {
    run_ctl *c = arg;
    serve_hooks h = { .log = hook_log, .wait_stop = hook_wait, .arg = c };
    c->rc = serve_run(&c->o, &h, c->err, sizeof c->err);
    return NULL;
}

static void ctl_init(run_ctl *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    serve_options_default(&c->o);
    c->o.engine = "mock";
    c->o.port = 0;
}

static void log_copy(run_ctl *c, char *out, size_t cap) {
    pthread_mutex_lock(&c->mu);
    snprintf(out, cap, "%s", c->log);
    pthread_mutex_unlock(&c->mu);
}

/* POST body to 127.0.0.1:port path; the response (headers and body). */
static void http_post(unsigned port, const char *path, const char *body, char *out,
                      size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    char req[1024];
    int n = snprintf(
        req, sizeof req,
        "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
        path, strlen(body), body);
    ck_assert(write(fd, req, (size_t)n) == n);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < cap && (r = read(fd, out + got, cap - 1 - got)) > 0)
        got += (size_t)r;
    out[got] = '\0';
    close(fd);
}

START_TEST(run_serves_and_drains) {
    run_ctl c;
    ctl_init(&c);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, run_thread, &c), 0);
    char log[4096] = "";
    for (int i = 0; i < 20000 && !strstr(log, "ready:"); i++) {
        usleep(1000);
        log_copy(&c, log, sizeof log);
    }
    unsigned port = 0;
    ck_assert_msg(sscanf(log, "listening on http://127.0.0.1:%u", &port) == 1, "%s", log);
    char want[1024];
    snprintf(
        want, sizeof want,
        "listening on http://127.0.0.1:%u (loading the model)\n"
        "chat template orch-plain-v1 (default)\n"
        "ready: model mock-gpt2 (gpt2, engine mock, vocab 256, context 1024), 4096 KV "
        "blocks of 16 "
        "tokens, max 64 sequences, 2048 tokens per iteration, prefix cache on\n",
        port);
    ck_assert_str_eq(log, want);
    /* the mock's greedy rule: next = 97 + (sum of ids so far) % 26; "Hi" = 177 */
    char resp[8192];
    http_post(port, "/v1/completions",
              "{\"prompt\":\"Hi\",\"max_tokens\":3,\"temperature\":0}", resp,
              sizeof resp);
    ck_assert_msg(strstr(resp, "HTTP/1.1 200") == resp, "%s", resp);
    ck_assert_msg(strstr(resp, "\"text\":\"vjl\"") &&
                      strstr(resp, "\"model\":\"mock-gpt2\""),
                  "%s", resp);
    atomic_store(&c.stop, 1);
    pthread_join(t, NULL);
    ck_assert_int_eq(c.rc, ORCH_EXIT_OK);
    log_copy(&c, log, sizeof log);
    strcat(want, "draining (0 sequences active, 0 HTTP requests in flight)\nstopped\n");
    ck_assert_str_eq(log, want);
    pthread_mutex_destroy(&c.mu);
}
END_TEST

START_TEST(run_stopped_before_ready) {
    run_ctl c;
    ctl_init(&c);
    atomic_store(&c.stop_at_0, 1);
    run_thread(&c);
    ck_assert_int_eq(c.rc, ORCH_EXIT_OK);
    char log[4096];
    log_copy(&c, log, sizeof log);
    ck_assert_msg(strstr(log, "(loading the model)\nstopped\n") && !strstr(log, "ready:"),
                  "%s", log);
    pthread_mutex_destroy(&c.mu);
}
END_TEST

START_TEST(run_start_failures) {
    run_ctl c;
    ctl_init(&c);
    c.o.kv_blocks = 10; /* the mock's context needs 64 */
    run_thread(&c);
    ck_assert_int_eq(c.rc, ORCH_EXIT_USAGE);
    ck_assert_str_eq(
        c.err, "KV pool of 10 blocks is too small: one sequence of the full context "
               "(1024 tokens) needs 64 blocks of 16");
    char log[4096];
    log_copy(&c, log, sizeof log);
    ck_assert_msg(strstr(log, "(loading the model)\n") && !strstr(log, "stopped"), "%s",
                  log);
    pthread_mutex_destroy(&c.mu);

    ctl_init(&c);
    c.o.host = "nope";
    run_thread(&c);
    ck_assert_int_eq(c.rc, ORCH_EXIT_USAGE);
    ck_assert_str_eq(c.err, "--host 'nope' is not an IPv4 address");
    ck_assert_str_eq(c.log, "");
    pthread_mutex_destroy(&c.mu);

    ctl_init(&c); /* a bad --chat-template fails before anything starts */
    c.o.chat_template = "chatml2";
    run_thread(&c);
    ck_assert_int_eq(c.rc, ORCH_EXIT_USAGE);
    ck_assert_str_eq(c.err,
                     "--chat-template: unknown template 'chatml2' (choices: chatml, "
                     "llama-2, llama-3, orch-plain-v1, or a Jinja template file)");
    ck_assert_str_eq(c.log, "");
    pthread_mutex_destroy(&c.mu);

    ctl_init(&c);
    c.o.ckpt = "/nonexistent/orch-run";
    c.o.engine = NULL;
    run_thread(&c);
    ck_assert_int_eq(c.rc, ORCH_EXIT_USAGE);
    ck_assert(c.err[0] != '\0');
    pthread_mutex_destroy(&c.mu);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("server_serve");
    TCase *tc = tcase_create("serve");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, defaults_names_and_mock_model);
    tcase_add_test(tc, kv_pool_sizing);
    tcase_add_test(tc, run_serves_and_drains);
    tcase_add_test(tc, run_stopped_before_ready);
    tcase_add_test(tc, run_start_failures);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
