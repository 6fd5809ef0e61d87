/*
 * fuzz_request.c - libFuzzer harness of the HTTP request body parser
 * (serve/request.h): the input is a POST body, parsed as /v1/completions and
 * as /v1/chat/completions, each with the byte tokenizer (vocabulary 256, as
 * the mock-gpt2 test server) and with GPT-2's BPE (50257), and as a body of
 * POST /tokenize and /detokenize (serve/tokenize_api.h: an answer is a JSON
 * object in UTF-8, a refusal a well-formed error).
 *
 * Checked besides the sanitizers: a failed parse is a 400 or 500 (404 only
 * for model_not_found) with a
 * message and an error body that is valid JSON in well-formed UTF-8; a parsed
 * request obeys request.h (1..max_seqs sequences, every prompt 1..context-1
 * ids below the vocabulary whose decoded text is the prompt's text, prompt +
 * max_tokens within the context, stop strings 1..256 bytes with the chat
 * template's last, sampling values, logit_bias, stop_token_ids and
 * min_tokens in range), and every sequence made from
 * it borrows the right prompt.
 *
 * Needs the GPT-2 vocabulary (tools/setup.sh): $ORCH_DATA_DIR/gpt2 or
 * ./data/gpt2. Memory: everything is freed per input (leaks are findings).
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "orchestrator/serve/api_error.h"
#include "orchestrator/serve/chat_template.h"
#include "orchestrator/serve/request.h"
#include "orchestrator/serve/tokenize_api.h"
#include "tests/fuzz/fuzz_util.h"

#define CONTEXT  1024u
#define MAX_SEQS 256u /* HTTP_DEFAULT_MAX_SEQS_PER_REQUEST */

static tokenizer *tok_byte, *tok_gpt2;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char err[1024];
    if (tokenizer_open("byte", NULL, &tok_byte, err, sizeof err) != 0 ||
        tokenizer_open("gpt2", NULL, &tok_gpt2, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_request: %s\n", err);
        exit(1);
    }
    return 0;
}

static void check_error(const api_error *e) {
    FUZZ_CHECK(
        e->status == 400 || e->status == 500 ||
            (e->status == 404 && e->code && strcmp(e->code, "model_not_found") == 0),
        "status %u", e->status);
    FUZZ_CHECK(e->msg[0] != '\0' && e->type != NULL, "empty error");
    strbuf b = { 0 };
    api_error_json(&b, e);
    FUZZ_CHECK(!b.oom && b.p, "error body out of memory");
    cJSON *j = cJSON_ParseWithLength(b.p, b.len);
    FUZZ_CHECK(cJSON_IsObject(j), "error body is not JSON: %s", b.p);
    FUZZ_CHECK(fuzz_utf8_ok(b.p, b.len), "error body is not UTF-8: %s", b.p);
    cJSON_Delete(j);
    free(b.p);
}

static void check_prompt(const request_limits *lim, const gen_prompt *p) {
    FUZZ_CHECK(p->n_ids >= 1 && p->n_ids < lim->context, "prompt of %u ids", p->n_ids);
    FUZZ_CHECK((uint64_t)p->n_ids + p->max_tokens <= lim->context,
               "%u ids + max_tokens %u over the context", p->n_ids, p->max_tokens);
    for (uint32_t k = 0; k < p->n_ids; k++)
        FUZZ_CHECK(p->ids[k] >= 0 && (uint32_t)p->ids[k] < lim->vocab, "id %d",
                   p->ids[k]);
    char *text = NULL;
    size_t len = 0;
    char err[256];
    FUZZ_CHECK(
        tokenizer_decode(lim->tok, p->ids, p->n_ids, &text, &len, err, sizeof err) == 0,
        "decode: %s", err);
    FUZZ_CHECK(p->text && p->text_len == len && memcmp(p->text, text, len) == 0 &&
                   p->text[len] == '\0',
               "prompt text differs from its ids");
    free(text);
}

