/*
 * Skinny float32 GEMM: a few rows of activations times many rows of weights.
 *
 * Each task takes a run of weight rows and multiplies TILE_W of them at a
 * time by TILE_S activation rows at a time, so a weight row comes from
 * memory once and is reused from L1 for every activation row; the
 * activations (at most MAX_S rows) stay in L2, and rows are cut into
 * passes of k_block floats so that one pass of them stays in L1. Weight
 * rows sharing an offset from a 64-byte boundary (MLX's buffers start 8
 * bytes past one) are read with aligned loads between a masked head and
 * tail step; the next TILE_W rows are prefetched into L2 on the way.
 * Sums are reduced VW at a time with a transposed shuffle tree.
 *
 * The vector width and tile sizes follow the instruction set chosen at
 * compile time (simd.h): AVX-512 (32 registers: 4 x 6 accumulators), AVX2+FMA
 * or plain SSE (16 registers: 2 x 6). GCC vector extensions keep one source
 * for all three.
 */
#include "blas_shim.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VW VL /* simd.h's lanes for this build's instruction set */
#if defined(MLXCEL_SIMD_AVX512)
#define TILE_W 4
#else
#define TILE_W 2
#endif
#define TILE_S 6
#define L1_FLOATS 6144 /* activation floats a pass may keep in L1 (24 KiB) */
#define K_BLOCK_MIN (8 * VW)
#define K_BLOCK_MAX 1024
#define MAX_S 64          /* most activation rows one call may carry */
#define CHUNK_FLOATS 32768 /* weights per task, about 128 KiB */
#define SERIAL_FMAS 262144 /* below this much work, threads cost more */

/* The kernel is written once with GCC vector extensions over simd.h's VL lanes. */
typedef float gvf __attribute__((vector_size(VW * 4)));
typedef int gvi __attribute__((vector_size(VW * 4)));

