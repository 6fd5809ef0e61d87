/*
 * test_server_policy.c - the header checks of orch serve (serve/http_policy.h):
 * which Host values a loopback-bound server accepts (loopback names with any
 * port or none, case-insensitive, the bound address, --allowed-host names;
 * not look-alikes, bare IPv6, bad ports or a missing Host in HTTP/1.1), a
 * non-loopback server (anything, unless --allowed-host is given), the
 * application/json media type with and without parameters, CORS origins
 * (exact, "*", none), bad configuration values, and the API key check:
 * accepted only for the exact key, whatever the length of a wrong one, and
 * compared through digests (the policy keeps no copy of the key).
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/serve/http_policy.h"
#include "tests/test_util.h"

START_TEST(loopback_hosts) {
    http_policy p;
    char err[256];
    http_policy_config c = { .bind_host = "127.0.0.1" };
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), 0);
    static const char *const ok[] = { "localhost",  "localhost:8080", "LOCALHOST:1",
                                      "127.0.0.1",  "127.0.0.1:80",   "[::1]",
                                      "[::1]:8080", "localhost:" };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        ck_assert_msg(http_policy_host_ok(&p, ok[i], 0), "%s refused", ok[i]);
    static const char *const bad[] = { "evil.example",
                                       "evil.example:8080",
                                       "localhost.evil.io",
                                       "127.0.0.1.nip.io",
                                       "127.0.0.2",
                                       "::1",
                                       "[::1",
                                       "localhost:80x",
                                       "",
                                       "[::2]:80",
                                       "localhost:80:80",
                                       "0.0.0.0" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(!http_policy_host_ok(&p, bad[i], 0), "%s accepted", bad[i]);
    /* no Host: only HTTP/1.0 */
    ck_assert(!http_policy_host_ok(&p, NULL, 0));
    ck_assert(http_policy_host_ok(&p, NULL, 1));
    http_policy_free(&p);

    /* bound to another loopback address, with extra names */
    const char *extra[] = { "api.example.com", "Other.Test:9000" };
    c = (http_policy_config){ .bind_host = "127.0.0.5",
                              .allowed_hosts = extra,
                              .n_allowed_hosts = 2 };
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), 0);
    ck_assert(http_policy_host_ok(&p, "127.0.0.5:8080", 0));
    ck_assert(http_policy_host_ok(&p, "api.example.com", 0));
    ck_assert(http_policy_host_ok(&p, "API.example.com:443", 0));
    ck_assert(http_policy_host_ok(&p, "other.test:1", 0)); /* the port is not kept */
    ck_assert(!http_policy_host_ok(&p, "example.com", 0));
    ck_assert(!http_policy_host_ok(&p, "x.api.example.com", 0));
    http_policy_free(&p);
}
END_TEST

START_TEST(other_binds_and_bad_config) {
    http_policy p;
    char err[256];
    http_policy_config c = { .bind_host = "0.0.0.0" };
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), 0);
    ck_assert(http_policy_host_ok(&p, "anything.example:1", 0));
    ck_assert(!http_policy_host_ok(&p, NULL, 0));
    http_policy_free(&p);
    const char *extra[] = { "svc.internal" };
    c.allowed_hosts = extra;
    c.n_allowed_hosts = 1;
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), 0);
    ck_assert(http_policy_host_ok(&p, "svc.internal:8080", 0));
    ck_assert(http_policy_host_ok(&p, "localhost", 0));
    ck_assert(!http_policy_host_ok(&p, "anything.example", 0));
    http_policy_free(&p);
    const char *empty[] = { "" };
    c.allowed_hosts = empty;
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), -1);
    ck_assert_str_eq(err, "--allowed-host '' is not a host name");
    c = (http_policy_config){ .bind_host = "127.0.0.1",
                              .cors_origins = empty,
                              .n_cors_origins = 1 };
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), -1);
    ck_assert_str_eq(err, "--cors-origin must not be empty");
}
END_TEST

