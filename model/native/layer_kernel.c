/*
 * A transformer layer's head and tail around attention; see layer_kernel.h for the contract.
 *
 * The products are the quantized matmul's (on the pool); what lies between them (norms, bias
 * adds, RoPE, residuals) is a few thousand numbers a token at decode, done here in plain
 * loops on the calling thread: cheaper than waking the pool for them.
 */
#include "layer_kernel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "pool.h"
#include "qmm_kernel.h"

/* Scratch up to this size is the calling thread's kept buffer: a decode step's layers reuse
 * it rather than faulting in fresh pages at every call. A larger one (a long prompt chunk)
 * is allocated and freed, so what stays allocated is bounded. */
#define SCRATCH_KEPT ((size_t)1 << 20)

static float *scratch_get(size_t floats) {
  const size_t bytes = floats * sizeof(float);
  if (bytes <= SCRATCH_KEPT) return mlxcel_thread_buffer(MLXCEL_BUF_LAYER, SCRATCH_KEPT);
  return malloc(bytes);
}

static void scratch_put(float *p, size_t floats) {
  if (floats * sizeof(float) > SCRATCH_KEPT) free(p);
}

/* y = x W^T (+ bias) for `m` rows of x. */
static int linear(const mlxcel_qlinear *l, const float *x, long m, float *y) {
  int status = mlxcel_qmm(x, m, l->k, l->w, l->scales, l->biases, l->n, l->bits, l->group, y);
  if (status != 0 || l->bias == NULL) return status;
  for (long r = 0; r < m; r++)
    for (long j = 0; j < l->n; j++) y[r * l->n + j] += l->bias[j];
  return 0;
}

/* out = x * rsqrt(mean(x^2) + eps) * weight over `n` numbers (as mx.fast.rms_norm). */
static void rms_norm(const float *x, const float *weight, float eps, long n, float *out) {
  float sum = 0.0f;
  for (long i = 0; i < n; i++) sum += x[i] * x[i];
  const float inv = 1.0f / sqrtf(sum / (float)n + eps);
  for (long i = 0; i < n; i++) out[i] = x[i] * inv * weight[i];
}

/* cos and sin of theta_i = position * scale * base^(-i / (dims / 2)), i < dims / 2, as
 * mx.fast.rope computes them. */
static void rope_angles(const mlxcel_head_args *a, int32_t position, const float *inv_freq,
                        float *c, float *s) {
  const float pos = (float)position * a->rope_scale;
  for (long i = 0; i < a->rope_dims / 2; i++) {
    const float theta = pos * inv_freq[i];
    c[i] = cosf(theta);
    s[i] = sinf(theta);
  }
}

/* RoPE of `heads` heads of one token, in place: pairs (i, i + dims/2), or (2i, 2i+1) when
 * traditional, turned by the angles' cos `cs` and sin `ss`; numbers past `dims` untouched. */
static void rope(float *x, long heads, long head_dim, const mlxcel_head_args *a, const float *cs,
                 const float *ss) {
  const long half = a->rope_dims / 2;
  for (long i = 0; i < half; i++) {
    const float c = cs[i], s = ss[i];
    for (long hd = 0; hd < heads; hd++) {
      float *row = x + hd * head_dim;
      const long i1 = a->rope_traditional ? 2 * i : i;
      const long i2 = a->rope_traditional ? 2 * i + 1 : i + half;
      const float x1 = row[i1], x2 = row[i2];
      row[i1] = x1 * c - x2 * s;
      row[i2] = x1 * s + x2 * c;
    }
  }
}

static int head_ok(const mlxcel_head_args *a) {
  const long qw = a->q_heads * a->head_dim, kw = a->kv_heads * a->head_dim;
  return a->tokens >= 1 && a->q.k == a->dim && a->k.k == a->dim && a->v.k == a->dim &&
         a->q.n == qw && a->k.n == kw && a->v.n == kw && a->rope_dims >= 2 &&
         a->rope_dims % 2 == 0 && a->rope_dims <= a->head_dim &&
         (a->q_norm == NULL) == (a->k_norm == NULL);
}

int mlxcel_layer_head(const mlxcel_head_args *a, const float *h, float *q, float *k, float *v) {
  if (!head_ok(a)) return 1;
  const long t = a->tokens, d = a->head_dim, half = a->rope_dims / 2;
  const size_t floats = (size_t)(t * a->dim + 3 * half + d);
  float *x = scratch_get(floats);
  if (x == NULL) return 3;
  float *inv_freq = x + t * a->dim, *cs = inv_freq + half, *ss = cs + half, *tmp = ss + half;
  for (long r = 0; r < t; r++) rms_norm(h + r * a->dim, a->norm, a->eps, a->dim, x + r * a->dim);
  int status = linear(&a->q, x, t, q);
  if (status == 0) status = linear(&a->k, x, t, k);
  if (status == 0) status = linear(&a->v, x, t, v);
  if (status == 0) {
    const float log_base = logf(a->rope_base);
    for (long i = 0; i < half; i++) inv_freq[i] = expf(-(float)i * log_base / (float)half);
    for (long r = 0; r < t; r++) {
      float *qr = q + r * a->q_heads * d, *kr = k + r * a->kv_heads * d;
      if (a->q_norm != NULL) {
        for (long hd = 0; hd < a->q_heads; hd++) {
          rms_norm(qr + hd * d, a->q_norm, a->qk_eps, d, tmp);
          memcpy(qr + hd * d, tmp, sizeof(float) * (size_t)d);
        }
        for (long hd = 0; hd < a->kv_heads; hd++) {
          rms_norm(kr + hd * d, a->k_norm, a->qk_eps, d, tmp);
          memcpy(kr + hd * d, tmp, sizeof(float) * (size_t)d);
        }
      }
      rope_angles(a, a->positions[r], inv_freq, cs, ss);
      rope(qr, a->q_heads, d, a, cs, ss);
      rope(kr, a->kv_heads, d, a, cs, ss);
    }
  }
  scratch_put(x, floats);
  return status;
}

static int tail_ok(const mlxcel_tail_args *a) {
  return a->tokens >= 1 && a->o.n == a->dim && a->gate.k == a->dim && a->up.k == a->dim &&
         a->gate.n == a->inter && a->up.n == a->inter && a->down.k == a->inter &&
         a->down.n == a->dim;
}

int mlxcel_layer_tail(const mlxcel_tail_args *a, const float *h, const float *attn, float *out) {
  if (!tail_ok(a)) return 1;
  const long t = a->tokens, dim = a->dim, inter = a->inter;
  const size_t floats = (size_t)(2 * t * dim + 3 * t * inter);
  float *x = scratch_get(floats);
  if (x == NULL) return 3;
  float *y = x + t * dim, *g = y + t * dim, *u = g + t * inter, *s = u + t * inter;
  int status = linear(&a->o, attn, t, out);
  if (status == 0) {
    for (long i = 0; i < t * dim; i++) out[i] += h[i];
    for (long r = 0; r < t; r++) rms_norm(out + r * dim, a->norm, a->eps, dim, x + r * dim);
    status = linear(&a->gate, x, t, g);
  }
  if (status == 0) status = linear(&a->up, x, t, u);
  if (status == 0) {
    mlxcel_swiglu(g, u, s, t * inter);
    status = linear(&a->down, s, t, y);
  }
  if (status == 0)
    for (long i = 0; i < t * dim; i++) out[i] += y[i];
  scratch_put(x, floats);
  return status;
}
