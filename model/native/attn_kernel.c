/*
 * CPU attention and SwiGLU for float32; see attn_kernel.h for the contract.
 *
 * Why a kernel of our own: MLX's CPU backend (the PyPI build on x86) runs
 * element-wise ops as scalar code on one thread, exp at ~13 ns an element, so
 * the softmax of a prompt chunk's attention costs more than its two products.
 * Here the scores never leave the L1 cache: per block of R query rows and BK
 * keys, the scores are computed, masked, exponentiated (a polynomial exp,
 * vectorised) and multiplied into the output at once ("flash" attention with
 * an online softmax), on every core.
 *
 * Layout of a block: the R rows of one KV head (rows taken query-position
 * major: row r is query position r / rep of query head r % rep, so one block
 * holds every query head that reads the same keys, and causal blocks stay
 * narrow). The scaled queries are packed transposed (Qt[d][r]), so a score
 * tile is up to RV vectors of VL rows by NK keys, each step one vector of Qt
 * times a broadcast key element.
 * The scores are kept transposed too (St[j][r]): the softmax's row maxima and
 * sums are then element-wise across key vectors, with no horizontal step.
 * The product with v is a register tile of MR rows by NV vectors of v.
 *
 * Build: one source, the instruction set chosen when compiling, with the
 * vector operations of simd.h (AVX-512 F/BW/VL + FMA, AVX2 + FMA, or portable C
 * with GCC vector extensions). The exp is the same algorithm in all three: n =
 * round(x log2 e), r = x - n ln 2 (two-part ln 2), a degree-7 polynomial
 * (Cephes' expf, ~1 ulp), times 2^n (AVX-512: scalef; else two exponent
 * halves, so that results up to the overflow to inf are right). Results below
 * FLT_MIN are 0: no denormals, which Intel cores compute slowly.
 */
#define _GNU_SOURCE
#include "attn_kernel.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "simd.h"

#define EXP_HI 89.0f  /* above: inf (2^128 overflows) */
#define EXP_LO -87.33f /* below: 0, not a denormal (e^-87.34 < FLT_MIN) */
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define BK 64 /* keys per block */

/* ------------------------------------------------------------------------
 * Tiles per instruction set (simd.h gives VL lanes): RV row vectors per block
 * (R = RV * VL rows), NK keys per score tile, MR rows by NV vectors per
 * product tile.
 * ------------------------------------------------------------------------ */
#if defined(MLXCEL_SIMD_AVX512)
#define RV 3
#define NK 8
#define MR 6
#define NV 4
#elif defined(MLXCEL_SIMD_AVX2)
#define RV 3
#define NK 4
#define MR 3
#define NV 4
#else
#define RV 4
#define NK 2
#define MR 2
#define NV 4
#endif

#define R (RV * VL) /* query rows per block */

INLINE vf v_exp(vf x_in) {
  const vf x = v_max(v_set1(EXP_LO), v_min(v_set1(EXP_HI), x_in));
  const vf n = v_round(v_mul(x, v_set1(LOG2E)));
  vf r = v_fma(n, v_set1(-LN2_HI), x);
  r = v_fma(n, v_set1(-LN2_LO), r);
  vf p = v_set1(1.9875691500e-4f);
  p = v_fma(p, r, v_set1(1.3981999507e-3f));
  p = v_fma(p, r, v_set1(8.3334519073e-3f));
  p = v_fma(p, r, v_set1(4.1665795894e-2f));
  p = v_fma(p, r, v_set1(1.6666665459e-1f));
  p = v_fma(p, r, v_set1(5.0000001201e-1f));
  p = v_add(v_fma(p, v_mul(r, r), r), v_set1(1.0f));
  /* Results under FLT_MIN are flushed to 0: computing a denormal costs a microcode
   * assist (~100 cycles) on Intel cores, and masked scores (-inf) are common. */
  return v_lt(x_in, v_set1(EXP_LO), v_set1(0.0f), v_scale2(p, n));
}

