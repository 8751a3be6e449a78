/*
 * CPU quantized matrix product for MLX's affine-quantized weights; see
 * qmm_kernel.h for the contract.
 *
 * Why a kernel of our own: MLX's CPU quantized_matmul dequantizes per output
 * element, so with a few rows of x it re-reads and re-unpacks every weight
 * for every row and runs far below the memory bandwidth. Here each block of
 * weights is unpacked and dequantized ONCE and then used for all M rows.
 *
 * Build: one source, the instruction set chosen when compiling (build.py's
 * table; the vector operations are simd.h's):
 *   AVX-512  -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mbmi2 -mf16c
 *            [-mavx512vbmi]
 *   AVX2     -mavx2 -mfma -mbmi2 -mf16c
 *   generic  neither (portable C, for tests and other CPUs)
 * The loader checks that the CPU supports the build it loads. The AVX-512
 * build with VBMI also carries an AMX path (compiled with a function-level
 * target, so no extra flags) that it uses only when the CPU has AMX and the
 * OS grants the tile state at run time (MLXCEL_QMM_AMX=0 switches it off).
 *
 * Paths, by the number of rows M (thresholds measured on Sapphire Rapids):
 *   direct  M <= QMM_DMT: per tile of QMM_NT weight rows, unpack (BMI2 pdep,
 *           or AVX512-VBMI vpmultishiftqb) to bytes, then each vector of
 *           weights is widened, converted and dequantized in registers and
 *           used at once for all M rows (accumulators in registers).
 *   amx     M >= QMM_AMX_MIN_M, AMX usable: bf16 tile products, exact (see
 *           the AMX section), about twice the float kernels' speed.
 *   panel   otherwise below QMM_BLAS_MIN_M: weights dequantized to an L1
 *           float panel, then a QMM_MT x QMM_NT register-tiled microkernel
 *           runs over all M rows.
 *   blas    M >= QMM_BLAS_MIN_M without AMX: tiles of rows dequantized into
 *           a float buffer (threads split the rows), then cblas_sgemm. Used
 *           only when a cblas_sgemm is bound in the process (weak symbol or
 *           global lookup); the program is expected to have bound a fast one
 *           (OpenBLAS) before calling.
 * Threads split N in every path, on the process's one pool (pool.c).
 * Compile-time knobs (tests use them to reach every path): QMM_BLAS_MIN_M,
 * QMM_AMX_MIN_M, QMM_NO_AMX, QMM_NO_VBMI, QMM_KB (K block of the float
 * paths), and QMM_TESTING (exports mlxcel_qmm_last_path for the tests).
 */
#define _GNU_SOURCE
#include "qmm_kernel.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "simd.h"

#if defined(MLXCEL_SIMD_AVX512) && defined(__AVX512VBMI__) && !defined(QMM_NO_VBMI)
#define QMM_VBMI 1
#endif
#if !defined(MLXCEL_SIMD_GENERIC) && defined(__BMI2__)
#define QMM_PDEP 1
#endif

#ifndef QMM_BLAS_MIN_M
#define QMM_BLAS_MIN_M 96
#endif
#ifndef QMM_KB
#define QMM_KB 1024 /* K block of the float panel: QMM_NT * QMM_KB * 4 bytes in L1 */
#endif
#ifndef QMM_WAKE_WORK
#define QMM_WAKE_WORK (1 << 18) /* n * k * m from which sleeping workers are woken */
#endif

/* Register tiles per instruction set (simd.h gives VL lanes): the panel path's
 * QMM_MT rows of x by QMM_NT rows of w, the direct path up to QMM_DMT rows of x. */
