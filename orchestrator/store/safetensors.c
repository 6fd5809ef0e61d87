/*
 * safetensors.c - validated mmap reader and streaming writer of safetensors
 * files. See safetensors.h for the format and the rules.
 */
#include "orchestrator/store/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/sha256.h"

/* Largest header accepted (as the reference implementation: 100 MB). */
#define HEADER_MAX ((uint64_t)100 * 1000 * 1000)
/* Offsets and sizes must be exact in a double (JSON numbers). */
#define EXACT_MAX 9007199254740992.0 /* 2^53 */

static const struct {
    const char *name;
    size_t size;
} dtypes[SAFETENSORS_DTYPE_COUNT] = {
    [SAFETENSORS_F32] = { "F32", 4 },   [SAFETENSORS_F16] = { "F16", 2 },
    [SAFETENSORS_BF16] = { "BF16", 2 }, [SAFETENSORS_I32] = { "I32", 4 },
    [SAFETENSORS_F64] = { "F64", 8 },   [SAFETENSORS_I64] = { "I64", 8 },
    [SAFETENSORS_I16] = { "I16", 2 },   [SAFETENSORS_I8] = { "I8", 1 },
    [SAFETENSORS_U8] = { "U8", 1 },     [SAFETENSORS_BOOL] = { "BOOL", 1 },
};

size_t safetensors_dtype_size(int dtype) {
    if (dtype < 0 || dtype >= SAFETENSORS_DTYPE_COUNT) return 0;
    return dtypes[dtype].size;
}

const char *safetensors_dtype_name(int dtype) {
    if (dtype < 0 || dtype >= SAFETENSORS_DTYPE_COUNT) return "?";
    return dtypes[dtype].name;
}

int safetensors_dtype_parse(const char *s) {
    if (!s) return -1;
    for (int i = 0; i < SAFETENSORS_DTYPE_COUNT; i++)
        if (strcmp(s, dtypes[i].name) == 0) return i;
    return -1;
}

/* ------------------------------------------------------------------------- */
/* Reader                                                                     */
/* ------------------------------------------------------------------------- */

float safetensors_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, ex = (h >> 10) & 0x1f, man = h & 0x3ffu;
    uint32_t bits;
    if (ex == 0) {
        float f = ldexpf((float)man, -24); /* zero and subnormals */
        return sign ? -f : f;
    }
    if (ex == 31)
        bits = sign | 0x7f800000u | man << 13;
    else
        bits = sign | (ex + 112) << 23 | man << 13;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float safetensors_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int safetensors_to_f32(int dtype, const void *src, float *dst, uint64_t n) {
    const uint8_t *p = src;
    switch (dtype) {
    case SAFETENSORS_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case SAFETENSORS_F16:
        for (uint64_t e = 0; e < n; e++)
            dst[e] = safetensors_f16_to_f32((uint16_t)(p[2 * e] | p[2 * e + 1] << 8));
        return 0;
    case SAFETENSORS_BF16:
        for (uint64_t e = 0; e < n; e++)
            dst[e] = safetensors_bf16_to_f32((uint16_t)(p[2 * e] | p[2 * e + 1] << 8));
        return 0;
    default: return -1;
    }
}

typedef struct meta_kv {
    char *key;
    char *value;
} meta_kv;

struct safetensors_file {
    void *map;
    size_t map_len;
    safetensors_tensor *tensors;
    size_t n;
    char *names; /* all names, NUL-separated */
    meta_kv *meta;
    size_t n_meta;
};

void safetensors_close(safetensors_file *f) {
    if (!f) return;
    if (f->map && f->map_len) munmap(f->map, f->map_len);
    free(f->tensors);
    free(f->names);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->meta);
    free(f);
}

size_t safetensors_count(const safetensors_file *f) { return f ? f->n : 0; }

const safetensors_tensor *safetensors_get(const safetensors_file *f, size_t i) {
    if (!f || i >= f->n) return NULL;
    return &f->tensors[i];
}

const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *safetensors_metadata(const safetensors_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    return NULL;
}

/* A JSON number that is a non-negative integer exactly representable. */
static int json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double v = j->valuedouble;
    if (!(v >= 0) || v > EXACT_MAX || floor(v) != v) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int cmp_by_begin(const void *a, const void *b) {
    const safetensors_tensor *x = *(const safetensors_tensor *const *)a;
    const safetensors_tensor *y = *(const safetensors_tensor *const *)b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py) return px < py ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : (x->nbytes > y->nbytes);
}