/* f on n floats of x into y, the tail through a padded vector. */
#define MAP_TAIL(n, body)                                                                 \
  do {                                                                                    \
    long i_ = 0;                                                                          \
    for (; i_ + VL <= (n); i_ += VL) body(i_, VL);                                        \
    if (i_ < (n)) body(i_, (n)-i_);                                                       \
  } while (0)

INLINE vf v_load_n(const float *p, long n) {
  if (n == VL) return v_load(p);
  float t[VL] = {0};
  memcpy(t, p, (size_t)n * sizeof(float));
  return v_load(t);
}
INLINE void v_store_n(float *p, vf v, long n) {
  if (n == VL) return v_store(p, v);
  float t[VL];
  v_store(t, v);
  memcpy(p, t, (size_t)n * sizeof(float));
}

/* ------------------------------------------------------------------------
 * SwiGLU: element-wise, in chunks over the pool.
 * ------------------------------------------------------------------------ */
typedef struct {
  const float *g, *u;
  float *o;
} swiglu_t;

static void swiglu_range(void *ctx, long i0, long i1) {
  const swiglu_t *s = ctx;
  const float *g = s->g + i0, *u = s->u + i0;
  float *o = s->o + i0;
  const vf one = v_set1(1.0f), zero = v_set1(0.0f);
  /* g / (1 + e^-g) * u: for g << 0 the exp overflows to inf and the quotient is
   * a signed zero, as silu's is; dividing first keeps a huge u from g*u = inf. */
#define SWIGLU_BODY(i, c)                                                                 \
  do {                                                                                    \
    const vf gv = v_load_n(g + (i), (c));                                                 \
    const vf e = v_exp(v_sub(zero, gv));                                                  \
    v_store_n(o + (i), v_mul(v_div(gv, v_add(one, e)), v_load_n(u + (i), (c))), (c));     \
  } while (0)
  MAP_TAIL(i1 - i0, SWIGLU_BODY);
#undef SWIGLU_BODY
}

void mlxcel_swiglu(const float *gate, const float *up, float *out, long n) {
  swiglu_t s = {gate, up, out};
  mlxcel_pool_for(swiglu_range, &s, n, 8192, n >= (1L << 16) ? MLXCEL_POOL_WAKE : 0);
}

/* ------------------------------------------------------------------------
 * Attention tiles.
 * ------------------------------------------------------------------------ */

/* St[kk][r] (kk < NK, r < rv * VL) = sum_d Qt[d][r] * kp[kk][d]. */
INLINE void qk_tile(const float *Qt, long D, const float *const *kp, float *st, const int rv) {
  vf acc[RV][NK];
#pragma GCC unroll 8
  for (int r = 0; r < rv; r++)
#pragma GCC unroll 8
    for (int kk = 0; kk < NK; kk++) acc[r][kk] = v_set1(0.0f);
  for (long d = 0; d < D; d++) {
    vf q[RV];
#pragma GCC unroll 8
    for (int r = 0; r < rv; r++) q[r] = v_load(Qt + d * R + r * VL);
#pragma GCC unroll 8
    for (int kk = 0; kk < NK; kk++) {
      const vf kb = v_set1(kp[kk][d]);
#pragma GCC unroll 8
      for (int r = 0; r < rv; r++) acc[r][kk] = v_fma(q[r], kb, acc[r][kk]);
    }
  }
#pragma GCC unroll 8
  for (int kk = 0; kk < NK; kk++)
#pragma GCC unroll 8
    for (int r = 0; r < rv; r++) v_store(st + kk * R + r * VL, acc[r][kk]);
}

