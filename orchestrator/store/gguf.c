/*
 * gguf.c - validated mmap reader and streaming writer of GGUF v3 files, the
 * ggml type table (names, block sizes) and the F16/BF16/Q8_0 conversions.
 * See gguf.h.
 */
#include "orchestrator/store/gguf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
/* Refuse absurd tables before allocating for them (each entry also needs
 * bytes of the file, which bounds counts further). */
#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_KEY     65535

/* ---- types ------------------------------------------------------------- */

static const struct {
    const char *name;
    uint32_t block, bytes;
} ttypes[] = {
    [0] = { "F32", 1, 4 },       [1] = { "F16", 1, 2 },
    [2] = { "Q4_0", 32, 18 },    [3] = { "Q4_1", 32, 20 },
    [6] = { "Q5_0", 32, 22 },    [7] = { "Q5_1", 32, 24 },
    [8] = { "Q8_0", 32, 34 },    [9] = { "Q8_1", 32, 36 },
    [10] = { "Q2_K", 256, 84 },  [11] = { "Q3_K", 256, 110 },
    [12] = { "Q4_K", 256, 144 }, [13] = { "Q5_K", 256, 176 },
    [14] = { "Q6_K", 256, 210 }, [15] = { "Q8_K", 256, 292 },
    [16] = { "IQ2_XXS", 0, 0 },  [17] = { "IQ2_XS", 0, 0 },
    [18] = { "IQ3_XXS", 0, 0 },  [19] = { "IQ1_S", 0, 0 },
    [20] = { "IQ4_NL", 32, 18 }, [21] = { "IQ3_S", 0, 0 },
    [22] = { "IQ2_S", 0, 0 },    [23] = { "IQ4_XS", 256, 136 },
    [24] = { "I8", 1, 1 },       [25] = { "I16", 1, 2 },
    [26] = { "I32", 1, 4 },      [27] = { "I64", 1, 8 },
    [28] = { "F64", 1, 8 },      [29] = { "IQ1_M", 0, 0 },
    [30] = { "BF16", 1, 2 },     [34] = { "TQ1_0", 0, 0 },
    [35] = { "TQ2_0", 0, 0 },    [39] = { "MXFP4", 32, 17 },
};
#define N_TTYPES (sizeof ttypes / sizeof ttypes[0])

const char *gguf_type_name(uint32_t type) {
    return type < N_TTYPES ? ttypes[type].name : NULL;
}

void gguf_type_size(uint32_t type, uint32_t *block, uint32_t *bytes) {
    *block = type < N_TTYPES ? ttypes[type].block : 0;
    *bytes = type < N_TTYPES ? ttypes[type].bytes : 0;
}

uint64_t gguf_type_nbytes(uint32_t type, uint64_t n) {
    uint32_t blk, by;
    gguf_type_size(type, &blk, &by);
    if (blk == 0 || n % blk != 0) return 0;
    return n / blk * by;
}

static const char *const vtype_names[GGUF_VTYPE_COUNT] = {
    "u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
    "bool", "string", "array", "u64", "i64", "f64",
};
static const uint8_t vtype_size[GGUF_VTYPE_COUNT] = { 1, 1, 2, 2, 4, 4, 4,
                                                      1, 0, 0, 8, 8, 8 };

const char *gguf_vtype_name(uint32_t vtype) {
    return vtype < GGUF_VTYPE_COUNT ? vtype_names[vtype] : "?";
}

/* ---- conversions -------------------------------------------------------- */

uint16_t gguf_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or NaN (NaN keeps a quiet payload bit) */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | (ax >> 13) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
    if (ax < 0x38800000u) {                                   /* f16 subnormal or 0 */
        if (ax < 0x33000000u) return (uint16_t)sign;          /* below half the least */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24: value = m * 2^(e-150), unit 2^-24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax - 0x38000000u; /* rebias the exponent 127 -> 15 */
    uint32_t q = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) q++; /* may carry into exp */
    return (uint16_t)(sign | q);
}

