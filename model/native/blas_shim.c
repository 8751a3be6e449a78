/*
 * The standard CBLAS GEMM names, served by scipy-openblas32 plus a kernel for
 * skinny float32 products.
 *
 * Why a shim: MLX's Linux CPU wheel links the netlib reference BLAS, which
 * runs float32 GEMM at a few GFLOP/s. PyPI's scipy-openblas32 ships a fast
 * OpenBLAS, but every symbol carries a `scipy_` prefix so it never clashes
 * with another BLAS. MLX only imports cblas_sgemm, cblas_dgemm and
 * cblas_cgemm; loading this shim with RTLD_GLOBAL before MLX is imported
 * makes the dynamic linker bind those three names here.
 *
 * Why a kernel: decoding multiplies a few activation rows by every weight
 * matrix, and MLX calls sgemm even for one row. OpenBLAS's sgemm packs the
 * big operand first, which with 2-16 rows halves or thirds the rate at which
 * the weights stream from memory, and one row only streams at full speed
 * through sgemv. So a product whose output has one row (or column) goes to
 * sgemv, and up to SKINNY_MAX_ROWS rows go to skinny_nt (blas_skinny.c), which
 * reads the weights once for all rows on the process's thread pool (pool.c,
 * compiled into this library, which owns it). Everything else, and every layout the kernel does not take,
 * goes to OpenBLAS unchanged.
 *
 * Integers are 32-bit (LP64 interface), matching both the reference BLAS
 * that MLX was built against and scipy-openblas32.
 */

#include "blas_shim.h"

#include <stdlib.h>

#define SHIM_EXPORT __attribute__((visibility("default")))

enum { ROW_MAJOR = 101, COL_MAJOR = 102, NO_TRANS = 111, TRANS = 112,
       CONJ_TRANS = 113 };

void scipy_cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                       float alpha, const float *a, int lda, const float *b,
                       int ldb, float beta, float *c, int ldc);

void scipy_cblas_sgemv(int order, int trans, int m, int n, float alpha,
                       const float *a, int lda, const float *x, int incx,
                       float beta, float *y, int incy);

void scipy_cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                       double alpha, const double *a, int lda, const double *b,
                       int ldb, double beta, double *c, int ldc);

void scipy_cblas_cgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                       const void *alpha, const void *a, int lda, const void *b,
                       int ldb, const void *beta, void *c, int ldc);

/* Rows up to which skinny_nt beats OpenBLAS's sgemm (measured by
 * bench/gemm.py); MLXCEL_BLAS_SKINNY_MAX overrides it, 0 turns it off. */
#define SKINNY_MAX_ROWS_DEFAULT 48

static int skinny_max_rows(void) {
  static int cached = -1;
  int value = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (value < 0) {
    const char *env = getenv("MLXCEL_BLAS_SKINNY_MAX");
    value = env && *env ? atoi(env) : SKINNY_MAX_ROWS_DEFAULT;
    if (value < 0) value = 0;
    __atomic_store_n(&cached, value, __ATOMIC_RELAXED);
  }
  return value;
}

static int is_trans(int t) { return t == TRANS || t == CONJ_TRANS; }

/* Whether the arguments are a valid sgemm call; invalid ones go to OpenBLAS,
 * which reports them the standard way. */
static int valid_call(int order, int ta, int tb, int m, int n, int k, int lda,
                      int ldb, int ldc) {
  if (order != ROW_MAJOR && order != COL_MAJOR) return 0;
  if ((ta != NO_TRANS && !is_trans(ta)) || (tb != NO_TRANS && !is_trans(tb)))
    return 0;
  if (m < 0 || n < 0 || k < 0) return 0;
  int row = order == ROW_MAJOR;
  /* Stored shapes: A is m x k (or k x m), B is k x n (or n x k), C is m x n. */
  int a_cols = row ? (is_trans(ta) ? m : k) : (is_trans(ta) ? k : m);
  int b_cols = row ? (is_trans(tb) ? k : n) : (is_trans(tb) ? n : k);
  int c_cols = row ? n : m;
  return lda >= (a_cols > 1 ? a_cols : 1) && ldb >= (b_cols > 1 ? b_cols : 1) &&
         ldc >= (c_cols > 1 ? c_cols : 1);
}

