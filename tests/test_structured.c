/*
 * test_structured.c - structured output: the regex compiler (regex_dfa.h:
 * matches and refusals), integer ranges of the schema compiler checked
 * against every integer around them, schema refusals naming keyword and
 * path (json_schema.h), tool definitions refused with their path
 * (tool_calls.h), token masks equal to a brute-force walk of every token,
 * the grammar cache, and random constrained generations (byte tokenizer,
 * masks + jump-forward) whose every output parses and validates against its
 * schema under an independent validator written here (PCRE2 for patterns),
 * with the byte tokenizer and with the GPT-2 vocabulary.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/rng.h"
#include "orchestrator/serve/grammar_mask.h"
#include "orchestrator/serve/json_schema.h"
#include "orchestrator/serve/regex_dfa.h"
#include "orchestrator/serve/sampler.h"
#include "orchestrator/serve/tool_calls.h"
#include "tests/test_util.h"

static regex_dfa *compile_ok(const char *re) {
    regex_dfa *d = NULL;
    char err[256];
    ck_assert_msg(regex_dfa_compile(re, strlen(re), &d, err, sizeof err) == 0, "%s: %s",
                  re, err);
    return d;
}

START_TEST(regex_matches) {
    static const struct {
        const char *re, *s;
        int match;
    } cases[] = {
        { "abc", "abc", 1 },
        { "abc", "abcd", 0 },
        { "a|bc", "bc", 1 },
        { "a*", "", 1 },
        { "a+", "", 0 },
        { "(ab)+", "ababab", 1 },
        { "(ab)+", "aba", 0 },
        { "a{2,3}", "aa", 1 },
        { "a{2,3}", "aaaa", 0 },
        { "a{2,}", "aaaaa", 1 },
        { "[a-c]x", "bx", 1 },
        { "[^a-c]x", "bx", 0 },
        { "[^a-c]x", "\xc3\xa9x", 1 },
        { ".", "\n", 0 },
        { ".", "\xe2\x82\xac", 1 },
        { ".", "\xe2\x82", 0 },
        { "\\d{3}-\\w+", "123-a_b", 1 },
        { "\\d", "x", 0 },
        { "\\s\\S", " x", 1 },
        { "^ab$", "ab", 1 },
        { "\\u00e9", "\xc3\xa9", 1 },
        { "[\\u4e00-\\u9fff]+", "\xe4\xb8\xad\xe6\x96\x87", 1 },
        { "\\.\\*", ".*", 1 },
        { "(?:x|y)?z", "z", 1 },
        { "(?<n>a)b", "ab", 1 },
        { "a+?b", "aab", 1 },
        { "[]]", "]", 1 },
        { "[a-]", "-", 1 },
        { "(?J:a\"b)", "a\\\"b", 1 },
        { "(?J:a\"b)", "a\"b", 0 },
        { "(?J:[\\s\\S])", "\\n", 1 },
        { "(?J:[\\s\\S])", "\\u0001", 1 },
        { "(?J:.)", "\n", 0 },
        { "[\\s\\S]{0,2}", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80", 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        regex_dfa *d = compile_ok(cases[i].re);
        ck_assert_msg(regex_dfa_match(d, cases[i].s, strlen(cases[i].s)) ==
                          cases[i].match,
                      "/%s/ on '%s'", cases[i].re, cases[i].s);
        regex_dfa_free(d);
    }
    /* forced bytes and completion */
    regex_dfa *d = compile_ok("\\{\"key\":(?:1|2)\\}");
    int32_t s = regex_dfa_start(d);
    ck_assert_int_eq(regex_dfa_forced_byte(d, s), '{');
    s = regex_dfa_walk(d, s, "{\"key\":", 7);
    ck_assert_int_eq(regex_dfa_forced_byte(d, s), -1);
    s = regex_dfa_walk(d, s, "2}", 2);
    ck_assert(regex_dfa_complete(d, s));
    regex_dfa_free(d);
    /* a branch that cannot end is pruned: after 'a' only 'c' leads on */
    d = compile_ok("a(?:b[^\\s\\S]|c)");
    s = regex_dfa_walk(d, regex_dfa_start(d), "a", 1);
    ck_assert_int_eq(regex_dfa_step(d, s, 'b'), -1);
    ck_assert_int_eq(regex_dfa_forced_byte(d, s), 'c');
    regex_dfa_free(d);
}
END_TEST

