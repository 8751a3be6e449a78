/*
 * CPU quantized matrix product for MLX's affine-quantized weights; see
 * qmm_kernel.h for the contract.
 *
 * Why a kernel of our own: MLX's CPU quantized_matmul dequantizes per output
 * element, so at decode (few rows of x) it re-reads and re-unpacks every
 * weight for every row and runs far below the memory bandwidth. Here every
 * weight block is unpacked and dequantized ONCE into a small float panel
 * that stays in L1, and that panel is then used for all M rows of x.
 *
 * Build: one source, the instruction set is chosen when compiling:
 *   AVX-512  -mavx512f -mavx512bw -mavx512vl -mfma -mbmi2 [-mavx512vbmi]
 *   AVX2     -mavx2 -mfma -mbmi2 -mf16c
 *   generic  neither (portable C, for tests and other CPUs)
 * The loader checks that the CPU supports the build it loads.
 *
 * Paths, by the number of rows M:
 *   M < QMM_BLAS_MIN_M  panel: for each tile of QMM_NT weight rows and each
 *                       block of K, unpack (BMI2 pdep, or AVX512-VBMI
 *                       multishift) and dequantize into an L1 float panel, then
 *                       a register-tiled QMM_MT x QMM_NT microkernel runs over
 *                       all M rows. Threads split N.
 *   otherwise           blas: dequantize tiles of rows into a float buffer
 *                       (threads split the rows), then cblas_sgemm. Used only
 *                       when a cblas_sgemm is bound in the process (weak
 *                       symbol or global lookup); the program is expected to
 *                       have bound a fast one (OpenBLAS) before loading this.
 * Compile-time knobs (tests use them to reach every path): QMM_BLAS_MIN_M,
 * QMM_KB (K block of the panel), QMM_SPIN_US (how long idle workers spin
 * before sleeping), QMM_NO_VBMI.
 */
#define _GNU_SOURCE
#include "qmm_kernel.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
#define QMM_ISA_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define QMM_ISA_AVX2 1
#else
#define QMM_ISA_GENERIC 1
#endif

#if !defined(QMM_ISA_GENERIC)
#include <immintrin.h>
#endif
#if defined(QMM_ISA_AVX512) && defined(__AVX512VBMI__) && !defined(QMM_NO_VBMI)
#define QMM_VBMI 1
#endif
#if !defined(QMM_ISA_GENERIC) && defined(__BMI2__)
#define QMM_PDEP 1
#endif

#ifndef QMM_BLAS_MIN_M
#define QMM_BLAS_MIN_M 96
#endif
#ifndef QMM_KB
#define QMM_KB 1024 /* K block of the float panel: QMM_NT * QMM_KB * 4 bytes in L1 */
#endif
#ifndef QMM_SPIN_US
#define QMM_SPIN_US 300
#endif
#define QMM_MAX_THREADS 64
#define INLINE static inline __attribute__((always_inline))

/* ------------------------------------------------------------------------
 * Vectors: VL float lanes.
 * ------------------------------------------------------------------------ */