float gguf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu,
             x;
    if (e == 0x1f) {
        x = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24 */
        return sign ? -v : v;
    } else {
        x = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

void gguf_quantize_q8_0(const float *src, uint8_t *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / GGUF_Q8_0_BLOCK; b++) {
        const float *x = src + b * GGUF_Q8_0_BLOCK;
        uint8_t *o = dst + b * GGUF_Q8_0_BYTES;
        float amax = 0;
        for (int i = 0; i < GGUF_Q8_0_BLOCK; i++)
            if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t dh = gguf_f32_to_f16(d);
        o[0] = (uint8_t)dh;
        o[1] = (uint8_t)(dh >> 8);
        for (int i = 0; i < GGUF_Q8_0_BLOCK; i++)
            o[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
    }
}

int gguf_to_f32(uint32_t type, const void *src, float *dst, uint64_t n) {
    const uint8_t *p = src;
    switch (type) {
    case GGUF_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case GGUF_TYPE_F16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = gguf_f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return 0;
    case GGUF_TYPE_BF16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return 0;
    case GGUF_TYPE_Q8_0:
        for (uint64_t b = 0; b < n / GGUF_Q8_0_BLOCK; b++) {
            const uint8_t *q = p + b * GGUF_Q8_0_BYTES;
            float d = gguf_f16_to_f32((uint16_t)(q[0] | q[1] << 8));
            for (int i = 0; i < GGUF_Q8_0_BLOCK; i++)
                dst[b * GGUF_Q8_0_BLOCK + i] = d * (float)(int8_t)q[2 + i];
        }
        return 0;
    default: return -1;
    }
}

/* ---- reader ------------------------------------------------------------- */

struct gguf_file {
    void *map; /* NULL for open_memory */
    size_t map_len;
    uint32_t version, alignment;
    gguf_kv *kv;
    size_t n_kv;
    gguf_tensor *t;
    size_t n_t;
    gguf_str *strs; /* every string value, by kv */
    char *names;    /* NUL-terminated copies of keys and tensor names */
    char *fname;    /* the file's name, for errors */
};

typedef struct cursor {
    const uint8_t *p, *end;
    const char *file;
    char *err;
    size_t err_cap;
} cursor;

static int need(cursor *c, uint64_t n, const char *what) {
    if (n <= (uint64_t)(c->end - c->p)) return 0;
    util_set_err(c->err, c->err_cap, "%s: truncated (%s runs past the end of the file)",
                 c->file, what);
    return -1;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what) {
    if (need(c, 4, what) != 0) return -1;
    memcpy(v, c->p, 4);
    c->p += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what) {
    if (need(c, 8, what) != 0) return -1;
    memcpy(v, c->p, 8);
    c->p += 8;
    return 0;
}

static int rd_str(cursor *c, gguf_str *s, const char *what) {
    if (rd_u64(c, &s->len, what) != 0 || need(c, s->len, what) != 0) return -1;
    s->p = (const char *)c->p;
    c->p += s->len;
    return 0;
}

/* Key or tensor name: non-empty, no NUL, bounded. */
static int name_ok(cursor *c, const gguf_str *s, const char *what, uint64_t index) {
    if (s->len > 0 && s->len <= GGUF_MAX_KEY && !memchr(s->p, 0, (size_t)s->len))
        return 0;
    util_set_err(c->err, c->err_cap, "%s: %s %llu: %s", c->file, what,
                 (unsigned long long)index,
                 s->len == 0             ? "empty name"
                 : s->len > GGUF_MAX_KEY ? "name too long"
                                         : "name holds a NUL byte");
    return -1;
}

/* A checked name copied into pool at *pos (NUL-terminated). */
static const char *keep_name(cursor *c, const gguf_str *s, char *pool, size_t *pos,
                             const char *what, uint64_t index) {
    if (name_ok(c, s, what, index) != 0) return NULL;
    char *d = pool + *pos;
    memcpy(d, s->p, (size_t)s->len);
    d[s->len] = '\0';
    *pos += (size_t)s->len + 1;
    return d;
}

/* Skip one value of type vt (not an array); strings go to strs[*ns]. */
static int skip_value(cursor *c, uint32_t vt, gguf_str *strs, size_t *ns,
                      const char *key) {
    if (vt == GGUF_STRING) {
        gguf_str s;
        if (rd_str(c, &s, key) != 0) return -1;
        if (strs) strs[*ns] = s;
        (*ns)++;
        return 0;
    }
    return need(c, vtype_size[vt], key) == 0 ? (c->p += vtype_size[vt], 0) : -1;
}

static int bad_vtype(cursor *c, const char *key, uint32_t vt, const char *what) {
    util_set_err(c->err, c->err_cap, "%s: key '%s': unknown %s type %u", c->file, key,
                 what, vt);
    return -1;
}

/* Parse the key/value section. Pass 1 (strs NULL) counts strings and name
 * bytes; pass 2 fills f. */
static int parse_kvs(cursor *c, uint64_t n_kv, gguf_file *f, gguf_str *strs,
                     size_t *n_strs, char *pool, size_t *pool_pos, size_t *name_bytes) {
    size_t ns = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_str ks;
        uint32_t vt;
        if (rd_str(c, &ks, "a key") != 0) return -1;
        const char *key = "?";
        char tmp[80];
        if (pool) {
            key = keep_name(c, &ks, pool, pool_pos, "key", i);
            if (!key) return -1;
        } else {
            if (name_ok(c, &ks, "key", i) != 0) return -1;
            *name_bytes += (size_t)ks.len + 1;
            snprintf(tmp, sizeof tmp, "%.*s", (int)(ks.len > 64 ? 64 : ks.len), ks.p);
            key = tmp;
        }
        if (rd_u32(c, &vt, key) != 0) return -1;
        if (vt >= GGUF_VTYPE_COUNT) return bad_vtype(c, key, vt, "value");
        gguf_kv *kv = f ? &f->kv[i] : NULL;
        if (kv) {
            kv->key = key;
            kv->type = vt;
            kv->n = 1;
            kv->data = c->p;
        }
        if (vt == GGUF_ARRAY) {
            uint32_t at;
            uint64_t n;
            if (rd_u32(c, &at, key) != 0 || rd_u64(c, &n, key) != 0) return -1;
            if (at >= GGUF_VTYPE_COUNT) return bad_vtype(c, key, at, "array element");
            if (at == GGUF_ARRAY) {
                util_set_err(c->err, c->err_cap,
                             "%s: key '%s': arrays of arrays are not supported", c->file,
                             key);
                return -1;
            }
            if (kv) {
                kv->arr_type = at;
                kv->n = n;
                kv->data = c->p;
                if (at == GGUF_STRING) kv->strs = strs + ns;
            }
            if (at == GGUF_STRING) {
                /* each string needs at least its 8-byte length */
                if (n > (uint64_t)(c->end - c->p) / 8) return need(c, UINT64_MAX, key);
                for (uint64_t k = 0; k < n; k++)
                    if (skip_value(c, at, strs, &ns, key) != 0) return -1;
            } else {
                if (n > (uint64_t)(c->end - c->p) / vtype_size[at])
                    return need(c, UINT64_MAX, key);
                c->p += n * vtype_size[at];
            }
        } else {
            if (kv && vt == GGUF_STRING) kv->strs = strs + ns;
            if (skip_value(c, vt, strs, &ns, key) != 0) return -1;
        }
    }
    *n_strs = ns;
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Duplicate names among n entries of stride bytes starting at the first
 * const char * field. */
static int check_unique(const char *file, const char *what, const void *base, size_t n,
                        size_t stride, char *err, size_t err_cap) {
    if (n < 2) return 0;
    const char **v = util_calloc(n, sizeof *v);
    if (!v) {
        util_set_err(err, err_cap, "%s: out of memory", file);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        memcpy(&v[i], (const char *)base + i * stride, sizeof v[i]);
    qsort(v, n, sizeof *v, cmp_str);
    for (size_t i = 1; i < n; i++)
        if (strcmp(v[i - 1], v[i]) == 0) {
            util_set_err(err, err_cap, "%s: duplicate %s '%s'", file, what, v[i]);
            free(v);
            return -1;
        }
    free(v);
    return 0;
}

static int cmp_off(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a,
                      *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int parse_tensor_info(cursor *c, gguf_tensor *t, uint64_t i, char *pool,
                             size_t *pool_pos) {
    gguf_str ns;
    if (rd_str(c, &ns, "a tensor name") != 0) return -1;
    t->name = keep_name(c, &ns, pool, pool_pos, "tensor", i);
    if (!t->name) return -1;
    if (rd_u32(c, &t->ndim, t->name) != 0) return -1;
    if (t->ndim < 1 || t->ndim > GGUF_MAX_DIMS) {
        util_set_err(c->err, c->err_cap, "%s: tensor '%s': %u dimensions (1..%d allowed)",
                     c->file, t->name, t->ndim, GGUF_MAX_DIMS);
        return -1;
    }
    t->numel = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (rd_u64(c, &t->ne[d], t->name) != 0) return -1;
        if (t->ne[d] == 0 || t->ne[d] > ((uint64_t)1 << 62) / t->numel) {
            util_set_err(c->err, c->err_cap, "%s: tensor '%s': dimension %u is %llu%s",
                         c->file, t->name, d, (unsigned long long)t->ne[d],
                         t->ne[d] ? " (too many elements)" : "");
            return -1;
        }
        t->numel *= t->ne[d];
    }
    if (rd_u32(c, &t->type, t->name) != 0 || rd_u64(c, &t->offset, t->name) != 0)
        return -1;
    uint32_t blk, by;
    gguf_type_size(t->type, &blk, &by);
    const char *tn = gguf_type_name(t->type);
    if (blk == 0) {
        if (tn)
            util_set_err(c->err, c->err_cap,
                         "%s: tensor '%s' has type %s, which orch cannot read", c->file,
                         t->name, tn);
        else
            util_set_err(c->err, c->err_cap, "%s: tensor '%s' has unknown type %u",
                         c->file, t->name, t->type);
        return -1;
    }
    if (t->ne[0] % blk != 0) {
        util_set_err(c->err, c->err_cap,
                     "%s: tensor '%s': row of %llu elements is not a whole number of "
                     "%s blocks (%u)",
                     c->file, t->name, (unsigned long long)t->ne[0], tn, blk);
        return -1;
    }
    t->nbytes = t->numel / blk * by;
    return 0;
}

static int parse_bytes(gguf_file *f, const char *file, const uint8_t *buf, size_t len,
                       char *err, size_t err_cap) {
    cursor c = { buf, buf + len, file, err, err_cap };
    uint32_t magic;
    uint64_t n_t, n_kv;
    if (len < 4 || (memcpy(&magic, buf, 4), magic != GGUF_MAGIC)) {
        util_set_err(err, err_cap, "%s: not a GGUF file (no GGUF magic)", file);
        return -1;
    }
    c.p += 4;
    if (rd_u32(&c, &f->version, "the header") != 0) return -1;
    if (f->version != 2 && f->version != 3) {
        util_set_err(err, err_cap, "%s: GGUF version %u is not supported (2 or 3)", file,
                     f->version);
        return -1;
    }
    if (rd_u64(&c, &n_t, "the header") != 0 || rd_u64(&c, &n_kv, "the header") != 0)
        return -1;
    /* every kv needs >= 12 bytes, every tensor info >= 28 */
    uint64_t rest = (uint64_t)(c.end - c.p);
    if (n_kv > rest / 12 || n_t > rest / 28 || n_t > GGUF_MAX_TENSORS) {
        util_set_err(err, err_cap,
                     "%s: header counts (%llu tensors, %llu keys) do not fit in the file",
                     file, (unsigned long long)n_t, (unsigned long long)n_kv);
        return -1;
    }
    /* Pass 1: sizes. */
    const uint8_t *kv_start = c.p;
    size_t n_strs = 0, name_bytes = 0;
    if (parse_kvs(&c, n_kv, NULL, NULL, &n_strs, NULL, NULL, &name_bytes) != 0) return -1;
    { /* Tensor name bytes, up to the first info that cannot be read: pass 2
       * reads the same bytes in the same order and refuses that info (or an
       * earlier one) with the real reason, so it never copies a name that is
       * not counted here (a name is counted as soon as it is read). */
        char scratch[256];
        cursor c2 = { c.p, c.end, file, scratch, sizeof scratch };
        for (uint64_t i = 0; i < n_t; i++) {
            gguf_str s;
            uint32_t nd;
            if (rd_str(&c2, &s, "a tensor name") != 0) break;
            name_bytes += (size_t)(s.len > GGUF_MAX_KEY ? 0 : s.len) + 1;
            if (rd_u32(&c2, &nd, "a tensor") != 0 || nd < 1 || nd > GGUF_MAX_DIMS ||
                need(&c2, (uint64_t)nd * 8 + 12, "a tensor") != 0)
                break;
            c2.p += (size_t)nd * 8 + 12;
        }
    }
    f->n_kv = (size_t)n_kv;
    f->n_t = (size_t)n_t;
    f->kv = util_calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
    f->t = util_calloc(f->n_t ? f->n_t : 1, sizeof *f->t);
    f->strs = util_calloc(n_strs ? n_strs : 1, sizeof *f->strs);
    f->names = malloc(name_bytes ? name_bytes : 1);
    if (!f->kv || !f->t || !f->strs || !f->names) {
        util_set_err(err, err_cap, "%s: out of memory", file);
        return -1;
    }
    /* Pass 2: fill. */
    c.p = kv_start;
    size_t pos = 0;
    if (parse_kvs(&c, n_kv, f, f->strs, &n_strs, f->names, &pos, &name_bytes) != 0)
        return -1;
    if (check_unique(file, "key", f->kv, f->n_kv, sizeof *f->kv, err, err_cap) != 0)
        return -1;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = gguf_find_kv(f, "general.alignment");
    if (al) {
        uint32_t a = 0;
        if (al->type == GGUF_U32) memcpy(&a, al->data, 4);
        if (al->type != GGUF_U32 || a == 0 || (a & (a - 1)) != 0 || a > (1u << 20)) {
            util_set_err(err, err_cap,
                         "%s: general.alignment must be a u32 power of two up to 2^20",
                         file);
            return -1;
        }
        f->alignment = a;
    }
    for (uint64_t i = 0; i < n_t; i++)
        if (parse_tensor_info(&c, &f->t[i], i, f->names, &pos) != 0) return -1;
    if (check_unique(file, "tensor", f->t, f->n_t, sizeof *f->t, err, err_cap) != 0)
        return -1;
    uint64_t hdr = (uint64_t)(c.p - buf);
    uint64_t data_off = (hdr + f->alignment - 1) / f->alignment * f->alignment;
    if (n_t > 0 && data_off > len) {
        util_set_err(err, err_cap, "%s: truncated (no data section)", file);
        return -1;
    }
    uint64_t data_len = data_off <= len ? len - data_off : 0;
    gguf_tensor **order = util_calloc(f->n_t ? f->n_t : 1, sizeof *order);
    if (!order) {
        util_set_err(err, err_cap, "%s: out of memory", file);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < f->n_t && rc == 0; i++) {
        gguf_tensor *t = &f->t[i];
        order[i] = t;
        if (t->offset % f->alignment != 0) {
            util_set_err(err, err_cap,
                         "%s: tensor '%s': offset %llu is not a multiple of the "
                         "alignment %u",
                         file, t->name, (unsigned long long)t->offset, f->alignment);
            rc = -1;
        } else if (t->offset > data_len || t->nbytes > data_len - t->offset) {
            util_set_err(err, err_cap,
                         "%s: tensor '%s': data [%llu, +%llu) runs past the end of the "
                         "file",
                         file, t->name, (unsigned long long)t->offset,
                         (unsigned long long)t->nbytes);
            rc = -1;
        } else {
            t->data = buf + data_off + t->offset;
        }
    }
    if (rc == 0 && f->n_t > 1) {
        qsort(order, f->n_t, sizeof *order, cmp_off);
        for (size_t i = 1; i < f->n_t && rc == 0; i++)
            if (order[i - 1]->offset + order[i - 1]->nbytes > order[i]->offset) {
                util_set_err(err, err_cap, "%s: tensors '%s' and '%s' overlap", file,
                             order[i - 1]->name, order[i]->name);
                rc = -1;
            }
    }
    free(order);
    return rc;
}

int gguf_open_memory(const void *buf, size_t len, const char *name, gguf_file **out,
                     char *err, size_t err_cap) {
    if (!name) name = "<memory>";
    gguf_file *f = util_calloc(1, sizeof *f);
    if (!f) {
        util_set_err(err, err_cap, "%s: out of memory", name);
        return -1;
    }
    if (!(f->fname = strdup(name))) {
        free(f);
        util_set_err(err, err_cap, "%s: out of memory", name);
        return -1;
    }
    if (parse_bytes(f, name, buf, len, err, err_cap) != 0) {
        gguf_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

int gguf_open(const char *path, gguf_file **out, char *err, size_t err_cap) {
    int fd;
    struct stat st;
    if (fsio_open_regular(path, &fd, &st, err, err_cap) != 0) return -1;
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            util_set_err(err, err_cap, "%s: mmap: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
    }
    close(fd);
    gguf_file *f = util_calloc(1, sizeof *f);
    if (!f) {
        util_set_err(err, err_cap, "%s: out of memory", path);
        if (map) munmap(map, size);
        return -1;
    }
    f->map = map;
    f->map_len = size;
    if (!(f->fname = strdup(path))) {
        util_set_err(err, err_cap, "%s: out of memory", path);
        gguf_close(f);
        return -1;
    }
    static const uint8_t empty[1];
    if (parse_bytes(f, path, map ? map : empty, size, err, err_cap) != 0) {
        gguf_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    free(f->kv);
    free(f->t);
    free(f->strs);
    free(f->names);
    free(f->fname);
    free(f);
}

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint32_t gguf_alignment(const gguf_file *f) { return f->alignment; }
size_t gguf_kv_count(const gguf_file *f) { return f->n_kv; }
size_t gguf_tensor_count(const gguf_file *f) { return f->n_t; }

const gguf_kv *gguf_kv_get(const gguf_file *f, size_t i) {
    return i < f->n_kv ? &f->kv[i] : NULL;
}

const gguf_tensor *gguf_tensor_get(const gguf_file *f, size_t i) {
    return i < f->n_t ? &f->t[i] : NULL;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    for (size_t i = 0; i < f->n_kv; i++)
        if (f->kv[i].key && strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (size_t i = 0; i < f->n_t; i++)
        if (f->t[i].name && strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

static int is_int_type(uint32_t t) {
    return t == GGUF_U8 || t == GGUF_I8 || t == GGUF_U16 || t == GGUF_I16 ||
           t == GGUF_U32 || t == GGUF_I32 || t == GGUF_U64 || t == GGUF_I64;
}

static int64_t int_at(uint32_t t, const uint8_t *p, int *neg_u64) {
    *neg_u64 = 0;
    switch (t) {
    case GGUF_U8: return p[0];
    case GGUF_I8: return (int8_t)p[0];
    case GGUF_U16: return (int64_t)(p[0] | p[1] << 8);
    case GGUF_I16: return (int16_t)(uint16_t)(p[0] | p[1] << 8);
    case GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > INT64_MAX) *neg_u64 = 1;
        return (int64_t)(v & INT64_MAX);
    }
    default: {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    }
}

int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i) {
    int big;
    return int_at(kv->arr_type, (const uint8_t *)kv->data + i * vtype_size[kv->arr_type],
                  &big);
}

static const char *file_name_of(const gguf_file *f) { return f->fname; }

int gguf_get_uint(const gguf_file *f, const char *key, uint64_t max, uint64_t *v,
                  char *err, size_t err_cap) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (!is_int_type(kv->type)) {
        util_set_err(err, err_cap, "%s: %s: expected an integer, found %s",
                     file_name_of(f), key, gguf_vtype_name(kv->type));
        return -1;
    }
    int big;
    int64_t x = int_at(kv->type, kv->data, &big);
    if (big || x < 0 || (uint64_t)x > max) {
        util_set_err(err, err_cap, "%s: %s: %s%lld is out of range (0..%llu)",
                     file_name_of(f), key, big ? ">" : "", (long long)x,
                     (unsigned long long)max);
        return -1;
    }
    *v = (uint64_t)x;
    return 1;
}

int gguf_get_float(const gguf_file *f, const char *key, double *v, char *err,
                   size_t err_cap) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type == GGUF_F32) {
        float x;
        memcpy(&x, kv->data, 4);
        *v = x;
    } else if (kv->type == GGUF_F64) {
        memcpy(v, kv->data, 8);
    } else {
        util_set_err(err, err_cap, "%s: %s: expected a float, found %s", file_name_of(f),
                     key, gguf_vtype_name(kv->type));
        return -1;
    }
    return 1;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *v, char *err,
                 size_t err_cap) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type != GGUF_STRING) {
        util_set_err(err, err_cap, "%s: %s: expected a string, found %s", file_name_of(f),
                     key, gguf_vtype_name(kv->type));
        return -1;
    }
    *v = kv->strs[0];
    return 1;
}

/* ---- writer ------------------------------------------------------------- */

typedef struct wtensor {
    char *name;
    uint32_t type, ndim;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes, offset;
} wtensor;

struct gguf_writer {
    char *path;
    uint8_t *kv; /* serialized key/values */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    char **keys;
    size_t keys_cap;
    wtensor *t;
    size_t n_t, t_cap;
    uint64_t total; /* data bytes incl. padding */
    uint64_t cur;   /* tensor being written */
    uint64_t done;  /* bytes of t[cur] written */
    int began;
    fsio_atomic_file out;
};

static int w_oom(gguf_writer *w, char *err, size_t err_cap) {
    util_set_err(err, err_cap, "%s: out of memory", w->path);
    return -1;
}

static int kv_put(gguf_writer *w, const void *p, size_t n) {
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_len + n) cap *= 2;
        uint8_t *b = realloc(w->kv, cap);
        if (!b) return -1;
        w->kv = b;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int kv_put_u32(gguf_writer *w, uint32_t v) { return kv_put(w, &v, 4); }
static int kv_put_u64(gguf_writer *w, uint64_t v) { return kv_put(w, &v, 8); }
static int kv_put_str(gguf_writer *w, const char *s, size_t n) {
    return kv_put_u64(w, n) != 0 || kv_put(w, s, n) != 0 ? -1 : 0;
}

/* Key check + the key and value type; records the key. */
static int kv_begin(gguf_writer *w, const char *key, uint32_t vt, char *err,
                    size_t err_cap) {
    if (w->began) {
        util_set_err(err, err_cap, "%s: key '%s' added after begin_data", w->path, key);
        return -1;
    }
    if (!key || !key[0]) {
        util_set_err(err, err_cap, "%s: empty key", w->path);
        return -1;
    }
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) {
            util_set_err(err, err_cap, "%s: duplicate key '%s'", w->path, key);
            return -1;
        }
    if (w->n_kv == w->keys_cap) {
        size_t cap = w->keys_cap ? 2 * w->keys_cap : 32;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k) return w_oom(w, err, err_cap);
        w->keys = k;
        w->keys_cap = cap;
    }
    w->keys[w->n_kv] = strdup(key);
    if (!w->keys[w->n_kv]) return w_oom(w, err, err_cap);
    w->n_kv++;
    if (kv_put_str(w, key, strlen(key)) != 0 || kv_put_u32(w, vt) != 0)
        return w_oom(w, err, err_cap);
    return 0;
}