#if defined(MLXCEL_SIMD_AVX512)
#define QMM_MT 6
#define QMM_NT 4
#define QMM_DMT 4
#elif defined(MLXCEL_SIMD_AVX2)
#define QMM_MT 3
#define QMM_NT 4
#define QMM_DMT 2
#else
#define QMM_MT 4
#define QMM_NT 2
#define QMM_DMT 4
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
INLINE void unpack_bits(const uint8_t *src, long avail, const int bits, long count,
                        uint8_t *dst) {
  /* Pack p (8 values) is `bits` bytes at p*bits: read it whole, shift out each value. */
  const uint64_t mask = (1u << bits) - 1u;
  for (long p = 0; p < count / 8; p++) {
    uint64_t v = 0;
    const long off = p * bits;
    if (off + 8 <= avail) {
      memcpy(&v, src + off, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
      v = __builtin_bswap64(v);
#endif
    } else {
      for (long i = 0; i < bits; i++) v |= (uint64_t)src[off + i] << (8 * i);
    }
    for (int i = 0; i < 8; i++) dst[8 * p + i] = (uint8_t)(v >> (i * bits) & mask);
  }
}

static void unpack(const uint8_t *src, long avail, int bits, long count, uint8_t *dst) {
  switch (bits) { /* constant shifts */
  case 2: unpack_bits(src, avail, 2, count, dst); break;
  case 3: unpack_bits(src, avail, 3, count, dst); break;
  case 4: unpack_bits(src, avail, 4, count, dst); break;
  case 5: unpack_bits(src, avail, 5, count, dst); break;
  default: unpack_bits(src, avail, 6, count, dst); break;
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
  const uint16_t *xt; /* amx path: x as bf16 tiles, see amx_prep_x */
  const float *xg;    /* amx path: x summed per group */
  long mtiles;
  int wake; /* worth waking sleeping workers (else only spinning ones help) */
} job_t;

#if defined(QMM_VBMI) && !defined(QMM_NO_AMX) && (defined(__clang__) || __GNUC__ >= 11)
#define QMM_AMX 1
#define QMM_AKB 1024 /* K block of the amx path's bf16 weight tiles */
#define QMM_ANT 4    /* tiles of 16 weight rows converted together, sharing x's tiles */
#endif

typedef struct {
  uint8_t ub[QMM_NT][QMM_KB] __attribute__((aligned(64)));
  float wf[QMM_NT][QMM_KB] __attribute__((aligned(64)));
#if defined(QMM_AMX)
  uint16_t ab[QMM_ANT][QMM_AKB / 32][16][32] __attribute__((aligned(64)));
  float cbuf[2][16][16] __attribute__((aligned(64)));
#endif
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

/* The next tile of weight rows, asked for a line at a time while this one
 * is computed. The direct path is the one that waits on memory, and the
 * hardware prefetcher loses track of the rows; spread out, the requests keep
 * the memory busy without filling the core's miss buffers, which a burst of
 * them at the start of each tile does (a whole-model pass at M = 1: 1.2x
 * faster than bursts, 1.4x faster than no prefetching at all). */
typedef struct {
  const char *w;           /* packed weights of the next tile's first row, at this k block */
  const float *s, *b;      /* its scales and biases, at this k block */
  long stride, gpr, rows;  /* bytes per weight row, groups per row, rows (0: none) */
  long gbytes;             /* packed bytes per group */
} ahead_t;

INLINE void ask_ahead(const ahead_t *pf, int j, long gi) {
  if ((gi & 1) || j >= pf->rows) return; /* every other group: about a line each */
  PREFETCH(pf->w + j * pf->stride + gi * pf->gbytes);
  if ((gi & 15) == 0) {
    PREFETCH(pf->s + j * pf->gpr + gi);
    PREFETCH(pf->b + j * pf->gpr + gi);
  }
}

/* ------------------------------------------------------------------------
 * Direct microkernel (few rows of x): y[mt][nt] (+)= x[mt][kb] . W[nt][kb]^T,
 * each weight vector dequantized in registers and used for all mt rows.
 * ------------------------------------------------------------------------ */
INLINE void direct_body(const int mt, const int nt, const int g, const float *x, long ldx,
                        const uint8_t *const *q, const float *s, const float *b, long gpr,
                        long kb, float *y, long ldy, int add, const ahead_t *pf) {
  vf acc[QMM_DMT][QMM_NT];
#pragma GCC unroll 8
  for (int i = 0; i < mt; i++)
#pragma GCC unroll 8
    for (int j = 0; j < nt; j++) acc[i][j] = v_zero();
  if (mt == 1) {
    /* One row of x: the weight rows one after the other, a single stream
     * from memory (the prefetcher follows it; several rows side by side
     * lose it), the sums of the rows still reduced together. */
#pragma GCC unroll 8
    for (int j = 0; j < nt; j++)
      for (long g0 = 0, gi = 0; g0 < kb; g0 += g, gi++) {
        ask_ahead(pf, j, gi);
        const vf vs = v_set1(s[j * gpr + gi]), vb = v_set1(b[j * gpr + gi]);
#pragma GCC unroll 8
        for (int k = 0; k < g; k += VL)
          acc[0][j] = v_fma(v_load(x + g0 + k), v_fma(v_u8(q[j] + g0 + k), vs, vb), acc[0][j]);
      }
    store_sums(mt, nt, acc, y, ldy, add);
    return;
  }
  for (long g0 = 0, gi = 0; g0 < kb; g0 += g, gi++) {
    vf vs[QMM_NT], vb[QMM_NT];
#pragma GCC unroll 8
    for (int j = 0; j < nt; j++) {
      ask_ahead(pf, j, gi);
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
                          const float *, long, long, float *, long, int, const ahead_t *);
#define DIRECT(MT, NT, G)                                                                    \
  static void direct_##MT##_##NT##_##G(const float *x, long ldx, const uint8_t *const *q,    \
                                       const float *s, const float *b, long gpr, long kb,    \
                                       float *y, long ldy, int add, const ahead_t *pf) {     \
    direct_body(MT, NT, G, x, ldx, q, s, b, gpr, kb, y, ldy, add, pf);                      \
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

/* Ask for weight rows [r, r + nt), values [k0, k0 + kb), and their scales
 * and biases, at once: for the first tile of a chunk (later tiles are asked
 * for as the one before them is computed, see ahead_t). */
static void prefetch_rows(const job_t *J, long r, long nt, long k0, long kb) {
  if (r + nt > J->n) nt = J->n - r;
  if (nt <= 0) return;
  const char *w = (const char *)(J->w + r * J->wrow + k0 * J->bits / 8);
  for (long o = 0, end = nt * kb * J->bits / 8; o < end; o += 64) PREFETCH(w + o);
  const long g = r * J->gpr + k0 / J->group, count = nt * (kb / J->group);
  for (long o = 0; o < count; o += 16) {
    PREFETCH(J->s + g + o);
    PREFETCH(J->b + g + o);
  }
}

/* Rows [n0, n1) of y for M <= QMM_DMT: the direct path, QMM_NT rows of w
 * at a time, the next QMM_NT asked for as it goes. */
static void direct_rows(const job_t *J, long n0, long n1, scratch_t *S) {
  const direct_fn *fns = DIRECTS[J->m - 1][group_index(J->group)];
  if (n0 < n1) prefetch_rows(J, n0, QMM_NT, 0, J->k < QMM_KB ? J->k : QMM_KB);
  for (long r0 = n0; r0 < n1; r0 += QMM_NT) {
    const int nt = (int)(n1 - r0 < QMM_NT ? n1 - r0 : QMM_NT);
    for (long k0 = 0; k0 < J->k; k0 += QMM_KB) {
      const long kb = J->k - k0 < QMM_KB ? J->k - k0 : QMM_KB;
      const long next = r0 + QMM_NT, g0n = next * J->gpr + k0 / J->group;
      const ahead_t pf = {
          .w = (const char *)J->w + next * J->wrow + k0 * J->bits / 8, .s = J->s + g0n,
          .b = J->b + g0n, .stride = J->wrow, .gpr = J->gpr,
          .rows = next < n1 ? (n1 - next < QMM_NT ? n1 - next : QMM_NT) : 0,
          .gbytes = J->group * J->bits / 8};
      const uint8_t *q[QMM_NT];
      for (int j = 0; j < nt; j++) q[j] = row_bytes(J, r0 + j, k0, kb, S->ub[j]);
      const long g0 = r0 * J->gpr + k0 / J->group;
      fns[nt - 1](J->x + k0, J->k, q, J->s + g0, J->b + g0, J->gpr, kb, J->y + r0, J->n, k0 > 0,
                  &pf);
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
 * AMX path (Sapphire Rapids and later, when the OS grants the tile state):
 * the tile multiplier computes bf16 products with float32 sums, so it is
 * used only where that is exact. A quantized value q (at most 8 bits) is an
 * exact bf16. x is cut into three bf16 parts x1 + x2 + x3 == x (exactly:
 * each part keeps the next 8 significant bits), so every product q * xi is
 * exact and the tiles sum them in float32, as the float kernels do:
 *   P[n][m] = sum over a group of q[n][k] * x[m][k]      (3 tile products)
 *   y[m][n] = sum over groups of s[n][g] * P[n][m] + b[n][g] * X[m][g]
 * with X[m][g] the group sums of x. Tiles: 0 weights (16 rows n x 32 k),
 * 1-3 the parts of x (16 pairs of k x 16 m, "VNNI" pairs), 4-5 two
 * accumulators used in turn so one group's scaling overlaps the next one's
 * products.
 * ------------------------------------------------------------------------ */
#if defined(QMM_AMX)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#ifndef QMM_AMX_MIN_M
#define QMM_AMX_MIN_M 5
#endif

static int amx_state; /* 1: usable, -1: not; settled by the first call */
static void amx_tables(void);

static void amx_check(void) {
  const char *env = getenv("MLXCEL_QMM_AMX");
  unsigned a, b, c, d;
  int ok = !(env && env[0] == '0') && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
           (d >> 24 & 1) && (d >> 22 & 1);
  /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: once for the whole process */
  ok = ok && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  if (ok) amx_tables();
  amx_state = ok ? 1 : -1;
}

/* CPU support, the OS's permission (Linux >= 5.16), and MLXCEL_QMM_AMX=0 unset;
 * checked once, whichever thread calls first. */
static int amx_usable(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, amx_check);
  return amx_state > 0;
}

/* Word lane i of 32 gets the 16 bits at bit i*bits (vpermb + vpsrlvw); a
 * table lookup (vpermw: low 5 bits; vpermt2w: low 6) maps it to bf16. */
static uint8_t AMX_WIDX[9][64];
static uint16_t AMX_WSHIFT[9][32], AMX_BF16[9][64];

static uint16_t bf16_of(unsigned v) {
  const float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16); /* exact: v < 256 has at most 8 significant bits */
}

static void amx_tables(void) {
  for (int bits = 2; bits <= 8; bits++) {
    for (int i = 0; i < 32; i++) {
      const int byte = i * bits >> 3;
      AMX_WIDX[bits][2 * i] = (uint8_t)byte;
      AMX_WIDX[bits][2 * i + 1] = (uint8_t)(byte + 1);
      AMX_WSHIFT[bits][i] = (uint16_t)(i * bits & 7);
    }
    for (int j = 0; j < 64; j++) AMX_BF16[bits][j] = bf16_of((unsigned)j & ((1u << bits) - 1u));
  }
}

/* Word indices taking the high halves of 32 floats in a and b: their bf16
 * truncations, in order. */
INLINE __m512i hi_words(__m512i a, __m512i b) {
  const __m512i idx = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35,
                                       33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_epi16(a, idx, b);
}

/* 32 values of a weight row (from the byte holding value 0) as bf16 words. */
INLINE __m512i row32_bf16(const uint8_t *src, int bits, __m512i widx, __m512i wshift,
                          __m512i t0, __m512i t1) {
  if (bits == 8) {
    const __m128i *p = (const __m128i *)src;
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p)));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p + 1)));
    return hi_words(_mm512_castps_si512(a), _mm512_castps_si512(b));
  }
  __m512i v = _mm512_maskz_loadu_epi8((1ULL << (4 * bits)) - 1, src);
  v = _mm512_srlv_epi16(_mm512_permutexvar_epi8(widx, v), wshift);
  return bits == 6 ? _mm512_permutex2var_epi16(t0, v, t1) : _mm512_permutexvar_epi16(v, t0);
}

