/*
 * test_file_store.c - Check suite for orchestrator/serve/file_store.{c,h}:
 * the fine-tuning JSONL rules (each kind accepted, each defect refused with
 * its line number), an upload committed, listed, read back and deleted,
 * refused uploads and the size limit leaving nothing on disk, the index
 * rebuilt by a new open (restart), and a crashed writer's leftovers (temp
 * file, data without metadata) removed at open.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/serve/file_store.h"
#include "tests/test_util.h"

static char dir[256];
static char err[1024];

static void setup(void) {
    test_tmpdir(dir, sizeof dir, "files");
    err[0] = '\0';
}
static void teardown(void) { test_rmdir(dir); }

static int validate(const char *text) {
    err[0] = '\0';
    return file_store_validate_jsonl(text, strlen(text), err, sizeof err);
}

static size_t files_on_disk(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "find %s/files -type f | wc -l", dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    unsigned long n = 0;
    ck_assert_int_eq(fscanf(p, "%lu", &n), 1);
    pclose(p);
    return (size_t)n;
}

START_TEST(test_validate_jsonl) {
    ck_assert_int_eq(validate("{\"prompt\":\"a\",\"completion\":\"b\"}\n"), 0);
    ck_assert_int_eq(validate("\n  \n{\"text\":\"t\"}\r\n\n"), 0);
    ck_assert_int_eq(validate("{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                              "{\"role\":\"user\",\"content\":\"u\"},"
                              "{\"role\":\"assistant\",\"content\":\"a\"}]}"),
                     0);
    static const struct {
        const char *text, *want;
    } bad[] = {
        { "", "has no examples" },
        { "\n\n", "has no examples" },
        { "{\"text\":\"a\"}\nnope\n", "line 2: not valid JSON" },
        { "{\"text\":\"a\"} {\"text\":\"b\"}\n", "line 1: text after the JSON object" },
        { "[1]\n", "line 1: not a JSON object" },
        { "{}\n", "line 1: needs \"prompt\" and \"completion\"" },
        { "{\"prompt\":\"a\"}\n", "\"prompt\" and \"completion\" must both be strings" },
        { "{\"prompt\":\"a\",\"completion\":\"\"}", "\"completion\" is empty" },
        { "{\"prompt\":\"a\",\"completion\":\"b\",\"text\":\"c\"}", "more than one of" },
        { "{\"text\":\"\"}", "\"text\" must be a non-empty string" },
        { "{\"messages\":[]}", "\"messages\" must be a non-empty array" },
        { "{\"messages\":[{\"content\":\"x\"}]}", "messages[0] needs a \"role\" string" },
        { "{\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}",
          "messages[0].role 'bot' is not system, user, assistant or tool" },
        { "{\"messages\":[{\"role\":\"user\",\"content\":1}]}",
          "messages[0].content must be a string" },
        { "{\"text\":\"a\"}\n{\"text\":\"a\"}\n{\"messages\":[{\"role\":\"user\","
          "\"content\":\"q\"}]}\n",
          "line 3: \"messages\" has no assistant turn" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(validate(bad[i].text), -1);
        ck_assert_msg(strstr(err, bad[i].want), "case %zu: '%s' lacks '%s'", i, err,
                      bad[i].want);
    }
    /* a NUL inside a line */
    const char nul[] = "{\"text\":\"a\"}\n{\"te\0xt\":\"b\"}\n";
    ck_assert_int_eq(file_store_validate_jsonl(nul, sizeof nul - 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "line 2: contains a NUL byte"), "%s", err);
}
END_TEST

static int put(file_store *fs, const char *text, const char *name, const char *purpose,
               file_info *fi) {
    file_upload *u = file_store_upload_begin(fs, err, sizeof err);
    ck_assert_msg(u != NULL, "%s", err);
    size_t n = strlen(text), half = n / 2;
    ck_assert_int_eq(file_upload_write(u, text, half, err, sizeof err), 0);
    ck_assert_int_eq(file_upload_write(u, text + half, n - half, err, sizeof err), 0);
    ck_assert_uint_eq(file_upload_bytes(u), n);
    return file_store_upload_commit(fs, u, name, purpose, fi, err, sizeof err);
}