static int cmp_names(const void *a, const void *b) {
    const safetensors_tensor *x = *(const safetensors_tensor *const *)a;
    const safetensors_tensor *y = *(const safetensors_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* The header's JSON: starts with '{', parses, nothing but whitespace after
 * it, an object. NULL (err set) otherwise. */
static cJSON *parse_json(const char *path, const char *hdr, size_t hdr_len, char *err,
                         size_t err_cap) {
    if (hdr_len == 0 || hdr[0] != '{') {
        util_set_err(err, err_cap,
                     "%s: not a safetensors file (header does not start with "
                     "'{')",
                     path);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, hdr_len, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - hdr) : 0;
        const char *ep = cJSON_GetErrorPtr();
        if (ep && ep >= hdr && ep <= hdr + hdr_len) at = (size_t)(ep - hdr);
        util_set_err(err, err_cap, "%s: header is not valid JSON (near byte %zu of %zu)",
                     path, at, hdr_len);
        return NULL;
    }
    /* Only whitespace may follow the JSON object inside the header. */
    for (const char *p = end; p && p < hdr + hdr_len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            util_set_err(err, err_cap,
                         "%s: trailing bytes after the JSON header (byte %zu)", path,
                         (size_t)(p - hdr));
            cJSON_Delete(root);
            return NULL;
        }
    }
    if (!cJSON_IsObject(root)) {
        util_set_err(err, err_cap, "%s: header is not a JSON object", path);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* The "__metadata__" object e: string values only. */
static int parse_metadata(safetensors_file *f, const cJSON *e, const char *path,
                          char *err, size_t err_cap) {
    if (!cJSON_IsObject(e)) {
        util_set_err(err, err_cap, "%s: __metadata__ is not an object of strings", path);
        return -1;
    }
    size_t m = (size_t)cJSON_GetArraySize(e);
    f->meta = util_calloc(m ? m : 1, sizeof *f->meta);
    if (!f->meta) {
        util_set_err(err, err_cap, "%s: out of memory", path);
        return -1;
    }
    for (cJSON *kv = e->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv) || !kv->string) {
            util_set_err(err, err_cap, "%s: __metadata__ value '%s' is not a string",
                         path, kv->string ? kv->string : "?");
            return -1;
        }
        meta_kv *slot = &f->meta[f->n_meta];
        slot->key = strdup(kv->string);
        slot->value = strdup(kv->valuestring);
        f->n_meta++;
        if (!slot->key || !slot->value) {
            util_set_err(err, err_cap, "%s: out of memory", path);
            return -1;
        }
    }
    return 0;
}

/* One tensor entry e named `name` into *t (dtype, shape, numel, nbytes,
 * data inside the data buffer of data_len bytes); not its name. */
static int parse_entry(const cJSON *e, const char *name, safetensors_tensor *t,
                       const uint8_t *data, uint64_t data_len, const char *path,
                       char *err, size_t err_cap) {
    if (!*name) {
        util_set_err(err, err_cap, "%s: tensor with an empty name", path);
        return -1;
    }
    if (!cJSON_IsObject(e)) {
        util_set_err(err, err_cap, "%s: tensor '%s': entry is not an object", path, name);
        return -1;
    }
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (cJSON *k = e->child; k; k = k->next) {
        const cJSON **slot = NULL;
        if (k->string && strcmp(k->string, "dtype") == 0)
            slot = &jd;
        else if (k->string && strcmp(k->string, "shape") == 0)
            slot = &js;
        else if (k->string && strcmp(k->string, "data_offsets") == 0)
            slot = &jo;
        if (!slot || *slot) {
            util_set_err(err, err_cap, "%s: tensor '%s': %s key '%s'", path, name,
                         slot ? "duplicate" : "unexpected", k->string ? k->string : "?");
            return -1;
        }
        *slot = k;
    }
    if (!jd || !js || !jo) {
        util_set_err(err, err_cap, "%s: tensor '%s': missing '%s'", path, name,
                     !jd   ? "dtype"
                     : !js ? "shape"
                           : "data_offsets");
        return -1;
    }
    int dt = cJSON_IsString(jd) ? safetensors_dtype_parse(jd->valuestring) : -1;
    if (dt < 0) {
        util_set_err(err, err_cap, "%s: tensor '%s': unsupported dtype %s%s%s", path,
                     name, cJSON_IsString(jd) ? "'" : "",
                     cJSON_IsString(jd) ? jd->valuestring : "(not a string)",
                     cJSON_IsString(jd) ? "'" : "");
        return -1;
    }
    if (!cJSON_IsArray(js) || cJSON_GetArraySize(js) > SAFETENSORS_MAX_DIMS) {
        util_set_err(err, err_cap,
                     "%s: tensor '%s': shape is not an array of at most %d "
                     "dimensions",
                     path, name, SAFETENSORS_MAX_DIMS);
        return -1;
    }
    t->dtype = dt;
    t->ndim = 0;
    t->numel = 1;
    for (cJSON *d = js->child; d; d = d->next) {
        uint64_t v;
        if (json_u64(d, &v) != 0) {
            util_set_err(err, err_cap,
                         "%s: tensor '%s': shape has a value that is not a "
                         "non-negative integer",
                         path, name);
            return -1;
        }
        if (v && t->numel > UINT64_MAX / v) {
            util_set_err(err, err_cap, "%s: tensor '%s': shape overflows", path, name);
            return -1;
        }
        t->shape[t->ndim++] = v;
        t->numel *= v;
    }
    size_t es = safetensors_dtype_size(dt);
    if (t->numel > UINT64_MAX / es) {
        util_set_err(err, err_cap, "%s: tensor '%s': shape overflows", path, name);
        return -1;
    }
    t->nbytes = t->numel * es;
    uint64_t b = 0, en = 0;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 ||
        json_u64(jo->child, &b) != 0 || json_u64(jo->child->next, &en) != 0) {
        util_set_err(err, err_cap,
                     "%s: tensor '%s': data_offsets is not [begin, end] of "
                     "non-negative integers",
                     path, name);
        return -1;
    }
    if (b > en || en > data_len) {
        util_set_err(err, err_cap,
                     "%s: tensor '%s': data_offsets [%llu, %llu] outside "
                     "the data buffer of %llu bytes (truncated file?)",
                     path, name, (unsigned long long)b, (unsigned long long)en,
                     (unsigned long long)data_len);
        return -1;
    }
    if (en - b != t->nbytes) {
        util_set_err(err, err_cap,
                     "%s: tensor '%s': data_offsets span %llu bytes but "
                     "%s shape needs %llu",
                     path, name, (unsigned long long)(en - b), dtypes[dt].name,
                     (unsigned long long)t->nbytes);
        return -1;
    }
    t->data = data + b;
    return 0;
}