int gguf_writer_create(const char *path, gguf_writer **out, char *err, size_t err_cap) {
    gguf_writer *w = util_calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        util_set_err(err, err_cap, "%s: out of memory", path);
        return -1;
    }
    if (gguf_writer_add_u32(w, "general.alignment", GGUF_DEFAULT_ALIGNMENT, err,
                            err_cap) != 0) {
        gguf_writer_abort(w);
        return -1;
    }
    *out = w;
    return 0;
}

int gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v, char *err,
                        size_t err_cap) {
    if (kv_begin(w, key, GGUF_U32, err, err_cap) != 0) return -1;
    return kv_put_u32(w, v) != 0 ? w_oom(w, err, err_cap) : 0;
}

int gguf_writer_add_f32(gguf_writer *w, const char *key, float v, char *err,
                        size_t err_cap) {
    if (kv_begin(w, key, GGUF_F32, err, err_cap) != 0) return -1;
    return kv_put(w, &v, 4) != 0 ? w_oom(w, err, err_cap) : 0;
}

int gguf_writer_add_bool(gguf_writer *w, const char *key, int v, char *err,
                         size_t err_cap) {
    if (kv_begin(w, key, GGUF_BOOL, err, err_cap) != 0) return -1;
    uint8_t b = v ? 1 : 0;
    return kv_put(w, &b, 1) != 0 ? w_oom(w, err, err_cap) : 0;
}