/* Weight rows [r0, r0 + 16) (rows past nt repeat the last), `steps` steps
 * of 32 values from k0, into bf16 tiles ab[step][16][32]. */
static void amx_convert(const job_t *J, long r0, int nt, long k0, long steps,
                        uint16_t (*ab)[16][32]) {
  const int bits = J->bits;
  const __m512i widx = _mm512_loadu_si512(AMX_WIDX[bits]);
  const __m512i wshift = _mm512_loadu_si512(AMX_WSHIFT[bits]);
  const __m512i t0 = _mm512_loadu_si512(AMX_BF16[bits]), t1 = _mm512_loadu_si512(AMX_BF16[bits] + 32);
  for (int r = 0; r < 16; r++) {
    const uint8_t *src = J->w + (r0 + (r < nt ? r : nt - 1)) * J->wrow + k0 * bits / 8;
    for (long ks = 0; ks < steps; ks++)
      _mm512_store_si512(ab[ks][r], row32_bf16(src + ks * 4 * bits, bits, widx, wshift, t0, t1));
  }
}

INLINE void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

/* Chunk = m-tiles [t0, t1): x rows cut into bf16 parts, laid out as tiles
 * xt[mtile][kstep][part][16 pairs][16 m][2], and group sums xg[mtile][g][16]. */
