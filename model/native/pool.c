/*
 * A small persistent thread pool, the one every kernel of mlxcel's native code runs on;
 * see pool.h for the contract and the environment.
 *
 * Why not OpenMP or a fresh thread per call: a decode step makes a few hundred kernel
 * calls of 0.01-2 ms each, so waking the workers must cost a few microseconds. Workers
 * spin for a while after each job (the next call usually comes within microseconds) and
 * then sleep on a futex, so an idle server costs no CPU. Chunks are handed out one at a
 * time through an atomic counter, so a worker that wakes late, or a core taken by another
 * process, only shifts work to whoever is free; the caller never waits for a worker that
 * has not started, it closes the job and runs the rest itself.
 *
 * One instance per process: this file is compiled into the BLAS shim (with
 * MLXCEL_POOL_OWNER: its pool is offered to the process through mlxcel_shared_pool) and
 * into every other library (the kernels' extension, the kernel's test library), whose
 * copy looks for the shim's pool when the library loads and forwards to it, and runs
 * its own only when the process has no shim (the reference BLAS, another BLAS, macOS).
 */
#define _GNU_SOURCE
#include "pool.h"

#include <dlfcn.h>
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
#define SPIN_US_DEFAULT 300 /* how long an idle worker spins before sleeping */
#define STACK_BYTES (1 << 20)
#define CLOSED ((uint64_t)1 << 31)
#define JOINED_MASK (CLOSED - 1)
#define POOL_ABI 1 /* bumped whenever mlxcel_pool_api or its meaning changes */

typedef struct {
  /* generation << 32 | CLOSED | workers that joined this generation */
  _Atomic uint64_t state;
  _Atomic uint32_t wake_seq; /* futex word, bumped on every post */
  _Atomic int sleepers;
  _Atomic int stop;  /* the workers leave (mlxcel_pool_set_threads) */
  _Atomic int park;  /* the workers sleep once the current job is done */
  _Atomic long next; /* next chunk to hand out */
  _Atomic long finished; /* joined workers done with this generation */
  mlxcel_range_fn fn;
  void *ctx;
  long n, per_chunk, chunks;
  long spin_ns;
  int threads;
  pthread_t tid[MAX_THREADS];
  pthread_mutex_t busy; /* one job at a time; other callers run theirs alone */
} pool_t;

static pool_t *g_pool;
static int g_want; /* threads asked for by mlxcel_pool_set_threads (0: environment) */
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