START_TEST(regex_refusals) {
    static const struct {
        const char *re, *msg;
    } cases[] = {
        { "(a", "missing )" },
        { "a)", "unmatched )" },
        { "*a", "nothing to repeat" },
        { "[abc", "unterminated character class" },
        { "[z-a]", "reversed range" },
        { "(?=a)", "lookahead is not supported" },
        { "(?<=a)b", "lookbehind is not supported" },
        { "(a)\\1", "backreferences are not supported" },
        { "\\bx", "word boundaries" },
        { "a^b", "'^' is only supported at the start" },
        { "a{5,2}", "max < min" },
        { "a{1001}", "repeat count over 1000" },
        { "a++", "possessive" },
        { "\\p{L}", "the escape \\p is not supported" },
        { "\xff", "invalid UTF-8" },
        { "(?:(?:(?:a{1000}){1000}){1000})", "too large" },
        { "(a|b)*a(a|b){20}", "more than 40000 automaton states" },
        { "(?:[ab]{0,100}[ac]{0,100}){0,100}", "too complex" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        regex_dfa *d = NULL;
        char err[256] = "";
        ck_assert_msg(
            regex_dfa_compile(cases[i].re, strlen(cases[i].re), &d, err, sizeof err) != 0,
            "/%s/ compiled", cases[i].re);
        ck_assert_msg(strstr(err, cases[i].msg), "/%s/: '%s' lacks '%s'", cases[i].re,
                      err, cases[i].msg);
    }
}
END_TEST

/* The regex of a schema given as JSON text. */
static regex_dfa *schema_dfa(const char *schema_json) {
    cJSON *s = cJSON_Parse(schema_json);
    ck_assert_ptr_nonnull(s);
    strbuf re = { 0 };
    char err[512];
    ck_assert_msg(json_schema_to_regex(s, "schema", &re, err, sizeof err) == 0, "%s: %s",
                  schema_json, err);
    cJSON_Delete(s);
    regex_dfa *d = compile_ok(re.p);
    strbuf_free(&re);
    return d;
}

START_TEST(integer_ranges) {
    static const long long ranges[][2] = { { 0, 120 },   { -5, 5 },    { 7, 7 },
                                           { -130, -9 }, { 95, 1004 }, { -1, 0 },
                                           { 0, 0 },     { 19, 20 } };
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++) {
        char js[128];
        snprintf(js, sizeof js,
                 "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", ranges[i][0],
                 ranges[i][1]);
        regex_dfa *d = schema_dfa(js);
        for (long long v = ranges[i][0] - 150; v <= ranges[i][1] + 150; v++) {
            char t[32];
            snprintf(t, sizeof t, "%lld", v);
            int want = v >= ranges[i][0] && v <= ranges[i][1];
            ck_assert_msg(regex_dfa_match(d, t, strlen(t)) == want, "%s on %s", js, t);
        }
        ck_assert(!regex_dfa_match(d, "-0", 2));
        ck_assert(!regex_dfa_match(d, "00", 2));
        regex_dfa_free(d);
    }
    /* one-sided and exclusive bounds */
    regex_dfa *d = schema_dfa("{\"type\":\"integer\",\"exclusiveMinimum\":9}");
    ck_assert(!regex_dfa_match(d, "9", 1));
    ck_assert(regex_dfa_match(d, "10", 2));
    ck_assert(regex_dfa_match(d, "123456789", 9));
    ck_assert(!regex_dfa_match(d, "-3", 2));
    regex_dfa_free(d);
    d = schema_dfa("{\"type\":\"integer\",\"maximum\":-3}");
    ck_assert(regex_dfa_match(d, "-3", 2));
    ck_assert(regex_dfa_match(d, "-1000000", 8));
    ck_assert(!regex_dfa_match(d, "-2", 2));
    ck_assert(!regex_dfa_match(d, "0", 1));
    regex_dfa_free(d);
}
END_TEST