static void amx_prep_x(const job_t *J, long t0, long t1, scratch_t *S) {
  (void)S;
  const long K = J->k, KS = K / 32, G = J->gpr;
  const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
  uint16_t *xt = (uint16_t *)J->xt;
  float *xg = (float *)J->xg;
  for (long mt = t0; mt < t1; mt++) {
    for (long ks = 0; ks < KS; ks++) {
      __m512i part[3][16];
      for (int i = 0; i < 16; i++) {
        const long m = mt * 16 + i;
        __m512 a = _mm512_setzero_ps(), b = a;
        if (m < J->m) {
          a = _mm512_loadu_ps(J->x + m * K + ks * 32);
          b = _mm512_loadu_ps(J->x + m * K + ks * 32 + 16);
        }
        for (int p = 0; p < 3; p++) {
          const __m512 ah = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), hi));
          const __m512 bh = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(b), hi));
          part[p][i] = hi_words(_mm512_castps_si512(ah), _mm512_castps_si512(bh));
          a = _mm512_sub_ps(a, ah); /* exact: the bits below the 8 kept */
          b = _mm512_sub_ps(b, bh);
        }
      }
      for (int p = 0; p < 3; p++) {
        transpose16(part[p]);
        uint16_t *tile = xt + ((mt * KS + ks) * 3 + p) * 512;
        for (int r = 0; r < 16; r++) _mm512_store_si512(tile + r * 32, part[p][r]);
      }
    }
    for (int i = 0; i < 16; i++) {
      const long m = mt * 16 + i;
      for (long g = 0; g < G; g++) {
        float sum = 0.0f;
        if (m < J->m) {
          __m512 v = _mm512_setzero_ps();
          for (int k = 0; k < J->group; k += 16)
            v = _mm512_add_ps(v, _mm512_loadu_ps(J->x + m * K + g * J->group + k));
          sum = _mm512_reduce_add_ps(v);
        }
        xg[(mt * G + g) * 16 + i] = sum;
      }
    }
  }
}

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg_t;

