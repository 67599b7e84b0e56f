/* One portable mutex: cffi drops the GIL around every C call, so C state
 * shared between threads needs a lock of its own. */
#ifndef PG_LOCK_H
#define PG_LOCK_H

#ifdef _WIN32
#include <windows.h>
typedef SRWLOCK pg_mutex;
#define PG_MUTEX_INIT SRWLOCK_INIT
#define pg_mutex_lock(m) AcquireSRWLockExclusive(m)
#define pg_mutex_unlock(m) ReleaseSRWLockExclusive(m)
#else
#include <pthread.h>
typedef pthread_mutex_t pg_mutex;
#define PG_MUTEX_INIT PTHREAD_MUTEX_INITIALIZER
#define pg_mutex_lock(m) pthread_mutex_lock(m)
#define pg_mutex_unlock(m) pthread_mutex_unlock(m)
#endif

#endif