#if defined(QMM_ISA_AVX512)
#define VL 16
#define QMM_MT 6 /* panel register tile: QMM_MT rows of x by QMM_NT rows of w */
#define QMM_NT 4
#define QMM_DMT 4 /* direct path up to this many rows of x */
typedef __m512 vf;
INLINE vf v_zero(void) { return _mm512_setzero_ps(); }
INLINE vf v_load(const float *p) { return _mm512_loadu_ps(p); }
INLINE void v_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
INLINE vf v_set1(float f) { return _mm512_set1_ps(f); }
INLINE vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
INLINE vf v_u8(const uint8_t *p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
INLINE float v_hsum(vf v) { return _mm512_reduce_add_ps(v); }
/* y[0..3] (+)= the sums of a, b, c and d, in one transposing reduction. */
INLINE void v_sum4(vf a, vf b, vf c, vf d, float *y, int add) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 t = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t), 1)));
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  if (add) r = _mm_add_ps(r, _mm_loadu_ps(y));
  _mm_storeu_ps(y, r);
}
#elif defined(QMM_ISA_AVX2)
#define VL 8
#define QMM_MT 3
#define QMM_NT 4
#define QMM_DMT 2
typedef __m256 vf;
INLINE vf v_zero(void) { return _mm256_setzero_ps(); }
INLINE vf v_load(const float *p) { return _mm256_loadu_ps(p); }
INLINE void v_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
INLINE vf v_set1(float f) { return _mm256_set1_ps(f); }
INLINE vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
INLINE vf v_u8(const uint8_t *p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
INLINE float v_hsum(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
INLINE void v_sum4(vf a, vf b, vf c, vf d, float *y, int add) {
  const __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
  const __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
  const __m256 t = _mm256_add_ps(
      _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(ab), _mm256_castps_pd(cd))),
      _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(ab), _mm256_castps_pd(cd))));
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  if (add) r = _mm_add_ps(r, _mm_loadu_ps(y));
  _mm_storeu_ps(y, r);
}
#else
#define VL 8
#define QMM_MT 4
#define QMM_NT 2
#define QMM_DMT 4
typedef struct {
  float f[VL];
} vf;
INLINE vf v_zero(void) {
  vf r;
  for (int i = 0; i < VL; i++) r.f[i] = 0.0f;
  return r;
}
INLINE vf v_load(const float *p) {
  vf r;
  memcpy(r.f, p, sizeof r.f);
  return r;
}
INLINE void v_store(float *p, vf v) { memcpy(p, v.f, sizeof v.f); }
INLINE vf v_set1(float f) {
  vf r;
  for (int i = 0; i < VL; i++) r.f[i] = f;
  return r;
}
INLINE vf v_fma(vf a, vf b, vf c) {
  for (int i = 0; i < VL; i++) c.f[i] += a.f[i] * b.f[i];
  return c;
}
INLINE vf v_u8(const uint8_t *p) {
  vf r;
  for (int i = 0; i < VL; i++) r.f[i] = (float)p[i];
  return r;
}
INLINE float v_hsum(vf v) {
  float s = 0.0f;
  for (int i = 0; i < VL; i++) s += v.f[i];
  return s;
}
INLINE void v_sum4(vf a, vf b, vf c, vf d, float *y, int add) {
  const float r[4] = {v_hsum(a), v_hsum(b), v_hsum(c), v_hsum(d)};
  for (int j = 0; j < 4; j++) y[j] = add ? y[j] + r[j] : r[j];
}
#endif

/* ------------------------------------------------------------------------
 * Unpacking: `count` values (a multiple of 32) of a row's bit stream, from a
 * byte-aligned start, into one byte per value. `avail` is how many bytes may
 * be read from `src` (to the end of the weight buffer).
 * ------------------------------------------------------------------------ */
#if defined(QMM_VBMI)
static uint8_t VBMI_PERM[9][64], VBMI_SHIFT[9][64];

/* Pack j of 8 values into qword j; byte i of it picks bits [i*bits, +8). */
static void vbmi_tables(void) {
  for (int bits = 2; bits <= 8; bits++)
    for (int j = 0; j < 8; j++)
      for (int i = 0; i < 8; i++) {
        VBMI_PERM[bits][j * 8 + i] = (uint8_t)(j * bits + (i < bits ? i : bits - 1));
        VBMI_SHIFT[bits][j * 8 + i] = (uint8_t)(i * bits);
      }
}