AMX_TARGET static void amx_config(void) {
  amx_cfg_t c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 6; t++) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

/* Accumulator tile T holds one group's products; stored to cbuf. */
#define AMX_GROUP(T, gi, cb)                                                                 \
  do {                                                                                      \
    _tile_zero(T);                                                                          \
    for (long j = 0; j < g32; j++) {                                                        \
      const long ks = (gi)*g32 + j;                                                         \
      _tile_loadd(0, ab[ks], 64);                                                           \
      _tile_loadd(1, xt + ks * 1536, 64);                                                   \
      _tile_loadd(2, xt + ks * 1536 + 512, 64);                                             \
      _tile_loadd(3, xt + ks * 1536 + 1024, 64);                                            \
      _tile_dpbf16ps(T, 0, 1);                                                              \
      _tile_dpbf16ps(T, 0, 2);                                                              \
      _tile_dpbf16ps(T, 0, 3);                                                              \
    }                                                                                       \
    _tile_stored(T, cb, 64);                                                                \
  } while (0)

/* acc[r] += s[r][g] * P[r] + b[r][g] * X[g]: rows past nt repeat the last. */
INLINE void amx_scale(__m512 acc[16], const float *cb, const float *s, const float *b,
                      const float *xg, long G, int nt) {
  const __m512 xv = _mm512_loadu_ps(xg);
  for (int r = 0; r < 16; r++) {
    const long rr = r < nt ? r : nt - 1;
    acc[r] = _mm512_fmadd_ps(_mm512_load_ps(cb + r * 16), _mm512_set1_ps(s[rr * G]), acc[r]);
    acc[r] = _mm512_fmadd_ps(xv, _mm512_set1_ps(b[rr * G]), acc[r]);
  }
}

