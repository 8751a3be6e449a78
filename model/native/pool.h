/*
 * The one thread pool of mlxcel's native code (pool.c): the BLAS shim's skinny kernel, the
 * quantized matmul, attention and SwiGLU all split their work over its threads.
 *
 * One set of workers per process: the BLAS shim, loaded first, owns the pool; the kernels'
 * extension, loaded after MLX, finds the shim's pool when it loads and forwards every call
 * to it (its own copy of pool.c serves only when no shim is loaded). So the cores are
 * never shared between two pools spinning against each other.
 *
 * Environment, read when the pool starts:
 *   MLXCEL_CPU_THREADS (older name MLXCEL_BLAS_THREADS; else OPENBLAS_NUM_THREADS)
 *       threads, the caller included (default: the CPUs this process may run on, at most 64)
 *   MLXCEL_CPU_SPIN_US (older name MLXCEL_BLAS_SPIN_US)
 *       how long an idle worker spins before it sleeps (default 300 microseconds)
 */
#ifndef MLXCEL_POOL_H
#define MLXCEL_POOL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Work on the items [begin, end) of a job. */
typedef void (*mlxcel_range_fn)(void *ctx, long begin, long end);

enum {
  /* The job is large enough to wake sleeping workers (that costs tens of microseconds);
   * without it only the workers still spinning help the caller. */
  MLXCEL_POOL_WAKE = 1,
  /* The workers sleep as soon as the job is done instead of spinning: someone else's
   * threads (OpenBLAS's) run next. */
  MLXCEL_POOL_PARK = 2,
};

/* Calls fn(ctx, begin, end) over [0, n) in chunks of per_chunk items, on the caller and
 * the pool's workers, and returns when every chunk is done. One job runs at a time: a
 * caller that finds the pool busy (another thread's job, or a job started from inside a
 * chunk) runs its chunks alone on its own thread. */
void mlxcel_pool_for(mlxcel_range_fn fn, void *ctx, long n, long per_chunk, int flags);

/* Threads a job is split over, the caller included (starts the workers if need be). */
int mlxcel_pool_threads(void);

/* Restarts the pool with n threads (n < 1: from the environment again). For tests and
 * benchmarks: not while another thread may call the pool. */
void mlxcel_pool_set_threads(int n);

/* 1 when this library's calls go to the BLAS shim's pool, 0 when it runs its own. */
int mlxcel_pool_shared(void);

/* A buffer of at least `bytes`, 64-byte aligned, owned by the calling thread (one per
 * slot), kept for its next call and freed when the thread exits; NULL when out of
 * memory. Kernels keep their per-thread scratch here, so a chunk may run on any thread. */
enum { MLXCEL_BUF_QMM = 0, MLXCEL_BUF_QMM_WEIGHTS, MLXCEL_BUF_QMM_X, MLXCEL_BUF_ATTN,
       MLXCEL_BUF_LAYER, MLXCEL_BUF_SLOTS };
void *mlxcel_thread_buffer(int slot, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* MLXCEL_POOL_H */