START_TEST(schema_refusals) {
    static const struct {
        const char *schema, *msg;
    } cases[] = {
        { "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":"
          "\"date\"}}}",
          "S.properties.d: the keyword 'format' is not supported" },
        { "{\"oneOf\":[{\"type\":\"string\"}]}",
          "S: the keyword 'oneOf' is not supported" },
        { "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":1}}",
          "S.items: minimum/maximum are only supported on type integer" },
        { "{\"type\":\"strin\"}", "S.type: unknown type 'strin'" },
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/x\"}}}",
          "S.properties.a.$ref: '#/$defs/x' does not name a schema" },
        { "{\"$ref\":\"http://x/y\"}", "S.$ref: only local references" },
        { "{\"type\":\"string\",\"pattern\":\"(a\"}", "S.pattern: at byte 2: missing )" },
        { "{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}",
          "S.pattern: 'pattern' together with minLength/maxLength is not supported" },
        { "{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}",
          "S: minItems is over maxItems" },
        { "{\"type\":\"array\",\"uniqueItems\":true}",
          "the keyword 'uniqueItems' is only" },
        { "{\"type\":\"object\",\"required\":[\"x\"]}",
          "S.required[0]: required property 'x' without a 'properties' entry" },
        { "{\"minLength\":2}", "S: 'minLength' needs a 'type'" },
        { "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer is within" },
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"null\"},{"
          "\"not\":{}}]}}}",
          "S.properties.a.anyOf[1]: the keyword 'not' is not supported" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *s = cJSON_Parse(cases[i].schema);
        ck_assert_ptr_nonnull(s);
        strbuf re = { 0 };
        char err[512] = "";
        ck_assert_msg(json_schema_to_regex(s, "S", &re, err, sizeof err) != 0,
                      "%s accepted", cases[i].schema);
        ck_assert_msg(strstr(err, cases[i].msg), "%s: '%s' lacks '%s'", cases[i].schema,
                      err, cases[i].msg);
        strbuf_free(&re);
        cJSON_Delete(s);
    }
}
END_TEST

/* A schema whose grammar would be huge is refused quickly. */
START_TEST(schema_too_large) {
    strbuf js = { 0 };
    strbuf_puts(&js, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 300; i++)
        strbuf_printf(&js, "%s\"p%d\":{\"type\":\"object\"}", i ? "," : "", i);
    strbuf_puts(&js, "}}");
    cJSON *s = cJSON_Parse(js.p);
    ck_assert_ptr_nonnull(s);
    strbuf re = { 0 };
    char err[512] = "";
    ck_assert_int_ne(json_schema_to_regex(s, "S", &re, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "too large to compile"), "%s", err);
    strbuf_free(&re);
    strbuf_free(&js);
    cJSON_Delete(s);
}
END_TEST

