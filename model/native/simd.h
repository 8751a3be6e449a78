/*
 * The vector operations every kernel of mlxcel's native code uses: one instruction set chosen
 * when compiling (the build passes its flags, see build.py), VL float lanes, and the same
 * operations under the same names whatever the set.
 *
 *   AVX-512  F, BW and VL with FMA: 16 lanes of __m512
 *   AVX2     with FMA: 8 lanes of __m256
 *   generic  portable C through GCC/Clang vector extensions: 4 lanes (native on SSE2 and
 *            NEON, scalar code elsewhere)
 *
 * Why one header: the quantized matmul (qmm_kernel.c), attention and SwiGLU
 * (attn_kernel.c) and the BLAS shim's skinny kernel (blas_skinny.c) each pick the set from
 * the same macros, so a build is one instruction set through and through and its name
 * (MLXCEL_SIMD_ISA) is what the loader checks against the CPU.
 *
 * The kernels' tile sizes stay with each kernel: they follow the register count and the
 * lanes, not the operations.
 */
#ifndef MLXCEL_SIMD_H
#define MLXCEL_SIMD_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
#define MLXCEL_SIMD_AVX512 1
#define MLXCEL_SIMD_ISA "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define MLXCEL_SIMD_AVX2 1
#define MLXCEL_SIMD_ISA "avx2"
#else
#define MLXCEL_SIMD_GENERIC 1
#define MLXCEL_SIMD_ISA "generic"
#endif

#if !defined(MLXCEL_SIMD_GENERIC)
#include <immintrin.h>
#endif

#define INLINE static inline __attribute__((always_inline))
#if defined(__x86_64__) || defined(__i386__)
/* An asm statement: GCC 12 drops loops of __builtin_prefetch as dead code. */
#define PREFETCH(p) __asm__ volatile("prefetcht0 %0" ::"m"(*(const char *)(p)))
#else
#define PREFETCH(p) __builtin_prefetch((p), 0, 3)
#endif

/* ------------------------------------------------------------------------
 * VL float lanes: load, store, broadcast, arithmetic, fused multiply-add.
 * v_max(c, x) and v_min(c, x) return x when either is NaN, so a NaN x stays
 * NaN; v_lt(a, b, x, y) is a < b ? x : y lane by lane, v_eq likewise.
 * ------------------------------------------------------------------------ */
#if defined(MLXCEL_SIMD_AVX512)
#define VL 16
typedef __m512 vf;
INLINE vf v_zero(void) { return _mm512_setzero_ps(); }
INLINE vf v_load(const float *p) { return _mm512_loadu_ps(p); }
INLINE void v_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
INLINE vf v_set1(float f) { return _mm512_set1_ps(f); }
INLINE vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
INLINE vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
INLINE vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
INLINE vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
INLINE vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
INLINE vf v_max(vf c, vf x) { return _mm512_max_ps(c, x); }
INLINE vf v_min(vf c, vf x) { return _mm512_min_ps(c, x); }
INLINE vf v_lt(vf a, vf b, vf x, vf y) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
}
INLINE vf v_eq(vf a, vf b, vf x, vf y) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), y, x);
}
INLINE vf v_round(vf x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* p * 2^n for integral n. */
INLINE vf v_scale2(vf p, vf n) { return _mm512_scalef_ps(p, n); }
/* VL bytes widened to floats. */
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
#elif defined(MLXCEL_SIMD_AVX2)
#define VL 8
typedef __m256 vf;
INLINE vf v_zero(void) { return _mm256_setzero_ps(); }
INLINE vf v_load(const float *p) { return _mm256_loadu_ps(p); }
INLINE void v_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
INLINE vf v_set1(float f) { return _mm256_set1_ps(f); }
INLINE vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
INLINE vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
INLINE vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
INLINE vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
INLINE vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
INLINE vf v_max(vf c, vf x) { return _mm256_max_ps(c, x); }
INLINE vf v_min(vf c, vf x) { return _mm256_min_ps(c, x); }
INLINE vf v_lt(vf a, vf b, vf x, vf y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
INLINE vf v_eq(vf a, vf b, vf x, vf y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_EQ_OQ)); }
INLINE vf v_round(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* p * 2^n for integral n in [-150, 128], as two factors that are normal floats. */
INLINE vf v_scale2(vf p, vf n) {
  const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1), bias = _mm256_set1_epi32(127);
  const vf e1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const vf e2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, e1), e2);
}
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
#define VL 4 /* a 16-byte vector: native on SSE2 and NEON */
typedef float vf __attribute__((vector_size(4 * VL)));
typedef int32_t vi __attribute__((vector_size(4 * VL)));
typedef uint8_t vu8 __attribute__((vector_size(VL)));
INLINE vf v_zero(void) { return (vf){0}; }
INLINE vf v_load(const float *p) {
  vf r;
  memcpy(&r, p, sizeof r);
  return r;
}
INLINE void v_store(float *p, vf v) { memcpy(p, &v, sizeof v); }
INLINE vf v_set1(float f) { return (vf){0} + f; }
INLINE vf v_add(vf a, vf b) { return a + b; }
INLINE vf v_sub(vf a, vf b) { return a - b; }
INLINE vf v_mul(vf a, vf b) { return a * b; }
INLINE vf v_div(vf a, vf b) { return a / b; }
INLINE vf v_fma(vf a, vf b, vf c) { return a * b + c; }
INLINE vf v_pick(vi m, vf x, vf y) { return (vf)(((vi)x & m) | ((vi)y & ~m)); }
INLINE vf v_lt(vf a, vf b, vf x, vf y) { return v_pick(a < b, x, y); }
INLINE vf v_eq(vf a, vf b, vf x, vf y) { return v_pick(a == b, x, y); }
INLINE vf v_max(vf c, vf x) { return v_pick(x < c, c, x); } /* NaN x stays */
INLINE vf v_min(vf c, vf x) { return v_pick(c < x, c, x); }
INLINE vf v_round(vf x) { /* to nearest even, |x| < 2^22 */
  const vf magic = v_set1(12582912.0f);
  return (x + magic) - magic;
}
INLINE vf v_scale2(vf p, vf n) {
  const vi ni = __builtin_convertvector(n, vi), n1 = ni >> 1, n2 = ni - n1;
  vf e1, e2;
  const vi b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  memcpy(&e1, &b1, sizeof e1);
  memcpy(&e2, &b2, sizeof e2);
  return p * e1 * e2;
}
INLINE vf v_u8(const uint8_t *p) {
  vu8 q;
  memcpy(&q, p, sizeof q);
  return __builtin_convertvector(q, vf);
}
INLINE float v_hsum(vf v) {
  float s = 0.0f;
  for (int i = 0; i < VL; i++) s += v[i];
  return s;
}
INLINE void v_sum4(vf a, vf b, vf c, vf d, float *y, int add) {
  const float r[4] = {v_hsum(a), v_hsum(b), v_hsum(c), v_hsum(d)};
  for (int j = 0; j < 4; j++) y[j] = add ? y[j] + r[j] : r[j];
}
#endif

#endif /* MLXCEL_SIMD_H */