/* O[rr][0, nv * VL) = alpha[rr] * O[rr] + sum_j St[j][rr] * v[j], rr < MR. */
INLINE void pv_tile(float *O, long ldo, const float *alpha, const float *st, const float *v,
                    long vss, int nk, const int nv) {
  vf acc[MR][NV];
#pragma GCC unroll 8
  for (int rr = 0; rr < MR; rr++) {
    const vf al = v_set1(alpha[rr]);
#pragma GCC unroll 8
    for (int n = 0; n < nv; n++) acc[rr][n] = v_mul(v_load(O + rr * ldo + n * VL), al);
  }
  for (int j = 0; j < nk; j++) {
    vf vv[NV];
#pragma GCC unroll 8
    for (int n = 0; n < nv; n++) vv[n] = v_load(v + j * vss + n * VL);
#pragma GCC unroll 8
    for (int rr = 0; rr < MR; rr++) {
      const vf p = v_set1(st[j * R + rr]);
#pragma GCC unroll 8
      for (int n = 0; n < nv; n++) acc[rr][n] = v_fma(p, vv[n], acc[rr][n]);
    }
  }
#pragma GCC unroll 8
  for (int rr = 0; rr < MR; rr++)
#pragma GCC unroll 8
    for (int n = 0; n < nv; n++) v_store(O + rr * ldo + n * VL, acc[rr][n]);
}

static void qk_any(const float *Qt, long D, const float *const *kp, float *st, int rv) {
  switch (rv) { /* constant row counts: the tile's loops unroll, accumulators in registers */
  case 1: qk_tile(Qt, D, kp, st, 1); break;
  case 2: qk_tile(Qt, D, kp, st, 2); break;
  case 3: qk_tile(Qt, D, kp, st, 3); break;
#if RV > 3
  default: qk_tile(Qt, D, kp, st, RV); break;
#endif
  }
}

static void pv_any(float *O, long ldo, const float *alpha, const float *st, const float *v,
                   long vss, int nk, int nv) {
  switch (nv) {
  case 1: pv_tile(O, ldo, alpha, st, v, vss, nk, 1); break;
  case 2: pv_tile(O, ldo, alpha, st, v, vss, nk, 2); break;
  case 3: pv_tile(O, ldo, alpha, st, v, vss, nk, 3); break;
  default: pv_tile(O, ldo, alpha, st, v, vss, nk, NV); break;
  }
}

/* ------------------------------------------------------------------------
 * One block: up to R query rows of one KV head against its keys.
 * ------------------------------------------------------------------------ */
typedef struct {
  const mlxcel_attn_args *a;
  long rep, rows, nrb, groups; /* rows per (batch, KV head); row blocks; batch * KV heads */
  int failed;
} plan_t;

typedef struct {
  float *Qt, *O, *St, *m, *l, *alpha, *pos, *mean;
  const char *mrow[R]; /* each row's mask row (boolean or additive masks) */
  long head[R], qpos[R];
  long nr, nrv, pv_rows; /* rows; row vectors scored; rows multiplied into O */
  float minpos, maxpos;  /* causal: the rows' positions */
} block_t;

static float *thread_scratch(size_t floats) {
  return mlxcel_thread_buffer(MLXCEL_BUF_ATTN, floats * sizeof(float));
}

#define ONES8 0x0101010101010101ULL
#define HAS_ZERO_BYTE(w) (((w)-ONES8) & ~(w)&0x8080808080808080ULL)

/* One past the last key of [0, nk) that row mask m sees (0: none). */
static long last_seen(const uint8_t *m, long nk, long ss) {
  long j = nk;
  while (j > 0 && !m[(j - 1) * ss]) j--;
  return j;
}

/* 0: no row sees a key of [j0, j0 + *nk); 1: every row sees them all; 2: mixed,
 * and then *nk is cut to one past the last key any row sees. Whole-block word
 * checks first: most blocks are all seen. */
static int bool_status(const block_t *B, long j0, long *nk, long ss) {
  uint64_t zero = 0, any = 0;
  for (long lr = 0; lr < B->nr; lr++) {
    const uint8_t *m = (const uint8_t *)B->mrow[lr] + j0 * ss;
    long j = 0;
    if (ss == 1)
      for (; j + 8 <= *nk; j += 8) {
        uint64_t w;
        memcpy(&w, m + j, 8);
        zero |= HAS_ZERO_BYTE(w);
        any |= w;
      }
    for (; j < *nk; j++) {
      zero |= m[j * ss] == 0;
      any |= m[j * ss];
    }
  }
  if (!any) return 0;
  if (!zero) return 1;
  long last = 0;
  for (long lr = 0; lr < B->nr && last < *nk; lr++) {
    const long row_last = last_seen((const uint8_t *)B->mrow[lr] + j0 * ss, *nk, ss);
    last = row_last > last ? row_last : last;
  }
  *nk = last;
  return 2;
}

