/*
 * flags.c - the table-driven command-line parser of the orch subcommands
 * (see flags.h): lookup by name, values in the "=" and space forms, number
 * parsing with ranges, positionals, --help and the usage printer.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/cli/flags.h"
#include "orchestrator/core/util.h"

/* The spec whose name is arg up to an '=' (or all of arg), or NULL. */
static const flag_spec *find_flag(const flags_cmd *c, const char *arg) {
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    for (const flag_spec *s = c->flags; s && s->name; s++)
        if (strlen(s->name) == n && strncmp(s->name, arg, n) == 0) return s;
    return NULL;
}

/* Whether "--name VALUE" takes the next argument as the value. */
static int takes_next(flag_kind k) {
    return k != FLAG_OPTIONAL && k != FLAG_TRUE && k != FLAG_FALSE;
}

static int is_help(const char *a) {
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

int flags_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (is_help(argv[i])) return 1;
    }
    return 0;
}

/* --help anywhere a flag may stand (values of known flags skipped). */
static int help_requested(const flags_cmd *c, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) return 0;
        if (is_help(a)) return 1;
        const flag_spec *s = a[0] == '-' ? find_flag(c, a) : NULL;
        if (s && takes_next(s->kind) && !strchr(a, '=')) i++;
    }
    return 0;
}

/* ---- numbers ---- */

typedef struct int_range {
    int is_unsigned;
    uint64_t umin, umax; /* unsigned kinds */
    int64_t smin, smax;  /* signed kinds */
    uint64_t utype_max;
    int64_t stype_min, stype_max;
} int_range;

static int_range range_of(const flag_spec *s) {
    int_range r;
    memset(&r, 0, sizeof r);
    r.is_unsigned = s->kind == FLAG_U64 || s->kind == FLAG_U32;
    if (r.is_unsigned) {
        r.utype_max = s->kind == FLAG_U64 ? UINT64_MAX : UINT32_MAX;
        r.umin = s->min > 0 ? (uint64_t)s->min : 0;
        r.umax = s->max > 0 ? (uint64_t)s->max : r.utype_max;
    } else {
        r.stype_min = s->kind == FLAG_INT ? INT_MIN : INT64_MIN;
        r.stype_max = s->kind == FLAG_INT ? INT_MAX : INT64_MAX;
        int whole = s->min == 0 && s->max == 0;
        r.smin = whole ? r.stype_min : s->min;
        r.smax = whole || s->max == 0 ? r.stype_max : s->max;
    }
    return r;
}

/* "a positive integer", "an integer in [0, 4096]", ... */
static void describe_int(const int_range *r, char *out, size_t cap) {
    if (r->is_unsigned) {
        if (r->umax == r->utype_max && r->umin <= 1)
            snprintf(out, cap, "%s",
                     r->umin ? "a positive integer" : "a non-negative integer");
        else if (r->umax == r->utype_max)
            snprintf(out, cap, "an integer >= %llu", (unsigned long long)r->umin);
        else
            snprintf(out, cap, "an integer in [%llu, %llu]", (unsigned long long)r->umin,
                     (unsigned long long)r->umax);
        return;
    }
    if (r->smax == r->stype_max && r->smin == r->stype_min)
        snprintf(out, cap, "an integer");
    else if (r->smax == r->stype_max && (r->smin == 0 || r->smin == 1))
        snprintf(out, cap, "%s",
                 r->smin ? "a positive integer" : "a non-negative integer");
    else if (r->smax == r->stype_max)
        snprintf(out, cap, "an integer >= %lld", (long long)r->smin);
    else
        snprintf(out, cap, "an integer in [%lld, %lld]", (long long)r->smin,
                 (long long)r->smax);
}

static void describe_double(const flag_spec *s, char *out, size_t cap) {
    if (!(s->dmin < s->dmax))
        snprintf(out, cap, "a number");
    else if (isinf(s->dmax))
        snprintf(out, cap, "a number %s %g", s->dmin_open ? ">" : ">=", s->dmin);
    else
        snprintf(out, cap, "a number in %c%g, %g]", s->dmin_open ? '(' : '[', s->dmin,
                 s->dmax);
}

/* Parse v into s->dst; 0, or -1 with the "expected ..." text in what. */
static int store_number(const flag_spec *s, const char *v, char *what, size_t cap) {
    if (s->kind == FLAG_DOUBLE || s->kind == FLAG_FLOAT) {
        double d;
        int ranged = s->dmin < s->dmax;
        if (util_parse_double(v, &d) != 0 ||
            (ranged && !((s->dmin_open ? d > s->dmin : d >= s->dmin) && d <= s->dmax))) {
            describe_double(s, what, cap);
            return -1;
        }
        if (s->kind == FLAG_DOUBLE)
            *(double *)s->dst = d;
        else
            *(float *)s->dst = (float)d;
        return 0;
    }
    int_range r = range_of(s);
    if (r.is_unsigned) {
        uint64_t u;
        if (util_parse_u64(v, &u) != 0 || u < r.umin || u > r.umax) {
            describe_int(&r, what, cap);
            return -1;
        }
        if (s->kind == FLAG_U64)
            *(uint64_t *)s->dst = u;
        else
            *(uint32_t *)s->dst = (uint32_t)u;
        return 0;
    }
    int64_t x;
    if (util_parse_i64(v, &x) != 0 || x < r.smin || x > r.smax) {
        describe_int(&r, what, cap);
        return -1;
    }
    if (s->kind == FLAG_I64)
        *(int64_t *)s->dst = x;
    else
        *(int *)s->dst = (int)x;
    return 0;
}

