/*
 * cpu_kvq.h - storage type of the CPU engine's KV cache (engine option
 * kv=auto|f32|bf16|int8) and the attention kernels that read it.
 *
 * f32 stores K and V as computed. bf16 stores the upper half of each fp32
 * value rounded to nearest even (integer arithmetic on the bits, the same
 * in every kernel version; NaN stays a quiet NaN, the sign is kept): half
 * the bytes that decoding reads per position. The readers widen bf16 back
 * to fp32 exactly (a 16-bit shift) and compute in fp32 with the fp32 query
 * and probabilities, so the only loss is the rounding of K and V once when
 * stored (relative error <= 2^-9 per value).
 *
 * int8 stores each head vector (the hs values of one head, one position,
 * one layer, K or V) as hs signed bytes followed by one fp32 scale d (4
 * bytes, unaligned): d = max|x_i| / 127 over that head vector, q_i =
 * round-to-nearest-even(x_i * (1/d)) in [-127, 127] (symmetric, no zero
 * point; d = 0 stores zeros), so |x_i - q_i d| <= d/2 (plus the fp32
 * rounding of x_i * (1/d): < 2^-16 d). A head vector is hs + 4 bytes, ~27%
 * of f32 for hs 64. Non-finite values make d non-finite and the head
 * vector reads back NaN (as f32 would propagate them). The readers widen
 * q_i to fp32 in registers (exact) and compute with the fp32 query and
 * probabilities: scores = scale * d_p * dot(q, k_p), mix = sum_p (w_p d_p)
 * v_p, so the only loss is the storage rounding.
 *
 * Kernel versions: AVX-512F (even and odd bf16 lanes widened with a shift
 * and a mask, no shuffles; int8 sign-extended 16 bytes at a time, head
 * sizes a multiple of 16), else portable C that widens one head vector at a
 * time and calls the isa-dispatched fp32 dot/axpy of cpu_kernels.c (AVX2 or
 * scalar). Results of one version are deterministic; versions differ in the
 * order of the fp32 sums only. The int8 store gives the same bytes in every
 * version (integer max of the |x| bits, IEEE division, round to nearest
 * even).
 *
 * Thread rules: all functions are pure (no state); callers split the work.
 */
#ifndef ORCH_CPU_KVQ_H
#define ORCH_CPU_KVQ_H

#include <stddef.h>
#include <stdint.h>

enum { CPU_KV_F32 = 0, CPU_KV_BF16 = 1, CPU_KV_INT8 = 2 };

/* Bytes of one stored head vector of hs values: hs * 4 (f32), hs * 2
 * (bf16), hs + 4 (int8: the values, then the fp32 scale). Rows of the pool
 * hold kv_heads such vectors side by side. */
size_t cpu_kv_vec_bytes(int dtype, size_t hs);
/* "f32" / "bf16" / "int8". */
const char *cpu_kv_dtype_name(int dtype);

/* One fp32 value rounded to bf16 bits (to nearest even; NaN kept quiet). */
uint16_t cpu_kv_bf16_round(float v);

/* dst (nvec head vectors of dtype, cpu_kv_vec_bytes apart) = src (nvec * hs
 * floats), rounded for bf16, quantized per head vector for int8 (every
 * version gives the same bytes). */
void cpu_kv_put(int isa, int dtype, void *dst, const float *src, size_t nvec, size_t hs);
/* dst (nvec * hs floats) = src (nvec head vectors of dtype): widened
 * exactly (bf16), q_i * d (int8). */
void cpu_kv_get(int isa, int dtype, float *dst, const void *src, size_t nvec, size_t hs);

/* Scores of one query: out[p] = scale * dot(q, k[p]) for p < n, k[p] a head
 * vector of hs values of dtype (f32: cpu_attn_scores). */
void cpu_kv_scores(int isa, int dtype, const float *q, const void *const *k, size_t n,
                   size_t hs, float scale, float *out);
/* Scores of nh heads h0..h0+nh-1 of one query q (all heads, hs floats
 * each) against rows whose keys sit side by side (row[p]: position p's row,
 * all heads): sc[h * ldsc + p] = scale * dot(q_(h0+h), k_(h0+h)[p]). Reads
 * each row once for the group where the kernel allows (bf16 or int8,
 * AVX-512, hs 64); else head by head with cpu_kv_scores. tmp: n pointers of scratch. */
void cpu_kv_scores_heads(int isa, int dtype, const float *q, const void *const *row,
                         size_t n, size_t h0, size_t nh, size_t hs, float scale,
                         float *sc, size_t ldsc, const void **tmp);
/* Mix of one head: out[d] = sum_p w[p] v[p][d], d < hs (f32: cpu_attn_mix). */
void cpu_kv_mix(int isa, int dtype, const float *w, const void *const *v, size_t n,
                size_t hs, float *out);
/* Mix of nh heads h0..h0+nh-1 whose values sit side by side in each row:
 * out[(h0 + h) * hs + d] = sum_p sc[h * ldsc + p] row[p][(h0 + h) * hs + d]
 * (row[p] points at the start of position p's row, all heads). Reads each
 * row once for a group of heads where the kernel allows (bf16 or int8,
 * AVX-512, hs 64); else head by head. tmp: n pointers of scratch. */
void cpu_kv_mix_heads(int isa, int dtype, const float *sc, size_t ldsc,
                      const void *const *row, size_t n, size_t h0, size_t nh, size_t hs,
                      const void **tmp, float *out);

#endif