/* y[m-tile mt][rows r0..r0+nt) (+)= this K block's share. */
AMX_TARGET static void amx_block(const job_t *J, long r0, int nt, long mt, long ks0, long nks,
                                 uint16_t (*ab)[16][32], scratch_t *S, int add) {
  const long G = J->gpr, g32 = J->group / 32, g0 = ks0 / g32, ng = nks / g32;
  const uint16_t *xt = J->xt + (mt * (J->k / 32) + ks0) * 1536;
  const float *xg = J->xg + (mt * G + g0) * 16;
  const float *s = J->s + r0 * G + g0, *b = J->b + r0 * G + g0;
  __m512 acc[16];
  for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
  for (long gi = 0; gi < ng; gi++) {
    if (gi & 1)
      AMX_GROUP(5, gi, S->cbuf[1]);
    else
      AMX_GROUP(4, gi, S->cbuf[0]);
    if (gi > 0)
      amx_scale(acc, S->cbuf[(gi - 1) & 1][0], s + gi - 1, b + gi - 1, xg + (gi - 1) * 16, G, nt);
  }
  amx_scale(acc, S->cbuf[(ng - 1) & 1][0], s + ng - 1, b + ng - 1, xg + (ng - 1) * 16, G, nt);
  __m512i out[16];
  for (int r = 0; r < 16; r++) out[r] = _mm512_castps_si512(acc[r]);
  transpose16(out); /* out[i]: row m of y, lanes = the nt rows of w */
  const __mmask16 cols = (__mmask16)((1u << nt) - 1u);
  for (int i = 0; i < 16 && mt * 16 + i < J->m; i++) {
    float *y = J->y + (mt * 16 + i) * J->n + r0;
    __m512 v = _mm512_castsi512_ps(out[i]);
    if (add) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(cols, y));
    _mm512_mask_storeu_ps(y, cols, v);
  }
}

/* Rows [n0, n1) of y (n0 a multiple of 16), all M rows: QMM_ANT tiles of
 * weight rows at a time, so each tile of x is read from memory once for
 * all of them. */