static void unpack(const uint8_t *src, long avail, int bits, long count, uint8_t *dst) {
  /* 64 values = 8 packs of 8: gather pack j's `bits` bytes into qword j,
   * then vpmultishiftqb picks byte i of the qword at bit i*bits. Masked loads
   * never touch (or fault on) bytes past the mask. */
  const __m512i vperm = _mm512_loadu_si512(VBMI_PERM[bits]);
  const __m512i vshift = _mm512_loadu_si512(VBMI_SHIFT[bits]);
  const __m512i vmask = _mm512_set1_epi8((char)((1u << bits) - 1u));
  const __mmask64 full = bits == 8 ? ~0ULL : (1ULL << (8 * bits)) - 1;
  (void)avail;
  long j = 0;
  for (; j + 64 <= count; j += 64) {
    __m512i v = _mm512_maskz_loadu_epi8(full, src + j * bits / 8);
    v = _mm512_and_si512(_mm512_multishift_epi64_epi8(vshift, _mm512_permutexvar_epi8(vperm, v)),
                         vmask);
    _mm512_storeu_si512(dst + j, v);
  }
  if (j < count) { /* 32 left */
    __m512i v = _mm512_maskz_loadu_epi8((1ULL << (4 * bits)) - 1, src + j * bits / 8);
    v = _mm512_and_si512(_mm512_multishift_epi64_epi8(vshift, _mm512_permutexvar_epi8(vperm, v)),
                         vmask);
    _mm256_storeu_si256((__m256i *)(dst + j), _mm512_castsi512_si256(v));
  }
}
#elif defined(QMM_PDEP)
static void unpack(const uint8_t *src, long avail, int bits, long count, uint8_t *dst) {
  /* Pack p (8 values) is `bits` bytes at p*bits; pdep spreads its 8*bits
   * bits to 8 bytes. An 8-byte load is only used where it stays in bounds. */
  const uint64_t mask = 0x0101010101010101ULL * ((1u << bits) - 1u);
  long packs = count / 8, safe = avail >= 8 ? (avail - 8) / bits + 1 : 0;
  if (safe > packs) safe = packs;
  long p = 0;
  for (; p < safe; p++) {
    uint64_t v;
    memcpy(&v, src + p * bits, 8);
    v = _pdep_u64(v, mask);
    memcpy(dst + 8 * p, &v, 8);
  }
  for (; p < packs; p++) {
    uint64_t v = 0;
    memcpy(&v, src + p * bits, (size_t)bits);
    v = _pdep_u64(v, mask);
    memcpy(dst + 8 * p, &v, 8);
  }
}
#else
static void unpack(const uint8_t *src, long avail, int bits, long count,
                          uint8_t *dst) {
  const unsigned mask = (1u << bits) - 1u;
  for (long j = 0; j < count; j++) {
    long off = j * bits;
    long byte = off >> 3;
    unsigned v = src[byte];
    if ((off & 7) + bits > 8 && byte + 1 < avail) v |= (unsigned)src[byte + 1] << 8;
    dst[j] = (uint8_t)((v >> (off & 7)) & mask);
  }
}

#endif

/* ------------------------------------------------------------------------
 * The job and its dequantization.
 * ------------------------------------------------------------------------ */
typedef struct {
  const float *x, *s, *b;
  const uint8_t *w;
  float *y;
  long m, k, n, wrow, wbytes, gpr; /* wrow: bytes per weight row; gpr: groups per row */
  int bits, group;
  /* rows [r_begin, r_end) in chunks of rows_per_chunk */
  long r_begin, r_end, rows_per_chunk;
  float *wbuf; /* blas path: rows [r_begin, r_end) dequantized here */
} job_t;

typedef struct {
  uint8_t ub[QMM_NT][QMM_KB] __attribute__((aligned(64)));
  float wf[QMM_NT][QMM_KB] __attribute__((aligned(64)));
} scratch_t;

/* One byte per value for values [k0, k0 + kb) of weight row r: the weights
 * themselves at 8 bits, else unpacked into ub. */
static const uint8_t *row_bytes(const job_t *J, long r, long k0, long kb, uint8_t *ub) {
  const long off = r * J->wrow + k0 * J->bits / 8;
  if (J->bits == 8) return J->w + off;
  unpack(J->w + off, J->wbytes - off, J->bits, kb, ub);
  return ub;
}

INLINE void dequant_body(const uint8_t *q, const float *s, const float *b, long kb, float *out,
                         const int g) {
  for (long g0 = 0, gi = 0; g0 < kb; g0 += g, gi++) {
    const vf vs = v_set1(s[gi]), vb = v_set1(b[gi]);
#pragma GCC unroll 8
    for (int k = 0; k < g; k += VL) v_store(out + g0 + k, v_fma(v_u8(q + g0 + k), vs, vb));
  }
}