/* order[0..n): unique names, and the data of the entries tiles the data
 * buffer exactly (no overlap, no hole). Sorts order. */
static int check_layout(safetensors_tensor **order, size_t n, const uint8_t *data,
                        uint64_t data_len, const char *path, char *err, size_t err_cap) {
    /* Unique names. */
    qsort(order, n, sizeof *order, cmp_names);
    for (size_t i = 1; i < n; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
            util_set_err(err, err_cap, "%s: duplicate tensor name '%s'", path,
                         order[i]->name);
            return -1;
        }
    /* Entries must tile the data buffer: no overlap, no hole. */
    qsort(order, n, sizeof *order, cmp_by_begin);
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = (uint64_t)((const uint8_t *)order[i]->data - data);
        if (b < pos) {
            util_set_err(err, err_cap,
                         "%s: tensor '%s' overlaps the previous tensor's data", path,
                         order[i]->name);
            return -1;
        }
        if (b > pos) {
            util_set_err(err, err_cap,
                         "%s: hole in the data buffer before tensor '%s' "
                         "(bytes %llu..%llu unused)",
                         path, order[i]->name, (unsigned long long)pos,
                         (unsigned long long)b);
            return -1;
        }
        pos = b + order[i]->nbytes;
    }
    if (pos != data_len) {
        util_set_err(err, err_cap,
                     "%s: data buffer has %llu bytes but the tensors cover %llu "
                     "(trailing garbage or wrong offsets)",
                     path, (unsigned long long)data_len, (unsigned long long)pos);
        return -1;
    }
    return 0;
}

