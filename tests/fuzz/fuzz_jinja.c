/*
 * fuzz_jinja.c - libFuzzer harness of the chat-template interpreter
 * (serve/jinja.h): the input is a Jinja template, parsed and, when it
 * parses, rendered with a fixed conversation (messages with every role,
 * add_generation_prompt, bos_token, eos_token, tools none) as
 * chat_template.c gives it.
 *
 * Checked besides the sanitizers: a refused parse says "chat template: line
 * N: ..."; a failed render has a message and leaves the output as it was;
 * a render is within the output limit and gives the same text twice (a
 * parsed template is immutable).
 * Memory: everything is freed per input (leaks are findings).
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/strbuf.h"
#include "orchestrator/serve/jinja.h"
#include "tests/fuzz/fuzz_util.h"

static cJSON *vars;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    vars = cJSON_Parse("{\"messages\":[{\"role\":\"system\",\"content\":\" Be brief. \"},"
                       "{\"role\":\"user\",\"content\":\"Hi \\u00e9\\n\"},"
                       "{\"role\":\"assistant\",\"content\":\"<think>x</think>Hello\"},"
                       "{\"role\":\"tool\",\"content\":\"42\"},"
                       "{\"role\":\"user\",\"content\":\"\"}],"
                       "\"add_generation_prompt\":true,\"bos_token\":\"<s>\","
                       "\"eos_token\":\"</s>\",\"tools\":null}");
    if (!vars) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    jinja_template *t = NULL;
    char err[512] = "";
    if (jinja_parse((const char *)data, size, &t, err, sizeof err) != 0) {
        FUZZ_CHECK(strncmp(err, "chat template: line ", 20) == 0, "parse error '%s'",
                   err);
        return 0;
    }
    strbuf a = { 0 }, b = { 0 };
    strbuf_puts(&a, "x");
    strbuf_puts(&b, "x");
    char err2[512] = "";
    int ra = jinja_render(t, vars, &a, err, sizeof err);
    int rb = jinja_render(t, vars, &b, err2, sizeof err2);
    FUZZ_CHECK(ra == rb, "two renders disagree (%d, %d)", ra, rb);
    if (ra != 0) {
        FUZZ_CHECK(err[0] && strcmp(err, err2) == 0, "render errors '%s' / '%s'", err,
                   err2);
        FUZZ_CHECK(a.len == 1 && strcmp(a.p, "x") == 0,
                   "a failed render changed the output");
    } else {
        FUZZ_CHECK(a.len == b.len && memcmp(a.p, b.p, a.len) == 0, "two renders differ");
        FUZZ_CHECK(a.len <= ((size_t)64 << 20) + 1, "output of %zu bytes", a.len);
    }
    strbuf_free(&a);
    strbuf_free(&b);
    jinja_free(t);
    return 0;
}
