/*
 * test_flags.c - Check suite for orchestrator/cli/flags.{c,h}: the "=" and
 * space forms, value-less and optional flags, repeatable flags, integer and
 * number ranges with their exact error texts, positionals and "--", and
 * --help (the usage text, and that it wins over bad arguments).
 */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/cli/flags.h"
#include "orchestrator/core/util.h"
#include "tests/test_util.h"

/* The destinations of the test command, reset by each test. */
static const char *g_name, *g_opt, *g_list[3], *g_pos[2];
static size_t g_nlist, g_npos;
static uint64_t g_u64;
static uint32_t g_u32;
static int g_int, g_flag, g_echo, g_opt_seen, g_u64_seen;
static int64_t g_i64;
static double g_dbl, g_frac;
static float g_flt;

static const flag_spec g_flags[] = {
    { "--name", FLAG_STRING, &g_name, "TEXT", .help = "a name\nsecond line" },
    { "--count", FLAG_U64, &g_u64, "N", .help = "a count", .seen = &g_u64_seen },
    { "--steps", FLAG_U64, &g_u64, "N", .help = NULL, .min = 1 },
    { "--width", FLAG_U32, &g_u32, "N", .help = "width", .min = 1, .max = 4096 },
    { "--port", FLAG_INT, &g_int, "N", .help = "port", .min = 0, .max = 65535 },
    { "--offset", FLAG_I64, &g_i64, "N", .help = "offset" },
    { "--low", FLAG_I64, &g_i64, "N", .help = NULL, .min = -5 },
    { "--scale", FLAG_DOUBLE, &g_dbl, "X", .help = "scale" },
    { "--peak", FLAG_DOUBLE, &g_dbl, "G", .help = NULL, .dmin = 0, .dmax = HUGE_VAL,
      .dmin_open = 1 },
    { "--frac", FLAG_DOUBLE, &g_frac, "F", .help = NULL, .dmin = 0, .dmax = 0.5 },
    { "--top-p", FLAG_FLOAT, &g_flt, "P", .help = NULL, .dmin = 0, .dmax = 1,
      .dmin_open = 1 },
    { "--json", FLAG_TRUE, &g_flag, NULL, .help = "print JSON" },
    { "--no-echo", FLAG_FALSE, &g_echo, NULL, .help = "do not echo" },
    { "--resume", FLAG_OPTIONAL, &g_opt, "[=DIR]", .help = "resume",
      .seen = &g_opt_seen },
    { "--set", FLAG_LIST, g_list, "K=V", .help = "override", .max = 3,
      .count = &g_nlist },
    { NULL },
};

static flags_cmd g_cmd = { "demo",  "usage: orch demo [options]\n\noptions:\n",
                           g_flags, "exit status: 0\n",
                           NULL,    0,
                           NULL,    NULL };

static void reset(void) {
    g_name = g_opt = NULL;
    memset(g_list, 0, sizeof g_list);
    memset(g_pos, 0, sizeof g_pos);
    g_nlist = g_npos = 0;
    g_u64 = 7;
    g_u32 = 0;
    g_int = -1;
    g_flag = 0;
    g_echo = 1;
    g_opt_seen = g_u64_seen = 0;
    g_i64 = 0;
    g_dbl = g_frac = 0;
    g_flt = 0;
    g_cmd.pos = NULL;
    g_cmd.max_pos = 0;
    g_cmd.n_pos = NULL;
    g_cmd.pos_name = NULL;
}

static char g_err[512];

/* Parse a NULL-terminated list of arguments after the command name. */
static int parse_v(const char *first, va_list ap) {
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"demo";
    for (const char *a = first; a; a = va_arg(ap, const char *)) {
        ck_assert_int_lt(argc, 31);
        argv[argc++] = (char *)a;
    }
    argv[argc] = NULL;
    return flags_parse_args(&g_cmd, argc, argv, NULL, g_err, sizeof g_err);
}

static int parse(const char *first, ...) {
    va_list ap;
    va_start(ap, first);
    int r = parse_v(first, ap);
    va_end(ap);
    return r;
}

/* Expect FLAGS_ERROR with exactly this message. */
static void expect_err(const char *want, const char *first, ...) {
    va_list ap;
    va_start(ap, first);
    int r = parse_v(first, ap);
    va_end(ap);
    ck_assert_int_eq(r, FLAGS_ERROR);
    ck_assert_str_eq(g_err, want);
}

