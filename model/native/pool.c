/*
 * A small persistent thread pool for the skinny kernel.
 *
 * Why not OpenMP or a fresh thread per call: a decode step makes ~170 GEMM
 * calls of 0.1-2 ms each, so waking the helpers must cost a few
 * microseconds. Workers spin for a while after each job (the next call
 * usually comes within microseconds) and then sleep on a futex, so an idle
 * server costs no CPU. Tasks are handed out one at a time through an atomic
 * counter, so a worker that wakes late, or a core taken by another process,
 * only shifts work to whoever is free; the caller never waits for a worker
 * that has not started, it closes the job and runs the rest itself.
 */
#define _GNU_SOURCE
#include "blas_shim.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64
#define SPIN_NS_DEFAULT 300000L /* how long an idle worker spins before sleeping */
#define CLOSED ((uint64_t)1 << 31)
#define JOINED_MASK (CLOSED - 1)

typedef struct {
  /* generation << 32 | CLOSED | workers that joined this generation */
  _Atomic uint64_t state;
  _Atomic uint32_t wake_seq; /* futex word, bumped on every post */
  _Atomic int sleepers;
  _Atomic long next; /* next task index to hand out */
  _Atomic long finished; /* joined workers done with this generation */
  void (*task)(void *, long);
  void *ctx;
  long count;
  long spin_ns;
  int threads;
  pthread_mutex_t busy; /* one caller at a time; others run serially */
} pool_t;

static pool_t *g_pool;
static pthread_mutex_t g_init = PTHREAD_MUTEX_INITIALIZER;
static int g_atfork_done;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Spin politely: a few hundred pauses (~10 µs) (the wait is usually short), then
 * yield the CPU each time, so a thread this one waits for, or another
 * process, that shares its core gets to run. */
static inline void pause_or_yield(unsigned spins) {
  if (spins < 256)
    cpu_relax();
  else
    sched_yield();
}

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void run_tasks(pool_t *p) {
  for (;;) {
    long i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
    if (i >= p->count) return;
    p->task(p->ctx, i);
  }
}

/* Waits until the state shows a generation other than `seen`, spinning
 * first and then sleeping on the futex. */
static uint64_t wait_for_post(pool_t *p, uint32_t seen) {
  long start = now_ns();
  for (unsigned spins = 0;; spins++) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    if ((uint32_t)(s >> 32) != seen) return s;
    pause_or_yield(spins);
    if ((spins & 255) != 255 || now_ns() - start < p->spin_ns) continue;
    atomic_fetch_add(&p->sleepers, 1);
    uint32_t seq = atomic_load(&p->wake_seq);
    s = atomic_load(&p->state);
    if ((uint32_t)(s >> 32) == seen)
      syscall(SYS_futex, &p->wake_seq, FUTEX_WAIT_PRIVATE, seq, NULL, NULL, 0);
    atomic_fetch_sub(&p->sleepers, 1);
    start = now_ns();
  }
}

static void *worker(void *arg) {
  pool_t *p = arg;
  uint32_t seen = (uint32_t)(atomic_load(&p->state) >> 32);
  for (;;) {
    uint64_t s = wait_for_post(p, seen);
    if (s & CLOSED) { /* the caller finished this job without us */
      seen = (uint32_t)(s >> 32);
      continue;
    }
    if (!atomic_compare_exchange_strong(&p->state, &s, s + 1)) continue;
    seen = (uint32_t)(s >> 32);
    run_tasks(p);
    atomic_fetch_add_explicit(&p->finished, 1, memory_order_release);
  }
  return NULL;
}

static int env_int(const char *name) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : 0;
}

/* MLXCEL_BLAS_THREADS, else OPENBLAS_NUM_THREADS, else the CPUs this
 * process may run on. */
static int wanted_threads(void) {
  int n = env_int("MLXCEL_BLAS_THREADS");
  if (n <= 0) n = env_int("OPENBLAS_NUM_THREADS");
  if (n <= 0) {
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  }
  return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

/* A forked child has none of the parent's workers: start afresh. */
static void after_fork_child(void) {
  g_pool = NULL;
  pthread_mutex_init(&g_init, NULL);
}

static pool_t *start_pool(void) {
  pool_t *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->threads = wanted_threads();
  long spin_us = env_int("MLXCEL_BLAS_SPIN_US");
  p->spin_ns = spin_us > 0 ? spin_us * 1000L : SPIN_NS_DEFAULT;
  pthread_mutex_init(&p->busy, NULL);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 1 << 18);
  /* Workers inherit a full signal mask: signals stay with the program's
   * own threads (Python handles them in its main thread). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int started = 1;
  for (int i = 1; i < p->threads; i++) {
    pthread_t t;
    if (pthread_create(&t, &attr, worker, p) != 0) break;
    started++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  p->threads = started;
  return p;
}

static pool_t *get_pool(void) {
  pool_t *p = __atomic_load_n(&g_pool, __ATOMIC_ACQUIRE);
  if (p) return p;
  pthread_mutex_lock(&g_init);
  if (!g_atfork_done) {
    pthread_atfork(NULL, NULL, after_fork_child);
    g_atfork_done = 1;
  }
  p = g_pool;
  if (!p) {
    p = start_pool();
    __atomic_store_n(&g_pool, p, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&g_init);
  return p;
}

int pool_threads(void) {
  pool_t *p = __atomic_load_n(&g_pool, __ATOMIC_ACQUIRE);
  return p ? p->threads : wanted_threads();
}

void pool_run(void (*task)(void *ctx, long i), void *ctx, long count) {
  pool_t *p = count > 1 ? get_pool() : NULL;
  if (!p || p->threads == 1 || pthread_mutex_trylock(&p->busy) != 0) {
    for (long i = 0; i < count; i++) task(ctx, i);
    return;
  }
  p->task = task;
  p->ctx = ctx;
  p->count = count;
  atomic_store_explicit(&p->next, 0, memory_order_relaxed);
  atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
  uint64_t gen = (atomic_load(&p->state) >> 32) + 1;
  atomic_store(&p->state, (gen & 0xffffffffu) << 32);
  atomic_fetch_add(&p->wake_seq, 1);
  if (atomic_load(&p->sleepers) > 0)
    syscall(SYS_futex, &p->wake_seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
  run_tasks(p);
  uint64_t s = atomic_fetch_or(&p->state, CLOSED);
  long joined = (long)(s & JOINED_MASK);
  for (unsigned spins = 0;
       atomic_load_explicit(&p->finished, memory_order_acquire) < joined; spins++)
    pause_or_yield(spins);
  pthread_mutex_unlock(&p->busy);
}