/* Parse and validate the header; fills f->tensors, f->names and f->meta. */
static int parse_header(safetensors_file *f, const char *path, const char *hdr,
                        size_t hdr_len, uint64_t data_len, const uint8_t *data, char *err,
                        size_t err_cap) {
    cJSON *root = parse_json(path, hdr, hdr_len, err, err_cap);
    if (!root) return -1;
    size_t n = 0, names_len = 0;
    int seen_meta = 0;
    for (cJSON *e = root->child; e; e = e->next) {
        if (!e->string) continue;
        if (strcmp(e->string, "__metadata__") == 0) {
            if (seen_meta++) {
                util_set_err(err, err_cap, "%s: duplicate __metadata__", path);
                cJSON_Delete(root);
                return -1;
            }
            continue;
        }
        n++;
        names_len += strlen(e->string) + 1;
    }
    f->tensors = util_calloc(n ? n : 1, sizeof *f->tensors);
    f->names = util_calloc(names_len ? names_len : 1, 1);
    safetensors_tensor **order = util_calloc(n ? n : 1, sizeof *order);
    if (!f->tensors || !f->names || !order) {
        util_set_err(err, err_cap, "%s: out of memory", path);
        free(order);
        cJSON_Delete(root);
        return -1;
    }
    char *np = f->names;
    int rc = -1;
    for (cJSON *e = root->child; e; e = e->next) {
        if (!e->string) continue;
        if (strcmp(e->string, "__metadata__") == 0) {
            if (parse_metadata(f, e, path, err, err_cap) != 0) goto out;
            continue;
        }
        const char *name = e->string;
        safetensors_tensor *t = &f->tensors[f->n];
        if (parse_entry(e, name, t, data, data_len, path, err, err_cap) != 0) goto out;
        size_t nl = strlen(name) + 1;
        memcpy(np, name, nl);
        t->name = np;
        np += nl;
        order[f->n] = t;
        f->n++;
    }
    rc = check_layout(order, f->n, data, data_len, path, err, err_cap);
out:
    free(order);
    cJSON_Delete(root);
    return rc;
}

/* Validate the size bytes at p (the whole file; NULL when size < 8) into f:
 * header length against the size, then the header. f borrows p. */
static int parse_bytes(safetensors_file *f, const char *path, const uint8_t *p,
                       uint64_t size, char *err, size_t err_cap) {
    if (size < 8 || !p) {
        util_set_err(err, err_cap,
                     "%s: file is %llu bytes, too short for a safetensors "
                     "header (truncated?)",
                     path, (unsigned long long)size);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen > size - 8) {
        util_set_err(err, err_cap,
                     "%s: header length %llu exceeds the file size %llu "
                     "(truncated or not a safetensors file)",
                     path, (unsigned long long)hlen, (unsigned long long)size);
        return -1;
    }
    if (hlen > HEADER_MAX) {
        util_set_err(err, err_cap, "%s: header length %llu exceeds the %llu limit", path,
                     (unsigned long long)hlen, (unsigned long long)HEADER_MAX);
        return -1;
    }
    return parse_header(f, path, (const char *)p + 8, (size_t)hlen, size - 8 - hlen,
                        p + 8 + hlen, err, err_cap);
}

