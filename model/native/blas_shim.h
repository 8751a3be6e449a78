/* Shared declarations of the BLAS shim's three sources. */
#ifndef MLXCEL_BLAS_SHIM_H
#define MLXCEL_BLAS_SHIM_H

#include "pool.h"
#include "simd.h"

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

#endif