/* Values [k0, k0 + kb) of weight row r as floats into out. */
static void dequant_row(const job_t *J, long r, long k0, long kb, uint8_t *ub, float *out) {
  const uint8_t *q = row_bytes(J, r, k0, kb, ub);
  const float *s = J->s + r * J->gpr + k0 / J->group, *b = J->b + r * J->gpr + k0 / J->group;
  switch (J->group) {
  case 32: dequant_body(q, s, b, kb, out, 32); break;
  case 64: dequant_body(q, s, b, kb, out, 64); break;
  default: dequant_body(q, s, b, kb, out, 128); break;
  }
}

INLINE void store_sums(const int mt, const int nt, vf acc[][QMM_NT], float *y, long ldy,
                       int add) {
  if (nt == 4) {
#pragma GCC unroll 8
    for (int i = 0; i < mt; i++) v_sum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], y + i * ldy, add);
    return;
  }
#pragma GCC unroll 8
  for (int i = 0; i < mt; i++)
#pragma GCC unroll 8
    for (int j = 0; j < nt; j++) {
      const float v = v_hsum(acc[i][j]);
      y[i * ldy + j] = add ? y[i * ldy + j] + v : v;
    }
}

/* ------------------------------------------------------------------------
 * Direct microkernel (few rows of x): y[mt][nt] (+)= x[mt][kb] . W[nt][kb]^T,
 * each weight vector dequantized in registers and used for all mt rows.
 * ------------------------------------------------------------------------ */
INLINE void direct_body(const int mt, const int nt, const int g, const float *x, long ldx,
                        const uint8_t *const *q, const float *s, const float *b, long gpr,
                        long kb, float *y, long ldy, int add) {
  vf acc[QMM_DMT][QMM_NT];
#pragma GCC unroll 8
  for (int i = 0; i < mt; i++)
#pragma GCC unroll 8
    for (int j = 0; j < nt; j++) acc[i][j] = v_zero();
  for (long g0 = 0, gi = 0; g0 < kb; g0 += g, gi++) {
    vf vs[QMM_NT], vb[QMM_NT];
#pragma GCC unroll 8
    for (int j = 0; j < nt; j++) {
      vs[j] = v_set1(s[j * gpr + gi]);
      vb[j] = v_set1(b[j * gpr + gi]);
    }
#pragma GCC unroll 8
    for (int k = 0; k < g; k += VL) {
      vf wv[QMM_NT];
#pragma GCC unroll 8
      for (int j = 0; j < nt; j++) wv[j] = v_fma(v_u8(q[j] + g0 + k), vs[j], vb[j]);
#pragma GCC unroll 8
      for (int i = 0; i < mt; i++) {
        const vf xv = v_load(x + i * ldx + g0 + k);
#pragma GCC unroll 8
        for (int j = 0; j < nt; j++) acc[i][j] = v_fma(xv, wv[j], acc[i][j]);
      }
    }
  }
  store_sums(mt, nt, acc, y, ldy, add);
}

typedef void (*direct_fn)(const float *, long, const uint8_t *const *, const float *,
                          const float *, long, long, float *, long, int);
#define DIRECT(MT, NT, G)                                                                    \
  static void direct_##MT##_##NT##_##G(const float *x, long ldx, const uint8_t *const *q,    \
                                       const float *s, const float *b, long gpr, long kb,    \
                                       float *y, long ldy, int add) {                        \
    direct_body(MT, NT, G, x, ldx, q, s, b, gpr, kb, y, ldy, add);                          \
  }

/* ------------------------------------------------------------------------
 * Panel microkernel (more rows of x): y[mt][nt] (+)= x[mt][kb] . wf[nt][kb]^T
 * over an already dequantized float panel.
 * ------------------------------------------------------------------------ */
INLINE void tile_body(const int mt, const int nt, const float *x, long ldx, const float *wf,
                      long kb, float *y, long ldy, int add) {
  vf acc[QMM_MT][QMM_NT];
#pragma GCC unroll 8
  for (int i = 0; i < mt; i++)
#pragma GCC unroll 8
    for (int j = 0; j < nt; j++) acc[i][j] = v_zero();
  for (long k = 0; k < kb; k += VL) {
    vf wv[QMM_NT];
#pragma GCC unroll 8
    for (int j = 0; j < nt; j++) wv[j] = v_load(wf + j * QMM_KB + k);
#pragma GCC unroll 8
    for (int i = 0; i < mt; i++) {
      const vf xv = v_load(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < nt; j++) acc[i][j] = v_fma(xv, wv[j], acc[i][j]);
    }
  }
  store_sums(mt, nt, acc, y, ldy, add);
}