int gguf_writer_add_str(gguf_writer *w, const char *key, const char *v, char *err,
                        size_t err_cap) {
    if (kv_begin(w, key, GGUF_STRING, err, err_cap) != 0) return -1;
    return kv_put_str(w, v, strlen(v)) != 0 ? w_oom(w, err, err_cap) : 0;
}

int gguf_writer_add_str_array(gguf_writer *w, const char *key, const char *const *strs,
                              const size_t *lens, uint64_t n, char *err, size_t err_cap) {
    if (kv_begin(w, key, GGUF_ARRAY, err, err_cap) != 0) return -1;
    if (kv_put_u32(w, GGUF_STRING) != 0 || kv_put_u64(w, n) != 0)
        return w_oom(w, err, err_cap);
    for (uint64_t i = 0; i < n; i++)
        if (kv_put_str(w, strs[i], lens ? lens[i] : strlen(strs[i])) != 0)
            return w_oom(w, err, err_cap);
    return 0;
}

int gguf_writer_add_i32_array(gguf_writer *w, const char *key, const int32_t *v,
                              uint64_t n, char *err, size_t err_cap) {
    if (kv_begin(w, key, GGUF_ARRAY, err, err_cap) != 0) return -1;
    if (kv_put_u32(w, GGUF_I32) != 0 || kv_put_u64(w, n) != 0 ||
        (n && kv_put(w, v, (size_t)n * 4) != 0))
        return w_oom(w, err, err_cap);
    return 0;
}

