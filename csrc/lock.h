/* One portable mutex.  C state shared between threads needs a lock of its
 * own: the calls that take long run without Python's GIL (cffi_build.py),
 * and every call may come from any thread. */
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
