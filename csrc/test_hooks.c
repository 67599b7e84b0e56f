/*
 * The fault-injection hooks of test_hooks.h (test builds only).  Their
 * countdowns have their own lock: allocations happen on any thread.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L     /* nanosleep */
#endif
#include "test_hooks.h"

#ifdef PG_TEST_HOOKS
#include <stdatomic.h>
#include "lock.h"
#ifndef _WIN32
#include <time.h>
#endif

static pg_mutex hook_lock = PG_MUTEX_INIT;
static uint32_t alloc_countdown;          /* 0: disarmed */

/* The hooks' settings, each read and written under hook_lock (the tests
 * set them from Python while the core's threads read them). */
static void set_locked(uint32_t *setting, uint32_t value) {
    pg_mutex_lock(&hook_lock);
    *setting = value;
    pg_mutex_unlock(&hook_lock);
}

static uint32_t get_locked(const uint32_t *setting) {
    pg_mutex_lock(&hook_lock);
    uint32_t value = *setting;
    pg_mutex_unlock(&hook_lock);
    return value;
}

void pg_fail_alloc(uint32_t n) { set_locked(&alloc_countdown, n); }
uint32_t pg_fail_alloc_pending(void) { return get_locked(&alloc_countdown); }

static int counted_down(uint32_t *countdown) {
    pg_mutex_lock(&hook_lock);
    int fail = *countdown != 0 && --*countdown == 0;
    pg_mutex_unlock(&hook_lock);
    return fail;
}

int pg_alloc_fails(void) { return counted_down(&alloc_countdown); }

static uint32_t hold_workers;
static uint32_t held_workers;

void pg_hold_workers(int hold) { set_locked(&hold_workers, hold != 0); }
uint32_t pg_held_workers(void) { return get_locked(&held_workers); }

static void nap_ms(void) {
#ifdef _WIN32
    Sleep(1);
#else
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
#endif
}

static _Atomic uint32_t hold_runs, held_runs;

void pg_hold_runs(int hold) { atomic_store(&hold_runs, hold != 0); }
uint32_t pg_held_runs(void) { return atomic_load(&held_runs); }

void pg_test_run_begun(void) {
    if (!atomic_load(&hold_runs)) return;
    atomic_fetch_add(&held_runs, 1u);
    while (atomic_load(&hold_runs)) nap_ms();
    atomic_fetch_sub(&held_runs, 1u);
}

/* A batched run's thread: wait (polling, never holding the lock while
 * asleep) while the tests hold the workers. */
void pg_test_worker_started(void) {
    int counted = 0;
    for (;;) {
        pg_mutex_lock(&hook_lock);
        int hold = hold_workers != 0;
        if (hold && !counted) held_workers++;
        if (!hold && counted) held_workers--;
        pg_mutex_unlock(&hook_lock);
        if (!hold) return;
        counted = 1;
        nap_ms();
    }
}

/* A batched run's caller, with hold 1: wait until its threads are held
 * (each with a chunk), so that the run is still under way while they are. */
void pg_test_caller_waits(uint32_t threads) {
    for (;;) {
        pg_mutex_lock(&hook_lock);
        int wait = hold_workers && held_workers < threads;
        pg_mutex_unlock(&hook_lock);
        if (!wait) return;
        nap_ms();
    }
}

void pg_test_hooks_lock(void) { pg_mutex_lock(&hook_lock); }
void pg_test_hooks_unlock(void) { pg_mutex_unlock(&hook_lock); }
#else
/* ISO C wants a translation unit to declare something. */
typedef int pg_no_test_hooks;
#endif
