/*
 * test_server_request.c - request bodies parsed into the typed generation
 * request (serve/request.h) with the byte tokenizer (token id = byte):
 * prompts in every form with their ids and decoded text, the default
 * max_tokens resolved once per prompt (16 for completions, the rest of the
 * context for chat, cut to what fits), max_completion_tokens, sampling
 * fields, stream options, logprobs, the chat template's stop strings, nulls
 * as absent, the sequences a request becomes (prompt / choice / RNG stream),
 * a table of rejected bodies with their exact status, param, code and
 * message, the strict JSON rules (data after the value, control bytes, NULs in
 * strings, duplicate keys at any depth) and prompts refused before they are
 * read in full (byte length, token arrays, tokenizing stopped at the
 * context), and structured output: one cached grammar, a matcher and the
 * scheduler hooks per sequence, tools on chat, refusal without a cache.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/strbuf.h"
#include "orchestrator/serve/request.h"
#include "orchestrator/serve/tokenize_api.h"
#include "orchestrator/serve/tool_calls.h"
#include "tests/test_util.h"

static tokenizer *tok;
static request_limits lim;

static void setup(void) {
    char err[256];
    ck_assert_msg(tokenizer_open("byte", NULL, &tok, err, sizeof err) == 0, "%s", err);
    lim = (request_limits){
        .tok = tok, .model_name = "m", .vocab = 256, .context = 64, .max_seqs = 8
    };
}

static void teardown(void) { tokenizer_free(tok); }

/* Parse a body that must be accepted. */
static void parse_ok(int chat, const char *body, gen_request *r) {
    api_error e;
    memset(&e, 0, sizeof e);
    int rc = gen_request_parse(&lim, chat, body, strlen(body), r, &e);
    ck_assert_msg(rc == 0, "%s: %u %s", body, e.status, e.msg);
}

static void expect_prompt(const gen_prompt *p, const char *text, uint32_t max_tokens) {
    size_t n = strlen(text);
    ck_assert_uint_eq(p->n_ids, n);
    for (size_t i = 0; i < n; i++) ck_assert_int_eq(p->ids[i], (unsigned char)text[i]);
    ck_assert_uint_eq(p->text_len, n);
    ck_assert_str_eq(p->text, text);
    ck_assert_uint_eq(p->max_tokens, max_tokens);
}

/* A model whose tokenizer_config asks for a BOS (the hf fixture
 * tests/fixtures/hf-tokenizer/tiny-bytelevel, read from the repository root
 * where run_tests.sh runs the suites): text prompts get it in front, once,
 * also when the text already starts with it (a chat template's BOS text);
 * token-id prompts are taken as given. */
START_TEST(hf_bos_prepended_once) {
    char err[256];
    tokenizer *hf = NULL;
    ck_assert_msg(tokenizer_open("hf", "tests/fixtures/hf-tokenizer/tiny-bytelevel", &hf,
                                 err, sizeof err) == 0,
                  "%s", err);
    request_limits l = lim;
    l.tok = hf;
    l.vocab = tokenizer_vocab_size(hf);
    const char *bodies[3] = { "{\"prompt\":\"hi\"}", "{\"prompt\":\"<|endoftext|>hi\"}",
                              "{\"prompt\":[104,105]}" };
    const uint32_t want_n[3] = { 3, 3, 2 };
    for (int i = 0; i < 3; i++) {
        gen_request r;
        api_error e;
        memset(&e, 0, sizeof e);
        ck_assert_msg(gen_request_parse(&l, 0, bodies[i], strlen(bodies[i]), &r, &e) == 0,
                      "%s: %s", bodies[i], e.msg);
        ck_assert_uint_eq(r.prompts[0].n_ids, want_n[i]);
        ck_assert_int_eq(r.prompts[0].ids[0], i < 2 ? 261 : 104);
        ck_assert_int_eq(r.prompts[0].ids[want_n[i] - 1], 105);
        gen_request_free(&r);
    }
    /* /tokenize: the same BOS with add_special (default) and
     * add_special_tokens, none when either is false. */
    tokenize_api_limits tl = { .tok = hf, .model_name = "m", .context = 64 };
    const char *tbodies[4] = { "{\"content\":\"hi\"}",
                               "{\"content\":\"hi\",\"add_special\":false}",
                               "{\"prompt\":\"hi\",\"add_special_tokens\":false}",
                               "{\"prompt\":\"<|endoftext|>hi\"}" };
    const char *want[4] = {
        "{\"tokens\":[261,104,105],\"count\":3,\"max_model_len\":64}",
        "{\"tokens\":[104,105],\"count\":2,\"max_model_len\":64}",
        "{\"tokens\":[104,105],\"count\":2,\"max_model_len\":64}",
        "{\"tokens\":[261,104,105],\"count\":3,\"max_model_len\":64}"
    };
    for (int i = 0; i < 4; i++) {
        strbuf out = { 0 };
        api_error e;
        memset(&e, 0, sizeof e);
        ck_assert_msg(
            tokenize_api_tokenize(&tl, tbodies[i], strlen(tbodies[i]), &out, &e) == 0,
            "%s: %s", tbodies[i], e.msg);
        ck_assert_str_eq(out.p, want[i]);
        free(out.p);
    }
    tokenizer_free(hf);
}
END_TEST