START_TEST(tool_refusals) {
    static const struct {
        const char *body, *msg;
    } cases[] = {
        { "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
          "\"parameters\":"
          "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"format\":"
          "\"uri\"}}}}}]}",
          "tools[0].function.parameters.properties.x: the keyword 'format' is not "
          "supported" },
        { "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":"
          "\"function\",\"function\":{\"name\":\"bad name\"}}]}",
          "tools[1].function.name: must be 1 to 64" },
        { "{\"tools\":[{\"type\":\"retrieval\"}]}", "tools[0].type: only \"function\"" },
        { "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_"
          "choice\":"
          "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}",
          "names the function 'g', which is not in 'tools'" },
        { "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_"
          "choice\":"
          "\"sometimes\"}",
          "'tool_choice' must be none, auto, required" },
        { "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
          "\"parameters\":"
          "[]}}]}",
          "tools[0].function.parameters: must be a JSON Schema object" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *root = cJSON_Parse(cases[i].body);
        ck_assert_ptr_nonnull(root);
        strbuf re = { 0 };
        api_error e;
        int mode;
        ck_assert_msg(tool_calls_parse(root, &mode, &re, &e) != 0, "%s accepted",
                      cases[i].body);
        ck_assert_uint_eq(e.status, 400);
        ck_assert_msg(strstr(e.msg, cases[i].msg), "%s: '%s' lacks '%s'", cases[i].body,
                      e.msg, cases[i].msg);
        strbuf_free(&re);
        cJSON_Delete(root);
    }
}
END_TEST

/* ------------------------------------------------------------------------- */
/* An independent validator for the subset                                    */
/* ------------------------------------------------------------------------- */
static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int pattern_search(const char *pat, const char *s) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
    ck_assert_ptr_nonnull(re);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

static int validate(const cJSON *sc, const cJSON *v, const cJSON *root) {
    if (cJSON_IsTrue(sc)) return 1;
    const cJSON *x;
    if ((x = cJSON_GetObjectItem(sc, "$ref"))) {
        const char *r = x->valuestring;
        if (strcmp(r, "#") == 0) return validate(root, v, root);
        return validate(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "$defs"), r + 8), v,
                        root);
    }
    if ((x = cJSON_GetObjectItem(sc, "const")) && !cJSON_Compare(x, v, 1)) return 0;
    if ((x = cJSON_GetObjectItem(sc, "enum"))) {
        int ok = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, x) ok |= cJSON_Compare(e, v, 1);
        if (!ok) return 0;
    }
    if ((x = cJSON_GetObjectItem(sc, "anyOf"))) {
        int ok = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, x) ok |= validate(e, v, root);
        if (!ok) return 0;
    }
    if ((x = cJSON_GetObjectItem(sc, "type"))) {
        int ok = 0;
        const cJSON *one = cJSON_IsArray(x) ? x->child : x;
        for (; one; one = cJSON_IsArray(x) ? one->next : NULL) {
            const char *t = one->valuestring;
            ok |= (!strcmp(t, "object") && cJSON_IsObject(v)) ||
                  (!strcmp(t, "array") && cJSON_IsArray(v)) ||
                  (!strcmp(t, "string") && cJSON_IsString(v)) ||
                  (!strcmp(t, "number") && cJSON_IsNumber(v)) ||
                  (!strcmp(t, "integer") && cJSON_IsNumber(v) &&
                   v->valuedouble == floor(v->valuedouble)) ||
                  (!strcmp(t, "boolean") && cJSON_IsBool(v)) ||
                  (!strcmp(t, "null") && cJSON_IsNull(v));
        }
        if (!ok) return 0;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItem(sc, "properties");
        const cJSON *add = cJSON_GetObjectItem(sc, "additionalProperties");
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(sc, "required")) {
            if (!cJSON_GetObjectItemCaseSensitive(v, e->valuestring)) return 0;
        }
        cJSON_ArrayForEach(e, v) {
            const cJSON *ps = cJSON_GetObjectItemCaseSensitive(props, e->string);
            if (ps && !validate(ps, e, root)) return 0;
            if (!ps && cJSON_IsFalse(add)) return 0;
            if (!ps && cJSON_IsObject(add) && !validate(add, e, root)) return 0;
        }
    }
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        if ((x = cJSON_GetObjectItem(sc, "minItems")) && n < x->valueint) return 0;
        if ((x = cJSON_GetObjectItem(sc, "maxItems")) && n > x->valueint) return 0;
        const cJSON *items = cJSON_GetObjectItem(sc, "items"), *e;
        cJSON_ArrayForEach(e, v) if (items && !validate(items, e, root)) return 0;
    }
    if (cJSON_IsString(v)) {
        size_t n = utf8_chars(v->valuestring);
        if ((x = cJSON_GetObjectItem(sc, "minLength")) && n < (size_t)x->valueint)
            return 0;
        if ((x = cJSON_GetObjectItem(sc, "maxLength")) && n > (size_t)x->valueint)
            return 0;
        if ((x = cJSON_GetObjectItem(sc, "pattern")) &&
            !pattern_search(x->valuestring, v->valuestring))
            return 0;
    }
    if (cJSON_IsNumber(v)) {
        if ((x = cJSON_GetObjectItem(sc, "minimum")) && v->valuedouble < x->valuedouble)
            return 0;
        if ((x = cJSON_GetObjectItem(sc, "maximum")) && v->valuedouble > x->valuedouble)
            return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------------- */
/* Random constrained generation                                              */
/* ------------------------------------------------------------------------- */
static tokenizer *tok;
static grammar_cache *gc;

static void setup(void) {
    char err[256];
    ck_assert_msg(tokenizer_open("byte", NULL, &tok, err, sizeof err) == 0, "%s", err);
    gc = grammar_cache_create(tok, 256, 16);
    ck_assert_ptr_nonnull(gc);
}

static void teardown(void) {
    grammar_cache_free(gc);
    tokenizer_free(tok);
}

static char *err_buf(void) {
    static char e[256];
    return e;
}

static grammar *grammar_of(const char *re) {
    grammar *g = NULL;
    char err[256];
    ck_assert_msg(grammar_cache_get(gc, re, strlen(re), &g, err, sizeof err) == 0, "%s",
                  err);
    return g;
}

/* One random output of g (tokens of t, uniform over the allowed ones; after
 * `patience` steps closing tokens first); jump-forward used at random.
 * Returns the malloc'd text; *forced counts jump-forward tokens. */
static char *generate_with(grammar *g, const tokenizer *t, uint32_t vocab, orch_rng *rng,
                           uint32_t patience, uint64_t *forced) {
    static const char pref[] = "\"}]0,a";
    int32_t pref_id[sizeof pref - 1];
    for (size_t k = 0; k < sizeof pref - 1; k++) { /* the one-byte token of each */
        pref_id[k] = -1;
        for (uint32_t v = 0; v < vocab && pref_id[k] < 0; v++) {
            const char *b;
            size_t n;
            if (tokenizer_token_bytes(t, (int32_t)v, &b, &n) == 0 && n == 1 &&
                b[0] == pref[k])
                pref_id[k] = (int32_t)v;
        }
    }
    grammar_matcher m;
    ck_assert_int_eq(grammar_matcher_init(&m, g), 0);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    int32_t *allowed = malloc(vocab * sizeof *allowed);
    ck_assert(out && allowed);
    for (uint32_t step = 0; step < 6000 && !grammar_matcher_complete(&m); step++) {
        int complete = 0;
        int32_t ids[64];
        uint32_t k =
            (rng_next(rng) & 1) ? grammar_matcher_forced(&m, ids, 64, &complete) : 0;
        uint32_t na = 0;
        int32_t pick = -1;
        if (!k) {
            const uint32_t *mask = grammar_matcher_mask(&m);
            for (uint32_t v = 0; v < vocab; v++)
                if (sampler_mask_allows(mask, v) && (int32_t)v != tokenizer_eot(t))
                    allowed[na++] = (int32_t)v;
            ck_assert_msg(na > 0, "no token allowed at '%.*s'", (int)n, out);
            pick = allowed[rng_next(rng) % na];
            if (step > patience)
                for (size_t q = 0; q < sizeof pref - 1; q++)
                    if (pref_id[q] >= 0 &&
                        sampler_mask_allows(mask, (uint32_t)pref_id[q])) {
                        pick = pref_id[q];
                        break;
                    }
            ids[0] = pick;
            k = 1;
        } else {
            *forced += k;
        }
        ck_assert_int_eq(grammar_matcher_feed(&m, ids, k), 0);
        for (uint32_t i = 0; i < k; i++) {
            const char *b;
            size_t len;
            ck_assert_int_eq(tokenizer_token_bytes(t, ids[i], &b, &len), 0);
            ck_assert(n + len + 1 < cap);
            memcpy(out + n, b, len);
            n += len;
        }
    }
    ck_assert_msg(grammar_matcher_complete(&m), "not complete: '%.*s'", (int)n, out);
    out[n] = '\0';
    grammar_matcher_reset(&m);
    free(allowed);
    return out;
}

static char *generate(grammar *g, orch_rng *rng, uint32_t patience, uint64_t *forced) {
    return generate_with(g, tok, 256, rng, patience, forced);
}

static const char *const SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,"
    "\"maxLength\":12},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":130},"
    "\"email\":{\"type\":\"string\",\"pattern\":\"^[a-z]{1,8}@[a-z]{1,8}\\\\.com$\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
    "\"minItems\":1,\"maxItems\":4},\"ok\":{\"type\":\"boolean\"},\"none\":{\"type\":"
    "\"null\"}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":"
    "\"string\","
    "\"maxLength\":3},{\"const\":{\"k\":[1,2]}}]},\"maxItems\":5}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
    "\"integer\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}",
    "{\"type\":[\"string\",\"null\",\"integer\"],\"maxLength\":4,\"minimum\":-3,"
    "\"maximum\":3}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\",\"minimum\":10,"
    "\"maximum\":12}}",
    "{\"type\":\"object\"}",
    "{\"type\":\"object\",\"properties\":{\"quote\":{\"type\":\"string\",\"pattern\":"
    "\"^[\\\"\\\\\\\\\\\\n]{2,4}$\"}},\"required\":[\"quote\"]}",
};