static void futex_wake_all(pool_t *p) {
  syscall(SYS_futex, &p->wake_seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void run_chunk(mlxcel_range_fn fn, void *ctx, long n, long per_chunk, long c) {
  const long begin = c * per_chunk;
  fn(ctx, begin, n - begin < per_chunk ? n : begin + per_chunk);
}

static void run_chunks(pool_t *p) {
  for (;;) {
    long c = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
    if (c >= p->chunks) return;
    run_chunk(p->fn, p->ctx, p->n, p->per_chunk, c);
  }
}

static int stopping(pool_t *p) { return atomic_load_explicit(&p->stop, memory_order_relaxed); }

/* Waits until the state shows a generation other than `seen`, or the pool stops:
 * spinning first (unless the last job parked the workers), then sleeping on the futex. */
static uint64_t wait_for_post(pool_t *p, uint32_t seen) {
  long start = now_ns();
  long spin_ns = atomic_load_explicit(&p->park, memory_order_relaxed) ? 0 : p->spin_ns;
  for (unsigned spins = 0;; spins++) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    if ((uint32_t)(s >> 32) != seen || stopping(p)) return s;
    if (spin_ns > 0) {
      pause_or_yield(spins);
      if ((spins & 255) != 255 || now_ns() - start < spin_ns) continue;
    }
    atomic_fetch_add(&p->sleepers, 1);
    uint32_t seq = atomic_load(&p->wake_seq);
    s = atomic_load(&p->state);
    if ((uint32_t)(s >> 32) == seen && !atomic_load(&p->stop))
      syscall(SYS_futex, &p->wake_seq, FUTEX_WAIT_PRIVATE, seq, NULL, NULL, 0);
    atomic_fetch_sub(&p->sleepers, 1);
    start = now_ns();
    spin_ns = p->spin_ns;
  }
}

static void *worker(void *arg) {
  pool_t *p = arg;
  uint32_t seen = (uint32_t)(atomic_load(&p->state) >> 32);
  for (;;) {
    uint64_t s = wait_for_post(p, seen);
    if (stopping(p)) return NULL;
    if (s & CLOSED) { /* the caller finished this job without us */
      seen = (uint32_t)(s >> 32);
      continue;
    }
    if (!atomic_compare_exchange_strong(&p->state, &s, s + 1)) continue;
    seen = (uint32_t)(s >> 32);
    run_chunks(p);
    atomic_fetch_add_explicit(&p->finished, 1, memory_order_release);
  }
  return NULL;
}

/* The first of the variables that is set to a number, else 0. */
static int env_int(const char *const *names) {
  for (; *names; names++) {
    const char *v = getenv(*names);
    if (v && *v) return atoi(v);
  }
  return 0;
}

/* mlxcel_pool_set_threads's number, else the environment (pool.h), else the CPUs this
 * process may run on. */
static int wanted_threads(void) {
  static const char *const names[] = {"MLXCEL_CPU_THREADS", "MLXCEL_BLAS_THREADS",
                                      "OPENBLAS_NUM_THREADS", NULL};
  int n = g_want > 0 ? g_want : env_int(names);
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
  static const char *const spin[] = {"MLXCEL_CPU_SPIN_US", "MLXCEL_BLAS_SPIN_US", NULL};
  pool_t *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->threads = wanted_threads();
  long spin_us = env_int(spin);
  p->spin_ns = (spin_us > 0 ? spin_us : SPIN_US_DEFAULT) * 1000L;
  pthread_mutex_init(&p->busy, NULL);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, STACK_BYTES);
  /* Workers inherit a full signal mask: signals stay with the program's
   * own threads (Python handles them in its main thread). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int started = 1;
  for (int i = 1; i < p->threads; i++) {
    if (pthread_create(&p->tid[i], &attr, worker, p) != 0) break;
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

static void own_for(mlxcel_range_fn fn, void *ctx, long n, long per_chunk, int flags) {
  if (n <= 0) return;
  if (per_chunk < 1) per_chunk = 1;
  const long chunks = n / per_chunk + (n % per_chunk != 0);
  pool_t *p = chunks > 1 ? get_pool() : NULL;
  if (!p || p->threads == 1 || pthread_mutex_trylock(&p->busy) != 0) {
    for (long c = 0; c < chunks; c++) run_chunk(fn, ctx, n, per_chunk, c);
    return;
  }
  p->fn = fn;
  p->ctx = ctx;
  p->n = n;
  p->per_chunk = per_chunk;
  p->chunks = chunks;
  atomic_store_explicit(&p->next, 0, memory_order_relaxed);
  atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
  atomic_store_explicit(&p->park, (flags & MLXCEL_POOL_PARK) != 0, memory_order_relaxed);
  uint64_t gen = (atomic_load(&p->state) >> 32) + 1;
  atomic_store(&p->state, (gen & 0xffffffffu) << 32);
  atomic_fetch_add(&p->wake_seq, 1);
  if ((flags & MLXCEL_POOL_WAKE) && atomic_load(&p->sleepers) > 0) futex_wake_all(p);
  run_chunks(p);
  uint64_t s = atomic_fetch_or(&p->state, CLOSED);
  long joined = (long)(s & JOINED_MASK);
  for (unsigned spins = 0;
       atomic_load_explicit(&p->finished, memory_order_acquire) < joined; spins++)
    pause_or_yield(spins);
  pthread_mutex_unlock(&p->busy);
}

static int own_threads(void) {
  pool_t *p = get_pool();
  return p ? p->threads : 1;
}

static void own_set_threads(int n) {
  pthread_mutex_lock(&g_init);
  pool_t *p = g_pool;
  if (p) {
    pthread_mutex_lock(&p->busy); /* the job in flight, if any, ends first */
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->wake_seq, 1);
    futex_wake_all(p);
    for (int i = 1; i < p->threads; i++) pthread_join(p->tid[i], NULL);
    pthread_mutex_unlock(&p->busy);
    pthread_mutex_destroy(&p->busy);
    __atomic_store_n(&g_pool, NULL, __ATOMIC_RELEASE);
    free(p);
  }
  g_want = n < 1 ? 0 : n > MAX_THREADS ? MAX_THREADS : n;
  pthread_mutex_unlock(&g_init);
}

