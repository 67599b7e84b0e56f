/*
 * The fault-injection hooks of test_hooks.h (test builds only).  Their
 * countdowns have their own lock: an allocation can happen with or without
 * the graph's lock held.
 */
#include "test_hooks.h"

#ifdef PG_TEST_HOOKS
#include "lock.h"

static pg_mutex hook_lock = PG_MUTEX_INIT;
static uint32_t alloc_countdown;          /* 0: disarmed */
static uint32_t unmap_countdown;

void pg_fail_alloc(uint32_t n) {
    pg_mutex_lock(&hook_lock);
    alloc_countdown = n;
    pg_mutex_unlock(&hook_lock);
}

uint32_t pg_fail_alloc_pending(void) {
    pg_mutex_lock(&hook_lock);
    uint32_t n = alloc_countdown;
    pg_mutex_unlock(&hook_lock);
    return n;
}

void pg_fail_unmap(uint32_t n) {
    pg_mutex_lock(&hook_lock);
    unmap_countdown = n;
    pg_mutex_unlock(&hook_lock);
}

static int counted_down(uint32_t *countdown) {
    pg_mutex_lock(&hook_lock);
    int fail = *countdown != 0 && --*countdown == 0;
    pg_mutex_unlock(&hook_lock);
    return fail;
}

int pg_alloc_fails(void) { return counted_down(&alloc_countdown); }
int pg_unmap_fails(void) { return counted_down(&unmap_countdown); }

void pg_test_hooks_lock(void) { pg_mutex_lock(&hook_lock); }
void pg_test_hooks_unlock(void) { pg_mutex_unlock(&hook_lock); }
#else
/* ISO C wants a translation unit to declare something. */
typedef int pg_no_test_hooks;
#endif