START_TEST(random_generations_validate) {
    orch_rng rng;
    rng_seed(&rng, 42);
    for (size_t i = 0; i < sizeof SCHEMAS / sizeof *SCHEMAS; i++) {
        cJSON *sc = cJSON_Parse(SCHEMAS[i]);
        ck_assert_ptr_nonnull(sc);
        strbuf re = { 0 };
        char err[512];
        ck_assert_msg(json_schema_to_regex(sc, "s", &re, err, sizeof err) == 0, "%s",
                      err);
        grammar *g = NULL;
        ck_assert_msg(grammar_cache_get(gc, re.p, re.len, &g, err, sizeof err) == 0,
                      "schema %zu: %s", i, err);
        uint64_t forced = 0;
        for (int k = 0; k < 40; k++) {
            char *out = generate(g, &rng, 40, &forced);
            cJSON *v = cJSON_Parse(out);
            ck_assert_msg(v != NULL, "schema %zu: output does not parse: %s", i, out);
            ck_assert_msg(validate(sc, v, sc), "schema %zu: output does not validate: %s",
                          i, out);
            cJSON_Delete(v);
            free(out);
        }
        ck_assert_msg(forced > 0, "schema %zu: no jump-forward", i);
        grammar_release(g);
        strbuf_free(&re);
        cJSON_Delete(sc);
    }
}
END_TEST

