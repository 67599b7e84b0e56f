/*
 * The compiler front shared by replay (replay.c) and batched programs
 * (batch.c): which nodes a program holds, in what order, and which slots
 * each one reads.  Everything after that (where each slot's numbers live,
 * what a step looks like) is the back end's own.
 */
#include <stdlib.h>
#include "node.h"
#include "program.h"

static int by_handle(const void *a, const void *b) {
    uint32_t x = ((const pg_slot_of *)a)->h, y = ((const pg_slot_of *)b)->h;
    return (x > y) - (x < y);
}

uint32_t pg_layout_slot(const pg_layout *L, uint32_t h) {
    pg_slot_of key = {h, 0};
    const pg_slot_of *hit = bsearch(&key, L->by_handle, L->n, sizeof *hit, by_handle);
    return hit ? hit->slot : UINT32_MAX;
}

void pg_layout_free(pg_layout *L) {
    free(L->handle); free(L->leaf); free(L->first_edge); free(L->kid); free(L->by_handle);
    *L = (pg_layout){0, 0, 0, NULL, NULL, NULL, NULL, NULL};
}

int32_t pg_lay_out(const uint32_t *roots, uint32_t nroots, pg_layout *L, uint32_t *bad) {
    *L = (pg_layout){0, 0, 0, NULL, NULL, NULL, NULL, NULL};
    uint32_t *order;          /* newest first */
    size_t n;
    int32_t rc = pg_record_order(roots, nroots, &order, &n);
    if (rc < 0) return rc;
    if (n >= UINT32_MAX) {    /* UINT32_MAX means "no slot" */
        free(order);
        return PG_E_ARG;
    }
    L->n = (uint32_t)n;
    for (size_t s = 0; s < n && rc == 0; s++) {
        const pg_node *node = pg_N(order[n - 1 - s]);
        if (pg_program_leaf(node)) {
            L->nleaves++;
        } else if (pg_program_runs(node)) {
            const uint32_t *kids;
            L->nedges += pg_children(node, &kids);
        } else {
            *bad = order[n - 1 - s];
            rc = PG_E_ARG;
        }
    }
    if (rc == 0 && !(PG_ALLOC(L->handle, n) && PG_ALLOC(L->leaf, n) &&
                     PG_ALLOC(L->first_edge, n + 1) && PG_ALLOC(L->kid, L->nedges) &&
                     PG_ALLOC(L->by_handle, n)))
        rc = PG_E_NOMEM;
    for (size_t s = 0; rc == 0 && s < n; s++) {
        L->handle[s] = order[n - 1 - s];
        L->by_handle[s] = (pg_slot_of){L->handle[s], (uint32_t)s};
    }
    if (rc == 0) qsort(L->by_handle, n, sizeof *L->by_handle, by_handle);
    size_t e = 0;
    for (size_t s = 0; rc == 0 && s < n; s++) {
        const pg_node *node = pg_N(L->handle[s]);
        L->first_edge[s] = e;
        L->leaf[s] = (uint8_t)pg_program_leaf(node);
        if (L->leaf[s]) continue;
        const uint32_t *kids;
        uint32_t nk = pg_children(node, &kids);
        for (uint32_t k = 0; k < nk; k++) L->kid[e++] = pg_layout_slot(L, kids[k]);
    }
    if (rc == 0) L->first_edge[n] = e;
    free(order);
    if (rc < 0) pg_layout_free(L);
    return rc;
}
