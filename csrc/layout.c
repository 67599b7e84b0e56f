/*
 * The compiler front shared by replay (replay.c) and batched programs
 * (batch.c): which nodes a program holds, in what order, and which slots
 * each one reads.  Everything after that (where each slot's numbers live,
 * what a step looks like) is the back end's own.
 */
#include <stdlib.h>
#include <string.h>
#include "node.h"
#include "program.h"

/* The table's first probe for a node: its address, multiplied (Fibonacci
 * hashing) so that nodes allocated side by side spread over the table. */
static size_t home(const pg_layout *L, const pg_node *node) {
    return (size_t)(((uint64_t)(uintptr_t)node * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & (L->cap - 1);
}

void pg_rule_watch_take(pg_rule_watch *w, pg_layout *L, uint64_t seen) {
    *w = (pg_rule_watch){L->node, L->n, seen};
    L->node = NULL;
}

void pg_rule_watch_free(pg_rule_watch *w) {
    free(w->node);
    *w = (pg_rule_watch){NULL, 0, 0};
}

int pg_rules_changed(pg_rule_watch *w) {
    const uint64_t now = pg_py_rules_now();
    if (now == w->seen) return 0;
    for (uint32_t i = 0; i < w->n; i++)
        if (w->node[i]->flags & PG_F_PY_BACKWARD) return 1;    /* (seen stays: refused again) */
    w->seen = now;
    return 0;
}

uint32_t pg_layout_slot(const pg_layout *L, const pg_node *node) {
    for (size_t i = home(L, node);; i = (i + 1) & (L->cap - 1)) {
        if (L->by_node[i].node == node) return L->by_node[i].slot;
        if (L->by_node[i].node == NULL) return UINT32_MAX;
    }
}

void pg_layout_free(pg_layout *L) {
    free(L->node); free(L->leaf); free(L->first_edge); free(L->kid); free(L->by_node);
    free(L->graded); free(L->detached);
    *L = (pg_layout){0};
}

/* Index L->node[0..n) by address (L->by_node, at most half full). */
static void index_nodes(pg_layout *L) {
    memset(L->by_node, 0, L->cap * sizeof *L->by_node);
    for (uint32_t s = 0; s < L->n; s++) {
        size_t i = home(L, L->node[s]);
        while (L->by_node[i].node != NULL) i = (i + 1) & (L->cap - 1);
        L->by_node[i] = (pg_slot_of){L->node[s], s};
    }
}

/* Reorder the interior slots of L->node (leaves first, then a topological
 * order) stably by level, and index them. */
static int32_t by_level(pg_layout *L) {
    const uint32_t n = L->n;
    uint32_t *level = NULL, *count = NULL;
    pg_node **sorted = NULL;
    index_nodes(L);
    if (!(PG_ALLOC(level, n) && PG_ALLOC(count, n + 1) && PG_ALLOC(sorted, n))) {
        free(level); free(count); free(sorted);
        return PG_E_NOMEM;
    }
    uint32_t top = 0;
    for (uint32_t s = L->nleaves; s < n; s++) {
        pg_node *const *kids;
        uint32_t nk = pg_children(L->node[s], &kids), lv = 0;
        for (uint32_t k = 0; k < nk; k++) {
            uint32_t c = pg_layout_slot(L, kids[k]);
            if (level[c] > lv) lv = level[c];
        }
        level[s] = lv + 1;
        if (lv + 1 > top) top = lv + 1;
        count[lv + 1]++;
    }
    /* counting sort: where each level starts */
    uint32_t at = L->nleaves;
    for (uint32_t lv = 1; lv <= top; lv++) {
        uint32_t c = count[lv];
        count[lv] = at;
        at += c;
    }
    for (uint32_t s = 0; s < L->nleaves; s++) sorted[s] = L->node[s];
    for (uint32_t s = L->nleaves; s < n; s++) sorted[count[level[s]]++] = L->node[s];
    memcpy(L->node, sorted, (size_t)n * sizeof *sorted);
    free(level); free(count); free(sorted);
    index_nodes(L);
    return 0;
}

/* With a detached_max node in the program: L->graded and L->detached
 * (program.h), from the walk backward() makes. */
static int32_t grade(pg_node *const *roots, uint32_t nroots, pg_layout *L) {
    int any = 0;
    for (uint32_t s = L->nleaves; s < L->n && !any; s++) any = L->node[s]->op == PG_OP_MAX;
    if (!any) return 0;
    pg_node **order;          /* parents first */
    size_t n;
    int32_t rc = pg_record_order(roots, nroots, 1, &order, &n);
    if (rc < 0) return rc;
    if (!(PG_ALLOC(L->graded, n) && PG_ALLOC(L->detached, L->n))) {
        free(order);
        return PG_E_NOMEM;
    }
    for (uint32_t s = L->nleaves; s < L->n; s++) L->detached[s] = !L->leaf[s];
    for (size_t i = 0; i < n; i++) {
        uint32_t s = pg_layout_slot(L, order[i]);
        if (s == UINT32_MAX || L->leaf[s]) continue;
        L->detached[s] = 0;
        L->graded[L->ngraded++] = s;
    }
    free(order);
    return 0;
}

/* The hash table's size for n nodes: a power of two, at least 2n. */
static size_t table_size(size_t n, size_t *cap) {
    size_t c = 16;
    while (c < 2 * n) c *= 2;
    *cap = c;
    return c;
}

int32_t pg_lay_out(pg_node *const *roots, uint32_t nroots, pg_layout *L, pg_node **bad,
                   int levels) {
    *L = (pg_layout){0};
    pg_node **order;          /* parents first */
    size_t n;
    int32_t rc = pg_record_order(roots, nroots, 0, &order, &n);
    if (rc < 0) return rc;
    if (n >= UINT32_MAX) {    /* UINT32_MAX means "no slot" */
        free(order);
        return PG_E_ARG;
    }
    L->n = (uint32_t)n;
    for (size_t s = 0; s < n && rc == 0; s++) {
        pg_node *node = order[n - 1 - s];
        if (pg_program_leaf(node)) {
            L->nleaves++;
        } else if (pg_program_runs(node)) {
            pg_node *const *kids;
            L->nedges += pg_children(node, &kids);
        } else {
            *bad = order[n - 1 - s];
            rc = PG_E_ARG;
        }
    }
    if (rc == 0 && !(PG_ALLOC(L->node, n) && PG_ALLOC(L->leaf, n) &&
                     PG_ALLOC(L->first_edge, n + 1) && PG_ALLOC(L->kid, L->nedges) &&
                     PG_ALLOC(L->by_node, table_size(n, &L->cap))))
        rc = PG_E_NOMEM;
    /* Leaves first, then the other nodes in the walk's order (children
     * first: the order backward() sweeps, backwards); with `levels`, by
     * level (a node's level is one more than its highest child's; leaves
     * are 0), each level in the walk's order: a topological order in which
     * the neurons of a layer, which share a level and which the walk meets
     * one after another, get consecutive slots (batch.c runs them as one
     * layer). */
    size_t next_leaf = 0, next_op = L->nleaves;
    for (size_t s = 0; rc == 0 && s < n; s++) {
        pg_node *node = order[n - 1 - s];
        L->node[pg_program_leaf(node) ? next_leaf++ : next_op++] = node;
    }
    if (rc == 0 && levels) rc = by_level(L);
    else if (rc == 0) index_nodes(L);
    size_t e = 0;
    for (size_t s = 0; rc == 0 && s < n; s++) {
        pg_node *node = L->node[s];
        L->first_edge[s] = e;
        L->leaf[s] = (uint8_t)pg_program_leaf(node);
        if (L->leaf[s]) continue;
        pg_node *const *kids;
        uint32_t nk = pg_children(node, &kids);
        for (uint32_t k = 0; k < nk; k++) L->kid[e++] = pg_layout_slot(L, kids[k]);
    }
    if (rc == 0) L->first_edge[n] = e;
    free(order);
    if (rc == 0) rc = grade(roots, nroots, L);
    if (rc < 0) pg_layout_free(L);
    return rc;
}