AMX_TARGET static void amx_rows(const job_t *J, long n0, long n1, scratch_t *S) {
  amx_config();
  for (long base = n0; base < n1; base += 16 * QMM_ANT) {
    for (long k0 = 0; k0 < J->k; k0 += QMM_AKB) {
      const long kb = J->k - k0 < QMM_AKB ? J->k - k0 : QMM_AKB;
      for (long r0 = base, t = 0; r0 < n1 && t < QMM_ANT; r0 += 16, t++)
        amx_convert(J, r0, (int)(n1 - r0 < 16 ? n1 - r0 : 16), k0, kb / 32, S->ab[t]);
      for (long mt = 0; mt < J->mtiles; mt++)
        for (long r0 = base, t = 0; r0 < n1 && t < QMM_ANT; r0 += 16, t++)
          amx_block(J, r0, (int)(n1 - r0 < 16 ? n1 - r0 : 16), mt, k0 / 32, kb / 32, S->ab[t], S,
                    k0 > 0);
    }
  }
  _tile_release();
}
#endif

/* ------------------------------------------------------------------------
 * Threads: every path splits rows of y into chunks over the one pool of the
 * process (pool.c); each chunk gets the scratch of the thread it runs on.
 * ------------------------------------------------------------------------ */
typedef void (*chunk_fn)(const job_t *, long, long, scratch_t *);

typedef struct {
  const job_t *J;
  chunk_fn fn;
  int failed; /* a thread had no memory for its scratch */
} run_t;