static void check_request(const request_limits *lim, const gen_request *r) {
    FUZZ_CHECK(r->n >= 1 && r->n <= 128, "n %u", r->n);
    FUZZ_CHECK(r->n_prompts >= 1, "no prompt");
    FUZZ_CHECK(!r->chat || r->n_prompts == 1, "chat with %u prompts", r->n_prompts);
    FUZZ_CHECK((uint64_t)r->n_prompts * r->n <= lim->max_seqs, "%u x %u sequences",
               r->n_prompts, r->n);
    for (uint32_t i = 0; i < r->n_prompts; i++) check_prompt(lim, &r->prompts[i]);
    FUZZ_CHECK(r->n_stops <= REQUEST_MAX_STOPS + CHAT_TEMPLATE_MAX_STOPS, "%u stops",
               r->n_stops);
    for (uint32_t i = 0; i < r->n_stops; i++) {
        size_t l = strlen(r->stops[i]);
        FUZZ_CHECK(l >= 1 && l <= REQUEST_MAX_STOP_LEN, "stop of %zu bytes", l);
    }
    if (r->chat) {
        const chat_template *t = chat_template_plain();
        FUZZ_CHECK(r->n_stops >= t->n_stops, "chat without template stops");
        for (unsigned i = 0; i < t->n_stops; i++)
            FUZZ_CHECK(strcmp(r->stops[r->n_stops - t->n_stops + i], t->stops[i]) == 0,
                       "template stop %u missing", i);
    }
    const sampler_params *s = &r->sampling;
    FUZZ_CHECK(s->temperature >= 0 && s->temperature <= 2, "temperature %g",
               (double)s->temperature);
    FUZZ_CHECK(s->top_p > 0 && s->top_p <= 1, "top_p %g", (double)s->top_p);
    FUZZ_CHECK(r->top_logprobs <= SCHED_MAX_TOP_LOGPROBS, "top_logprobs %u",
               r->top_logprobs);
    FUZZ_CHECK(s->min_p >= 0 && s->min_p <= 1, "min_p %g", (double)s->min_p);
    FUZZ_CHECK(fabsf(s->presence_penalty) <= 2 && fabsf(s->frequency_penalty) <= 2,
               "penalties %g %g", (double)s->presence_penalty,
               (double)s->frequency_penalty);
    FUZZ_CHECK(s->repetition_penalty > 0 && s->repetition_penalty <= 10,
               "repetition_penalty %g", (double)s->repetition_penalty);
    FUZZ_CHECK(r->n_bias <= REQUEST_MAX_LOGIT_BIAS, "%u logit_bias entries", r->n_bias);
    for (uint32_t i = 0; i < r->n_bias; i++)
        FUZZ_CHECK(r->bias_ids[i] >= 0 && (uint32_t)r->bias_ids[i] < lim->vocab &&
                       fabsf(r->bias[i]) <= 100,
                   "logit_bias %d: %g", r->bias_ids[i], (double)r->bias[i]);
    FUZZ_CHECK(r->n_stop_token_ids <= SCHED_MAX_STOP_TOKEN_IDS, "%u stop token ids",
               r->n_stop_token_ids);
    for (uint32_t i = 0; i < r->n_stop_token_ids; i++)
        FUZZ_CHECK(r->stop_token_ids[i] >= 0 &&
                       (uint32_t)r->stop_token_ids[i] < lim->vocab,
                   "stop token id %d", r->stop_token_ids[i]);
    for (uint32_t i = 0; i < r->n_prompts; i++)
        FUZZ_CHECK(r->min_tokens <= r->prompts[i].max_tokens, "min_tokens %u > max %u",
                   r->min_tokens, r->prompts[i].max_tokens);
    FUZZ_CHECK(!r->include_usage || r->stream, "include_usage without stream");
    FUZZ_CHECK(!r->chat || !r->echo, "echo in chat");
    uint32_t ns = gen_request_n_seqs(r);
    FUZZ_CHECK(ns == r->n_prompts * r->n, "n_seqs %u", ns);
    for (uint32_t i = 0; i < ns; i++) {
        sched_seq q;
        memset(&q, 0, sizeof q);
        gen_request_seq(r, i, 42, &q);
        const gen_prompt *p = &r->prompts[i / r->n];
        FUZZ_CHECK(q.prompt == p->ids && q.n_prompt == p->n_ids &&
                       q.max_tokens == p->max_tokens && q.n_stop == r->n_stops,
                   "sequence %u does not match its prompt", i);
    }
}

static void parse_one(const tokenizer *tok, const char *model, int chat,
                      const uint8_t *data, size_t size) {
    request_limits lim = { .tok = tok,
                           .model_name = model,
                           .vocab = tokenizer_vocab_size(tok),
                           .context = CONTEXT,
                           .max_seqs = MAX_SEQS };
    gen_request r;
    api_error e;
    memset(&e, 0, sizeof e);
    if (gen_request_parse(&lim, chat, (const char *)data, size, &r, &e) == 0)
        check_request(&lim, &r);
    else
        check_error(&e);
    gen_request_free(&r);
}

/* POST /tokenize and /detokenize on the same body: an answer is a JSON
 * object, a refusal a well-formed error. */
static void tokenize_one(const tokenizer *tok, const char *model, int detok,
                         const uint8_t *data, size_t size) {
    tokenize_api_limits lim = { .tok = tok, .model_name = model, .context = CONTEXT };
    strbuf b = { 0 };
    api_error e;
    memset(&e, 0, sizeof e);
    int rc = detok ? tokenize_api_detokenize(&lim, (const char *)data, size, &b, &e)
                   : tokenize_api_tokenize(&lim, (const char *)data, size, &b, &e);
    if (rc == 0) {
        cJSON *j = cJSON_ParseWithLength(b.p, b.len);
        FUZZ_CHECK(cJSON_IsObject(j), "answer is not a JSON object: %.200s", b.p);
        FUZZ_CHECK(fuzz_utf8_ok(b.p, b.len), "answer is not UTF-8");
        cJSON_Delete(j);
    } else {
        check_error(&e);
    }
    free(b.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int chat = 0; chat <= 1; chat++) {
        parse_one(tok_byte, "mock-gpt2", chat, data, size);
        parse_one(tok_gpt2, "gpt2", chat, data, size);
        tokenize_one(chat ? tok_gpt2 : tok_byte, "mock-gpt2", 0, data, size);
        tokenize_one(chat ? tok_gpt2 : tok_byte, "mock-gpt2", 1, data, size);
    }
    return 0;
}
