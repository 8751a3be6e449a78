/* Shared declarations of the BLAS shim's three sources. */
#ifndef MLXCEL_BLAS_SHIM_H
#define MLXCEL_BLAS_SHIM_H

/* C[i][j] = alpha * sum_k S(i, k) W(j, k) + beta * C[i][j] for i < m (few
 * rows: the activations) and j < n (many rows: the weights). Element (x, y)
 * of S, W and C sits at base[x * _i/_j + y * _k/_j] with the strides below. */
typedef struct {
  long m, n, k;
  float alpha, beta;
  const float *s;
  long s_i, s_k;
  const float *w;
  long w_j, w_k;
  float *c;
  long c_i, c_j;
} skinny_args;

/* Computes the product (W's rows must be contiguous: w_k == 1) and returns 1,
 * or returns 0 when it cannot (out of memory) and leaves C untouched. */
int skinny_nt(const skinny_args *p);

#if defined(__AVX512F__)
#define SKINNY_ISA "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define SKINNY_ISA "avx2"
#else
#define SKINNY_ISA "generic"
#endif

/* Runs task(ctx, i) for every i < count, spread over the pool's threads and
 * the caller; returns when all have run. */
void pool_run(void (*task)(void *ctx, long i), void *ctx, long count);

/* Threads pool_run uses, the caller included. */
int pool_threads(void);

#endif