START_TEST(regex_generations_match) {
    static const char *const res[] = { "[0-9]{3}-[a-z]{2,4}", "(?:yes|no|maybe)",
                                       "\\{\"a\":(?:true|false)\\}",
                                       "[\xc3\xa0-\xc3\xbf]{1,3}x" };
    orch_rng rng;
    rng_seed(&rng, 7);
    for (size_t i = 0; i < sizeof res / sizeof *res; i++) {
        grammar *g = grammar_of(res[i]);
        uint64_t forced = 0;
        for (int k = 0; k < 30; k++) {
            char *out = generate(g, &rng, 10, &forced);
            ck_assert_msg(regex_dfa_match(grammar_dfa(g), out, strlen(out)), "%s", out);
            char anchored[128];
            snprintf(anchored, sizeof anchored, "^(?:%s)$", res[i]);
            ck_assert_msg(pattern_search(anchored, out), "/%s/ (PCRE2) on %s", res[i],
                          out);
            free(out);
        }
        grammar_release(g);
    }
}
END_TEST

START_TEST(masks_match_brute_force) {
    const char *re = "\\{\"k\":\"(?J:[\\s\\S]{0,3})\",\"n\":-?[0-9]+\\}";
    grammar *g = grammar_of(re);
    const regex_dfa *d = grammar_dfa(g);
    for (uint32_t st = 0; st < regex_dfa_states(d); st++) {
        grammar_matcher m;
        ck_assert_int_eq(grammar_matcher_init(&m, g), 0);
        m.state = (int32_t)st;
        const uint32_t *mask = grammar_matcher_mask(&m);
        for (uint32_t v = 0; v < 256; v++) {
            char b = (char)v;
            int want = regex_dfa_walk(d, (int32_t)st, &b, 1) >= 0;
            ck_assert_msg(sampler_mask_allows(mask, v) == want, "state %u token %u", st,
                          v);
        }
        grammar_matcher_reset(&m);
    }
    /* the cache: the same text is the same grammar */
    grammar_cache_stats s0, s1;
    grammar_cache_get_stats(gc, &s0);
    grammar *g2 = grammar_of(re);
    grammar_cache_get_stats(gc, &s1);
    ck_assert_ptr_eq(g, g2);
    ck_assert_uint_eq(s1.hits, s0.hits + 1);
    grammar_release(g2);
    grammar_release(g);
    /* jump-forward over a long fixed key */
    g = grammar_of("\\{\"a_rather_long_fixed_key_name\":[0-9]\\}");
    grammar_matcher m;
    ck_assert_int_eq(grammar_matcher_init(&m, g), 0);
    int32_t ids[64];
    int complete = 1;
    uint32_t k = grammar_matcher_forced(&m, ids, 64, &complete);
    ck_assert_uint_eq(k, strlen("{\"a_rather_long_fixed_key_name\":"));
    ck_assert_int_eq(complete, 0);
    ck_assert_int_eq(grammar_matcher_feed(&m, ids, k), 0);
    int32_t seven = '7';
    grammar_matcher_feed(&m, &seven, 1);
    k = grammar_matcher_forced(&m, ids, 64, &complete);
    ck_assert_uint_eq(k, 1);
    ck_assert_int_eq(ids[0], '}');
    ck_assert_int_eq(complete, 1);
    grammar_matcher_reset(&m);
    grammar_release(g);
    /* a grammar (and its matcher) may outlive its cache */
    grammar_cache *local = grammar_cache_create(tok, 256, 2);
    ck_assert_ptr_nonnull(local);
    ck_assert_int_eq(grammar_cache_get(local, "ab|ac", 5, &g, err_buf(), 256), 0);
    ck_assert_int_eq(grammar_matcher_init(&m, g), 0);
    grammar_release(g);
    grammar_cache_free(local);
    int32_t a = 'a';
    ck_assert_int_eq(grammar_matcher_feed(&m, &a, 1), 0);
    const uint32_t *mk = grammar_matcher_mask(&m);
    for (uint32_t v = 0; v < 256; v++)
        ck_assert_int_eq(sampler_mask_allows(mk, v), v == 'b' || v == 'c');
    grammar_matcher_reset(&m);
    /* an empty language is refused */
    char err[256];
    ck_assert_int_ne(grammar_cache_get(gc, "[^\\s\\S]", 7, &g, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "admits no output") != NULL, "%s", err);
}
END_TEST

