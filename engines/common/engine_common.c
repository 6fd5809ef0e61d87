/*
 * engine_common.c - engine-side code shared by the mock, cpu and cuda engines:
 * status strings, errors, the GPT-2 and LLaMA model rules, tables and
 * initialisation, RoPE frequencies,
 * AdamW constants, the options parser (see engine_common.h for the rules).
 * Messages here are part of the engines' behaviour: tests assert them, so
 * change them only with the tests.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sincos */
#endif
#include "engines/common/engine_common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ENGINE_PI 3.14159265358979323846

/* ------------------------------------------------------------------------- */
/* Status strings and errors                                                  */
/* ------------------------------------------------------------------------- */

const char *engine_status_string(int32_t status) {
    switch (status) {
    case ORCH_OK: return "ok";
    case ORCH_ERR_INVALID_ARGUMENT: return "invalid argument";
    case ORCH_ERR_OUT_OF_MEMORY: return "out of memory";
    case ORCH_ERR_UNSUPPORTED: return "unsupported";
    case ORCH_ERR_STATE: return "call out of order";
    case ORCH_ERR_CAPACITY: return "capacity exceeded";
    case ORCH_ERR_DEVICE: return "device error";
    case ORCH_ERR_NUMERIC: return "non-finite value";
    case ORCH_ERR_INTERNAL: return "internal error";
    default: return "unknown status";
    }
}

int32_t engine_fail_buf(char *err, size_t cap, int32_t status, const char *fmt, ...) {
    if (err && cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return status;
}

int32_t engine_fail_nonfinite_norm(char *err, size_t cap) {
    return engine_fail_buf(err, cap, ORCH_ERR_NUMERIC,
                           "optimizer_step: gradient norm is not finite (NaN/Inf "
                           "gradients); nothing changed");
}

/* ------------------------------------------------------------------------- */
/* Model description                                                          */
/* ------------------------------------------------------------------------- */

/* The llama-only members of *m (arch already checked): kv_heads, flags, rope.
 * Fills the defaults (kv_heads = heads, rope_theta 10000, rope_factor 1). */
static int32_t llama_normalise(orch_model_desc *m, char *err, size_t cap) {
    if (m->kv_heads == 0) m->kv_heads = m->heads;
    if (m->kv_heads > m->heads || m->heads % m->kv_heads != 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model kv_heads %u must divide heads %u", m->kv_heads,
                               m->heads);
    if ((m->width / m->heads) % 2 != 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model head size %u (width/heads) must be even for RoPE",
                               m->width / m->heads);
    if (m->flags & ~ORCH_MODEL_FLAG_UNTIED_HEAD)
        return engine_fail_buf(err, cap, ORCH_ERR_UNSUPPORTED,
                               "model flags 0x%x has bits this engine does not know",
                               m->flags);
    if (!(m->rope_theta >= 0.0f) || isinf(m->rope_theta))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model rope_theta must be a finite value >= 0");
    if (m->rope_theta == 0.0f) m->rope_theta = 10000.0f;
    if (m->rope_theta <= 1.0f)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model rope_theta %g must be > 1", (double)m->rope_theta);
    switch (m->rope_scaling) {
    case ORCH_ROPE_NONE:
        if (m->rope_factor != 0.0f || m->rope_low_freq_factor != 0.0f ||
            m->rope_high_freq_factor != 0.0f || m->rope_original_context != 0)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "model rope scaling parameters are set but "
                                   "rope_scaling is none");
        break;
    case ORCH_ROPE_LINEAR:
        if (m->rope_factor == 0.0f) m->rope_factor = 1.0f;
        if (!(m->rope_factor > 0.0f) || isinf(m->rope_factor))
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "model rope_factor must be finite and > 0");
        if (m->rope_low_freq_factor != 0.0f || m->rope_high_freq_factor != 0.0f ||
            m->rope_original_context != 0)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "model rope low/high_freq_factor and original_context "
                                   "belong to llama3 scaling, not linear");
        break;
    case ORCH_ROPE_LLAMA3:
        if (!(m->rope_factor > 0.0f) || isinf(m->rope_factor) ||
            !(m->rope_low_freq_factor > 0.0f) || isinf(m->rope_low_freq_factor) ||
            !(m->rope_high_freq_factor > m->rope_low_freq_factor) ||
            isinf(m->rope_high_freq_factor) || m->rope_original_context == 0)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "model llama3 rope scaling needs factor > 0, "
                                   "0 < low_freq_factor < high_freq_factor and "
                                   "original_context > 0");
        break;
    default:
        return engine_fail_buf(err, cap, ORCH_ERR_UNSUPPORTED,
                               "model rope_scaling %u is unknown (none 0, linear 1, "
                               "llama3 2)",
                               m->rope_scaling);
    }
    return ORCH_OK;
}