static void apply_mask(const block_t *B, const mlxcel_attn_args *a, long j0, long nk) {
  const long ss = a->mask_strides[3];
  float *St = B->St;
  if (a->mask_kind == MLXCEL_MASK_CAUSAL) {
    const vf ninf = v_set1(-INFINITY);
    for (long j = 0; j < nk; j++) {
      if ((float)(j0 + j) <= B->minpos) continue;
      const vf jf = v_set1((float)(j0 + j));
      for (long r = 0; r < B->nrv; r++) {
        float *s = St + j * R + r * VL;
        v_store(s, v_lt(v_load(B->pos + r * VL), jf, ninf, v_load(s)));
      }
    }
  } else if (a->mask_kind == MLXCEL_MASK_BOOL) {
    for (long lr = 0; lr < B->nr; lr++) {
      const uint8_t *m = (const uint8_t *)B->mrow[lr] + j0 * ss;
      long j = 0;
      if (ss == 1) /* skip runs of eight keys the row sees */
        for (uint64_t w; j + 8 <= nk; j += 8) {
          memcpy(&w, m + j, 8);
          if (!HAS_ZERO_BYTE(w)) continue;
          for (long t = j; t < j + 8; t++)
            if (!m[t]) St[t * R + lr] = -INFINITY;
        }
      for (; j < nk; j++)
        if (!m[j * ss]) St[j * R + lr] = -INFINITY;
    }
  } else {
    for (long lr = 0; lr < B->nr; lr++) {
      const float *m = (const float *)B->mrow[lr] + j0 * ss;
      for (long j = 0; j < nk; j++) St[j * R + lr] += m[j * ss];
    }
  }
}

/* Online softmax over the block's scores: St becomes exp(St - m_new), l and
 * alpha (the factor the rows' earlier sums are rescaled by) are updated. A
 * row with no finite score yet keeps a reference of 0, so that exp(-inf) = 0
 * and no -inf - -inf NaN appears. */
static void softmax_block(const block_t *B, long nk) {
  const vf ninf = v_set1(-INFINITY), zero = v_set1(0.0f);
  for (long r = 0; r < B->nrv; r++) {
    const long o = r * VL;
    vf bm = ninf;
    for (long j = 0; j < nk; j++) bm = v_max(bm, v_load(B->St + j * R + o));
    const vf m_old = v_load(B->m + o), m_new = v_max(m_old, bm);
    const vf ref = v_eq(m_new, ninf, zero, m_new);
    vf sum = zero;
    for (long j = 0; j < nk; j++) {
      float *s = B->St + j * R + o;
      const vf p = v_exp(v_sub(v_load(s), ref));
      v_store(s, p);
      sum = v_add(sum, p);
    }
    const vf al = v_exp(v_sub(m_old, ref));
    v_store(B->alpha + o, al);
    v_store(B->l + o, v_fma(v_load(B->l + o), al, sum));
    v_store(B->m + o, m_new);
  }
}

static void scores(const block_t *B, const float *kbase, long kss, long Dk, long j0, long nk) {
  const float *kp[NK];
  for (long jt = 0; jt < nk; jt += NK) {
    for (int kk = 0; kk < NK; kk++) {
      const long j = jt + kk < nk ? jt + kk : nk - 1; /* past the end: a real key, unused */
      kp[kk] = kbase + (j0 + j) * kss;
    }
    qk_any(B->Qt, Dk, kp, B->St + jt * R, (int)B->nrv);
  }
}

