/*
 * json_read.c - range-checked number reads from parsed JSON; see
 * json_read.h.
 */
#include "orchestrator/core/json_read.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/core/util.h"

const char *json_read_type_name(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

/* The item at the dotted path (NULL when absent); -1 when an intermediate
 * is present but not an object. */
static int lookup(const cJSON *obj, const char *path, const cJSON **item, char *err,
                  size_t err_cap) {
    *item = NULL;
    const cJSON *node = obj;
    const char *seg = path;
    for (;;) {
        if (!cJSON_IsObject(node)) return 0;
        const char *dot = strchr(seg, '.');
        char name[128];
        size_t n = dot ? (size_t)(dot - seg) : strlen(seg);
        if (n >= sizeof name) return 0;
        memcpy(name, seg, n);
        name[n] = '\0';
        const cJSON *child = cJSON_GetObjectItemCaseSensitive(node, name);
        if (!dot) {
            *item = child;
            return 0;
        }
        if (child && !cJSON_IsObject(child)) {
            util_set_err(err, err_cap, "%.*s: expected an object, got %s",
                         (int)(dot - path), path, json_read_type_name(child));
            return -1;
        }
        node = child;
        seg = dot + 1;
    }
}

/* Absent, null-as-absent, missing-required: 1 = use the default, 0 = v is
 * there to check, -1 = error. */
static int present(const cJSON *obj, const char *path, unsigned flags, const cJSON **v,
                   char *err, size_t err_cap) {
    if (lookup(obj, path, v, err, err_cap) != 0) return -1;
    int absent = !*v || ((flags & JSON_READ_NULLABLE) && cJSON_IsNull(*v));
    if (!absent) return 0;
    if (flags & JSON_READ_REQUIRED) {
        util_set_err(err, err_cap, "%s: missing", path);
        return -1;
    }
    return 1;
}

int json_read_u64(const cJSON *obj, const char *path, unsigned flags, uint64_t def,
                  uint64_t min, uint64_t max, uint64_t *out, char *err, size_t err_cap) {
    const cJSON *v;
    int p = present(obj, path, flags, &v, err, err_cap);
    if (p < 0) return -1;
    if (p > 0) {
        *out = def;
        return 0;
    }
    if (max > JSON_READ_U64_MAX) max = JSON_READ_U64_MAX;
    if (!cJSON_IsNumber(v)) {
        util_set_err(err, err_cap, "%s: expected an integer, got %s", path,
                     json_read_type_name(v));
        return -1;
    }
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d)) {
        util_set_err(err, err_cap, "%s: expected an integer, got %.10g", path, d);
        return -1;
    }
    /* Compared as doubles: min and max (<= 2^53) are exact. */
    if (d < (double)min || d > (double)max) {
        util_set_err(err, err_cap, "%s: %.10g is out of range (%llu..%llu)", path, d,
                     (unsigned long long)min, (unsigned long long)max);
        return -1;
    }
    *out = (uint64_t)d;
    return 0;
}

int json_read_f64(const cJSON *obj, const char *path, unsigned flags, double def,
                  double min, double max, double *out, char *err, size_t err_cap) {
    const cJSON *v;
    int p = present(obj, path, flags, &v, err, err_cap);
    if (p < 0) return -1;
    if (p > 0) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v)) {
        util_set_err(err, err_cap, "%s: expected a number, got %s", path,
                     json_read_type_name(v));
        return -1;
    }
    double d = v->valuedouble;
    if (!isfinite(d)) {
        util_set_err(err, err_cap, "%s: must be finite", path);
        return -1;
    }
    if (!(d >= min && d <= max)) {
        util_set_err(err, err_cap, "%s: %.10g is out of range (%.10g..%.10g)", path, d,
                     min, max);
        return -1;
    }
    *out = d;
    return 0;
}