START_TEST(completion_defaults) {
    gen_request r;
    parse_ok(0, "{\"prompt\":\"Hi\"}", &r);
    ck_assert_int_eq(r.chat, 0);
    ck_assert_uint_eq(r.n_prompts, 1);
    expect_prompt(&r.prompts[0], "Hi", REQUEST_DEFAULT_MAX_TOKENS);
    ck_assert_uint_eq(r.n, 1);
    ck_assert_uint_eq(gen_request_n_seqs(&r), 1);
    ck_assert_float_eq(r.sampling.temperature, 1.0f);
    ck_assert_float_eq(r.sampling.top_p, 1.0f);
    ck_assert_uint_eq(r.sampling.top_k, 0);
    ck_assert_int_eq(r.has_seed, 0);
    ck_assert_int_eq(r.stream | r.include_usage | r.echo | r.logprobs | r.ignore_eos, 0);
    ck_assert_uint_eq(r.top_logprobs, 0);
    ck_assert_uint_eq(r.n_stops, 0);
    gen_request_free(&r);
    /* null counts as absent; model may name the served one */
    parse_ok(0,
             "{\"model\":\"m\",\"prompt\":\"Hi\",\"max_tokens\":null,\"stop\":null,\"n\":"
             "null}",
             &r);
    expect_prompt(&r.prompts[0], "Hi", 16);
    ck_assert_uint_eq(r.n, 1);
    gen_request_free(&r);
}
END_TEST

