/*
 * Forwarding shim from the standard CBLAS GEMM names to scipy-openblas32.
 *
 * Why: MLX's Linux CPU wheel links the netlib reference BLAS, which runs
 * float32 GEMM at a few GFLOP/s. PyPI's scipy-openblas32 ships a fast
 * OpenBLAS, but every symbol carries a `scipy_` prefix so it never clashes
 * with another BLAS. MLX only imports cblas_sgemm, cblas_dgemm and
 * cblas_cgemm; loading this shim with RTLD_GLOBAL before MLX is imported
 * makes the dynamic linker bind those three names here, and from here to
 * OpenBLAS.
 *
 * Integers are 32-bit (LP64 interface), matching both the reference BLAS
 * that MLX was built against and scipy-openblas32.
 */

#define SHIM_EXPORT __attribute__((visibility("default")))

void scipy_cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                       float alpha, const float *a, int lda, const float *b,
                       int ldb, float beta, float *c, int ldc);

void scipy_cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                       double alpha, const double *a, int lda, const double *b,
                       int ldb, double beta, double *c, int ldc);

void scipy_cblas_cgemm(int order, int trans_a, int trans_b, int m, int n, int k,
                       const void *alpha, const void *a, int lda, const void *b,
                       int ldb, const void *beta, void *c, int ldc);

SHIM_EXPORT void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n,
                             int k, float alpha, const float *a, int lda,
                             const float *b, int ldb, float beta, float *c,
                             int ldc) {
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

/* Lets the loader confirm it found this shim and not some other library. */
SHIM_EXPORT int mlxcel_blas_shim_version(void) { return 1; }