START_TEST(test_upload_list_delete_reopen) {
    file_store *fs = file_store_open(dir, 0, err, sizeof err);
    ck_assert_msg(fs != NULL, "%s", err);
    const char *text = "{\"text\":\"hello\"}\n";
    file_info a, b;
    ck_assert_msg(put(fs, text, "a.jsonl", "fine-tune", &a) == 0, "%s", err);
    ck_assert_msg(put(fs, text, "b.jsonl", "fine-tune", &b) == 0, "%s", err);
    ck_assert_str_ne(a.id, b.id);
    ck_assert_uint_eq(a.bytes, strlen(text));
    ck_assert_str_eq(a.filename, "a.jsonl");
    /* refusals leave nothing */
    ck_assert_int_eq(put(fs, "{\"text\":1}\n", "c.jsonl", "fine-tune", NULL), -1);
    ck_assert_msg(strstr(err, "line 1:"), "%s", err);
    ck_assert_int_eq(put(fs, text, "c.jsonl", "assistants", NULL), -1);
    ck_assert_msg(strstr(err, "purpose 'assistants' is not supported"), "%s", err);
    ck_assert_int_eq(put(fs, text, "bad\nname", "fine-tune", NULL), -1);
    ck_assert_msg(strstr(err, "control character"), "%s", err);
    ck_assert_uint_eq(files_on_disk(), 4); /* two files: data + metadata each */

    file_info got;
    ck_assert_int_eq(file_store_get(fs, a.id, &got), 0);
    ck_assert_str_eq(got.filename, "a.jsonl");
    ck_assert_int_eq(file_store_get(fs, "file-nothere", &got), -1);
    ck_assert_int_eq(file_store_get(fs, "../../etc/passwd", &got), -1);
    char path[4200];
    ck_assert_int_eq(file_store_data_path(fs, a.id, path, sizeof path), 0);
    FILE *fp = fopen(path, "r");
    ck_assert_ptr_nonnull(fp);
    char buf[64] = { 0 };
    ck_assert_uint_eq(fread(buf, 1, sizeof buf - 1, fp), strlen(text));
    fclose(fp);
    ck_assert_str_eq(buf, text);

    strbuf js = { 0 };
    file_store_list_json(fs, &js, NULL);
    ck_assert_msg(strstr(js.p, a.id) && strstr(js.p, b.id) &&
                      strstr(js.p, "\"object\":\"list\""),
                  "%s", js.p);
    strbuf_free(&js);
    file_store_list_json(fs, &js, "batch");
    ck_assert_msg(!strstr(js.p, a.id) && strstr(js.p, "\"data\":[]"), "%s", js.p);
    strbuf_free(&js);

    ck_assert_int_eq(file_store_delete(fs, a.id, err, sizeof err), 0);
    ck_assert_int_eq(file_store_get(fs, a.id, NULL), -1);
    ck_assert_int_eq(file_store_delete(fs, a.id, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no such file"), "%s", err);
    file_store_close(fs);

    /* a restart sees b only */
    fs = file_store_open(dir, 0, err, sizeof err);
    ck_assert_msg(fs != NULL, "%s", err);
    ck_assert_int_eq(file_store_get(fs, a.id, NULL), -1);
    ck_assert_int_eq(file_store_get(fs, b.id, &got), 0);
    ck_assert_uint_eq(got.bytes, strlen(text));
    ck_assert_int_eq(got.created_at, b.created_at);
    file_store_close(fs);
}
END_TEST

START_TEST(test_size_limit_and_abort) {
    file_store *fs = file_store_open(dir, 10, err, sizeof err);
    ck_assert_msg(fs != NULL, "%s", err);
    file_upload *u = file_store_upload_begin(fs, err, sizeof err);
    ck_assert_ptr_nonnull(u);
    ck_assert_int_eq(file_upload_write(u, "0123456789", 10, err, sizeof err), 0);
    ck_assert_int_eq(file_upload_write(u, "x", 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "over the limit of 10 bytes"), "%s", err);
    ck_assert_int_eq(file_upload_write(u, "", 0, err, sizeof err), -1); /* stays failed */
    ck_assert_int_lt(
        file_store_upload_commit(fs, u, "x", "fine-tune", NULL, err, sizeof err), 0);
    u = file_store_upload_begin(fs, err, sizeof err);
    ck_assert_int_eq(file_upload_write(u, "{\"text\":1}", 10, err, sizeof err), 0);
    file_store_upload_abort(u);
    file_store_upload_abort(NULL);
    ck_assert_uint_eq(files_on_disk(), 0);
    file_store_close(fs);
}
END_TEST

START_TEST(test_leftovers_removed_at_open) {
    file_store *fs = file_store_open(dir, 0, err, sizeof err);
    ck_assert_ptr_nonnull(fs);
    file_info keep;
    ck_assert_int_eq(put(fs, "{\"text\":\"k\"}", "k.jsonl", "fine-tune", &keep), 0);
    file_store_close(fs);
    char p[512];
    /* a dead writer's temp file (pid 1 is alive: use one that cannot be) and
     * data whose metadata never landed */
    snprintf(p, sizeof p, "%s/files/upload.tmp.999999999.0", dir);
    FILE *fp = fopen(p, "w");
    fputs("partial", fp);
    fclose(fp);
    snprintf(p, sizeof p, "%s/files/file-0123456789abcdef01234567.data", dir);
    fp = fopen(p, "w");
    fputs("{\"text\":\"orphan\"}", fp);
    fclose(fp);
    /* a metadata file that does not parse is ignored (and its data removed) */
    snprintf(p, sizeof p, "%s/files/file-aaaaaaaaaaaaaaaaaaaaaaaa.json", dir);
    fp = fopen(p, "w");
    fputs("{\"id\":", fp);
    fclose(fp);
    ck_assert_uint_eq(files_on_disk(), 5);
    fs = file_store_open(dir, 0, err, sizeof err);
    ck_assert_msg(fs != NULL, "%s", err);
    ck_assert_int_eq(file_store_get(fs, keep.id, NULL), 0);
    ck_assert_int_eq(file_store_get(fs, "file-0123456789abcdef01234567", NULL), -1);
    ck_assert_int_eq(file_store_get(fs, "file-aaaaaaaaaaaaaaaaaaaaaaaa", NULL), -1);
    ck_assert_uint_eq(files_on_disk(), 3); /* keep's two + the unreadable metadata */
    file_store_close(fs);
}
END_TEST

int main(void) {
    Suite *s = suite_create("file_store");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_validate_jsonl);
    tcase_add_test(tc, test_upload_list_delete_reopen);
    tcase_add_test(tc, test_size_limit_and_abort);
    tcase_add_test(tc, test_leftovers_removed_at_open);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