START_TEST(max_tokens_resolved_once_per_prompt) {
    gen_request r;
    /* 50 + 16 > 64: the default is cut to the 14 positions left */
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":[\"%.50s\",\"ab\"]}",
             "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
    parse_ok(0, body, &r);
    ck_assert_uint_eq(r.n_prompts, 2);
    ck_assert_uint_eq(r.prompts[0].n_ids, 50);
    ck_assert_uint_eq(r.prompts[0].max_tokens, 14);
    ck_assert_uint_eq(r.prompts[1].max_tokens, 16);
    gen_request_free(&r);
    /* an explicit value is taken as is */
    parse_ok(0, "{\"prompt\":\"abcd\",\"max_tokens\":60}", &r);
    ck_assert_uint_eq(r.prompts[0].max_tokens, 60);
    gen_request_free(&r);
    parse_ok(0, "{\"prompt\":\"abcd\",\"max_tokens\":0}", &r);
    ck_assert_uint_eq(r.prompts[0].max_tokens, 0);
    gen_request_free(&r);
    /* chat: the rest of the context; max_completion_tokens wins */
    parse_ok(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
    expect_prompt(&r.prompts[0], "User: hi\nAssistant:", 64 - 19);
    gen_request_free(&r);
    parse_ok(1,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":9,"
             "\"max_completion_tokens\":5}",
             &r);
    ck_assert_uint_eq(r.prompts[0].max_tokens, 5);
    gen_request_free(&r);
}
END_TEST

START_TEST(prompt_forms) {
    gen_request r;
    parse_ok(0, "{\"prompt\":[72,105,33]}", &r); /* one prompt as token ids */
    ck_assert_uint_eq(r.n_prompts, 1);
    expect_prompt(&r.prompts[0], "Hi!", 16);
    gen_request_free(&r);
    parse_ok(0, "{\"prompt\":[\"ab\",[99,100],\"e\"],\"n\":2}", &r);
    ck_assert_uint_eq(r.n_prompts, 3);
    expect_prompt(&r.prompts[0], "ab", 16);
    expect_prompt(&r.prompts[1], "cd", 16);
    expect_prompt(&r.prompts[2], "e", 16);
    ck_assert_uint_eq(gen_request_n_seqs(&r), 6);
    gen_request_free(&r);
    /* chat: content parts joined, assistant content may be null, roles */
    parse_ok(1,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\","
             "\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
             "\"text\":\"b\"}]},"
             "{\"role\":\"assistant\",\"content\":null},{\"role\":\"developer\","
             "\"content\":\"d\"}]}",
             &r);
    expect_prompt(&r.prompts[0],
                  "System: s\nUser: ab\nAssistant: \nSystem: d\nAssistant:", 64 - 51);
    gen_request_free(&r);
}
END_TEST

START_TEST(fields_and_stops) {
    gen_request r;
    parse_ok(
        0,
        "{\"prompt\":\"a\",\"temperature\":0.5,\"top_p\":0.25,\"top_k\":7,\"seed\":-3,"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"echo\":true,"
        "\"logprobs\":3,\"ignore_eos\":true,\"stop\":[\"x\",\"yz\"],\"best_of\":1,"
        "\"presence_penalty\":0,\"logit_bias\":{}}",
        &r);
    ck_assert_float_eq(r.sampling.temperature, 0.5f);
    ck_assert_float_eq(r.sampling.top_p, 0.25f);
    ck_assert_uint_eq(r.sampling.top_k, 7);
    ck_assert_int_eq(r.has_seed, 1);
    ck_assert_uint_eq(r.seed, (uint64_t)-3);
    ck_assert_int_eq(r.stream, 1);
    ck_assert_int_eq(r.include_usage, 1);
    ck_assert_int_eq(r.echo, 1);
    ck_assert_int_eq(r.logprobs, 1);
    ck_assert_uint_eq(r.top_logprobs, 3);
    ck_assert_int_eq(r.ignore_eos, 1);
    ck_assert_uint_eq(r.n_stops, 2);
    ck_assert_str_eq(r.stops[0], "x");
    ck_assert_str_eq(r.stops[1], "yz");
    gen_request_free(&r);
    /* the token controls */
    parse_ok(0,
             "{\"prompt\":\"a\",\"min_p\":0.05,\"presence_penalty\":-0.5,"
             "\"frequency_penalty\":1.5,\"repetition_penalty\":1.2,"
             "\"logit_bias\":{\"7\":-100,\"255\":3.5},\"stop_token_ids\":[9,0],"
             "\"min_tokens\":4,\"max_tokens\":4}",
             &r);
    ck_assert_float_eq(r.sampling.min_p, 0.05f);
    ck_assert_float_eq(r.sampling.presence_penalty, -0.5f);
    ck_assert_float_eq(r.sampling.frequency_penalty, 1.5f);
    ck_assert_float_eq(r.sampling.repetition_penalty, 1.2f);
    ck_assert_uint_eq(r.n_bias, 2);
    ck_assert_int_eq(r.bias_ids[0], 7);
    ck_assert_float_eq(r.bias[0], -100.0f);
    ck_assert_int_eq(r.bias_ids[1], 255);
    ck_assert_float_eq(r.bias[1], 3.5f);
    ck_assert_uint_eq(r.n_stop_token_ids, 2);
    ck_assert_int_eq(r.stop_token_ids[0], 9);
    ck_assert_int_eq(r.stop_token_ids[1], 0);
    ck_assert_uint_eq(r.min_tokens, 4);
    sched_seq q;
    memset(&q, 0, sizeof q);
    gen_request_seq(&r, 0, 1, &q);
    ck_assert_uint_eq(q.n_bias, 2);
    ck_assert_ptr_eq(q.bias_ids, r.bias_ids);
    ck_assert_uint_eq(q.n_stop_token_ids, 2);
    ck_assert_uint_eq(q.min_tokens, 4);
    ck_assert_float_eq(q.sampling.repetition_penalty, 1.2f);
    gen_request_free(&r);
    /* defaults: repetition_penalty 1 (off) */
    parse_ok(0, "{\"prompt\":\"a\"}", &r);
    ck_assert_float_eq(r.sampling.repetition_penalty, 1.0f);
    ck_assert_float_eq(r.sampling.min_p, 0.0f);
    ck_assert_uint_eq(r.n_bias + r.n_stop_token_ids + r.min_tokens, 0);
    gen_request_free(&r);
    /* top_k -1 is off; logprobs 0 still asks */
    parse_ok(0, "{\"prompt\":\"a\",\"top_k\":-1,\"logprobs\":0,\"stop\":\"q\"}", &r);
    ck_assert_uint_eq(r.sampling.top_k, 0);
    ck_assert_int_eq(r.include_usage, 0);
    ck_assert_int_eq(r.logprobs, 1);
    ck_assert_uint_eq(r.top_logprobs, 0);
    ck_assert_uint_eq(r.n_stops, 1);
    gen_request_free(&r);
    /* chat: logprobs + top_logprobs; the template's stops after the client's */
    parse_ok(
        1,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
        "\"top_logprobs\":2,\"stop\":\"END\",\"response_format\":{\"type\":\"text\"}}",
        &r);
    ck_assert_int_eq(r.logprobs, 1);
    ck_assert_uint_eq(r.top_logprobs, 2);
    ck_assert_uint_eq(r.n_stops, 3);
    ck_assert_str_eq(r.stops[0], "END");
    ck_assert_str_eq(r.stops[1], "\nUser:");
    ck_assert_str_eq(r.stops[2], "\nSystem:");
    gen_request_free(&r);
}
END_TEST

START_TEST(sequences_of_a_request) {
    gen_request r;
    parse_ok(0,
             "{\"prompt\":[\"ab\",\"cde\"],\"n\":2,\"max_tokens\":5,\"temperature\":0.7,"
             "\"echo\":true,\"logprobs\":1,\"stream\":true,\"stop\":\"z\",\"ignore_eos\":"
             "true}",
             &r);
    sched_seq q[4];
    memset(q, 0, sizeof q);
    for (uint32_t i = 0; i < 4; i++) gen_request_seq(&r, i, 42, &q[i]);
    for (uint32_t i = 0; i < 4; i++) {
        const gen_prompt *p = &r.prompts[i / 2];
        ck_assert_ptr_eq(q[i].prompt, p->ids);
        ck_assert_uint_eq(q[i].n_prompt, p->n_ids);
        ck_assert_uint_eq(q[i].max_tokens, 5);
        ck_assert_float_eq(q[i].sampling.temperature, 0.7f);
        sampler_rng want;
        sampler_rng_seed_stream(&want, 42, i % 2);
        ck_assert_mem_eq(&q[i].rng, &want, sizeof want);
        ck_assert_uint_eq(q[i].n_stop, 1);
        ck_assert_str_eq(q[i].stop[0], "z");
        ck_assert_int_eq(q[i].want_logprobs, 1);
        ck_assert_uint_eq(q[i].top_logprobs, 1);
        ck_assert_int_eq(q[i].want_prompt_logprobs, 1);
        ck_assert_int_eq(q[i].stream, 1);
        ck_assert_int_eq(q[i].ignore_eot, 1);
    }
    ck_assert_uint_eq(q[2].n_prompt, 3);
    ck_assert(memcmp(&q[0].rng, &q[1].rng, sizeof q[0].rng) != 0); /* choices differ */
    ck_assert_mem_eq(&q[0].rng, &q[2].rng, sizeof q[0].rng); /* choice 0 of each prompt */
    gen_request_free(&r);
}
END_TEST

/* Structured output: the grammar is shared (cached) and every sequence gets
 * its own matcher and the scheduler hooks; without a grammar cache the
 * request is refused. */
START_TEST(structured_output_sequences) {
    grammar_cache *gc = grammar_cache_create(tok, 256, 8);
    ck_assert_ptr_nonnull(gc);
    lim.grammars = gc;
    const char *body =
        "{\"prompt\":[\"a\",\"b\"],\"n\":2,\"max_tokens\":9,\"response_format\":{"
        "\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{"
        "\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"boolean\"}},"
        "\"required\":[\"k\"]}}}}";
    gen_request r, r2;
    parse_ok(0, body, &r);
    parse_ok(0, body, &r2);
    ck_assert_ptr_nonnull(r.grammar);
    ck_assert_ptr_eq(r.grammar, r2.grammar); /* compiled once */
    ck_assert_int_eq(r.tool_mode, 0);
    sched_seq q[4];
    memset(q, 0, sizeof q);
    for (uint32_t i = 0; i < 4; i++) {
        gen_request_seq(&r, i, 1, &q[i]);
        ck_assert_ptr_eq(q[i].constraint, &r.matchers[i]);
        ck_assert_ptr_nonnull(q[i].token_mask);
        ck_assert_ptr_nonnull(q[i].forced_tokens);
    }
    /* the first token may only be '{' */
    const uint32_t *mask = q[0].token_mask(&q[0]);
    for (uint32_t v = 0; v < 256; v++)
        ck_assert_int_eq(sampler_mask_allows(mask, v), v == '{');
    gen_request_free(&r);
    gen_request_free(&r2);
    /* tools on chat (listed in the prompt first) */
    lim.context = 256;
    parse_ok(1,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
             "\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\"}",
             &r);
    ck_assert_int_eq(r.tool_mode, TOOL_MODE_CALL);
    ck_assert_str_eq(
        r.prompts[0].text,
        "System: Tools: [{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]\n"
        "User: x\nAssistant:");
    ck_assert_ptr_nonnull(r.grammar);
    const char *call = "{\"name\":\"f\",\"arguments\":{}}";
    ck_assert(regex_dfa_match(grammar_dfa(r.grammar), call, strlen(call)));
    ck_assert(!regex_dfa_match(grammar_dfa(r.grammar), call, strlen(call) - 1));
    gen_request_free(&r);
    grammar_cache_free(gc);
    /* no cache: refused */
    lim.grammars = NULL;
    api_error e;
    const char *b2 = "{\"prompt\":\"a\",\"guided_choice\":[\"x\"]}";
    ck_assert_int_ne(gen_request_parse(&lim, 0, b2, strlen(b2), &r, &e), 0);
    gen_request_free(&r);
    ck_assert_uint_eq(e.status, 400);
    ck_assert_str_eq(e.param, "guided_choice");
    ck_assert_str_eq(e.msg, "structured output is not available on this server");
}
END_TEST

typedef struct bad_case {
    int chat;
    const char *body;
    unsigned status;
    const char *param, *code, *msg;
} bad_case;

static const bad_case BAD[] = {
    { 0, "nope", 400, NULL, "invalid_json",
      "the request body is not valid JSON (error near byte 0)" },
    { 0, "[1]", 400, NULL, "invalid_json", "the request body must be a JSON object" },
    { 0, "{\"prompt\":\"a\",\"model\":\"x\"}", 404, "model", "model_not_found",
      "the model 'x' does not exist; this server serves 'm'" },
    { 0, "{\"prompt\":\"a\",\"model\":1}", 400, "model", "invalid_type",
      "'model' must be a string" },
    { 0, "{}", 400, "prompt", "missing_required_parameter", "'prompt' is required" },
    { 0, "{\"prompt\":5}", 400, "prompt", "invalid_type",
      "'prompt' must be a string, an array of token ids, or an array of either" },
    { 0, "{\"prompt\":[]}", 400, "prompt", "invalid_value",
      "'prompt' is an empty array" },
    { 0, "{\"prompt\":[1,300]}", 400, "prompt", "invalid_value",
      "prompt: token ids must be integers in [0, 256); element 1 is not" },
    { 0, "{\"prompt\":[[1],5]}", 400, "prompt", "invalid_type",
      "prompt[1] must be a string or a non-empty array of token ids" },
    { 0, "{\"prompt\":\"\"}", 400, "prompt", "invalid_value", "the prompt is empty" },
    { 0, "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}", 400,
      "prompt", "invalid_value", "at most 8 prompts per request, got 9" },
    { 0, "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":3}", 400, "n", "invalid_value",
      "n x prompts = 9 is over the limit of 8 sequences per request" },
    { 0, "{\"prompt\":\"a\",\"temperature\":2.5}", 400, "temperature", "invalid_value",
      "'temperature' must be in [0, 2], got 2.5" },
    { 0, "{\"prompt\":\"a\",\"top_p\":0}", 400, "top_p", "invalid_value",
      "'top_p' must be in (0, 1], got 0" },
    { 0, "{\"prompt\":\"a\",\"n\":0}", 400, "n", "invalid_value",
      "'n' must be between 1 and 128, got 0" },
    { 0, "{\"prompt\":\"a\",\"n\":1.5}", 400, "n", "invalid_type",
      "'n' must be an integer" },
    { 0, "{\"prompt\":\"a\",\"best_of\":2}", 400, "best_of", "unsupported_parameter",
      "'best_of' other than n is not supported" },
    { 0, "{\"prompt\":\"a\",\"stream\":1}", 400, "stream", "invalid_type",
      "'stream' must be a boolean" },
    { 0, "{\"prompt\":\"a\",\"stream_options\":1}", 400, "stream_options", "invalid_type",
      "'stream_options' must be an object" },
    { 0, "{\"prompt\":\"a\",\"logprobs\":21}", 400, "logprobs", "invalid_value",
      "'logprobs' must be between 0 and 20, got 21" },
    { 0, "{\"prompt\":\"a\",\"stop\":\"\"}", 400, "stop", "invalid_value",
      "stop strings must not be empty" },
    { 0, "{\"prompt\":\"a\",\"stop\":[1]}", 400, "stop", "invalid_type",
      "'stop' must be a string or an array of strings" },
    { 0, "{\"prompt\":\"a\",\"presence_penalty\":2.5}", 400, "presence_penalty",
      "invalid_value", "'presence_penalty' must be in [-2, 2], got 2.5" },
    { 0, "{\"prompt\":\"a\",\"frequency_penalty\":\"x\"}", 400, "frequency_penalty",
      "invalid_type", "'frequency_penalty' must be a number" },
    { 0, "{\"prompt\":\"a\",\"repetition_penalty\":0}", 400, "repetition_penalty",
      "invalid_value", "'repetition_penalty' must be in (0, 10], got 0" },
    { 0, "{\"prompt\":\"a\",\"min_p\":1.5}", 400, "min_p", "invalid_value",
      "'min_p' must be in [0, 1], got 1.5" },
    { 0, "{\"prompt\":\"a\",\"logit_bias\":[1]}", 400, "logit_bias", "invalid_type",
      "'logit_bias' must be an object of token id: bias" },
    { 0, "{\"prompt\":\"a\",\"logit_bias\":{\"256\":2}}", 400, "logit_bias",
      "invalid_value", "'logit_bias' key '256' is not a token id (0..255)" },
    { 0, "{\"prompt\":\"a\",\"logit_bias\":{\"-1\":2}}", 400, "logit_bias",
      "invalid_value", "'logit_bias' key '-1' is not a token id (0..255)" },
    { 0, "{\"prompt\":\"a\",\"logit_bias\":{\"7\":101}}", 400, "logit_bias",
      "invalid_value", "'logit_bias' value for token 7 must be a number in [-100, 100]" },
    { 0, "{\"prompt\":\"a\",\"stop_token_ids\":5}", 400, "stop_token_ids", "invalid_type",
      "'stop_token_ids' must be an array of token ids" },
    { 0, "{\"prompt\":\"a\",\"stop_token_ids\":[1.5]}", 400, "stop_token_ids",
      "invalid_value", "'stop_token_ids' entries must be token ids (0..255)" },
    { 0, "{\"prompt\":\"a\",\"min_tokens\":-1}", 400, "min_tokens", "invalid_value",
      "'min_tokens' must be between 0 and 1000000000, got -1" },
    { 0, "{\"prompt\":\"a\",\"max_tokens\":3,\"min_tokens\":4}", 400, "min_tokens",
      "invalid_value",
      "'min_tokens' (4) is more than the 3 tokens the completion may have" },
    { 0, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 400,
      "stream_options", "invalid_value",
      "'stream_options' is only allowed when 'stream' is true" },
    { 0, "{\"prompt\":\"a\",\"guided_grammar\":\"x\"}", 400, NULL, "unknown_parameter",
      "Unrecognized request argument supplied: guided_grammar" },
    { 0, "{\"prompt\":\"a\",\"suffix\":\"x\"}", 400, "suffix", "unsupported_parameter",
      "'suffix' is not supported" },
    { 0, "{\"prompt\":\"abcd\",\"max_tokens\":61}", 400, "max_tokens",
      "context_length_exceeded",
      "This model's maximum context length is 64 tokens. However, you requested 65 "
      "tokens (4 in the "
      "prompt, 61 for the completion). Please reduce the prompt or the completion "
      "length." },
    { 0,
      "{\"prompt\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
      "1,1,1,1,1,1,1,"
      "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}",
      400, "prompt", "context_length_exceeded",
      "This model's maximum context length is 64 tokens, but the prompt has 64 tokens. "
      "Please shorten it." },
    { 1, "{}", 400, "messages", "missing_required_parameter", "'messages' is required" },
    { 1, "{\"messages\":[]}", 400, "messages", "invalid_type",
      "'messages' must be a non-empty array" },
    { 1, "{\"messages\":[5]}", 400, "messages", "invalid_type",
      "messages[0] must be an object with a string 'role'" },
    { 1, "{\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", 400, "messages",
      "invalid_value",
      "messages[0].role 'bot' is not one of system, developer, user, assistant, tool" },
    { 1, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages",
      "missing_required_parameter", "messages[0].content is required" },
    { 1, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", 400,
      "messages", "invalid_value",
      "messages[0].content[0] must be {\"type\":\"text\",\"text\":STRING} (only text "
      "parts are supported)" },
    { 1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400,
      "top_logprobs", "invalid_value", "'top_logprobs' requires 'logprobs': true" },
    { 1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[]}", 400,
      "tools", "invalid_type", "'tools' must be a non-empty array" },
    { 1,
      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{"
      "\"type\":\"json\"}}",
      400, "response_format", "invalid_value",
      "response_format.type must be text, json_object or json_schema, got 'json'" },
    { 1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"functions\":[{}]}", 400,
      "functions", "unsupported_parameter",
      "'functions' / 'function_call' are not supported; use 'tools' / 'tool_choice'" },
    { 1,
      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":"
      "60}",
      400, "max_completion_tokens", "context_length_exceeded",
      "This model's maximum context length is 64 tokens. However, you requested 78 "
      "tokens (18 in the "
      "messages, 60 for the completion). Please reduce the messages or the completion "
      "length." },
};