int safetensors_open(const char *path, safetensors_file **out, char *err,
                     size_t err_cap) {
    int fd;
    struct stat st;
    if (fsio_open_regular(path, &fd, &st, err, err_cap) != 0) return -1;
    uint64_t size = (uint64_t)st.st_size;
    safetensors_file *f = util_calloc(1, sizeof *f);
    if (!f) {
        util_set_err(err, err_cap, "%s: out of memory", path);
        close(fd);
        return -1;
    }
    if (size >= 8) { /* shorter files are refused by parse_bytes */
        void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            util_set_err(err, err_cap, "%s: mmap: %s", path, strerror(errno));
            close(fd);
            free(f);
            return -1;
        }
        f->map = map;
        f->map_len = (size_t)size;
    }
    close(fd);
    if (parse_bytes(f, path, f->map, size, err, err_cap) != 0) {
        safetensors_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

int safetensors_open_memory(const void *buf, size_t len, const char *name,
                            safetensors_file **out, char *err, size_t err_cap) {
    if (!name) name = "<memory>";
    safetensors_file *f = util_calloc(1, sizeof *f);
    if (!f) {
        util_set_err(err, err_cap, "%s: out of memory", name);
        return -1;
    }
    /* f->map stays NULL: the buffer is the caller's, never unmapped. */
    if (parse_bytes(f, name, buf, len, err, err_cap) != 0) {
        safetensors_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Writer                                                                     */
/* ------------------------------------------------------------------------- */

struct safetensors_writer {
    char *path;
    cJSON *header;        /* tensors in declaration order */
    cJSON *meta;          /* NULL until a metadata entry is added */
    uint64_t total;       /* bytes of data declared */
    uint64_t written;     /* bytes of data written */
    fsio_atomic_file out; /* the temp file; out.fp is NULL until begin_data */
    sha256_ctx sha;
};

int safetensors_writer_create(const char *path, safetensors_writer **out, char *err,
                              size_t err_cap) {
    safetensors_writer *w = util_calloc(1, sizeof *w);
    if (!w) goto oom;
    w->path = strdup(path);
    w->header = cJSON_CreateObject();
    if (!w->path || !w->header) goto oom;
    *out = w;
    return 0;
oom:
    util_set_err(err, err_cap, "%s: out of memory", path);
    safetensors_writer_abort(w);
    return -1;
}

int safetensors_writer_add_metadata(safetensors_writer *w, const char *key,
                                    const char *value, char *err, size_t err_cap) {
    if (w->out.fp) {
        util_set_err(err, err_cap, "%s: metadata after begin_data", w->path);
        return -1;
    }
    if (!w->meta) {
        w->meta = cJSON_CreateObject();
        if (!w->meta) goto oom;
    }
    if (cJSON_GetObjectItemCaseSensitive(w->meta, key)) {
        util_set_err(err, err_cap, "%s: duplicate metadata key '%s'", w->path, key);
        return -1;
    }
    if (!cJSON_AddStringToObject(w->meta, key, value)) goto oom;
    return 0;
oom:
    util_set_err(err, err_cap, "%s: out of memory", w->path);
    return -1;
}

int safetensors_writer_declare(safetensors_writer *w, const char *name, int dtype,
                               uint32_t ndim, const uint64_t *shape, char *err,
                               size_t err_cap) {
    if (w->out.fp) {
        util_set_err(err, err_cap, "%s: declare after begin_data", w->path);
        return -1;
    }
    if (!name || !*name || strcmp(name, "__metadata__") == 0) {
        util_set_err(err, err_cap, "%s: invalid tensor name '%s'", w->path,
                     name ? name : "");
        return -1;
    }
    if (dtype < 0 || dtype > SAFETENSORS_I32 || ndim > SAFETENSORS_MAX_DIMS) {
        util_set_err(err, err_cap, "%s: tensor '%s': unsupported dtype or rank", w->path,
                     name);
        return -1;
    }
    if (cJSON_GetObjectItemCaseSensitive(w->header, name)) {
        util_set_err(err, err_cap, "%s: duplicate tensor name '%s'", w->path, name);
        return -1;
    }
    uint64_t numel = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] && numel > (uint64_t)EXACT_MAX / shape[i]) {
            util_set_err(err, err_cap, "%s: tensor '%s': too large", w->path, name);
            return -1;
        }
        numel *= shape[i];
    }
    uint64_t nbytes = numel * safetensors_dtype_size(dtype);
    if (w->total + nbytes > (uint64_t)EXACT_MAX) {
        util_set_err(err, err_cap, "%s: file too large", w->path);
        return -1;
    }
    cJSON *e = cJSON_CreateObject();
    cJSON *js = cJSON_CreateArray();
    cJSON *jo = cJSON_CreateArray();
    if (!e || !js || !jo) {
        cJSON_Delete(e);
        cJSON_Delete(js);
        cJSON_Delete(jo);
        goto oom;
    }
    cJSON_AddItemToObject(e, "dtype", cJSON_CreateString(dtypes[dtype].name));
    for (uint32_t i = 0; i < ndim; i++)
        cJSON_AddItemToArray(js, cJSON_CreateNumber((double)shape[i]));
    cJSON_AddItemToObject(e, "shape", js);
    cJSON_AddItemToArray(jo, cJSON_CreateNumber((double)w->total));
    cJSON_AddItemToArray(jo, cJSON_CreateNumber((double)(w->total + nbytes)));
    cJSON_AddItemToObject(e, "data_offsets", jo);
    if (!cJSON_AddItemToObject(w->header, name, e)) {
        cJSON_Delete(e);
        goto oom;
    }
    w->total += nbytes;
    return 0;
oom:
    util_set_err(err, err_cap, "%s: out of memory", w->path);
    return -1;
}