int gguf_writer_add_f32_array(gguf_writer *w, const char *key, const float *v, uint64_t n,
                              char *err, size_t err_cap) {
    if (kv_begin(w, key, GGUF_ARRAY, err, err_cap) != 0) return -1;
    if (kv_put_u32(w, GGUF_F32) != 0 || kv_put_u64(w, n) != 0 ||
        (n && kv_put(w, v, (size_t)n * 4) != 0))
        return w_oom(w, err, err_cap);
    return 0;
}

static uint64_t align_up(uint64_t x) {
    return (x + GGUF_DEFAULT_ALIGNMENT - 1) / GGUF_DEFAULT_ALIGNMENT *
           GGUF_DEFAULT_ALIGNMENT;
}

int gguf_writer_declare(gguf_writer *w, const char *name, uint32_t type, uint32_t ndim,
                        const uint64_t *ne, char *err, size_t err_cap) {
    if (w->began || !name || !name[0] || strlen(name) > GGUF_MAX_KEY || ndim < 1 ||
        ndim > GGUF_MAX_DIMS) {
        util_set_err(err, err_cap, "%s: bad tensor declaration '%s'", w->path,
                     name ? name : "");
        return -1;
    }
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) {
            util_set_err(err, err_cap, "%s: duplicate tensor '%s'", w->path, name);
            return -1;
        }
    uint64_t n = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (ne[d] == 0 || ne[d] > ((uint64_t)1 << 62) / n) {
            util_set_err(err, err_cap, "%s: tensor '%s': bad dimension %u", w->path, name,
                         d);
            return -1;
        }
        n *= ne[d];
    }
    uint32_t blk, by;
    gguf_type_size(type, &blk, &by);
    if (blk == 0 || ne[0] % blk != 0) {
        if (blk == 0)
            util_set_err(err, err_cap, "%s: tensor '%s': type %u cannot be written",
                         w->path, name, type);
        else
            util_set_err(err, err_cap,
                         "%s: tensor '%s': type %s needs rows that are a multiple of %u",
                         w->path, name, gguf_type_name(type), blk);
        return -1;
    }
    if (w->n_t == w->t_cap) {
        size_t cap = w->t_cap ? 2 * w->t_cap : 64;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) return w_oom(w, err, err_cap);
        w->t = t;
        w->t_cap = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return w_oom(w, err, err_cap);
    t->type = type;
    t->ndim = ndim;
    memcpy(t->ne, ne, ndim * sizeof *ne);
    t->nbytes = n / blk * by;
    t->offset = w->total;
    w->total = align_up(w->total + t->nbytes);
    w->n_t++;
    return 0;
}