START_TEST(rejected_bodies) {
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        const bad_case *c = &BAD[i];
        gen_request r;
        api_error e;
        memset(&e, 0, sizeof e);
        int rc = gen_request_parse(&lim, c->chat, c->body, strlen(c->body), &r, &e);
        ck_assert_msg(rc == -1, "case %zu accepted: %s", i, c->body);
        ck_assert_msg(e.status == c->status, "case %zu: status %u", i, e.status);
        ck_assert_str_eq(e.type, "invalid_request_error");
        if (c->param)
            ck_assert_msg(e.param && strcmp(e.param, c->param) == 0, "case %zu param", i);
        else
            ck_assert_ptr_null(e.param);
        ck_assert_msg(e.code && strcmp(e.code, c->code) == 0, "case %zu code %s", i,
                      e.code);
        ck_assert_msg(strcmp(e.msg, c->msg) == 0, "case %zu: [%s]", i, e.msg);
        gen_request_free(&r); /* whatever was allocated before the error */
    }
}
END_TEST

/* Bodies cJSON accepts that must be refused (json_strict.h), and prompts
 * refused before they are read in full. */
static const bad_case STRICT[] = {
    { 0, "{\"prompt\":\"a\"} x", 400, NULL, "invalid_json",
      "unexpected data after the JSON value (byte 15)" },
    { 0, "{\"prompt\":\"a\"}{}", 400, NULL, "invalid_json",
      "unexpected data after the JSON value (byte 14)" },
    { 0, "{\"prompt\":\"a\"\x01}", 400, NULL, "invalid_json",
      "control character 0x01 outside a string (byte 13)" },
    { 0, "{\"prompt\":\"a\\u0000b\"}", 400, "prompt", "invalid_value",
      "prompt contains a NUL character (\\u0000), which is not allowed" },
    { 0, "{\"prompt\":[\"ok\",\"a\\u0000\"]}", 400, "prompt", "invalid_value",
      "prompt[1] contains a NUL character (\\u0000), which is not allowed" },
    { 0, "{\"prompt\":\"a\",\"user\":\"\\u0000\"}", 400, "user", "invalid_value",
      "user contains a NUL character (\\u0000), which is not allowed" },
    { 0, "{\"prompt\":\"a\",\"zz\":{\"k\":[1,\"\\u0000\"]}}", 400, NULL, "invalid_value",
      "zz.k[1] contains a NUL character (\\u0000), which is not allowed" },
    { 0, "{\"pro\\u0000mpt\":\"a\"}", 400, NULL, "invalid_value",
      "a key of pro\\u0000mpt contains a NUL character (\\u0000), which is not allowed" },
    { 1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\\u0000\"}]}", 400, "messages",
      "invalid_value",
      "messages[0].content contains a NUL character (\\u0000), which is not allowed" },
    { 0, "{\"model\":\"m\",\"prompt\":\"a\",\"model\":\"x\"}", 400, "model",
      "duplicate_key", "duplicate key 'model' in the request body" },
    { 1, "{\"messages\":[{\"role\":\"user\",\"role\":\"system\",\"content\":\"x\"}]}",
      400, "messages", "duplicate_key", "duplicate key 'role' in messages[0]" },
    { 0,
      "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true,\"include_usage\":"
      "false}}",
      400, "stream_options", "duplicate_key",
      "duplicate key 'include_usage' in stream_options" },
    { 0,
      "{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5,\"f\":6,\"g\":7,\"h\":8,\"i\":9,\"a\":0,"
      "\"prompt\":\"x\"}",
      400, NULL, "duplicate_key", "duplicate key 'a' in the request body" },
};

