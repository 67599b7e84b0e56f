/*
 * Fault injection for the tests, compiled only into a test build: building
 * with PYGRAD_TEST_HOOKS=1 defines PG_TEST_HOOKS and adds the functions
 * between the cdef markers to the cdef (csrc/cffi_build.py).  .ci/sanitize
 * and .ci/valgrind build that way; the tests that need a hook skip without
 * one.  A production core has none of these symbols, and its allocator
 * calls malloc with no lock and no countdown: the hooks below compile to
 * constants there.
 */
#ifndef PG_TEST_HOOKS_H
#define PG_TEST_HOOKS_H

#include <stdint.h>

#ifdef PG_TEST_HOOKS
/* cdef-begin */
/* The n-th heap allocation from now fails (0 disarms), as if the system
 * were out of memory.  pg_fail_alloc_pending is what is left of the countdown: 0 once the
 * failure has happened. */
void pg_fail_alloc(uint32_t n);
uint32_t pg_fail_alloc_pending(void);
/* With hold 1, each thread a batched run starts (batch.c) waits once it
 * has taken its first chunk, until hold is 0 again (and the calling thread
 * waits until they all do, so each holds one); pg_held_workers says how
 * many wait now. */
void pg_hold_workers(int hold);
uint32_t pg_held_workers(void);
/* With hold 1, the calling thread takes the sweep lock (csrc/backward.c),
 * as a long walk would; 0 lets it go (from the same thread).
 * pg_sweep_lock_waits counts the tries that found it taken since. */
void pg_test_hold_sweep_lock(int hold);
uint32_t pg_sweep_lock_waits(void);
/* With hold 1, a program's forward or backward (replay.c) waits once it
 * has marked itself running, until hold is 0 again; pg_held_runs says how
 * many wait now.  Atomics, no lock: a forked child's copy is usable. */
void pg_hold_runs(int hold);
uint32_t pg_held_runs(void);
/* cdef-end */

/* For the core: does this allocation fail? */
int pg_alloc_fails(void);
void pg_test_hooks_lock(void);
void pg_test_hooks_unlock(void);
void pg_test_worker_started(void);
void pg_test_caller_waits(uint32_t threads);
void pg_test_run_begun(void);
#else
static inline void pg_test_worker_started(void) {}
static inline void pg_test_caller_waits(uint32_t threads) { (void)threads; }
static inline void pg_test_run_begun(void) {}
static inline int pg_alloc_fails(void) { return 0; }
static inline void pg_test_hooks_lock(void) {}
static inline void pg_test_hooks_unlock(void) {}
#endif

#endif