/* ---- parsing ---- */

/* Apply one flag occurrence with value v (NULL: none given). */
static int apply(const flags_cmd *c, const flag_spec *s, const char *arg, const char *v,
                 char *err, size_t err_cap) {
    char what[96];
    switch (s->kind) {
    case FLAG_TRUE:
    case FLAG_FALSE:
        if (v) {
            util_set_err(err, err_cap, "%s: %s: takes no value ('%s')", c->name, s->name,
                         arg);
            return -1;
        }
        *(int *)s->dst = s->kind == FLAG_TRUE;
        break;
    case FLAG_OPTIONAL:
        if (v && !*v) {
            util_set_err(err, err_cap, "%s: %s: missing value", c->name, s->name);
            return -1;
        }
        if (v) *(const char **)s->dst = v;
        break;
    case FLAG_STRING: *(const char **)s->dst = v; break;
    case FLAG_LIST:
        if (*s->count >= (size_t)s->max) {
            util_set_err(err, err_cap, "%s: too many %s options (at most %lld)", c->name,
                         s->name, (long long)s->max);
            return -1;
        }
        ((const char **)s->dst)[(*s->count)++] = v;
        break;
    default:
        if (store_number(s, v, what, sizeof what) != 0) {
            util_set_err(err, err_cap, "%s: %s '%.64s': expected %s", c->name, s->name, v,
                         what);
            return -1;
        }
        break;
    }
    if (s->seen) *s->seen = 1;
    return 0;
}

static int add_positional(const flags_cmd *c, const char *a, char *err, size_t err_cap) {
    if (!c->pos || c->max_pos == 0) {
        util_set_err(err, err_cap, "%s: unknown argument '%s' (see orch %s --help)",
                     c->name, a, c->name);
        return -1;
    }
    if (*c->n_pos >= c->max_pos) {
        if (c->max_pos == 1)
            util_set_err(err, err_cap, "%s: more than one %s given ('%s', '%s')", c->name,
                         c->pos_name, c->pos[0], a);
        else
            util_set_err(err, err_cap, "%s: more than %zu %s given ('%s')", c->name,
                         c->max_pos, c->pos_name, a);
        return -1;
    }
    c->pos[(*c->n_pos)++] = a;
    return 0;
}

int flags_parse_args(const flags_cmd *c, int argc, char **argv, FILE *help_out, char *err,
                     size_t err_cap) {
    if (err && err_cap) err[0] = '\0';
    if (help_requested(c, argc, argv)) {
        if (help_out) flags_print_usage(c, help_out);
        return FLAGS_HELP;
    }
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            if (add_positional(c, a, err, err_cap) != 0) return FLAGS_ERROR;
            continue;
        }
        const flag_spec *s = find_flag(c, a);
        if (!s) {
            util_set_err(err, err_cap,
                         "%s: unknown argument '%s' (see orch %s "
                         "--help)",
                         c->name, a, c->name);
            return FLAGS_ERROR;
        }
        const char *eq = strchr(a, '=');
        const char *v = eq ? eq + 1 : NULL;
        if (!v && takes_next(s->kind)) {
            if (i + 1 >= argc) {
                util_set_err(err, err_cap, "%s: %s: missing value", c->name, s->name);
                return FLAGS_ERROR;
            }
            v = argv[++i];
        }
        if (apply(c, s, a, v, err, err_cap) != 0) return FLAGS_ERROR;
    }
    return FLAGS_OK;
}

int flags_parse(const flags_cmd *c, int argc, char **argv, int *exit_status) {
    char err[1024];
    int r = flags_parse_args(c, argc, argv, stdout, err, sizeof err);
    if (r == FLAGS_OK) return 0;
    if (r == FLAGS_HELP) {
        fflush(stdout);
        *exit_status = ORCH_EXIT_OK;
    } else {
        util_error("%s", err);
        *exit_status = ORCH_EXIT_USAGE;
    }
    return 1;
}

/* ---- usage ---- */

static void flag_label(const flag_spec *s, char *out, size_t cap) {
    const char *arg = s->arg ? s->arg : "";
    const char *sep = *arg && *arg != '[' && *arg != '=' ? " " : "";
    snprintf(out, cap, "%s%s%s", s->name, sep, arg);
}

void flags_print_usage(const flags_cmd *c, FILE *f) {
    if (c->usage) fputs(c->usage, f);
    size_t width = 0;
    char label[128];
    for (const flag_spec *s = c->flags; s && s->name; s++) {
        if (!s->help) continue;
        flag_label(s, label, sizeof label);
        if (strlen(label) > width) width = strlen(label);
    }
    int col = (int)width + 3;
    for (const flag_spec *s = c->flags; s && s->name; s++) {
        if (!s->help) continue;
        flag_label(s, label, sizeof label);
        const char *h = s->help;
        fprintf(f, "  %-*s", col, label);
        for (;;) {
            const char *nl = strchr(h, '\n');
            int n = nl ? (int)(nl - h) : (int)strlen(h);
            fprintf(f, "%.*s\n", n, h);
            if (!nl || !nl[1]) break;
            h = nl + 1;
            fprintf(f, "  %*s", col, "");
        }
    }
    if (c->footer) fputs(c->footer, f);
}