START_TEST(strict_json) {
    for (size_t i = 0; i < sizeof STRICT / sizeof *STRICT; i++) {
        const bad_case *c = &STRICT[i];
        gen_request r;
        api_error e;
        memset(&e, 0, sizeof e);
        int rc = gen_request_parse(&lim, c->chat, c->body, strlen(c->body), &r, &e);
        ck_assert_msg(rc == -1, "case %zu accepted: %s", i, c->body);
        ck_assert_msg(e.status == c->status, "case %zu: status %u", i, e.status);
        if (c->param)
            ck_assert_msg(e.param && strcmp(e.param, c->param) == 0, "case %zu param %s",
                          i, e.param ? e.param : "(null)");
        else
            ck_assert_msg(!e.param, "case %zu param %s", i, e.param);
        ck_assert_msg(e.code && strcmp(e.code, c->code) == 0, "case %zu code %s", i,
                      e.code);
        ck_assert_msg(strcmp(e.msg, c->msg) == 0, "case %zu: [%s]", i, e.msg);
        gen_request_free(&r);
    }
    /* a raw NUL byte inside the prompt string (strlen would stop there) */
    static const char raw[] = "{\"prompt\":\"ab\0cd\"}";
    gen_request r;
    api_error e;
    ck_assert_int_eq(gen_request_parse(&lim, 0, raw, sizeof raw - 1, &r, &e), -1);
    ck_assert_str_eq(e.param, "prompt");
    ck_assert_str_eq(e.code, "invalid_value");
    gen_request_free(&r);
    /* a NUL after the value is trailing data, not the end */
    static const char tail[] = "{\"prompt\":\"ab\"}\0{\"x\":1}";
    ck_assert_int_eq(gen_request_parse(&lim, 0, tail, sizeof tail - 1, &r, &e), -1);
    ck_assert_str_eq(e.msg, "unexpected data after the JSON value (byte 15)");
    gen_request_free(&r);
    /* what stays accepted: trailing whitespace, an escaped backslash before
     * u0000 (six characters, no NUL), the same key in different objects */
    parse_ok(0, "{\"prompt\":\"a\"} \r\n\t", &r);
    expect_prompt(&r.prompts[0], "a", 16);
    gen_request_free(&r);
    parse_ok(0, "{\"prompt\":\"\\\\u0000\"}", &r);
    expect_prompt(&r.prompts[0], "\\u0000", 16);
    gen_request_free(&r);
    parse_ok(1,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
             "\"content\":\"b\"}]}",
             &r);
    gen_request_free(&r);
}
END_TEST