int32_t engine_model_normalise(const orch_model_desc *in, const engine_model_limits *lim,
                               orch_model_desc *out, char *err, size_t cap) {
    if (!in)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model description is NULL");
    const uint32_t need = (uint32_t)(offsetof(orch_model_desc, width) + sizeof(uint32_t));
    if (in->struct_size < need)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model description struct_size %u is too small (need "
                               "at least %u)",
                               in->struct_size, need);
    orch_model_desc m;
    memset(&m, 0, sizeof m);
    memcpy(&m, in, in->struct_size < sizeof m ? in->struct_size : sizeof m);
    m.struct_size = sizeof m;
    if (m.arch == ORCH_ARCH_LLAMA && !lim->llama)
        return engine_fail_buf(err, cap, ORCH_ERR_UNSUPPORTED,
                               "model arch %u (llama) is not supported by the %s "
                               "engine (gpt2 only)",
                               m.arch, lim->engine);
    if (m.arch != ORCH_ARCH_GPT2 && m.arch != ORCH_ARCH_LLAMA)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model arch %u is unknown (gpt2 is %u, llama %u)", m.arch,
                               (unsigned)ORCH_ARCH_GPT2, (unsigned)ORCH_ARCH_LLAMA);
    const struct {
        const char *name;
        uint32_t v, max;
    } dims[] = { { "vocab_size", m.vocab_size, lim->max_vocab },
                 { "context", m.context, lim->max_context },
                 { "layers", m.layers, lim->max_layers },
                 { "heads", m.heads, UINT32_MAX },
                 { "width", m.width, lim->max_width } };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].v == 0)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "model %s must be > 0", dims[i].name);
        if (dims[i].v > dims[i].max)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "model %s %u exceeds the %s engine's limit %u",
                                   dims[i].name, dims[i].v, lim->engine, dims[i].max);
    }
    if (m.width % m.heads != 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model heads (%u) must divide width (%u)", m.heads,
                               m.width);
    if (m.arch == ORCH_ARCH_GPT2) {
        if (m.kv_heads != 0 && m.kv_heads != m.heads)
            return engine_fail_buf(err, cap, ORCH_ERR_UNSUPPORTED,
                                   "model kv_heads %u differs from heads %u "
                                   "(grouped-query attention is not supported for gpt2)",
                                   m.kv_heads, m.heads);
        if (m.rope_theta != 0.0f || m.flags != 0 || m.rope_scaling != 0 ||
            m.rope_factor != 0.0f || m.rope_low_freq_factor != 0.0f ||
            m.rope_high_freq_factor != 0.0f || m.rope_original_context != 0)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "model rope_theta, flags and rope scaling apply to "
                                   "llama only (must be 0 for gpt2)");
        m.kv_heads = m.heads;
    } else {
        int32_t st = llama_normalise(&m, err, cap);
        if (st != ORCH_OK) return st;
    }
    if (m.mlp_width == 0) {
        if (m.width > UINT32_MAX / 4u)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "model width %u too large (4*width, the default "
                                   "mlp_width, overflows)",
                                   m.width);
        m.mlp_width = 4u * m.width;
    }
    if (m.mlp_width > lim->max_mlp_width)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model mlp_width %u exceeds the %s engine's limit %u",
                               m.mlp_width, lim->engine, lim->max_mlp_width);
    if (!(m.layernorm_eps >= 0.0f) || isinf(m.layernorm_eps))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model layernorm_eps must be a finite value >= 0");
    if (m.layernorm_eps == 0.0f) m.layernorm_eps = 1e-5f;
    uint64_t params;
    if (engine_model_param_count(&m, &params) != 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "model parameter count overflows 64 bits");
    *out = m;
    return ORCH_OK;
}