typedef void (*tile_fn)(const float *, long, const float *, long, float *, long, int);
#define TILE(MT, NT)                                                                         \
  static void tile_##MT##_##NT(const float *x, long ldx, const float *wf, long kb, float *y, \
                               long ldy, int add) {                                          \
    tile_body(MT, NT, x, ldx, wf, kb, y, ldy, add);                                          \
  }

#if QMM_NT == 4
#define FOR_NT(F, ...) F(__VA_ARGS__, 1) F(__VA_ARGS__, 2) F(__VA_ARGS__, 3) F(__VA_ARGS__, 4)
#define PTRS_NT(P, ...) {P(__VA_ARGS__, 1), P(__VA_ARGS__, 2), P(__VA_ARGS__, 3), P(__VA_ARGS__, 4)}
#elif QMM_NT == 2
#define FOR_NT(F, ...) F(__VA_ARGS__, 1) F(__VA_ARGS__, 2)
#define PTRS_NT(P, ...) {P(__VA_ARGS__, 1), P(__VA_ARGS__, 2)}
#else
#error "QMM_NT must be 2 or 4"
#endif
#define TILE_P(MT, NT) tile_##MT##_##NT
#define DIRECT_G(MT, G, NT) DIRECT(MT, NT, G)
#define DIRECT_P(MT, G, NT) direct_##MT##_##NT##_##G
#define DIRECT_ALL(MT) FOR_NT(DIRECT_G, MT, 32) FOR_NT(DIRECT_G, MT, 64) FOR_NT(DIRECT_G, MT, 128)
#define DIRECT_PTRS(MT)                                                                      \
  {PTRS_NT(DIRECT_P, MT, 32), PTRS_NT(DIRECT_P, MT, 64), PTRS_NT(DIRECT_P, MT, 128)}

FOR_NT(TILE, 1)
FOR_NT(TILE, 2)
FOR_NT(TILE, 3)
#if QMM_MT >= 4
FOR_NT(TILE, 4)
#endif
#if QMM_MT >= 6
FOR_NT(TILE, 5)
FOR_NT(TILE, 6)
#endif
static const tile_fn TILES[QMM_MT][QMM_NT] = {
    PTRS_NT(TILE_P, 1), PTRS_NT(TILE_P, 2), PTRS_NT(TILE_P, 3),
#if QMM_MT >= 4
    PTRS_NT(TILE_P, 4),
#endif
#if QMM_MT >= 6
    PTRS_NT(TILE_P, 5), PTRS_NT(TILE_P, 6),
#endif
};

DIRECT_ALL(1)
DIRECT_ALL(2)
#if QMM_DMT >= 4
DIRECT_ALL(3)
DIRECT_ALL(4)
#endif
static const direct_fn DIRECTS[QMM_DMT][3][QMM_NT] = {
    DIRECT_PTRS(1), DIRECT_PTRS(2),
#if QMM_DMT >= 4
    DIRECT_PTRS(3), DIRECT_PTRS(4),
#endif
};

static int group_index(int g) { return g == 32 ? 0 : g == 64 ? 1 : 2; }

/* Rows [n0, n1) of y for M <= QMM_DMT: the direct path. */
static void direct_rows(const job_t *J, long n0, long n1, scratch_t *S) {
  const direct_fn *fns = DIRECTS[J->m - 1][group_index(J->group)];
  for (long r0 = n0; r0 < n1; r0 += QMM_NT) {
    const int nt = (int)(n1 - r0 < QMM_NT ? n1 - r0 : QMM_NT);
    for (long k0 = 0; k0 < J->k; k0 += QMM_KB) {
      const long kb = J->k - k0 < QMM_KB ? J->k - k0 : QMM_KB;
      const uint8_t *q[QMM_NT];
      for (int j = 0; j < nt; j++) q[j] = row_bytes(J, r0 + j, k0, kb, S->ub[j]);
      const long g0 = r0 * J->gpr + k0 / J->group;
      fns[nt - 1](J->x + k0, J->k, q, J->s + g0, J->b + g0, J->gpr, kb, J->y + r0, J->n, k0 > 0);
    }
  }
}

