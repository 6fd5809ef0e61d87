/*
 * test_finetune_data.c - orchestrator/data/finetune_data.c: the three JSONL
 * shapes and their loss masks (completion only, assistant turns only under
 * orch-plain-v1 and chatml, every token for text), "weight": 0 turns,
 * packing into rows (targets, -1 at example ends and padding, truncation,
 * dropped examples), and every malformed line reported with its line number
 * and what is wrong. Byte tokenizer: ids are the bytes, so masks can be
 * checked character by character.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/data/finetune_data.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/serve/chat_template.h"
#include "tests/test_util.h"

static tokenizer *tok;

static ft_data_opts opts(const chat_template *t, uint32_t seq_len) {
    ft_data_opts o = { tok, t, "no template here", seq_len, 256, 0 };
    return o;
}

/* The mask of one line as a string of '0'/'1', and the ids as text. */
static void encode(const char *line, const chat_template *t, char *mask_out,
                   char *text_out) {
    ft_data_opts o = opts(t, 64);
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    char err[512] = "";
    ck_assert_msg(ft_encode_line(line, strlen(line), "x:1", &o, &ids, &mask, &n, err,
                                 sizeof err) == 0,
                  "%s", err);
    for (size_t i = 0; i < n; i++) {
        mask_out[i] = mask[i] ? '1' : '0';
        text_out[i] = (char)ids[i];
    }
    mask_out[n] = text_out[n] = '\0';
    free(ids);
    free(mask);
}

/* The characters of text whose mask is 1. */
static void learned(const char *mask, const char *text, char *out) {
    size_t k = 0;
    for (size_t i = 0; text[i]; i++)
        if (mask[i] == '1') out[k++] = text[i];
    out[k] = '\0';
}

START_TEST(test_prompt_completion_mask) {
    char m[256], t[256];
    encode("{\"prompt\": \"Q: 2+2?\", \"completion\": \" 4\"}", NULL, m, t);
    ck_assert_str_eq(t, "Q: 2+2? 4");
    ck_assert_str_eq(m, "000000011"); /* byte has no end-of-text token */
    encode("{\"text\": \"abc\"}", NULL, m, t);
    ck_assert_str_eq(m, "111");
}
END_TEST

START_TEST(test_blank_line) {
    ft_data_opts o = opts(NULL, 8);
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    char err[64];
    ck_assert_int_eq(
        ft_encode_line(" \r", 2, "x:1", &o, &ids, &mask, &n, err, sizeof err), 1);
}
END_TEST

START_TEST(test_messages_plain_mask) {
    char m[512], t[512], l[512];
    encode(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": "
        "\"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}, "
        "{\"role\": \"user\", \"content\": \"again\"}, {\"role\": \"assistant\", "
        "\"content\": \"ok\"}]}",
        chat_template_plain(), m, t);
    ck_assert_str_eq(t, "System: be brief\nUser: hi\nAssistant: yo\nUser: again\n"
                        "Assistant: ok\n");
    learned(m, t, l);
    ck_assert_str_eq(l, " yo\n ok\n"); /* each turn's content and its end */
    /* weight 0: the first answer is context only. */
    encode(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": "
        "\"assistant\", \"content\": \"yo\", \"weight\": 0}, {\"role\": \"user\", "
        "\"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"ok\", \"weight\": "
        "1}]}",
        chat_template_plain(), m, t);
    learned(m, t, l);
    ck_assert_str_eq(l, " ok\n");
}
END_TEST

START_TEST(test_messages_chatml_mask) {
    char m[512], t[512], l[512];
    encode("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": "
           "\"assistant\", \"content\": \"yo\"}]}",
           chat_template_find("chatml"), m, t);
    ck_assert_str_eq(t, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo"
                        "<|im_end|>\n");
    learned(m, t, l);
    ck_assert_str_eq(l, "yo<|im_end|>\n");
}
END_TEST