int engine_gpt2_param_count(const orch_model_desc *m, uint64_t *out) {
    const uint64_t C = m->width, V = m->vocab_size, T = m->context, M = m->mlp_width;
    uint64_t a, b, layer = 0, total;
    /* per layer: 2C + (3C*C + 3C) + (C*C + C) + 2C + (M*C + M) + (C*M + C) */
    if (__builtin_mul_overflow(3 * C, C, &a) || __builtin_add_overflow(layer, a, &layer))
        return -1;
    if (__builtin_mul_overflow(C, C, &a) || __builtin_add_overflow(layer, a, &layer))
        return -1;
    if (__builtin_mul_overflow(M, C, &a) || __builtin_mul_overflow(a, 2, &b) ||
        __builtin_add_overflow(layer, b, &layer))
        return -1;
    if (__builtin_add_overflow(layer, 9 * C + M, &layer)) return -1;
    if (__builtin_mul_overflow(layer, (uint64_t)m->layers, &total)) return -1;
    if (__builtin_mul_overflow(V, C, &a) || __builtin_add_overflow(total, a, &total))
        return -1;
    if (__builtin_mul_overflow(T, C, &a) || __builtin_add_overflow(total, a, &total))
        return -1;
    if (__builtin_add_overflow(total, 2 * C, &total)) return -1;
    *out = total;
    return 0;
}

int engine_llama_param_count(const orch_model_desc *m, uint64_t *out) {
    const uint64_t C = m->width, V = m->vocab_size, M = m->mlp_width;
    const uint64_t D = C / m->heads, KV = (uint64_t)m->kv_heads * D;
    uint64_t a, b, layer = 2 * C, total;
    /* per layer: 2C (norms) + C*C (q) + 2*KV*C (k, v) + C*C (o) + 3*M*C (mlp) */
    if (__builtin_mul_overflow(C, C, &a) || __builtin_mul_overflow(a, 2, &b) ||
        __builtin_add_overflow(layer, b, &layer))
        return -1;
    if (__builtin_mul_overflow(KV, C, &a) || __builtin_mul_overflow(a, 2, &b) ||
        __builtin_add_overflow(layer, b, &layer))
        return -1;
    if (__builtin_mul_overflow(M, C, &a) || __builtin_mul_overflow(a, 3, &b) ||
        __builtin_add_overflow(layer, b, &layer))
        return -1;
    if (__builtin_mul_overflow(layer, (uint64_t)m->layers, &total)) return -1;
    if (__builtin_mul_overflow(V, C, &a) || __builtin_add_overflow(total, a, &total))
        return -1;
    if ((m->flags & ORCH_MODEL_FLAG_UNTIED_HEAD) &&
        __builtin_add_overflow(total, a, &total))
        return -1;
    if (__builtin_add_overflow(total, C, &total)) return -1;
    *out = total;
    return 0;
}

int engine_model_param_count(const orch_model_desc *m, uint64_t *out) {
    return m->arch == ORCH_ARCH_LLAMA ? engine_llama_param_count(m, out)
                                      : engine_gpt2_param_count(m, out);
}

uint64_t engine_host_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return 0;
    return (uint64_t)pages * (uint64_t)page;
}

/* ------------------------------------------------------------------------- */
/* GPT-2 tensor table                                                         */
/* ------------------------------------------------------------------------- */

uint32_t engine_gpt2_tensor_count(uint32_t layers) {
    return 4u + ENGINE_GPT2_PER_LAYER * layers;
}