START_TEST(test_both_forms) {
    reset();
    ck_assert_int_eq(parse("--name=abc", "--count", "42", NULL), FLAGS_OK);
    ck_assert_str_eq(g_name, "abc");
    ck_assert_uint_eq(g_u64, 42);
    ck_assert_int_eq(g_u64_seen, 1);
    reset();
    ck_assert_int_eq(parse("--name", "x y", "--count=0", NULL), FLAGS_OK);
    ck_assert_str_eq(g_name, "x y");
    ck_assert_uint_eq(g_u64, 0);
    /* The space form takes the next argument whatever it looks like. */
    reset();
    ck_assert_int_eq(parse("--name", "--json", NULL), FLAGS_OK);
    ck_assert_str_eq(g_name, "--json");
    ck_assert_int_eq(g_flag, 0);
    /* "=" with an empty value, "=" inside the value, the last one wins. */
    reset();
    ck_assert_int_eq(parse("--name=", NULL), FLAGS_OK);
    ck_assert_str_eq(g_name, "");
    ck_assert_int_eq(parse("--name=a=b", "--name", "c", NULL), FLAGS_OK);
    ck_assert_str_eq(g_name, "c");
    /* Untouched destinations keep their defaults. */
    reset();
    ck_assert_int_eq(parse(NULL), FLAGS_OK);
    ck_assert_uint_eq(g_u64, 7);
    ck_assert_int_eq(g_int, -1);
    ck_assert_int_eq(g_u64_seen, 0);
}
END_TEST

START_TEST(test_unknown_and_missing) {
    reset();
    expect_err("demo: unknown argument '--bogus' (see orch demo --help)", "--bogus",
               NULL);
    expect_err("demo: unknown argument '--nam=x' (see orch demo --help)", "--nam=x",
               NULL);
    expect_err("demo: unknown argument '--names=x' (see orch demo --help)", "--names=x",
               NULL);
    expect_err("demo: unknown argument 'file.txt' (see orch demo --help)", "file.txt",
               NULL);
    expect_err("demo: unknown argument '-x' (see orch demo --help)", "-x", NULL);
    expect_err("demo: --count: missing value", "--count", NULL);
    expect_err("demo: --name: missing value", "--json", "--name", NULL);
}
END_TEST

START_TEST(test_integers) {
    reset();
    expect_err("demo: --count 'abc': expected a non-negative integer", "--count", "abc",
               NULL);
    expect_err("demo: --count '-3': expected a non-negative integer", "--count=-3", NULL);
    expect_err("demo: --count '99999999999999999999': expected a non-negative "
               "integer",
               "--count", "99999999999999999999", NULL);
    expect_err("demo: --count '': expected a non-negative integer", "--count=", NULL);
    expect_err("demo: --count '12x': expected a non-negative integer", "--count", "12x",
               NULL);
    expect_err("demo: --steps '0': expected a positive integer", "--steps", "0", NULL);
    ck_assert_int_eq(parse("--count", "18446744073709551615", NULL), FLAGS_OK);
    ck_assert_uint_eq(g_u64, UINT64_MAX);
    /* u32 with a range: both ends are inside, one past is not. */
    ck_assert_int_eq(parse("--width", "1", NULL), FLAGS_OK);
    ck_assert_uint_eq(g_u32, 1);
    ck_assert_int_eq(parse("--width=4096", NULL), FLAGS_OK);
    ck_assert_uint_eq(g_u32, 4096);
    expect_err("demo: --width '4097': expected an integer in [1, 4096]", "--width",
               "4097", NULL);
    expect_err("demo: --width '0': expected an integer in [1, 4096]", "--width", "0",
               NULL);
    ck_assert_uint_eq(g_u32, 4096); /* a rejected value writes nothing */
    /* int: [0, 65535] */
    ck_assert_int_eq(parse("--port", "0", NULL), FLAGS_OK);
    ck_assert_int_eq(g_int, 0);
    ck_assert_int_eq(parse("--port", "65535", NULL), FLAGS_OK);
    ck_assert_int_eq(g_int, 65535);
    expect_err("demo: --port '65536': expected an integer in [0, 65535]", "--port",
               "65536", NULL);
    expect_err("demo: --port '-1': expected an integer in [0, 65535]", "--port", "-1",
               NULL);
    /* i64: the whole range, or a lower bound. */
    ck_assert_int_eq(parse("--offset", "-9223372036854775808", NULL), FLAGS_OK);
    ck_assert(g_i64 == INT64_MIN);
    expect_err("demo: --offset 'x': expected an integer", "--offset", "x", NULL);
    ck_assert_int_eq(parse("--low=-5", NULL), FLAGS_OK);
    ck_assert_int_eq(g_i64, -5);
    expect_err("demo: --low '-6': expected an integer >= -5", "--low", "-6", NULL);
}
END_TEST