START_TEST(test_packing) {
    /* seq_len 8: "abcd" gives 3 positions, "efg" 2 -> one row; "hijklmnopqrs"
     * (12 tokens, 11 positions) is cut to 8 in a row of its own; a prompt
     * whose completion is cut off entirely is dropped. */
    const char *text = "{\"text\": \"abcd\"}\n"
                       "\n"
                       "{\"prompt\": \"e\", \"completion\": \"fg\"}\n"
                       "{\"text\": \"hijklmnopqrs\"}\n"
                       "{\"prompt\": \"0123456789\", \"completion\": \"z\"}\n";
    ft_data_opts o = opts(NULL, 8);
    ft_dataset d;
    char err[512] = "";
    ck_assert_msg(ft_data_parse(text, strlen(text), "p.jsonl", &o, &d, err, sizeof err) ==
                      0,
                  "%s", err);
    ck_assert_uint_eq(d.n_examples, 4);
    ck_assert_uint_eq(d.n_rows, 2);
    ck_assert_uint_eq(d.n_truncated, 2);
    ck_assert_uint_eq(d.n_dropped, 1);
    const int32_t tok0[8] = { 'a', 'b', 'c', 'e', 'f', 0, 0, 0 };
    const int32_t tgt0[8] = { 'b', 'c', 'd', 'f', 'g', -1, -1, -1 };
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(d.tokens[i], tok0[i]);
        ck_assert_int_eq(d.targets[i], tgt0[i]);
        ck_assert_int_eq(d.tokens[8 + i], 'h' + i);
        ck_assert_int_eq(d.targets[8 + i], 'i' + i);
    }
    ck_assert_uint_eq(d.n_targets, 3 + 2 + 8);
    ft_dataset_free(&d);
    /* Nothing to learn at all. */
    const char *none = "{\"prompt\": \"0123456789\", \"completion\": \"z\"}\n";
    ck_assert_int_eq(
        ft_data_parse(none, strlen(none), "n.jsonl", &o, &d, err, sizeof err), -1);
    ck_assert_str_eq(err, "n.jsonl: no example has a token to learn from (1 examples)");
    /* Without packing every example has a row of its own, from position 0. */
    o.one_per_row = 1;
    ck_assert_msg(ft_data_parse(text, strlen(text), "p.jsonl", &o, &d, err, sizeof err) ==
                      0,
                  "%s", err);
    ck_assert_uint_eq(d.n_examples, 4);
    ck_assert_uint_eq(d.n_rows, 3);
    ck_assert_uint_eq(d.n_dropped, 1);
    const int32_t tok1[3][8] = { { 'a', 'b', 'c', 0, 0, 0, 0, 0 },
                                 { 'e', 'f', 0, 0, 0, 0, 0, 0 },
                                 { 'h', 'i', 'j', 'k', 'l', 'm', 'n', 'o' } };
    const int32_t tgt1[3][8] = { { 'b', 'c', 'd', -1, -1, -1, -1, -1 },
                                 { 'f', 'g', -1, -1, -1, -1, -1, -1 },
                                 { 'i', 'j', 'k', 'l', 'm', 'n', 'o', 'p' } };
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 8; i++) {
            ck_assert_int_eq(d.tokens[r * 8 + i], tok1[r][i]);
            ck_assert_int_eq(d.targets[r * 8 + i], tgt1[r][i]);
        }
    ck_assert_uint_eq(d.n_targets, 3 + 2 + 8);
    ft_dataset_free(&d);
}
END_TEST

