/*
 * CPU attention and SwiGLU for float32, with a vectorised exp.
 *
 * mlxcel_attention computes what mx.fast.scaled_dot_product_attention
 * computes on MLX's CPU backend:
 *
 *   out = softmax(scale * q k^T + mask) v
 *
 *   q    [B][Hq][L][Dk]   k [B][Hkv][S][Dk]   v [B][Hkv][S][Dv]
 *   out  [B][Hq][L][Dv]   written contiguous, never read
 *
 * Hq is a multiple of Hkv (query head h reads key head h / (Hq / Hkv)). The
 * last axis of q, k and v must be contiguous; the other three axes take any
 * element strides (a KV cache's slice, a transposed projection).
 *
 * Masks, as MLX's own:
 *   MLXCEL_MASK_NONE      every key is seen;
 *   MLXCEL_MASK_CAUSAL    query i (at position S - L + i) sees keys j <= S - L + i;
 *   MLXCEL_MASK_BOOL      uint8 [B][Hq][L][S] by strides (0 for a broadcast axis),
 *                         nonzero = attend;
 *   MLXCEL_MASK_ADDITIVE  float32, same layout, added to the scaled scores.
 * A row that sees no key at all (causal or boolean) gets the mean of v over
 * all S keys, which is what MLX's where(mask, scores, float32 min) followed
 * by a softmax gives; an additive row of only -inf gives NaN, as MLX's does.
 *
 * Results equal MLX's within float32 rounding (blockwise "online" softmax:
 * the sums are taken in another order). Work is split over blocks of query
 * rows on the process's one thread pool (pool.h); calls from several threads
 * at once each get the right answer (one on the pool, the others alone).
 */
#ifndef MLXCEL_ATTN_KERNEL_H
#define MLXCEL_ATTN_KERNEL_H

#ifdef __cplusplus
extern "C" {
#endif

enum { MLXCEL_MASK_NONE = 0, MLXCEL_MASK_CAUSAL = 1, MLXCEL_MASK_BOOL = 2, MLXCEL_MASK_ADDITIVE = 3 };

typedef struct {
  const float *q, *k, *v;
  long q_strides[3]; /* b, h, l in elements (the last axis is contiguous) */
  long k_strides[3]; /* b, h, s */
  long v_strides[3]; /* b, h, s */
  const void *mask;  /* MLXCEL_MASK_BOOL or _ADDITIVE only */
  long mask_strides[4]; /* b, h, l, s */
  int mask_kind;
  long batch, q_heads, kv_heads, q_len, k_len, k_dim, v_dim;
  float scale;
  float *out;
} mlxcel_attn_args;

/* Returns 0 on success, nonzero for arguments it does not take (out untouched). */
int mlxcel_attention(const mlxcel_attn_args *args);

/* out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], i < n;
 * contiguous arrays (out may alias neither input). */
void mlxcel_swiglu(const float *gate, const float *up, float *out, long n);

#ifdef __cplusplus
}
#endif

#endif /* MLXCEL_ATTN_KERNEL_H */