static int put(gguf_writer *w, const void *p, size_t n, char *err, size_t err_cap) {
    return fsio_atomic_write(&w->out, p, n, err, err_cap);
}

static int put_zeros(gguf_writer *w, uint64_t n, char *err, size_t err_cap) {
    static const uint8_t z[GGUF_DEFAULT_ALIGNMENT];
    return n ? put(w, z, (size_t)n, err, err_cap) : 0;
}

int gguf_writer_begin_data(gguf_writer *w, char *err, size_t err_cap) {
    if (w->began) {
        util_set_err(err, err_cap, "%s: begin_data called twice", w->path);
        return -1;
    }
    w->began = 1;
    if (fsio_atomic_open(&w->out, w->path, err, err_cap) != 0) return -1;
    setvbuf(w->out.fp, NULL, _IOFBF, 1 << 20);
    uint32_t hdr32[2] = { GGUF_MAGIC, GGUF_VERSION };
    uint64_t hdr64[2] = { w->n_t, w->n_kv };
    if (put(w, hdr32, 8, err, err_cap) != 0 || put(w, hdr64, 16, err, err_cap) != 0 ||
        put(w, w->kv, w->kv_len, err, err_cap) != 0)
        return -1;
    uint64_t pos = 24 + w->kv_len;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        uint64_t nl = strlen(t->name);
        if (put(w, &nl, 8, err, err_cap) != 0 || put(w, t->name, nl, err, err_cap) != 0 ||
            put(w, &t->ndim, 4, err, err_cap) != 0 ||
            put(w, t->ne, t->ndim * 8, err, err_cap) != 0 ||
            put(w, &t->type, 4, err, err_cap) != 0 ||
            put(w, &t->offset, 8, err, err_cap) != 0)
            return -1;
        pos += 8 + nl + 4 + 8 * t->ndim + 12;
    }
    w->cur = 0;
    w->done = 0;
    return put_zeros(w, align_up(pos) - pos, err, err_cap);
}