static void run_range(void *ctx, long begin, long end) {
  run_t *r = ctx;
  scratch_t *S = mlxcel_thread_buffer(MLXCEL_BUF_QMM, sizeof(scratch_t));
  if (!S) {
    __atomic_store_n(&r->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  r->fn(r->J, r->J->r_begin + begin, r->J->r_begin + end, S);
}

/* Rows [r_begin, r_end) of the job in chunks of rows_per_chunk on the pool (the
 * caller included); 0 once done, nonzero when a thread had no scratch. `park`:
 * the workers sleep afterwards (OpenBLAS's threads run next). */
static int pool_run(const job_t *J, chunk_fn fn, int park) {
  run_t r = {.J = J, .fn = fn};
  const int flags = (J->wake ? MLXCEL_POOL_WAKE : 0) | (park ? MLXCEL_POOL_PARK : 0);
  mlxcel_pool_for(run_range, &r, J->r_end - J->r_begin, J->rows_per_chunk, flags);
  return __atomic_load_n(&r.failed, __ATOMIC_RELAXED);
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

/* Chunks of at least `min_rows` rows (a multiple of `align`), about eight
 * per thread so a busy core does not hold the call up. */
static void split(job_t *J, long min_rows, long align) {
  const long rows = J->r_end - J->r_begin, want = (long)mlxcel_pool_threads() * 8;
  long per = (rows + want - 1) / want;
  if (per < min_rows) per = min_rows;
  J->rows_per_chunk = (per + align - 1) / align * align;
}

/* 1 done, 0 not taken (no memory for the float tile), -1 failed part way. */
static int blas_path(job_t *J, sgemm_fn gemm) {
  long tile = (1L << 18) / J->k; /* about 1 MiB of float weights per tile */
  tile = tile < 64 ? 64 : tile / 16 * 16;
  if (tile > J->n) tile = J->n;
  float *wbuf = mlxcel_thread_buffer(MLXCEL_BUF_QMM_WEIGHTS, (size_t)tile * (size_t)J->k * 4);
  if (!wbuf) return 0;
  J->wbuf = wbuf;
  for (long base = 0; base < J->n; base += tile) {
    J->r_begin = base;
    J->r_end = base + tile < J->n ? base + tile : J->n;
    split(J, QMM_NT, QMM_NT);
    if (pool_run(J, blas_rows, 1)) return -1;
    /* CblasRowMajor, CblasNoTrans, CblasTrans: y[:, tile] = x . wbuf^T */
    gemm(101, 111, 112, (int)J->m, (int)(J->r_end - base), (int)J->k, 1.0f, J->x, (int)J->k,
         wbuf, (int)J->k, 0.0f, J->y + base, (int)J->n);
  }
  return 1;
}

#if defined(QMM_AMX)
/* As blas_path: 1 done, 0 not taken, -1 failed part way. */
static int amx_path(job_t *J) {
  const long mtiles = (J->m + 15) / 16, ks = J->k / 32;
  const size_t xt_bytes = (size_t)(mtiles * ks * 3 * 1024), xg_bytes = (size_t)(mtiles * J->gpr * 64);
  char *xbuf = mlxcel_thread_buffer(MLXCEL_BUF_QMM_X, xt_bytes + xg_bytes);
  if (!xbuf) return 0;
  J->xt = (const uint16_t *)xbuf;
  J->xg = (const float *)(xbuf + xt_bytes);
  J->mtiles = mtiles;
  J->r_begin = 0;
  J->r_end = mtiles;
  J->rows_per_chunk = 1;
  if (pool_run(J, amx_prep_x, 0)) return -1;
  J->r_end = J->n;
  split(J, (32768 + J->k - 1) / J->k, 16);
  return pool_run(J, amx_rows, 0) ? -1 : 1;
}
#endif

/* Which path the last call took: 1 direct, 2 panel, 3 blas, 4 amx. Exported
 * only from test builds (-DQMM_TESTING), so tests can tell the paths apart. */
static int last_path;
#if defined(QMM_TESTING)
__attribute__((visibility("default"))) int mlxcel_qmm_last_path(void) { return last_path; }
#endif

int mlxcel_qmm(const float *x, long m, long k, const uint32_t *w, const float *scales,
               const float *biases, long n, int bits, int group, float *y) {
  if (bits < 2 || bits > 8 || bits == 7 || (group != 32 && group != 64 && group != 128))
    return 1;
  /* (each fits the int arguments of cblas_sgemm) */
  if (m < 1 || n < 1 || k < group || k % group != 0 || m > 0x7FFFFFFF || n > 0x7FFFFFFF ||
      k > 0x7FFFFFFF)
    return 2;
#if defined(QMM_VBMI)
  static pthread_once_t vbmi_once = PTHREAD_ONCE_INIT;
  pthread_once(&vbmi_once, vbmi_tables);
#endif
  job_t J = {.x = x, .s = scales, .b = biases, .w = (const uint8_t *)w, .y = y, .m = m, .k = k,
             .n = n, .wrow = k * bits / 8, .wbytes = n * (k * bits / 8), .gpr = k / group,
             .bits = bits, .group = group, .r_begin = 0, .r_end = n,
             /* waking a sleeping worker costs tens of us: not for small calls */
             .wake = (double)n * (double)k * (double)m >= QMM_WAKE_WORK};
#if defined(QMM_AMX)
  if (m >= QMM_AMX_MIN_M && amx_usable()) {
    last_path = 4;
    const int done = amx_path(&J);
    if (done) return done > 0 ? 0 : 3;
  }
#endif
  sgemm_fn gemm = m >= QMM_BLAS_MIN_M ? find_sgemm() : NULL;
  last_path = 3;
  const int done = gemm ? blas_path(&J, gemm) : 0;
  if (done) return done > 0 ? 0 : 3;
  J.wbuf = NULL;
  J.r_begin = 0;
  J.r_end = n;
  /* Below ~32K weights a second thread costs more than it saves. */
  split(&J, (32768 + k - 1) / k, QMM_NT);
  last_path = m <= QMM_DMT ? 1 : 2;
  return pool_run(&J, m <= QMM_DMT ? direct_rows : panel_rows, 0) ? 3 : 0;
}

const char *mlxcel_qmm_isa(void) { return MLXCEL_SIMD_ISA; }