/* The GPT-2 vocabulary (multi-byte tokens, an end-of-text token): masks
 * equal a walk of every token's bytes, the end-of-text token only in
 * accepting states, jump-forward runs re-tokenized by BPE, and random
 * generations validate. */
START_TEST(gpt2_vocabulary) {
    tokenizer *g2 = NULL;
    char err[512];
    ck_assert_msg(tokenizer_open("gpt2", NULL, &g2, err, sizeof err) == 0,
                  "gpt2 vocabulary (run tools/setup.sh): %s", err);
    uint32_t V = tokenizer_vocab_size(g2);
    int32_t eot = tokenizer_eot(g2);
    grammar_cache *c2 = grammar_cache_create(g2, V, 4);
    ck_assert_ptr_nonnull(c2);
    orch_rng rng;
    rng_seed(&rng, 11);
    const char *schemas[] = { SCHEMAS[0], SCHEMAS[2] };
    for (size_t i = 0; i < 2; i++) {
        cJSON *sc = cJSON_Parse(schemas[i]);
        strbuf re = { 0 };
        ck_assert(json_schema_to_regex(sc, "s", &re, err, sizeof err) == 0);
        grammar *g = NULL;
        ck_assert_msg(grammar_cache_get(c2, re.p, re.len, &g, err, sizeof err) == 0, "%s",
                      err);
        const regex_dfa *d = grammar_dfa(g);
        for (uint32_t st = 0; st < regex_dfa_states(d); st += 7) { /* masks */
            grammar_matcher m;
            ck_assert_int_eq(grammar_matcher_init(&m, g), 0);
            m.state = (int32_t)st;
            const uint32_t *mask = grammar_matcher_mask(&m);
            for (uint32_t v = 0; v < V; v++) {
                const char *b;
                size_t n;
                int want;
                if ((int32_t)v == eot)
                    want = regex_dfa_accepting(d, (int32_t)st);
                else
                    want = tokenizer_token_bytes(g2, (int32_t)v, &b, &n) == 0 && n > 0 &&
                           regex_dfa_walk(d, (int32_t)st, b, n) >= 0;
                ck_assert_msg(sampler_mask_allows(mask, v) == want, "state %u token %u",
                              st, v);
            }
            grammar_matcher_reset(&m);
        }
        uint64_t forced = 0;
        for (int k = 0; k < 15; k++) {
            char *out = generate_with(g, g2, V, &rng, 30, &forced);
            cJSON *v = cJSON_Parse(out);
            ck_assert_msg(v && validate(sc, v, sc), "gpt2 schema %zu: %s", i, out);
            cJSON_Delete(v);
            free(out);
        }
        ck_assert(forced > 0);
        grammar_release(g);
        strbuf_free(&re);
        cJSON_Delete(sc);
    }
    grammar_cache_free(c2);
    tokenizer_free(g2);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("structured");
    TCase *tc = tcase_create("structured");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, regex_matches);
    tcase_add_test(tc, regex_refusals);
    tcase_add_test(tc, integer_ranges);
    tcase_add_test(tc, schema_refusals);
    tcase_add_test(tc, schema_too_large);
    tcase_add_test(tc, tool_refusals);
    tcase_add_test(tc, random_generations_validate);
    tcase_add_test(tc, regex_generations_match);
    tcase_add_test(tc, masks_match_brute_force);
    tcase_add_test(tc, gpt2_vocabulary);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