/* Rows [n0, n1) of y, all M rows: the panel path. */
static void panel_rows(const job_t *J, long n0, long n1, scratch_t *S) {
  for (long r0 = n0; r0 < n1; r0 += QMM_NT) {
    const int nt = (int)(n1 - r0 < QMM_NT ? n1 - r0 : QMM_NT);
    for (long k0 = 0; k0 < J->k; k0 += QMM_KB) {
      const long kb = J->k - k0 < QMM_KB ? J->k - k0 : QMM_KB;
      for (int j = 0; j < nt; j++) dequant_row(J, r0 + j, k0, kb, S->ub[0], S->wf[j]);
      for (long m0 = 0; m0 < J->m; m0 += QMM_MT) {
        const int mt = (int)(J->m - m0 < QMM_MT ? J->m - m0 : QMM_MT);
        TILES[mt - 1][nt - 1](J->x + m0 * J->k + k0, J->k, &S->wf[0][0], kb, J->y + m0 * J->n + r0,
                              J->n, k0 > 0);
      }
    }
  }
}

/* Rows [n0, n1) of the current blas tile dequantized into wbuf. */
static void blas_rows(const job_t *J, long n0, long n1, scratch_t *S) {
  for (long r = n0; r < n1; r++)
    for (long k0 = 0; k0 < J->k; k0 += QMM_KB) {
      const long kb = J->k - k0 < QMM_KB ? J->k - k0 : QMM_KB;
      dequant_row(J, r, k0, kb, S->ub[0], J->wbuf + (r - J->r_begin) * J->k + k0);
    }
}

/* ------------------------------------------------------------------------
 * Thread pool: persistent workers, spin then sleep. One 64-bit ticket holds
 * generation (16 bits), chunk count (24) and next chunk (24), so claiming a
 * chunk is one CAS and a late worker can never claim a chunk of a job that
 * is no longer (or not yet) current. The caller works too and returns once
 * every chunk is done, so it never depends on a worker waking up.
 * ------------------------------------------------------------------------ */
typedef void (*chunk_fn)(const job_t *, long, long, scratch_t *);

#define T_GEN(t) ((t) >> 48)
#define T_COUNT(t) (((t) >> 24) & 0xFFFFFF)
#define T_NEXT(t) ((t)&0xFFFFFF)
#define T_MAXCHUNKS 0xFFFFFFL

