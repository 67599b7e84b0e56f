/*
 * Threads, in four rules (docs/lifetime.md, "Threads", links here; lifetime
 * is csrc/value_binding.h's five).  Any call may come from any thread.
 * What is listed under a rule is where it applies, not a further rule.
 *
 *  1. The GIL guards Python objects, reference counts and nodes' flags;
 *     C's long calls let it go only after taking their references.
 *     - cffi's calls keep it (csrc/cffi_build.py); the long ones
 *       (backward, compile, a batch's compile and run, hvp, bulk reads and
 *       writes, optimizer steps, a program's runs) release it.  pygrad
 *       refuses to run with the GIL disabled.
 *     - A walk, under the sweep lock only, sees a flag set meanwhile or
 *       not (a _backward given to a node while another thread walks it
 *       counts from the next walk).
 *
 *  2. A lock is held only while C or pygrad's own bookkeeping runs, never
 *     across user code, and what was read before it is checked again
 *     under it.
 *     - The sweep lock (backward.c) guards walks' marks and scratch, and
 *       makes a sweep's rules one step (two backward()s over shared nodes
 *       each add their whole gradient), unless a Python closure lies
 *       below: that sweep records its order under the lock, then runs its
 *       rules and closures without it.  A compiled run that adds into
 *       nodes' grads takes it too: a program's backward for its whole
 *       run, a batch's sums to write them (made again under it if another
 *       thread wrote one of those grads meanwhile), so each run adds its
 *       whole sum.  Its holder never waits for the GIL, so a thread
 *       holding the GIL may wait for it (fork, and pygrad.grad's numbers),
 *       and so may a long call without the GIL.
 *     - Other C state shared between threads is atomic (replay.c's pending
 *       marks and clock, nodes.c's count of rules set in Python),
 *       thread-local (a trace's flag, the free list of node objects) or
 *       touched only with the GIL (replay.c's list of programs, the
 *       collector's pauses).
 *     - A Program's and a PerLength's CallLock (pygrad/replay.py) guards
 *       their buffers for a run (a program or batch marks its run too,
 *       and refuses a second: PG_E_BUSY, program.h's run mark); the
 *       holding thread calling again (a signal handler, a __del__) gets a
 *       RuntimeError, never a wait.
 *       What may call back (an lr schedule, a loss to trace, your
 *       optimizer's methods) runs before it is taken or after: the
 *       optimizer's step count read then is checked under it.
 *     - batch.c's worker threads touch only their job record once a call
 *       has returned; the record counts its own threads.
 *
 *  3. Every wait can be interrupted, and fork() finds nothing held.
 *     - A waiter for the sweep lock tries in slices of tens of
 *       milliseconds, running signals between (a Ctrl-C ends the wait).
 *       A compiled run that adds into grads (rule 2) waits for it inside
 *       its own C call, as part of that call: a Ctrl-C then rises as the
 *       call returns, after the other thread's C call and its own.
 *     - fork() takes the sweep lock around itself, waiting (the GIL held,
 *       as CPython forks) for a walk another thread is in: one C call, as
 *       long as that backward(); a Ctrl-C meanwhile rises as fork returns,
 *       as one during your own backward() does.  A forked child remakes
 *       each CallLock on first use, takes over a run mark another thread
 *       left (its grads reset first), turns the collector back on if
 *       pygrad had paused it, and counts only the forking thread's trace
 *       (pg_after_fork_in_child).
 *
 *  4. Unguarded by design: a node's numbers outside a locked walk, and
 *     caches that any thread builds alike.
 *     - Numbers race as floats do: a closure sweep's rules and another
 *       thread's writes may lose each other's additions, as two threads'
 *       += do in micrograd; pygrad.grad's restore (pg_grad_numbers) undoes
 *       a write made meanwhile without the GIL; settling may read a
 *       program's arrays while another thread's run writes them.
 *     - _prev's cache, per_length's program for a length and nn's fused
 *       cache are built the same by any thread; the first or last made is
 *       kept.
 *
 * Below, one portable mutex (the sweep lock's).
 */
#ifndef PG_LOCK_H
#define PG_LOCK_H

#ifdef _WIN32
#include <windows.h>
typedef SRWLOCK pg_mutex;
#define PG_MUTEX_INIT SRWLOCK_INIT
#define pg_mutex_lock(m) AcquireSRWLockExclusive(m)
#define pg_mutex_trylock(m) (TryAcquireSRWLockExclusive(m) != 0)
#define pg_mutex_unlock(m) ReleaseSRWLockExclusive(m)
static inline void pg_nap_quarter_ms(void) { Sleep(0); }
#else
#include <pthread.h>
typedef pthread_mutex_t pg_mutex;
#define PG_MUTEX_INIT PTHREAD_MUTEX_INITIALIZER
#define pg_mutex_lock(m) pthread_mutex_lock(m)
#define pg_mutex_trylock(m) (pthread_mutex_trylock(m) == 0)
#define pg_mutex_unlock(m) pthread_mutex_unlock(m)
#include <time.h>
/* A short sleep between tries of a lock (the holder runs only C). */
static inline void pg_nap_quarter_ms(void) {
    struct timespec t = {0, 250000};
    nanosleep(&t, NULL);
}
#endif

#endif