START_TEST(test_numbers) {
    reset();
    ck_assert_int_eq(parse("--scale", "-2.5e3", NULL), FLAGS_OK);
    ck_assert(g_dbl == -2500.0);
    expect_err("demo: --scale '1.5.2': expected a number", "--scale", "1.5.2", NULL);
    ck_assert_int_eq(parse("--peak", "250", NULL), FLAGS_OK);
    ck_assert(g_dbl == 250.0);
    expect_err("demo: --peak '0': expected a number > 0", "--peak", "0", NULL);
    expect_err("demo: --peak 'nan': expected a number > 0", "--peak", "nan", NULL);
    ck_assert_int_eq(parse("--frac", "0", NULL), FLAGS_OK);
    ck_assert_int_eq(parse("--frac", "0.5", NULL), FLAGS_OK);
    ck_assert(g_frac == 0.5);
    expect_err("demo: --frac '0.9': expected a number in [0, 0.5]", "--frac", "0.9",
               NULL);
    ck_assert_int_eq(parse("--top-p=0.25", NULL), FLAGS_OK);
    ck_assert(g_flt == 0.25f);
    expect_err("demo: --top-p '0': expected a number in (0, 1]", "--top-p", "0", NULL);
}
END_TEST

START_TEST(test_bools_and_optional) {
    reset();
    ck_assert_int_eq(parse("--json", "--no-echo", NULL), FLAGS_OK);
    ck_assert_int_eq(g_flag, 1);
    ck_assert_int_eq(g_echo, 0);
    expect_err("demo: --json: takes no value ('--json=1')", "--json=1", NULL);
    expect_err("demo: --no-echo: takes no value ('--no-echo=')", "--no-echo=", NULL);
    /* An optional value comes only after '='. */
    reset();
    ck_assert_int_eq(parse("--resume", NULL), FLAGS_OK);
    ck_assert_int_eq(g_opt_seen, 1);
    ck_assert_ptr_null(g_opt);
    reset();
    ck_assert_int_eq(parse("--resume=runs/a", NULL), FLAGS_OK);
    ck_assert_int_eq(g_opt_seen, 1);
    ck_assert_str_eq(g_opt, "runs/a");
    reset();
    expect_err("demo: unknown argument 'runs/a' (see orch demo --help)", "--resume",
               "runs/a", NULL);
    expect_err("demo: --resume: missing value", "--resume=", NULL);
}
END_TEST

START_TEST(test_repeatable) {
    reset();
    ck_assert_int_eq(parse("--set", "a=1", "--set=b=2", "--set", "c=3", NULL), FLAGS_OK);
    ck_assert_uint_eq(g_nlist, 3);
    ck_assert_str_eq(g_list[0], "a=1");
    ck_assert_str_eq(g_list[1], "b=2");
    ck_assert_str_eq(g_list[2], "c=3");
    reset();
    expect_err("demo: too many --set options (at most 3)", "--set", "a", "--set", "b",
               "--set", "c", "--set", "d", NULL);
    ck_assert_uint_eq(g_nlist, 3);
}
END_TEST

START_TEST(test_positionals) {
    reset();
    g_cmd.pos = g_pos;
    g_cmd.max_pos = 1;
    g_cmd.n_pos = &g_npos;
    g_cmd.pos_name = "FILE";
    ck_assert_int_eq(parse("--json", "in.bin", "--count", "3", NULL), FLAGS_OK);
    ck_assert_uint_eq(g_npos, 1);
    ck_assert_str_eq(g_pos[0], "in.bin");
    ck_assert_uint_eq(g_u64, 3);
    g_npos = 0;
    ck_assert_int_eq(parse("-", NULL), FLAGS_OK); /* "-" (stdin) is positional */
    ck_assert_str_eq(g_pos[0], "-");
    g_npos = 0;
    expect_err("demo: more than one FILE given ('a', 'b')", "a", "b", NULL);
    /* After "--" everything is positional, --help included. */
    g_npos = 0;
    g_flag = 0;
    ck_assert_int_eq(parse("--", "--json", NULL), FLAGS_OK);
    ck_assert_str_eq(g_pos[0], "--json");
    ck_assert_int_eq(g_flag, 0);
    g_npos = 0;
    ck_assert_int_eq(parse("--", "--help", NULL), FLAGS_OK);
    ck_assert_str_eq(g_pos[0], "--help");
    g_npos = 0;
    g_cmd.max_pos = 2;
    ck_assert_int_eq(parse("a", "b", NULL), FLAGS_OK);
    g_npos = 0;
    expect_err("demo: more than 2 FILE given ('c')", "a", "b", "c", NULL);
}
END_TEST