static struct {
  int want; /* threads requested (0: default) */
  int started;
  int nthreads; /* including the caller */
  pthread_t tid[QMM_MAX_THREADS];
  scratch_t *scratch[QMM_MAX_THREADS];
  _Atomic uint64_t ticket;
  _Atomic long done;
  _Atomic int sleepers, stop, park;
  const job_t *job;
  chunk_fn fn;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  float *wbuf;
  size_t wbuf_floats;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static inline void cpu_relax(void) {
#if !defined(QMM_ISA_GENERIC)
  _mm_pause();
#endif
}

static void run_chunk(const job_t *J, chunk_fn fn, long c, scratch_t *S) {
  const long n0 = J->r_begin + c * J->rows_per_chunk;
  const long n1 = n0 + J->rows_per_chunk < J->r_end ? n0 + J->rows_per_chunk : J->r_end;
  fn(J, n0, n1, S);
}

/* Claim and run chunks of generation `gen` until none is left. */
static void run_chunks(uint64_t gen, scratch_t *S) {
  for (;;) {
    uint64_t t = atomic_load_explicit(&P.ticket, memory_order_acquire);
    if (T_GEN(t) != gen || T_NEXT(t) >= T_COUNT(t)) return;
    if (!atomic_compare_exchange_weak_explicit(&P.ticket, &t, t + 1, memory_order_acq_rel,
                                               memory_order_relaxed))
      continue;
    run_chunk(P.job, P.fn, (long)T_NEXT(t), S);
    atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
  }
}

static void *worker_main(void *arg) {
  const int id = (int)(intptr_t)arg;
  uint64_t seen = T_GEN(atomic_load(&P.ticket));
  for (;;) {
    double t0 = atomic_load_explicit(&P.park, memory_order_relaxed) ? -1e18 : now_us();
    for (int spins = 0; T_GEN(atomic_load_explicit(&P.ticket, memory_order_acquire)) == seen;
         spins++) {
      if (atomic_load_explicit(&P.stop, memory_order_relaxed)) return NULL;
      cpu_relax();
      if ((spins & 15) == 15 && now_us() - t0 > QMM_SPIN_US) {
        atomic_fetch_add(&P.sleepers, 1);
        pthread_mutex_lock(&P.mu);
        while (T_GEN(atomic_load(&P.ticket)) == seen && !atomic_load(&P.stop))
          pthread_cond_wait(&P.cv, &P.mu);
        pthread_mutex_unlock(&P.mu);
        atomic_fetch_sub(&P.sleepers, 1);
      }
    }
    seen = T_GEN(atomic_load_explicit(&P.ticket, memory_order_acquire));
    run_chunks(seen, P.scratch[id]);
  }
}

static int default_threads(void) {
  cpu_set_t set;
  int n = 1;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  return n < 1 ? 1 : n > QMM_MAX_THREADS ? QMM_MAX_THREADS : n;
}

static void pool_stop(void) {
  if (!P.started) return;
  atomic_store(&P.stop, 1);
  pthread_mutex_lock(&P.mu);
  pthread_cond_broadcast(&P.cv);
  pthread_mutex_unlock(&P.mu);
  for (int i = 1; i < P.nthreads; i++) pthread_join(P.tid[i], NULL);
  atomic_store(&P.stop, 0);
  P.started = 0;
}

static scratch_t *scratch_for(int i) {
  if (!P.scratch[i]) P.scratch[i] = aligned_alloc(64, sizeof(scratch_t));
  return P.scratch[i];
}

/* Start the workers if needed; returns the number of threads available. */
static int pool_start(void) {
  if (P.started) return P.nthreads;
  int n = P.want > 0 ? P.want : default_threads();
  P.nthreads = 1;
  if (!scratch_for(0)) return 0;
  for (int i = 1; i < n; i++) {
    if (!scratch_for(i)) break;
    if (pthread_create(&P.tid[i], NULL, worker_main, (void *)(intptr_t)i) != 0) break;
    P.nthreads = i + 1;
  }
  P.started = 1;
  return P.nthreads;
}

/* Run fn over `nchunks` chunks of the job on the pool (caller included). */
static void pool_run(const job_t *J, chunk_fn fn, long nchunks, int park_after) {
  if (P.nthreads <= 1 || nchunks <= 1) {
    for (long c = 0; c < nchunks; c++) run_chunk(J, fn, c, P.scratch[0]);
    return;
  }
  P.job = J;
  P.fn = fn;
  atomic_store_explicit(&P.done, 0, memory_order_relaxed);
  atomic_store_explicit(&P.park, park_after, memory_order_relaxed);
  const uint64_t gen = (T_GEN(atomic_load(&P.ticket)) + 1) & 0xFFFF;
  atomic_store(&P.ticket, gen << 48 | (uint64_t)nchunks << 24);
  if (atomic_load(&P.sleepers) > 0) {
    pthread_mutex_lock(&P.mu);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
  }
  run_chunks(gen, P.scratch[0]);
  while (atomic_load_explicit(&P.done, memory_order_acquire) < nchunks) cpu_relax();
}

/* ------------------------------------------------------------------------
 * BLAS binding: a weak reference (bound if a cblas_sgemm is global when this
 * library loads), else a global lookup at first use.
 * ------------------------------------------------------------------------ */
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
extern void cblas_sgemm(int, int, int, int, int, int, float, const float *, int, const float *,
                        int, float, float *, int) __attribute__((weak));

static sgemm_fn find_sgemm(void) {
  static sgemm_fn fn;
  static int looked;
  if (!looked) {
    fn = cblas_sgemm ? cblas_sgemm : (sgemm_fn)dlsym(RTLD_DEFAULT, "cblas_sgemm");
    looked = 1;
  }
  return fn;
}

/* Chunks of at least `min_rows` rows (a multiple of QMM_NT), about four per
 * thread so a busy core does not hold the call up. */
static long split(job_t *J, long min_rows) {
  const long rows = J->r_end - J->r_begin, want = (long)P.nthreads * 4;
  long per = (rows + want - 1) / want;
  if (per < min_rows) per = min_rows;
  per = (per + QMM_NT - 1) / QMM_NT * QMM_NT;
  if (per * T_MAXCHUNKS < rows) per = (rows + T_MAXCHUNKS - 1) / T_MAXCHUNKS;
  J->rows_per_chunk = per;
  return (rows + per - 1) / per;
}

static int blas_path(job_t *J, sgemm_fn gemm) {
  long tile = (1L << 18) / J->k; /* about 1 MiB of float weights per tile */
  tile = tile < 64 ? 64 : tile / 16 * 16;
  if (tile > J->n) tile = J->n;
  const size_t need = (size_t)tile * (size_t)J->k;
  if (P.wbuf_floats < need) {
    free(P.wbuf);
    P.wbuf = aligned_alloc(64, (need * sizeof(float) + 63) / 64 * 64);
    P.wbuf_floats = P.wbuf ? need : 0;
    if (!P.wbuf) return 0;
  }
  J->wbuf = P.wbuf;
  for (long base = 0; base < J->n; base += tile) {
    J->r_begin = base;
    J->r_end = base + tile < J->n ? base + tile : J->n;
    pool_run(J, blas_rows, split(J, QMM_NT), 1);
    /* CblasRowMajor, CblasNoTrans, CblasTrans: y[:, tile] = x . wbuf^T */
    gemm(101, 111, 112, (int)J->m, (int)(J->r_end - base), (int)J->k, 1.0f, J->x, (int)J->k,
         P.wbuf, (int)J->k, 0.0f, J->y + base, (int)J->n);
  }
  return 1;
}

int mlxcel_qmm(const float *x, long m, long k, const uint32_t *w, const float *scales,
               const float *biases, long n, int bits, int group, float *y) {
  if (bits < 2 || bits > 8 || bits == 7 || (group != 32 && group != 64 && group != 128))
    return 1;
  if (m < 1 || n < 1 || k < group || k % group != 0 || k > (1L << 30) / (m > n ? m : n))
    return 2;
  if (pool_start() < 1) return 3;
#if defined(QMM_VBMI)
  if (VBMI_SHIFT[2][1] == 0) vbmi_tables();
#endif
  job_t J = {.x = x, .s = scales, .b = biases, .w = (const uint8_t *)w, .y = y, .m = m, .k = k,
             .n = n, .wrow = k * bits / 8, .wbytes = n * (k * bits / 8), .gpr = k / group,
             .bits = bits, .group = group, .r_begin = 0, .r_end = n};
  sgemm_fn gemm = m >= QMM_BLAS_MIN_M && m <= 0x7FFFFFFF ? find_sgemm() : NULL;
  if (gemm && blas_path(&J, gemm)) return 0;
  J.wbuf = NULL;
  J.r_begin = 0;
  J.r_end = n;
  /* Below ~32K weights a second thread costs more than it saves. */
  const long min_rows = (32768 + k - 1) / k;
  pool_run(&J, m <= QMM_DMT ? direct_rows : panel_rows, split(&J, min_rows), 0);
  return 0;
}

const char *mlxcel_qmm_isa(void) {
#if defined(QMM_ISA_AVX512)
  return "avx512";
#elif defined(QMM_ISA_AVX2)
  return "avx2";
#else
  return "generic";
#endif
}

void mlxcel_qmm_set_threads(int n) {
  if (n > QMM_MAX_THREADS) n = QMM_MAX_THREADS;
  pool_stop();
  P.want = n > 0 ? n : 0;
}
