/*
 * Every heap allocation of the core goes through here, so that a test build
 * can make the n-th one fail (test_hooks.h) and check that the failure turns
 * into a MemoryError and leaves the engine usable.  In a production build
 * pg_alloc_fails() is the constant 0 and these are malloc, calloc and realloc.
 */
#include <stdlib.h>
#include "node.h"

void *pg_malloc(size_t size) { return pg_alloc_fails() ? NULL : malloc(size); }

void *pg_calloc(size_t count, size_t size) {
    return pg_alloc_fails() ? NULL : calloc(count, size);
}

void *pg_realloc(void *p, size_t size) { return pg_alloc_fails() ? NULL : realloc(p, size); }
