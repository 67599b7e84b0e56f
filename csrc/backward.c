/*
 * The reverse sweep.  Nodes are created after their children, and segments
 * are listed by creation, so walking nodes from the root down in reverse
 * creation order visits every parent before its children: a topological
 * order with no sort, no recursion and no stack, as in Stan Math's grad().
 * A node is "reached" when a reached parent names it (marked with the
 * sweep's epoch); reached nodes apply their gradient rule as the walk meets
 * them, and the walk ends when no reached node is left.  Segments with no
 * reached node are skipped whole, so unrelated live graphs cost little.
 *
 * The walk runs under the lock.  A node whose backward is a Python closure
 * can't run there: from that node on, the walk only records the remaining
 * order, releases the lock, and hands Python one closure at a time
 * (pg_backward returns h + 1; pg_backward_resume continues).
 */
#include <stdlib.h>
#include "node.h"

struct pg_sweep {
    uint32_t *order;       /* the rest of the walk, once Python is involved */
    size_t n, cap, pos;
};

static uint32_t epoch;

/* A finished sweep's buffer is kept per thread for the next backward that
 * meets Python (a nested backward from a closure just makes its own). */
static _Thread_local pg_sweep *spare;

static int push(pg_sweep *s, uint32_t h) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        uint32_t *p = realloc(s->order, cap * sizeof(uint32_t));
        if (p == NULL) return 0;
        s->order = p;
        s->cap = cap;
    }
    s->order[s->n++] = h;
    return 1;
}

void pg_sweep_free(pg_sweep *s) {
    if (s == NULL) return;
    if (spare == NULL) {
        spare = s;
        return;
    }
    free(s->order);
    free(s);
}

static pg_sweep *sweep_new(void) {
    pg_sweep *s = spare;
    spare = NULL;
    if (s == NULL) s = calloc(1, sizeof *s);
    if (s != NULL) s->n = s->pos = 0;
    return s;
}

/* Walk from root (lock held).  Returns 0 when done, or 1 with *rest set to
 * the remaining order from the first Python node on, or PG_E_NOMEM.  With
 * record_all the walk applies nothing and records every node (replay). */
static int walk(uint32_t root, int record_all, pg_sweep **rest) {
    if (++epoch == 0) {
        pg_reset_marks();
        epoch = 1;
    }
    const uint32_t ep = epoch;
    pg_sweep *s = record_all ? sweep_new() : NULL;
    if (record_all && s == NULL) return PG_E_NOMEM;
    pg_seg *seg = pg_segtab[root >> PG_SEG_BITS];
    pg_node *r = pg_N(root);
    r->mark = ep;
    if (!record_all) r->grad = 1.0;
    seg->reach_epoch = ep;
    size_t pending = 1;
    int64_t i = root & (PG_SEG_NODES - 1);
    for (;;) {
        for (; i >= 0; i--) {
            pg_node *n = &seg->nodes[i];
            if (n->mark != ep || (n->flags & PG_F_DEAD)) continue;
            const uint32_t *kids;
            uint32_t nk = pg_children(n, &kids);
            for (uint32_t k = 0; k < nk; k++) {
                pg_node *c = pg_N(kids[k]);
                if (c->mark != ep) {
                    c->mark = ep;
                    pg_segtab[kids[k] >> PG_SEG_BITS]->reach_epoch = ep;
                    pending++;
                }
            }
            if (s == NULL && (n->flags & PG_F_PY_BACKWARD)) {
                s = sweep_new();
                if (s == NULL) return PG_E_NOMEM;
            }
            if (s == NULL) {
                pg_rules[n->op].backward(n);
            } else if (!push(s, (seg->sid << PG_SEG_BITS) | (uint32_t)i)) {
                pg_sweep_free(s);
                return PG_E_NOMEM;
            }
            if (--pending == 0) {
                *rest = s;
                return s != NULL;
            }
        }
        do seg = seg->older; while (seg != NULL && seg->reach_epoch != ep);
        if (seg == NULL) {          /* unreachable: children are never newer */
            *rest = s;
            return s != NULL;
        }
        i = (int64_t)seg->used - 1;
    }
}

/* Apply the recorded order; stop at a Python node and return its h + 1. */
static int32_t run(pg_sweep *s) {
    while (s->pos < s->n) {
        uint32_t h = s->order[s->pos++];
        pg_node *n = pg_N(h);
        if (n->flags & PG_F_PY_BACKWARD) return (int32_t)(h + 1);
        pg_rules[n->op].backward(n);
    }
    pg_sweep_free(s);
    return 0;
}

int32_t pg_backward(uint32_t root, pg_sweep **out) {
    *out = NULL;
    pg_sweep *rest = NULL;
    pg_lock();
    int rc = pg_handle_valid(root) ? walk(root, 0, &rest) : PG_E_ARG;
    pg_unlock();
    if (rc <= 0) return rc;
    int32_t next = run(rest);
    if (next > 0) *out = rest;
    return next;
}

int pg_record_order(uint32_t root, uint32_t **order, size_t *n) {
    pg_sweep *s = NULL;
    pg_lock();
    int rc = pg_handle_valid(root) ? walk(root, 1, &s) : PG_E_ARG;
    pg_unlock();
    if (rc < 0) return rc;
    *order = s->order;          /* the caller owns the buffer now */
    *n = s->n;
    free(s);
    return 0;
}

int32_t pg_backward_resume(pg_sweep *s) {
    return run(s);
}

void pg_node_backward(uint32_t h) {
    pg_node *n = pg_N(h);
    pg_rules[n->op].backward(n);
}