/* Each bad line, placed on line 3 after two good ones, gives this error. */
START_TEST(test_errors_with_line_numbers) {
    static const struct {
        const char *line, *want;
    } bad[] = {
        { "{\"text\": \"a\"", "f.jsonl:3: not valid JSON (column " },
        { "[1, 2]", "f.jsonl:3: expected a JSON object" },
        { "{\"text\": \"a\"} x", "f.jsonl:3: text after the JSON value (column 15)" },
        { "{\"txt\": \"a\"}", "f.jsonl:3: unknown key \"txt\"" },
        { "{}",
          "f.jsonl:3: expected \"prompt\" and \"completion\", \"messages\" or \"text\"" },
        { "{\"text\": \"a\", \"prompt\": \"b\", \"completion\": \"c\"}",
          "f.jsonl:3: mixes the shapes" },
        { "{\"prompt\": 1, \"completion\": \"c\"}",
          "f.jsonl:3: \"prompt\" must be a string" },
        { "{\"prompt\": \"p\"}", "f.jsonl:3: \"completion\" must be a string" },
        { "{\"prompt\": \"p\", \"completion\": \"\"}",
          "f.jsonl:3: \"completion\" is empty (nothing to learn)" },
        { "{\"text\": \"\"}", "f.jsonl:3: \"text\" is empty" },
        { "{\"text\": 5}", "f.jsonl:3: \"text\" must be a string" },
        { "{\"messages\": {}}", "f.jsonl:3: \"messages\" must be a non-empty array" },
        { "{\"messages\": []}", "f.jsonl:3: \"messages\" must be a non-empty array" },
        { "{\"messages\": [1]}", "f.jsonl:3: messages[0] is not an object" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"name\": \"x\"}]}",
          "f.jsonl:3: messages[0]: unknown key \"name\"" },
        { "{\"messages\": [{\"role\": \"robot\", \"content\": \"a\"}]}",
          "f.jsonl:3: messages[0]: role \"robot\"" },
        { "{\"messages\": [{\"role\": \"tool\", \"content\": \"a\"}]}",
          "f.jsonl:3: messages[0]: role \"tool\"" },
        { "{\"messages\": [{\"content\": \"a\"}]}",
          "f.jsonl:3: messages[0]: \"role\" must be a string" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": null}]}",
          "f.jsonl:3: messages[0]: \"content\" must be a string" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}",
          "f.jsonl:3: no assistant message to learn from" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"weight\": 1}]}",
          "f.jsonl:3: messages[0]: \"weight\" must be 0 or 1, on an assistant message" },
        { "{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\", \"weight\": "
          "0}]}",
          "f.jsonl:3: no assistant message to learn from" },
    };
    ft_data_opts o = opts(chat_template_plain(), 64);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[1024], err[1024] = "";
        snprintf(text, sizeof text, "{\"text\": \"ok\"}\n\n%s\n{\"text\": \"ok\"}\n",
                 bad[i].line);
        /* line 2 is blank: the bad line is line 3 */
        ft_dataset d;
        ck_assert_int_eq(
            ft_data_parse(text, strlen(text), "f.jsonl", &o, &d, err, sizeof err), -1);
        ck_assert_msg(strncmp(err, bad[i].want, strlen(bad[i].want)) == 0,
                      "line '%s': got '%s', want '%s...'", bad[i].line, err, bad[i].want);
    }
    /* messages without a usable template: the reason is given. */
    ft_data_opts nt = opts(NULL, 64);
    const char *m = "{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}\n";
    char err[512];
    ft_dataset d;
    ck_assert_int_eq(ft_data_parse(m, strlen(m), "g.jsonl", &nt, &d, err, sizeof err),
                     -1);
    ck_assert_str_eq(err, "g.jsonl:1: a \"messages\" example needs a chat template: no "
                          "template here");
    /* ids beyond the model's vocabulary */
    ft_data_opts small = opts(NULL, 64);
    small.vocab_size = 100;
    const char *hi = "{\"text\": \"az\"}\n";
    ck_assert_int_eq(
        ft_data_parse(hi, strlen(hi), "h.jsonl", &small, &d, err, sizeof err), -1);
    ck_assert_str_eq(err,
                     "h.jsonl:1: token id 122 is outside the model's vocabulary of 100");
    /* a missing file */
    ck_assert_int_eq(ft_data_load("/nonexistent/x.jsonl", &o, &d, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x.jsonl"));
}
END_TEST

int main(void) {
    char err[512];
    if (tokenizer_open("byte", NULL, &tok, err, sizeof err) != 0) {
        fprintf(stderr, "test_finetune_data: %s\n", err);
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("finetune_data");
    TCase *tc = tcase_create("jsonl");
    tcase_add_test(tc, test_prompt_completion_mask);
    tcase_add_test(tc, test_blank_line);
    tcase_add_test(tc, test_messages_plain_mask);
    tcase_add_test(tc, test_messages_chatml_mask);
    tcase_add_test(tc, test_packing);
    tcase_add_test(tc, test_errors_with_line_numbers);
    suite_add_tcase(s, tc);
    int rc = test_run_suite(s);
    tokenizer_free(tok);
    return rc;
}