int gguf_writer_write(gguf_writer *w, const void *data, size_t bytes, char *err,
                      size_t err_cap) {
    const uint8_t *p = data;
    if (!w->began || !w->out.fp) {
        util_set_err(err, err_cap, "%s: write before begin_data", w->path);
        return -1;
    }
    while (bytes > 0) {
        if (w->cur >= w->n_t) {
            util_set_err(err, err_cap, "%s: more data than the tensors declared",
                         w->path);
            return -1;
        }
        const wtensor *t = &w->t[w->cur];
        uint64_t take = t->nbytes - w->done;
        if (take > bytes) take = bytes;
        if (put(w, p, (size_t)take, err, err_cap) != 0) return -1;
        p += take;
        bytes -= (size_t)take;
        w->done += take;
        if (w->done == t->nbytes) {
            uint64_t end = t->offset + t->nbytes;
            if (put_zeros(w, align_up(end) - end, err, err_cap) != 0) return -1;
            w->cur++;
            w->done = 0;
        }
    }
    return 0;
}

int gguf_writer_finish(gguf_writer *w, char *err, size_t err_cap) {
    int rc = -1;
    if (!w->began && gguf_writer_begin_data(w, err, err_cap) != 0) goto out;
    if (!w->out.fp) {
        util_set_err(err, err_cap, "%s: the file was never opened", w->path);
        goto out;
    }
    if (w->cur != w->n_t) {
        util_set_err(err, err_cap, "%s: tensor '%s' is missing data", w->path,
                     w->t[w->cur].name);
        goto out;
    }
    if (fsio_atomic_commit(&w->out, err, err_cap) != 0) goto out;
    rc = 0;
out:
    gguf_writer_abort(w);
    return rc;
}

void gguf_writer_abort(gguf_writer *w) {
    if (!w) return;
    if (w->began) fsio_atomic_abort(&w->out);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->kv);
    free(w->path);
    free(w);
}