/* y[j] = alpha * sum_k W(j, k) x[k] + beta * y[j] through OpenBLAS's sgemv. */
static void one_row(const skinny_args *p) {
  if (p->beta == 0.0f) {
    /* sgemv may compute 0 * y, and y may hold NaN when beta is 0. */
    for (long j = 0; j < p->n; j++) p->c[j * p->c_j] = 0.0f;
  }
  int incx = (int)p->s_k, incy = (int)p->c_j;
  if (p->w_k == 1)
    scipy_cblas_sgemv(ROW_MAJOR, NO_TRANS, (int)p->n, (int)p->k, p->alpha, p->w,
                      (int)p->w_j, p->s, incx, p->beta, p->c, incy);
  else
    scipy_cblas_sgemv(ROW_MAJOR, TRANS, (int)p->k, (int)p->n, p->alpha, p->w,
                      (int)p->w_k, p->s, incx, p->beta, p->c, incy);
}

/* Handles the call and returns 1, or returns 0 for OpenBLAS to handle it. */
static int skinny_sgemm(int order, int ta, int tb, int m, int n, int k,
                        float alpha, const float *a, int lda, const float *b,
                        int ldb, float beta, float *c, int ldc) {
  if (!valid_call(order, ta, tb, m, n, k, lda, ldb, ldc)) return 0;
  if (m == 0 || n == 0 || k == 0 || alpha == 0.0f) return 0;
  if (order == COL_MAJOR) {
    /* Column-major C = op(A) op(B) is row-major C^T = op(B)^T op(A)^T. */
    const float *t = a; a = b; b = t;
    int ti = lda; lda = ldb; ldb = ti;
    ti = ta; ta = tb; tb = ti;
    ti = m; m = n; n = ti;
  }
  /* Row-major now: C[i][j] = sum_k opA(i, k) opB(k, j), C's rows ldc apart.
   * The side with fewer rows of output becomes the small operand S, the
   * other the big operand W; C is addressed through (c_i, c_j). */
  long a_i = is_trans(ta) ? 1 : lda, a_k = is_trans(ta) ? lda : 1;
  long b_j = is_trans(tb) ? ldb : 1, b_k = is_trans(tb) ? 1 : ldb;
  skinny_args p = {.k = k, .alpha = alpha, .beta = beta, .c = c};
  if (m <= n) {
    p.m = m; p.n = n;
    p.s = a; p.s_i = a_i; p.s_k = a_k;
    p.w = b; p.w_j = b_j; p.w_k = b_k;
    p.c_i = ldc; p.c_j = 1;
  } else {
    p.m = n; p.n = m;
    p.s = b; p.s_i = b_j; p.s_k = b_k;
    p.w = a; p.w_j = a_i; p.w_k = a_k;
    p.c_i = 1; p.c_j = ldc;
  }
  if (p.m == 1) {
    one_row(&p);
    return 1;
  }
  if (p.m > skinny_max_rows() || p.w_k != 1) return 0;
  return skinny_nt(&p);
}

SHIM_EXPORT void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n,
                             int k, float alpha, const float *a, int lda,
                             const float *b, int ldb, float beta, float *c,
                             int ldc) {
  if (skinny_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                   beta, c, ldc))
    return;
  scipy_cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                    beta, c, ldc);
}

SHIM_EXPORT void cblas_dgemm(int order, int trans_a, int trans_b, int m, int n,
                             int k, double alpha, const double *a, int lda,
                             const double *b, int ldb, double beta, double *c,
                             int ldc) {
  scipy_cblas_dgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                    beta, c, ldc);
}

SHIM_EXPORT void cblas_cgemm(int order, int trans_a, int trans_b, int m, int n,
                             int k, const void *alpha, const void *a, int lda,
                             const void *b, int ldb, const void *beta, void *c,
                             int ldc) {
  scipy_cblas_cgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                    beta, c, ldc);
}

/* Which kernel this build compiled in: "avx512", "avx2" or "generic". */
SHIM_EXPORT const char *mlxcel_blas_shim_isa(void) { return MLXCEL_SIMD_ISA; }

/* Threads the skinny kernel runs on (the caller included): the process's one
 * pool (pool.c), which this library owns and offers to the kernels. */
SHIM_EXPORT int mlxcel_blas_shim_threads(void) { return mlxcel_pool_threads(); }

/* Lets the loader confirm it found this shim and not some other library;
 * 2 added the skinny kernel and the two functions above, 3 the pool shared
 * with the kernels (mlxcel_shared_pool). */
SHIM_EXPORT int mlxcel_blas_shim_version(void) { return 3; }