START_TEST(long_prompts_refused_early) {
    gen_request r;
    api_error e;
    char body[512], text[301];
    memset(text, 'a', 300);
    text[300] = '\0';
    /* byte tokenizer: 1 byte per token, the count is exact */
    lim.max_token_bytes = 1;
    snprintf(body, sizeof body, "{\"prompt\":\"%.64s\"}", text);
    ck_assert_int_eq(gen_request_parse(&lim, 0, body, strlen(body), &r, &e), -1);
    ck_assert_str_eq(e.code, "context_length_exceeded");
    ck_assert_str_eq(e.msg, "This model's maximum context length is 64 tokens, but the "
                            "prompt has 64 tokens. Please shorten it.");
    gen_request_free(&r);
    /* tokens of up to 4 bytes: 300 bytes are at least 75 tokens */
    lim.max_token_bytes = 4;
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", text);
    ck_assert_int_eq(gen_request_parse(&lim, 0, body, strlen(body), &r, &e), -1);
    ck_assert_str_eq(e.param, "prompt");
    ck_assert_str_eq(e.msg,
                     "This model's maximum context length is 64 tokens, but the "
                     "prompt has at least 75 tokens (300 bytes). Please shorten it.");
    gen_request_free(&r);
    /* 255 bytes with 4-byte tokens could fit: tokenized, and refused once the
     * tokens fill the context */
    snprintf(body, sizeof body, "{\"prompt\":\"%.255s\"}", text);
    ck_assert_int_eq(gen_request_parse(&lim, 0, body, strlen(body), &r, &e), -1);
    ck_assert_str_eq(e.msg,
                     "This model's maximum context length is 64 tokens, but the "
                     "prompt has at least 255 tokens (255 bytes). Please shorten it.");
    gen_request_free(&r);
    /* chat: the rendered messages */
    lim.max_token_bytes = 1;
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%.60s\"}]}", text);
    ck_assert_int_eq(gen_request_parse(&lim, 1, body, strlen(body), &r, &e), -1);
    ck_assert_str_eq(e.param, "messages");
    ck_assert_str_eq(e.code, "context_length_exceeded");
    gen_request_free(&r);
    /* a token array of context length is refused before its ids are checked */
    strbuf b = { 0 };
    strbuf_puts(&b, "{\"prompt\":[");
    for (int i = 0; i < 64; i++) strbuf_puts(&b, i ? ",999" : "999");
    strbuf_puts(&b, "]}");
    ck_assert_int_eq(gen_request_parse(&lim, 0, b.p, b.len, &r, &e), -1);
    ck_assert_str_eq(e.code, "context_length_exceeded");
    gen_request_free(&r);
    free(b.p);
    /* what fits is still accepted */
    lim.max_token_bytes = 4;
    snprintf(body, sizeof body, "{\"prompt\":\"%.40s\",\"max_tokens\":3}", text);
    parse_ok(0, body, &r);
    ck_assert_uint_eq(r.prompts[0].n_ids, 40);
    gen_request_free(&r);
    lim.max_token_bytes = 0;
    /* the longest token of each tokenizer */
    ck_assert_uint_eq(request_max_token_bytes(tok), 1);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("server_request");
    TCase *tc = tcase_create("parse");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, completion_defaults);
    tcase_add_test(tc, max_tokens_resolved_once_per_prompt);
    tcase_add_test(tc, prompt_forms);
    tcase_add_test(tc, fields_and_stops);
    tcase_add_test(tc, sequences_of_a_request);
    tcase_add_test(tc, structured_output_sequences);
    tcase_add_test(tc, rejected_bodies);
    tcase_add_test(tc, strict_json);
    tcase_add_test(tc, long_prompts_refused_early);
    tcase_add_test(tc, hf_bos_prepended_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