static void tensor_add(engine_tensor *t, uint32_t *n, uint64_t *offset, const char *name,
                       uint32_t ndim, uint64_t d0, uint64_t d1) {
    engine_tensor *x = &t[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ndim = ndim;
    x->shape[0] = d0;
    x->shape[1] = ndim > 1 ? d1 : 0;
    x->numel = ndim > 1 ? d0 * d1 : d0;
    x->flags = ndim == 1 ? ORCH_TENSOR_FLAG_NO_DECAY : 0;
    x->offset = *offset;
    *offset += x->numel;
}

uint64_t engine_gpt2_table_fill(engine_tensor *out, uint32_t layers, uint64_t V,
                                uint64_t T, uint64_t C, uint64_t M) {
    static const struct {
        const char *suffix;
        uint32_t ndim;
        int d0, d1; /* 1 = C, 3 = 3C, 4 = M */
    } spec[ENGINE_GPT2_PER_LAYER] = {
        { "ln_1.weight", 1, 1, 0 },        { "ln_1.bias", 1, 1, 0 },
        { "attn.c_attn.weight", 2, 3, 1 }, { "attn.c_attn.bias", 1, 3, 0 },
        { "attn.c_proj.weight", 2, 1, 1 }, { "attn.c_proj.bias", 1, 1, 0 },
        { "ln_2.weight", 1, 1, 0 },        { "ln_2.bias", 1, 1, 0 },
        { "mlp.c_fc.weight", 2, 4, 1 },    { "mlp.c_fc.bias", 1, 4, 0 },
        { "mlp.c_proj.weight", 2, 1, 4 },  { "mlp.c_proj.bias", 1, 1, 0 },
    };
    uint32_t n = 0;
    uint64_t off = 0;
    char name[ORCH_TENSOR_NAME_MAX];
    tensor_add(out, &n, &off, "wte.weight", 2, V, C);
    tensor_add(out, &n, &off, "wpe.weight", 2, T, C);
    for (uint32_t i = 0; i < layers; i++) {
        for (uint32_t k = 0; k < ENGINE_GPT2_PER_LAYER; k++) {
            uint64_t d[2];
            for (int a = 0; a < 2; a++) {
                int code = a == 0 ? spec[k].d0 : spec[k].d1;
                d[a] = code == 1 ? C : code == 3 ? 3 * C : code == 4 ? M : 0;
            }
            snprintf(name, sizeof name, "h.%u.%s", i, spec[k].suffix);
            tensor_add(out, &n, &off, name, spec[k].ndim, d[0], d[1]);
        }
    }
    tensor_add(out, &n, &off, "ln_f.weight", 1, C, 0);
    tensor_add(out, &n, &off, "ln_f.bias", 1, C, 0);
    return off;
}

uint32_t engine_llama_tensor_count(uint32_t layers, uint32_t flags) {
    return 2u + ENGINE_LLAMA_PER_LAYER * layers +
           ((flags & ORCH_MODEL_FLAG_UNTIED_HEAD) ? 1u : 0u);
}

uint64_t engine_llama_table_fill(engine_tensor *out, const orch_model_desc *m) {
    static const struct {
        const char *suffix;
        uint32_t ndim;
        int d0, d1; /* 1 = C, 2 = kv_heads*D, 4 = M */
    } spec[ENGINE_LLAMA_PER_LAYER] = {
        { "input_layernorm.weight", 1, 1, 0 },
        { "self_attn.q_proj.weight", 2, 1, 1 },
        { "self_attn.k_proj.weight", 2, 2, 1 },
        { "self_attn.v_proj.weight", 2, 2, 1 },
        { "self_attn.o_proj.weight", 2, 1, 1 },
        { "post_attention_layernorm.weight", 1, 1, 0 },
        { "mlp.gate_proj.weight", 2, 4, 1 },
        { "mlp.up_proj.weight", 2, 4, 1 },
        { "mlp.down_proj.weight", 2, 1, 4 },
    };
    const uint64_t C = m->width, M = m->mlp_width;
    const uint64_t KV = (uint64_t)m->kv_heads * (C / m->heads);
    uint32_t n = 0;
    uint64_t off = 0;
    char name[ORCH_TENSOR_NAME_MAX];
    tensor_add(out, &n, &off, "model.embed_tokens.weight", 2, m->vocab_size, C);
    for (uint32_t i = 0; i < m->layers; i++) {
        for (uint32_t k = 0; k < ENGINE_LLAMA_PER_LAYER; k++) {
            uint64_t d[2];
            for (int a = 0; a < 2; a++) {
                int code = a == 0 ? spec[k].d0 : spec[k].d1;
                d[a] = code == 1 ? C : code == 2 ? KV : code == 4 ? M : 0;
            }
            snprintf(name, sizeof name, "model.layers.%u.%s", i, spec[k].suffix);
            tensor_add(out, &n, &off, name, spec[k].ndim, d[0], d[1]);
        }
    }
    tensor_add(out, &n, &off, "model.norm.weight", 1, C, 0);
    if (m->flags & ORCH_MODEL_FLAG_UNTIED_HEAD)
        tensor_add(out, &n, &off, "lm_head.weight", 2, m->vocab_size, C);
    return off;
}

uint32_t engine_model_tensor_count(const orch_model_desc *m) {
    return m->arch == ORCH_ARCH_LLAMA ? engine_llama_tensor_count(m->layers, m->flags)
                                      : engine_gpt2_tensor_count(m->layers);
}

uint64_t engine_model_table_fill(engine_tensor *out, const orch_model_desc *m) {
    if (m->arch == ORCH_ARCH_LLAMA) return engine_llama_table_fill(out, m);
    return engine_gpt2_table_fill(out, m->layers, m->vocab_size, m->context, m->width,
                                  m->mlp_width);
}

void engine_rope_inv_freq(const orch_model_desc *m, float *out) {
    const uint32_t D = m->width / m->heads;
    const double theta = (double)m->rope_theta;
    for (uint32_t i = 0; i < D / 2; i++) {
        double f = 1.0 / pow(theta, (double)(2 * i) / (double)D);
        if (m->rope_scaling == ORCH_ROPE_LINEAR) {
            f /= (double)m->rope_factor;
        } else if (m->rope_scaling == ORCH_ROPE_LLAMA3) {
            const double factor = m->rope_factor, lo = m->rope_low_freq_factor;
            const double hi = m->rope_high_freq_factor, orig = m->rope_original_context;
            const double wavelen = 2.0 * ENGINE_PI / f;
            if (wavelen > orig / lo) {
                f /= factor;
            } else if (!(wavelen < orig / hi)) {
                const double smooth = (orig / wavelen - lo) / (hi - lo);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        out[i] = (float)f;
    }
}

void engine_tensor_info_fill(const engine_tensor *t, orch_tensor_info *out) {
    orch_tensor_info info;
    memset(&info, 0, sizeof info);
    size_t n = out->struct_size < sizeof info ? out->struct_size : sizeof info;
    info.struct_size = (uint32_t)n;
    info.dtype = ORCH_DTYPE_F32;
    info.ndim = t->ndim;
    info.flags = t->flags;
    info.shape[0] = t->shape[0];
    info.shape[1] = t->shape[1];
    info.numel = t->numel;
    info.offset = t->offset;
    memcpy(info.name, t->name, sizeof info.name);
    memcpy(out, &info, n);
}

/* ------------------------------------------------------------------------- */
/* GPT-2 initialisation                                                       */
/* ------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

double engine_gpt2_init_std(const engine_tensor *t, uint32_t layers) {
    if (ends_with(t->name, "attn.c_proj.weight") ||
        ends_with(t->name, "mlp.c_proj.weight") ||
        ends_with(t->name, "self_attn.o_proj.weight") ||
        ends_with(t->name, "mlp.down_proj.weight"))
        return 0.02 / sqrt(2.0 * (double)layers);
    return 0.02;
}

float engine_gpt2_init_value(const engine_tensor *t) {
    return ends_with(t->name, ".weight") ? 1.0f : 0.0f;
}

void engine_normal_pair(uint64_t x1, uint64_t x2, double std, float *a, float *b) {
    double r = sqrt(-2.0 * log(engine_unit(x1)));
    double th = 2.0 * ENGINE_PI * engine_unit(x2);
    double sn, cs;
    sincos(th, &sn, &cs); /* glibc: the same values as sin, cos */
    *a = (float)(std * r * cs);
    *b = (float)(std * r * sn);
}

/* ------------------------------------------------------------------------- */
/* AdamW constants                                                            */
/* ------------------------------------------------------------------------- */

void engine_adamw_consts_init(const orch_adamw_params *p, engine_adamw_consts *c) {
    const double t = (double)p->step;
    const double bc1 = 1.0 - pow((double)p->beta1, t);
    const double bc2 = 1.0 - pow((double)p->beta2, t);
    memset(c, 0, sizeof *c);
    c->beta1 = p->beta1;
    c->beta2 = p->beta2;
    c->one_minus_beta1 = 1.0f - p->beta1;
    c->one_minus_beta2 = 1.0f - p->beta2;
    c->decay = 1.0f;
    c->step_size = (float)((double)p->lr / bc1);
    c->inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
    c->eps = p->eps;
    c->gscale = 1.0f;
}

float engine_adamw_decay(const orch_adamw_params *p, uint32_t tensor_flags) {
    return (tensor_flags & ORCH_TENSOR_FLAG_NO_DECAY) ? 1.0f
                                                      : 1.0f - p->lr * p->weight_decay;
}

float engine_grad_clip_scale(const orch_adamw_params *p, double norm) {
    if (p->grad_clip > 0.0f && norm > (double)p->grad_clip)
        return (float)((double)p->grad_clip / norm);
    return 1.0f;
}

/* ------------------------------------------------------------------------- */
/* Options strings                                                            */
/* ------------------------------------------------------------------------- */

static int is_sep(char c) { return c == ',' || c == ';'; }
static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int engine_opts_next(const char **cursor, engine_opt_item *it) {
    const char *p = *cursor;
    while (*p && (is_sep(*p) || is_space(*p))) p++;
    if (!*p) {
        *cursor = p;
        return 0;
    }
    const char *start = p;
    while (*p && !is_sep(*p)) p++;
    const char *end = p;
    while (end > start && is_space(end[-1])) end--;
    size_t len = (size_t)(end - start);
    const char *eq = (const char *)memchr(start, '=', len);
    size_t klen = eq ? (size_t)(eq - start) : len;
    while (klen > 0 && is_space(start[klen - 1])) klen--;
    const char *v = eq ? eq + 1 : end;
    while (v < end && is_space(*v)) v++;
    it->item = start;
    it->item_len = len;
    it->key = start;
    it->key_len = klen;
    it->value = v;
    it->value_len = (size_t)(end - v);
    it->has_eq = eq != NULL;
    *cursor = p;
    return 1;
}

int engine_opt_is(const char *s, size_t len, const char *word) {
    return strlen(word) == len && memcmp(s, word, len) == 0;
}

int engine_parse_u64(const char *s, size_t len, uint64_t *out) {
    if (len == 0 || len > 19) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10u + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

/* Index of the value among the '|'-separated words, or -1. */
static int choice_index(const char *choices, const char *v, size_t len) {
    int k = 0;
    for (const char *w = choices;; k++) {
        const char *bar = strchr(w, '|');
        size_t wl = bar ? (size_t)(bar - w) : strlen(w);
        if (wl == len && memcmp(w, v, len) == 0) return k;
        if (!bar) return -1;
        w = bar + 1;
    }
}

/* "a|b|c" as "a, b or c". */
static void choice_text(const char *choices, char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (const char *w = choices; *w && used + 1 < cap;) {
        const char *bar = strchr(w, '|');
        size_t wl = bar ? (size_t)(bar - w) : strlen(w);
        const char *join = w == choices ? "" : strchr(w, '|') ? ", " : " or ";
        int n = snprintf(out + used, cap - used, "%s%.*s", join, (int)wl, w);
        if (n < 0) break;
        used += (size_t)n;
        if (!bar) break;
        w = bar + 1;
    }
}

static int32_t opt_value(const engine_opt_item *it, const char *engine,
                         const engine_opt_spec *sp, uint64_t *value, char *err,
                         size_t cap) {
    if (sp->choices) {
        int k = choice_index(sp->choices, it->value, it->value_len);
        if (k < 0) {
            char words[256];
            choice_text(sp->choices, words, sizeof words);
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "%s options: %s '%.*s' is not %s", engine, sp->key,
                                   (int)it->value_len, it->value, words);
        }
        *value = (uint64_t)k;
        return ORCH_OK;
    }
    uint64_t num = 0;
    if (engine_parse_u64(it->value, it->value_len, &num) || num < sp->min ||
        num > sp->max)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s options: %s '%.*s' is not an integer %llu..%llu",
                               engine, sp->key, (int)it->value_len, it->value,
                               (unsigned long long)sp->min, (unsigned long long)sp->max);
    *value = num;
    return ORCH_OK;
}

int32_t engine_opts_parse(const char *s, const char *engine, const engine_opt_spec *spec,
                          size_t n_spec, uint64_t *values, uint8_t *given, char *err,
                          size_t cap) {
    if (!s) return ORCH_OK;
    engine_opt_item it;
    while (engine_opts_next(&s, &it)) {
        if (!it.has_eq)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "%s options: '%.*s' is not key=value", engine,
                                   (int)it.item_len, it.item);
        size_t k = 0;
        while (k < n_spec && !engine_opt_is(it.key, it.key_len, spec[k].key)) k++;
        if (k == n_spec) {
            char keys[256] = "";
            size_t used = 0;
            for (size_t j = 0; j < n_spec && used < sizeof keys; j++) {
                int n = snprintf(keys + used, sizeof keys - used, "%s%s", j ? ", " : "",
                                 spec[j].key);
                if (n < 0) break;
                used += (size_t)n;
            }
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "%s options: unknown option '%.*s' (the %s engine "
                                   "knows %s)",
                                   engine, (int)it.key_len, it.key, engine, keys);
        }
        uint64_t v = 0;
        int32_t st = opt_value(&it, engine, &spec[k], &v, err, cap);
        if (st != ORCH_OK) return st;
        values[k] = v;
        given[k] = 1;
    }
    return ORCH_OK;
}