static void products(const block_t *B, const float *vbase, long vss, long Dv, long j0, long nk) {
  const float *v = vbase + j0 * vss;
  for (long t = 0; t < B->pv_rows; t += MR) {
    float *O = B->O + t * Dv;
    long d0 = 0;
    for (; d0 + NV * VL <= Dv; d0 += NV * VL)
      pv_any(O + d0, Dv, B->alpha + t, B->St + t, v + d0, vss, (int)nk, NV);
    const long nv = (Dv - d0) / VL;
    if (nv > 0) {
      pv_any(O + d0, Dv, B->alpha + t, B->St + t, v + d0, vss, (int)nk, (int)nv);
      d0 += nv * VL;
    }
    for (long d = d0; d < Dv; d++) /* the last Dv % VL columns */
      for (long rr = 0; rr < MR; rr++) {
        float acc = O[rr * Dv + d] * B->alpha[t + rr];
        for (long j = 0; j < nk; j++) acc += B->St[j * R + t + rr] * v[j * vss + d];
        O[rr * Dv + d] = acc;
      }
  }
}

/* Which rows the block holds, their packed scaled queries and where their masks are. */
static void setup_block(block_t *B, const plan_t *P, long b, long g, long r0) {
  const mlxcel_attn_args *a = P->a;
  const long Dk = a->k_dim, elsize = a->mask_kind == MLXCEL_MASK_BOOL ? 1 : 4;
  B->nr = P->rows - r0 < R ? P->rows - r0 : R;
  B->minpos = INFINITY;
  B->maxpos = -INFINITY;
  for (long lr = 0; lr < R; lr++) {
    if (lr >= B->nr) { /* padding: zero queries that see every key, never stored */
      for (long d = 0; d < Dk; d++) B->Qt[d * R + lr] = 0.0f;
      B->pos[lr] = 1e30f;
      continue;
    }
    const long r = r0 + lr, i = r / P->rep, h = g * P->rep + r % P->rep;
    const float *q = a->q + b * a->q_strides[0] + h * a->q_strides[1] + i * a->q_strides[2];
    for (long d = 0; d < Dk; d++) B->Qt[d * R + lr] = q[d] * a->scale;
    const float pos = (float)(a->k_len - a->q_len + i);
    B->pos[lr] = pos;
    B->minpos = pos < B->minpos ? pos : B->minpos;
    B->maxpos = pos > B->maxpos ? pos : B->maxpos;
    B->head[lr] = h;
    B->qpos[lr] = i;
    if (a->mask_kind >= MLXCEL_MASK_BOOL)
      B->mrow[lr] = (const char *)a->mask +
                    elsize * (b * a->mask_strides[0] + h * a->mask_strides[1] + i * a->mask_strides[2]);
  }
  B->pv_rows = (B->nr + MR - 1) / MR * MR;
  B->nrv = (B->pv_rows + VL - 1) / VL;
}

/* Rows that saw no key (causal or boolean masks) get the mean of v, as MLX's
 * softmax of equal float32-min scores gives; others O / l (0 / 0 = NaN for an
 * additive row of -inf, as MLX's). */
static void finish_block(const block_t *B, const mlxcel_attn_args *a, const float *vbase, long b) {
  const long Dv = a->v_dim, S = a->k_len, vss = a->v_strides[2];
  int have_mean = 0;
  for (long lr = 0; lr < B->nr; lr++) {
    float *dst = a->out + ((b * a->q_heads + B->head[lr]) * a->q_len + B->qpos[lr]) * Dv;
    const float l = B->l[lr];
    if (l == 0.0f && a->mask_kind != MLXCEL_MASK_ADDITIVE) {
      if (!have_mean) {
        for (long d = 0; d < Dv; d++) {
          float s = 0.0f;
          for (long j = 0; j < S; j++) s += vbase[j * vss + d];
          B->mean[d] = s / (float)S;
        }
        have_mean = 1;
      }
      memcpy(dst, B->mean, (size_t)Dv * sizeof(float));
      continue;
    }
    for (long d = 0; d < Dv; d++) dst[d] = B->O[lr * Dv + d] / l;
  }
}