START_TEST(test_help) {
    reset();
    ck_assert_int_eq(parse("--help", NULL), FLAGS_HELP);
    ck_assert_int_eq(parse("-h", NULL), FLAGS_HELP);
    /* --help wins over bad arguments anywhere on the line... */
    ck_assert_int_eq(parse("--bogus", "--count", "x", "-h", NULL), FLAGS_HELP);
    /* ...but not when it is a flag's value. */
    ck_assert_int_eq(parse("--name", "-h", NULL), FLAGS_OK);
    ck_assert_str_eq(g_name, "-h");
    ck_assert_int_eq(parse("--name=--help", NULL), FLAGS_OK);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    char *argv[] = { "demo", "--count", "x", "--help", NULL };
    ck_assert_int_eq(flags_parse_args(&g_cmd, 4, argv, f, g_err, sizeof g_err),
                     FLAGS_HELP);
    fclose(f);
    ck_assert_str_eq(g_err, "");
    ck_assert_uint_eq(g_u64, 7); /* nothing parsed */
    const char *head = "usage: orch demo [options]\n\noptions:\n  --name TEXT ";
    ck_assert(strncmp(text, head, strlen(head)) == 0);
    ck_assert(strstr(text, "exit status: 0\n") != NULL);
    free(text);
}
END_TEST

START_TEST(test_usage_text) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    flags_print_usage(&g_cmd, f);
    fclose(f);
    /* Width: the longest listed label ("--resume[=DIR]", 14) + 3. */
    ck_assert_str_eq(text, "usage: orch demo [options]\n"
                           "\n"
                           "options:\n"
                           "  --name TEXT      a name\n"
                           "                   second line\n"
                           "  --count N        a count\n"
                           "  --width N        width\n"
                           "  --port N         port\n"
                           "  --offset N       offset\n"
                           "  --scale X        scale\n"
                           "  --json           print JSON\n"
                           "  --no-echo        do not echo\n"
                           "  --resume[=DIR]   resume\n"
                           "  --set K=V        override\n"
                           "exit status: 0\n");
    free(text);
}
END_TEST

START_TEST(test_cli_wrapper) {
    reset();
    int st = -1;
    char *ok[] = { "demo", "--count", "5", NULL };
    ck_assert_int_eq(flags_parse(&g_cmd, 3, ok, &st), 0);
    ck_assert_uint_eq(g_u64, 5);
    char *bad[] = { "demo", "--count", "x", NULL };
    ck_assert_int_eq(flags_parse(&g_cmd, 3, bad, &st), 1);
    ck_assert_int_eq(st, ORCH_EXIT_USAGE);
    char *help[] = { "demo", "-h", NULL };
    ck_assert_int_eq(flags_parse(&g_cmd, 2, help, &st), 1);
    ck_assert_int_eq(st, ORCH_EXIT_OK);
    char *w1[] = { "demo", "x", "--help", NULL };
    char *w2[] = { "demo", "--", "--help", NULL };
    ck_assert_int_eq(flags_wants_help(3, w1), 1);
    ck_assert_int_eq(flags_wants_help(3, w2), 0);
}
END_TEST

static Suite *flags_suite(void) {
    Suite *s = suite_create("flags");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_both_forms);
    tcase_add_test(tc, test_unknown_and_missing);
    tcase_add_test(tc, test_integers);
    tcase_add_test(tc, test_numbers);
    tcase_add_test(tc, test_bools_and_optional);
    tcase_add_test(tc, test_repeatable);
    tcase_add_test(tc, test_positionals);
    tcase_add_test(tc, test_help);
    tcase_add_test(tc, test_usage_text);
    tcase_add_test(tc, test_cli_wrapper);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(flags_suite()); }