START_TEST(json_media_type) {
    static const char *const ok[] = { "application/json", "Application/JSON",
                                      "application/json; charset=utf-8",
                                      "application/json;charset=UTF-8",
                                      " application/json " };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        ck_assert_msg(http_policy_is_json(ok[i]), "%s refused", ok[i]);
    static const char *const bad[] = { NULL,
                                       "",
                                       "text/plain",
                                       "application/x-www-form-urlencoded",
                                       "multipart/form-data; boundary=x",
                                       "application/jsonx",
                                       "application/json-seq",
                                       "text/json" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(!http_policy_is_json(bad[i]), "%s accepted",
                      bad[i] ? bad[i] : "(none)");
}
END_TEST

START_TEST(cors_origins) {
    http_policy p;
    char err[256];
    http_policy_config c = { .bind_host = "127.0.0.1" };
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), 0);
    ck_assert_ptr_null(http_policy_cors(&p, "http://localhost:3000"));
    ck_assert_ptr_null(http_policy_cors(&p, NULL));
    http_policy_free(&p);
    const char *origins[] = { "http://localhost:3000", "https://app.example" };
    c.cors_origins = origins;
    c.n_cors_origins = 2;
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), 0);
    const char *o = "https://app.example";
    ck_assert_ptr_eq(http_policy_cors(&p, o), o); /* the origin itself is echoed */
    ck_assert_str_eq(http_policy_cors(&p, "http://localhost:3000"),
                     "http://localhost:3000");
    ck_assert_ptr_null(http_policy_cors(&p, "https://evil.example"));
    ck_assert_ptr_null(http_policy_cors(&p, "https://app.example.evil"));
    ck_assert_ptr_null(http_policy_cors(&p, "null"));
    http_policy_free(&p);
    const char *any[] = { "*" };
    c.cors_origins = any;
    c.n_cors_origins = 1;
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), 0);
    ck_assert_str_eq(http_policy_cors(&p, "https://whatever.example"), "*");
    ck_assert_ptr_null(http_policy_cors(&p, NULL));
    http_policy_free(&p);
}
END_TEST

START_TEST(api_key_digests) {
    http_policy p;
    char err[256];
    http_policy_config c = { .bind_host = "127.0.0.1" };
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), 0);
    ck_assert(http_policy_auth_ok(&p, NULL)); /* no key: everyone */
    http_policy_free(&p);
    char key[] = "sekret-key-0123";
    c.api_key = key;
    ck_assert_int_eq(http_policy_init(&p, &c, err, sizeof err), 0);
    memset(key, 'x', sizeof key - 1); /* the policy must not hold the key itself */
    ck_assert(http_policy_auth_ok(&p, "Bearer sekret-key-0123"));
    ck_assert(http_policy_auth_ok(&p, "bearer   sekret-key-0123"));
    static const char *const bad[] = { NULL,
                                       "",
                                       "sekret-key-0123",
                                       "Basic sekret-key-0123",
                                       "Bearer ",
                                       "Bearer s",
                                       "Bearer sekret-key-012",
                                       "Bearer sekret-key-01234",
                                       "Bearer sekret-key-0124",
                                       "Bearer Sekret-key-0123",
                                       "Bearer xxxxxxxxxxxxxxx" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(!http_policy_auth_ok(&p, bad[i]), "%s accepted",
                      bad[i] ? bad[i] : "(none)");
    char longer[4096];
    memset(longer, 'k', sizeof longer);
    memcpy(longer, "Bearer ", 7);
    longer[sizeof longer - 1] = '\0';
    ck_assert(!http_policy_auth_ok(&p, longer));
    http_policy_free(&p);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("server_policy");
    TCase *tc = tcase_create("policy");
    tcase_add_test(tc, loopback_hosts);
    tcase_add_test(tc, other_binds_and_bad_config);
    tcase_add_test(tc, json_media_type);
    tcase_add_test(tc, cors_origins);
    tcase_add_test(tc, api_key_digests);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