/* ------------------------------------------------------------------------
 * One pool per process: the shim's, found by the other libraries when they load.
 * ------------------------------------------------------------------------ */
typedef struct {
  int abi;
  void (*pool_for)(mlxcel_range_fn, void *, long, long, int);
  int (*threads)(void);
  void (*set_threads)(int);
} mlxcel_pool_api;

static const mlxcel_pool_api OWN = {POOL_ABI, own_for, own_threads, own_set_threads};
static const mlxcel_pool_api *g_api = &OWN;

#if defined(MLXCEL_POOL_OWNER)
/* The BLAS shim's build: its pool is the process's, offered to the libraries loaded
 * after it (the shim is loaded with RTLD_GLOBAL, so a global lookup finds this). */
__attribute__((visibility("default"))) const mlxcel_pool_api *mlxcel_shared_pool(void) {
  return &OWN;
}
#else
/* Another library: when it loads, the shim's pool if the process has one (of this
 * library's ABI), else its own. */
__attribute__((constructor)) static void find_shared_pool(void) {
  typedef const mlxcel_pool_api *(*getter)(void);
  getter shared = (getter)dlsym(RTLD_DEFAULT, "mlxcel_shared_pool");
  const mlxcel_pool_api *found = shared ? shared() : NULL;
  if (found && found->abi == POOL_ABI) g_api = found;
}
#endif

void mlxcel_pool_for(mlxcel_range_fn fn, void *ctx, long n, long per_chunk, int flags) {
  g_api->pool_for(fn, ctx, n, per_chunk, flags);
}

int mlxcel_pool_threads(void) { return g_api->threads(); }

void mlxcel_pool_set_threads(int n) { g_api->set_threads(n); }

int mlxcel_pool_shared(void) { return g_api != &OWN; }

/* ------------------------------------------------------------------------
 * Per-thread buffers: a chunk may run on any worker or on the caller.
 * ------------------------------------------------------------------------ */
typedef struct {
  void *data[MLXCEL_BUF_SLOTS];
  size_t bytes[MLXCEL_BUF_SLOTS];
} buffers_t;

static pthread_key_t g_buffers;
static pthread_once_t g_buffers_once = PTHREAD_ONCE_INIT;

static void free_buffers(void *arg) {
  buffers_t *b = arg;
  for (int i = 0; i < MLXCEL_BUF_SLOTS; i++) free(b->data[i]);
  free(b);
}

static void make_buffers_key(void) { pthread_key_create(&g_buffers, free_buffers); }

void *mlxcel_thread_buffer(int slot, size_t bytes) {
  if (slot < 0 || slot >= MLXCEL_BUF_SLOTS) return NULL;
  pthread_once(&g_buffers_once, make_buffers_key);
  buffers_t *b = pthread_getspecific(g_buffers);
  if (!b) {
    b = calloc(1, sizeof *b);
    if (!b || pthread_setspecific(g_buffers, b) != 0) {
      free(b);
      return NULL;
    }
  }
  if (b->bytes[slot] < bytes) {
    free(b->data[slot]);
    b->data[slot] = aligned_alloc(64, (bytes + 63) / 64 * 64);
    b->bytes[slot] = b->data[slot] ? bytes : 0;
  }
  return b->data[slot];
}
