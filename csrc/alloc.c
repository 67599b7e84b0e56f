/*
 * Every heap allocation of the core goes through here, so that a test can
 * make the n-th one fail (pg_fail_alloc) and check that the failure turns
 * into a MemoryError and leaves the engine usable; likewise returning a
 * segment mapping to the OS (pg_fail_unmap).  Allocations are rare (a
 * segment per 4,096 nodes, an edge chunk per 4,096 child slots, a buffer
 * per sweep or program), so the hook's own lock costs nothing measurable.
 */
#include <stdlib.h>
#include "node.h"
#include "lock.h"

static pg_mutex hook_lock = PG_MUTEX_INIT;
static uint32_t countdown;          /* 0: disarmed */
static uint32_t unmap_countdown;

void pg_fail_alloc(uint32_t n) {
    pg_mutex_lock(&hook_lock);
    countdown = n;
    pg_mutex_unlock(&hook_lock);
}

uint32_t pg_fail_alloc_pending(void) {
    pg_mutex_lock(&hook_lock);
    uint32_t n = countdown;
    pg_mutex_unlock(&hook_lock);
    return n;
}

void pg_fail_unmap(uint32_t n) {
    pg_mutex_lock(&hook_lock);
    unmap_countdown = n;
    pg_mutex_unlock(&hook_lock);
}

int pg_unmap_fails(void) {
    pg_mutex_lock(&hook_lock);
    int fail = unmap_countdown != 0 && --unmap_countdown == 0;
    pg_mutex_unlock(&hook_lock);
    return fail;
}

void pg_alloc_hook_lock(void) { pg_mutex_lock(&hook_lock); }
void pg_alloc_hook_unlock(void) { pg_mutex_unlock(&hook_lock); }

int pg_alloc_fails(void) {
    pg_mutex_lock(&hook_lock);
    int fail = countdown != 0 && --countdown == 0;
    pg_mutex_unlock(&hook_lock);
    return fail;
}

void *pg_malloc(size_t size) { return pg_alloc_fails() ? NULL : malloc(size); }

void *pg_realloc(void *p, size_t size) { return pg_alloc_fails() ? NULL : realloc(p, size); }