static int put(safetensors_writer *w, const void *p, size_t n, char *err,
               size_t err_cap) {
    if (fsio_atomic_write(&w->out, p, n, err, err_cap) != 0) return -1;
    sha256_update(&w->sha, p, n);
    return 0;
}

int safetensors_writer_begin_data(safetensors_writer *w, char *err, size_t err_cap) {
    if (w->out.fp) {
        util_set_err(err, err_cap, "%s: begin_data called twice", w->path);
        return -1;
    }
    if (w->meta) {
        /* __metadata__ first, as other writers do. */
        cJSON *hdr = cJSON_CreateObject();
        if (!hdr) goto oom;
        cJSON_AddItemToObject(hdr, "__metadata__", w->meta);
        w->meta = NULL;
        while (w->header->child) {
            cJSON *it = w->header->child;
            char *key = strdup(it->string);
            if (!key) {
                cJSON_Delete(hdr);
                goto oom;
            }
            cJSON_DetachItemViaPointer(w->header, it);
            cJSON_AddItemToObject(hdr, key, it);
            free(key);
        }
        cJSON_Delete(w->header);
        w->header = hdr;
    }
    char *json = cJSON_PrintUnformatted(w->header);
    if (!json) goto oom;
    size_t jl = strlen(json);
    size_t padded = (jl + 7) & ~(size_t)7;
    if (fsio_atomic_open(&w->out, w->path, err, err_cap) != 0) {
        free(json);
        return -1;
    }
    setvbuf(w->out.fp, NULL, _IOFBF, 1 << 20);
    sha256_init(&w->sha);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int rc = put(w, len8, 8, err, err_cap);
    if (rc == 0) rc = put(w, json, jl, err, err_cap);
    free(json);
    static const char spaces[8] = "        ";
    if (rc == 0) rc = put(w, spaces, padded - jl, err, err_cap);
    return rc;
oom:
    util_set_err(err, err_cap, "%s: out of memory", w->path);
    return -1;
}

int safetensors_writer_write(safetensors_writer *w, const void *data, size_t bytes,
                             char *err, size_t err_cap) {
    if (!w->out.fp) {
        util_set_err(err, err_cap, "%s: write before begin_data", w->path);
        return -1;
    }
    if (bytes > w->total - w->written) {
        util_set_err(err, err_cap,
                     "%s: %zu bytes written past the declared %llu bytes of "
                     "tensor data",
                     w->path, bytes, (unsigned long long)w->total);
        return -1;
    }
    if (put(w, data, bytes, err, err_cap) != 0) return -1;
    w->written += bytes;
    return 0;
}

int safetensors_writer_finish(safetensors_writer *w, uint8_t sha256_out[32], char *err,
                              size_t err_cap) {
    int rc = -1;
    if (!w->out.fp && safetensors_writer_begin_data(w, err, err_cap) != 0) goto out;
    if (w->written != w->total) {
        util_set_err(err, err_cap,
                     "%s: only %llu of %llu declared data bytes were written", w->path,
                     (unsigned long long)w->written, (unsigned long long)w->total);
        goto out;
    }
    if (fsio_atomic_commit(&w->out, err, err_cap) != 0) goto out;
    if (sha256_out && sha256_final(&w->sha, sha256_out) != 0) {
        util_set_err(err, err_cap, "%s: SHA-256 failed (libcrypto)", w->path);
        goto out;
    }
    rc = 0;
out:
    safetensors_writer_abort(w);
    return rc;
}

void safetensors_writer_abort(safetensors_writer *w) {
    if (!w) return;
    fsio_atomic_abort(&w->out); /* a no-op after a commit */
    sha256_discard(&w->sha);
    free(w->path);
    cJSON_Delete(w->header);
    cJSON_Delete(w->meta);
    free(w);
}