static void attn_block(plan_t *P, long b, long g, long r0) {
  const mlxcel_attn_args *a = P->a;
  const long Dk = a->k_dim, Dv = a->v_dim, S = a->k_len;
  float *buf = thread_scratch((size_t)(Dk * R + R * Dv + (BK + NK) * R + 5 * R + Dv));
  if (!buf) {
    __atomic_store_n(&P->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  block_t B;
  B.Qt = buf;
  B.O = B.Qt + Dk * R;
  B.St = B.O + R * Dv;
  B.m = B.St + (BK + NK) * R;
  B.l = B.m + R;
  B.alpha = B.l + R;
  B.pos = B.alpha + R;
  B.mean = B.pos + R;
  setup_block(&B, P, b, g, r0);
  memset(B.O, 0, (size_t)(B.pv_rows * Dv) * sizeof(float));
  for (long lr = 0; lr < R; lr++) {
    B.m[lr] = -INFINITY;
    B.l[lr] = 0.0f;
  }
  const float *kbase = a->k + b * a->k_strides[0] + g * a->k_strides[1];
  const float *vbase = a->v + b * a->v_strides[0] + g * a->v_strides[1];
  long kend = S;
  if (a->mask_kind == MLXCEL_MASK_CAUSAL) /* keys past the last row's position: never seen */
    kend = B.maxpos + 1.0f < (float)S ? (long)(B.maxpos + 1.0f) : S;
  for (long j0 = 0; j0 < kend; j0 += BK) {
    long nk = kend - j0 < BK ? kend - j0 : BK;
    int masked = a->mask_kind == MLXCEL_MASK_ADDITIVE ||
                 (a->mask_kind == MLXCEL_MASK_CAUSAL && (float)(j0 + nk - 1) > B.minpos);
    if (a->mask_kind == MLXCEL_MASK_BOOL) {
      const int status = bool_status(&B, j0, &nk, a->mask_strides[3]);
      if (status == 0) continue; /* no row sees these keys: they add nothing */
      masked = status == 2;
    }
    scores(&B, kbase, a->k_strides[2], Dk, j0, nk);
    if (masked) apply_mask(&B, a, j0, nk);
    softmax_block(&B, nk);
    products(&B, vbase, a->v_strides[2], Dv, j0, nk);
  }
  finish_block(&B, a, vbase, b);
}

static void attn_range(void *ctx, long t0, long t1) {
  plan_t *P = ctx;
  for (long t = t0; t < t1; t++) {
    /* the last row blocks first: under a causal mask they see the most keys */
    const long bg = t % P->groups, rb = P->nrb - 1 - t / P->groups;
    attn_block(P, bg / P->a->kv_heads, bg % P->a->kv_heads, rb * R);
  }
}

int mlxcel_attention(const mlxcel_attn_args *a) {
  if (a->batch < 0 || a->q_heads < 1 || a->kv_heads < 1 || a->q_heads % a->kv_heads != 0 ||
      a->q_len < 0 || a->k_len < 1 || a->k_dim < 1 || a->v_dim < 1)
    return 1;
  if (a->mask_kind < MLXCEL_MASK_NONE || a->mask_kind > MLXCEL_MASK_ADDITIVE ||
      (a->mask_kind >= MLXCEL_MASK_BOOL && !a->mask))
    return 2;
  if (a->batch == 0 || a->q_len == 0) return 0;
  plan_t P = {.a = a, .rep = a->q_heads / a->kv_heads, .groups = a->batch * a->kv_heads};
  P.rows = P.rep * a->q_len;
  P.nrb = (P.rows + R - 1) / R;
  const double work = (double)a->batch * a->q_heads * a->q_len * a->k_len * (a->k_dim + a->v_dim);
  mlxcel_pool_for(attn_range, &P, P.groups * P.nrb, 1, work >= (double)(1 << 20) ? MLXCEL_POOL_WAKE : 0);
  return P.failed ? 3 : 0;
}
