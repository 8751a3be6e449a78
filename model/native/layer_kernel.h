/*
 * One transformer layer's position-independent work in two calls, for float32 activations
 * and MLX's affine-quantized weights (the layers of qwen2, qwen3 and llama).
 *
 *   mlxcel_layer_head:  x = rms_norm(h) * norm
 *                       q, k, v = x W_q^T (+ b_q), x W_k^T (+ b_k), x W_v^T (+ b_v)
 *                       q, k = rms_norm per head (qwen3's q_norm, k_norm; optional)
 *                       q, k = RoPE at each token's position (as mx.fast.rope)
 *   mlxcel_layer_tail:  h1 = h + attn W_o^T (+ b_o)
 *                       x = rms_norm(h1) * norm
 *                       out = h1 + (silu(x W_g^T) * (x W_u^T)) W_d^T   (each + its bias)
 *
 * Why: between a decode step's weight products sit ~20 small MLX operations a layer (norms,
 * bias adds, reshapes, RoPE, residuals), each a graph node with its own dispatch; at a few
 * rows they cost as much as the products. Here they are plain loops between direct calls
 * of the quantized matmul (qmm_kernel.h) and SwiGLU (attn_kernel.h), on the one pool.
 *
 * Layouts (row-major, contiguous): h, attn, out [tokens][dim]; q [tokens][q_heads][head_dim];
 * k, v [tokens][kv_heads][head_dim]; positions int32 [tokens]. The weights are read where
 * they are (no copy); scratch up to 1 MiB is the calling thread's kept buffer (pool.h), more
 * is allocated per call and freed before it returns.
 */
#ifndef MLXCEL_LAYER_KERNEL_H
#define MLXCEL_LAYER_KERNEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One quantized linear map: out[n] = sum_k x[k] W[n][k] (+ bias[n]); see qmm_kernel.h. */
typedef struct {
  const uint32_t *w;
  const float *scales, *biases;
  const float *bias; /* [n] or NULL */
  long n, k;
  int bits, group;
} mlxcel_qlinear;

typedef struct {
  long tokens, dim, q_heads, kv_heads, head_dim;
  const float *norm;
  float eps;
  mlxcel_qlinear q, k, v;
  const float *q_norm, *k_norm; /* [head_dim] each, or both NULL */
  float qk_eps;
  const int32_t *positions;
  long rope_dims;
  float rope_base, rope_scale;
  int rope_traditional;
} mlxcel_head_args;

typedef struct {
  long tokens, dim, inter;
  mlxcel_qlinear o, gate, up, down;
  const float *norm;
  float eps;
} mlxcel_tail_args;

/* 0 on success; nonzero for shapes or parameters it does not take, or out of memory
 * (the outputs are unspecified then). */
int mlxcel_layer_head(const mlxcel_head_args *a, const float *h, float *q, float *k, float *v);
int mlxcel_layer_tail(const mlxcel_tail_args *a, const float *h, const float *attn, float *out);

#ifdef __cplusplus
}
#endif

#endif /* MLXCEL_LAYER_KERNEL_H */