static inline gvf load(const float *p) {
  gvf v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* The ragged ends of every weight row: the lanes before the first aligned
 * vector (head) and after the last whole one (tail), each done as one
 * full-width, in-bounds vector step with the other lanes masked off. */
typedef struct {
  int head, tail; /* whether this pass does them */
  long tail_k;    /* where the tail step loads */
  gvi head_keep, tail_keep;
} edges_t;

typedef struct {
  const skinny_args *p;
  const float *s; /* activation rows, contiguous in k */
  long s_i;
  long rows_per_task;
  long head;     /* floats before each weight row's first 64-byte boundary */
  long body_end; /* end of the whole vectors that follow the head */
  long k_block;  /* floats of a row per pass */
  int alike;     /* all weight rows at the same offset from a boundary */
  edges_t edges; /* both ends of every row */
} job_t;

/* a[r][t] += W[r][k:k+VW] . S[t][k:k+VW], lanes outside `keep` zeroed in
 * both operands when MASKED (so 0 * inf never appears). */
INLINE void
step(const int RW, const int RS, const int MASKED, const float *w, long w_j,
     const float *s, long s_i, long k, gvi keep, gvf a[TILE_W][TILE_S]) {
  gvf wv[TILE_W];
#pragma GCC unroll 8
  for (int r = 0; r < RW; r++) {
    wv[r] = load(w + r * w_j + k);
    if (MASKED) wv[r] = (gvf)((gvi)wv[r] & keep);
  }
#pragma GCC unroll 8
  for (int t = 0; t < RS; t++) {
    gvf x = load(s + t * s_i + k);
    if (MASKED) x = (gvf)((gvi)x & keep);
#pragma GCC unroll 8
    for (int r = 0; r < RW; r++) a[r][t] += wv[r] * x;
  }
}

/* Adds S[t][k0:k1] . W[r][k0:k1] (and the edges `e` asks for) into
 * acc[r * m + t] for RW weight rows and RS activation rows; RW and RS are
 * constants at every call site, so the loops unroll and the sums live in
 * registers. The next weight rows are prefetched into L2 on the way. */
INLINE void
tile(const int RW, const int RS, const float *w, long w_j, const float *s,
     long s_i, long k0, long k1, const edges_t *e, gvf *acc, long m) {
  const float *ahead = w + TILE_W * w_j;
  gvf a[TILE_W][TILE_S];
#pragma GCC unroll 8
  for (int r = 0; r < RW; r++)
#pragma GCC unroll 8
    for (int t = 0; t < RS; t++) a[r][t] = acc[r * m + t];
  if (e->head) step(RW, RS, 1, w, w_j, s, s_i, 0, e->head_keep, a);
  for (long k = k0; k < k1; k += VW) {
    step(RW, RS, 0, w, w_j, s, s_i, k, e->head_keep, a);
#pragma GCC unroll 8
    for (int r = 0; r < RW; r++) __builtin_prefetch(ahead + r * w_j + k, 0, 2);
  }
  if (e->tail) step(RW, RS, 1, w, w_j, s, s_i, e->tail_k, e->tail_keep, a);
#pragma GCC unroll 8
  for (int r = 0; r < RW; r++)
#pragma GCC unroll 8
    for (int t = 0; t < RS; t++) acc[r * m + t] = a[r][t];
}

#define TILE_CASE(RW, RS) \
  case RS: tile(RW, RS, w, w_j, s, s_i, k0, k1, e, acc, m); break;

static void tile_any(int rw, int rs, const float *w, long w_j, const float *s,
                     long s_i, long k0, long k1, const edges_t *e, gvf *acc,
                     long m) {
  if (rw == TILE_W) {
    switch (rs) {
      TILE_CASE(TILE_W, 1) TILE_CASE(TILE_W, 2) TILE_CASE(TILE_W, 3)
      TILE_CASE(TILE_W, 4) TILE_CASE(TILE_W, 5) TILE_CASE(TILE_W, 6)
    }
  } else {
    switch (rs) {
      TILE_CASE(1, 1) TILE_CASE(1, 2) TILE_CASE(1, 3)
      TILE_CASE(1, 4) TILE_CASE(1, 5) TILE_CASE(1, 6)
    }
  }
}

/* One level of a transposed reduction, over the first 2n vectors of v: each
 * pair's blocks of B lanes (partial sums of one vector each) become blocks
 * of B / 2 lanes, the first vector's in the first half of each block and
 * the second's in the second half. LO and HI pick the halves to add. */
#define FOLD(n, LO, HI)                                                  \
  _Pragma("GCC unroll 8") for (int q = 0; q < (n); q++) v[q] =           \
      __builtin_shuffle(v[2 * q], v[2 * q + 1], LO) +                    \
      __builtin_shuffle(v[2 * q], v[2 * q + 1], HI)

/* Lane l of the result is the sum of the lanes of v[bit_reverse(l)]:
 * log2(VW) levels of FOLD, two shuffles per sum in all instead of the
 * log2(VW) that reducing each vector on its own costs. */
static inline gvf reduce_many(gvf v[VW]) {
#if VW == 16
  FOLD(8, ((gvi){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}),
       ((gvi){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}));
  FOLD(4, ((gvi){0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}),
       ((gvi){4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}));
  FOLD(2, ((gvi){0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}),
       ((gvi){2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}));
  FOLD(1, ((gvi){0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}),
       ((gvi){1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}));
#elif VW == 8
  FOLD(4, ((gvi){0, 1, 2, 3, 8, 9, 10, 11}),
       ((gvi){4, 5, 6, 7, 12, 13, 14, 15}));
  FOLD(2, ((gvi){0, 1, 8, 9, 4, 5, 12, 13}),
       ((gvi){2, 3, 10, 11, 6, 7, 14, 15}));
  FOLD(1, ((gvi){0, 8, 2, 10, 4, 12, 6, 14}),
       ((gvi){1, 9, 3, 11, 5, 13, 7, 15}));
#elif VW == 4
  FOLD(2, ((gvi){0, 1, 4, 5}),
       ((gvi){2, 3, 6, 7}));
  FOLD(1, ((gvi){0, 4, 2, 6}),
       ((gvi){1, 5, 3, 7}));
#endif
  return v[0];
}

static int bit_reverse(int x) {
  int out = 0;
  for (int bit = 1; bit < VW; bit <<= 1, x >>= 1) out = out << 1 | (x & 1);
  return out;
}

/* Writes the rw x m results, acc[r * m + i] for C[i][j + r], VW at a time;
 * rows shorter than a vector are summed here. */
static void store(const job_t *job, const float *w, long j, int rw, gvf *acc) {
  const skinny_args *p = job->p;
  long total = rw * p->m, r = 0, i = 0;
  long scalar_from = p->k < VW ? 0 : p->k;
  for (long base = 0; base < total; base += VW) {
    gvf v[VW];
    for (int l = 0; l < VW; l++) {
      long at = base + bit_reverse(l);
      v[l] = at < total ? acc[at] : (gvf){0};
    }
    gvf sums = reduce_many(v);
    for (int l = 0; l < VW && base + l < total; l++) {
      float sum = sums[l];
      for (long k = scalar_from; k < p->k; k++)
        sum += w[r * p->w_j + k] * job->s[i * job->s_i + k];
      float *c = p->c + i * p->c_i + (j + r) * p->c_j;
      *c = p->beta == 0.0f ? p->alpha * sum : p->alpha * sum + p->beta * *c;
      if (++i == p->m) i = 0, r++;
    }
  }
}

/* All activation rows times weight rows [j, j + rw). */
static void rows(const job_t *job, long j, int rw, gvf *acc) {
  const skinny_args *p = job->p;
  const float *w = p->w + j * p->w_j;
  memset(acc, 0, sizeof(*acc) * rw * p->m);
  if (p->k >= VW) {
    edges_t e = job->edges;
    long k0 = job->head;
    do { /* at least once: a row may be all head and tail */
      long k1 = k0 + job->k_block < job->body_end ? k0 + job->k_block : job->body_end;
      e.head = job->edges.head && k0 == job->head;
      e.tail = job->edges.tail && k1 == job->body_end;
      for (long i = 0; i < p->m; i += TILE_S) {
        int rs = p->m - i >= TILE_S ? TILE_S : (int)(p->m - i);
        tile_any(rw, rs, w, p->w_j, job->s + i * job->s_i, job->s_i, k0, k1,
                 &e, acc + i, p->m);
      }
      k0 = k1;
    } while (k0 < job->body_end);
  }
  store(job, w, j, rw, acc);
}

/* One task: weight rows [first, first + rows_per_task). */
static void run_task(void *ctx, long task) {
  const job_t *job = ctx;
  long n = job->p->n;
  long first = task * job->rows_per_task;
  long last = first + job->rows_per_task < n ? first + job->rows_per_task : n;
  gvf acc[TILE_W * MAX_S];
  long j = first;
  for (; j + TILE_W <= last; j += TILE_W) rows(job, j, TILE_W, acc);
  for (; j < last; j++) rows(job, j, 1, acc);
}

/* Tasks [first, end): the pool's chunks are one task each. */
static void run_tasks(void *ctx, long first, long end) {
  for (long task = first; task < end; task++) run_task(ctx, task);
}

#define ALIGN_BYTES (VW * 4)

/* Float offset of `x` within its vector-sized block. */
static long misalign(const float *x) {
  return (long)((uintptr_t)x % ALIGN_BYTES) / 4;
}

/* Where the weight rows' vectors start: every row must sit at the same
 * offset from a vector boundary, else the kernel uses unaligned loads. */
static void plan_alignment(job_t *job) {
  const skinny_args *p = job->p;
  job->alike = (uintptr_t)p->w % 4 == 0 && p->w_j % VW == 0 && p->k >= VW;
  job->head = job->alike ? (VW - misalign(p->w)) % VW : 0;
  job->body_end = p->k < VW ? 0 : job->head + (p->k - job->head) / VW * VW;
  gvi lane;
  for (int e = 0; e < VW; e++) lane[e] = e;
  job->edges.head = job->head > 0;
  job->edges.head_keep = lane < (int)job->head;
  job->edges.tail = p->k >= VW && job->body_end < p->k;
  job->edges.tail_k = p->k - VW;
  job->edges.tail_keep = lane >= (int)(job->body_end - job->edges.tail_k);
}

/* The activations as contiguous rows at the weights' alignment; copied
 * (per thread) when strided or differently aligned. */
static int place_activations(job_t *job) {
  static __thread float *buf;
  static __thread size_t cap;
  const skinny_args *p = job->p;
  int aligned = job->alike;
  if (p->s_k == 1 && (!aligned || (p->s_i % VW == 0 && misalign(p->s) == misalign(p->w) &&
                                   (uintptr_t)p->s % 4 == 0))) {
    job->s = p->s;
    job->s_i = p->s_i;
    return 1;
  }
  long ld = (p->k + VW - 1) / VW * VW;
  size_t need = (size_t)p->m * (size_t)ld + 2 * VW;
  if (need > cap) {
    float *grown = realloc(buf, need * sizeof *buf);
    if (!grown) return 0;
    buf = grown;
    cap = need;
  }
  float *s = buf + (VW - misalign(buf)) % VW + (aligned ? misalign(p->w) : 0);
  for (long i = 0; i < p->m; i++)
    for (long k = 0; k < p->k; k++) s[i * ld + k] = p->s[i * p->s_i + k * p->s_k];
  job->s = s;
  job->s_i = ld;
  return 1;
}

int skinny_nt(const skinny_args *p) {
  if (p->m > MAX_S || p->w_k != 1) return 0;
  job_t job = {.p = p};
  plan_alignment(&job);
  if (!place_activations(&job)) return 0;
  long kb = L1_FLOATS / p->m / VW * VW;
  job.k_block = kb < K_BLOCK_MIN ? K_BLOCK_MIN : kb > K_BLOCK_MAX ? K_BLOCK_MAX : kb;
  long rows = CHUNK_FLOATS / p->k;
  long threads = (double)p->m * p->n * p->k < SERIAL_FMAS ? 1 : mlxcel_pool_threads();
  long balanced = (p->n + 4 * threads - 1) / (4 * threads); /* >= 4 tasks each */
  if (rows > balanced) rows = balanced;
  if (rows < 1) rows = 1;
  rows = (rows + TILE_W - 1) / TILE_W * TILE_W;
  if (threads == 1) rows = p->n;
  job.rows_per_task = rows;
  mlxcel_pool_for(run_tasks, &job, (p->n + rows - 1) / rows, 1, MLXCEL_POOL_WAKE);
  return 1;
}
