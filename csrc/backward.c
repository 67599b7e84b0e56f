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
 * can't run there: when one may lie below the root (the root is
 * Python-held, or a closure was set late: memory.c), the walk only records
 * the order into Python's sweep and saves every grad it will touch, then
 * releases the lock, and the recorded rules run, handing Python one closure
 * at a time (pg_backward returns h + 1; pg_backward_resume continues).  If
 * a closure fails, pg_sweep_restore puts every saved grad back.
 */
#include <stdlib.h>
#include <string.h>
#include "node.h"

static uint32_t epoch;
/* A recorded order's first capacity (it doubles as needed). */
#define ORDER_START 1024u

static int reserve(pg_sweep *s, size_t need) {
    if (need <= s->cap) return 1;
    size_t cap = s->cap ? 2 * s->cap : ORDER_START;
    while (cap < need) cap *= 2;
    uint32_t *p = pg_realloc(s->order, cap * sizeof(uint32_t));
    if (p == NULL) return 0;
    s->order = p;
    s->cap = cap;
    return 1;
}

void pg_sweep_clear(pg_sweep *s) {
    if (s == NULL) return;
    free(s->order);
    free(s->saved);
    s->order = NULL;
    s->saved = NULL;
    s->n = s->cap = s->pos = 0;
}

/* Save the grad and aux word (SUB and DIV keep a hidden grad there: ops.c)
 * of every recorded node, before any changes. */
static int save(pg_sweep *s) {
    free(s->saved);
    s->saved = pg_malloc((s->n ? s->n : 1) * 2 * sizeof(double));
    if (s->saved == NULL) return 0;
    for (size_t i = 0; i < s->n; i++) {
        pg_node *n = pg_N(s->order[i]);
        s->saved[2 * i] = n->grad;
        memcpy(&s->saved[2 * i + 1], &n->aux, sizeof(double));
    }
    return 1;
}

void pg_sweep_restore(pg_sweep *s) {
    if (s == NULL || s->done || s->saved == NULL) return;
    pg_lock();
    for (size_t i = 0; i < s->n; i++) {
        pg_node *n = pg_N(s->order[i]);
        if (n->flags & PG_F_DEAD) continue;
        n->grad = s->saved[2 * i];
        memcpy(&n->aux, &s->saved[2 * i + 1], sizeof(double));
    }
    s->done = 1;
    pg_unlock();
}

/* Walk from the roots (lock held; live, distinct handles).  Returns 0 when
 * done, 1 when the order was recorded into s for run() (Python is
 * involved, or record_all: replay records every node and applies nothing),
 * or a PG_E_*. */
static int walk(const uint32_t *roots, uint32_t nroots, int record_all, pg_sweep *s) {
    /* When a closure may be met, the walk only records, with room for
     * every live node made up front: running out of memory then happens
     * before any grad has changed. */
    int record = record_all || (pg_N(roots[0])->flags & PG_F_PY_HELD) || pg_late_py_nodes() > 0;
    if (record) {
        if (s == NULL) return PG_E_SWEEP;
        s->n = s->pos = 0;
        if (!reserve(s, record_all ? 0 : (size_t)pg_live_nodes_locked())) return PG_E_NOMEM;
    }
    if (++epoch == 0) {
        pg_reset_marks();
        epoch = 1;
    }
    const uint32_t ep = epoch;
    /* Start at the newest root: every node below the roots comes after it. */
    uint32_t top = roots[0];
    size_t pending = 0;
    for (uint32_t j = 0; j < nroots; j++) {
        uint32_t h = roots[j];
        pg_seg *sj = pg_segtab[h >> PG_SEG_BITS], *st = pg_segtab[top >> PG_SEG_BITS];
        if (sj->birth > st->birth || (sj == st && h > top)) top = h;
        pg_node *r = pg_N(h);
        if (r->mark == ep) continue;
        r->mark = ep;
        if (!record) r->grad = 1.0;
        sj->reach_epoch = ep;
        pending++;
    }
    pg_seg *seg = pg_segtab[top >> PG_SEG_BITS];
    int64_t i = top & (PG_SEG_NODES - 1);
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
            if (!record) {
                pg_rules[n->op].backward(n);
            } else {
                if (!reserve(s, s->n + 1)) return PG_E_NOMEM;
                s->order[s->n++] = (seg->sid << PG_SEG_BITS) | (uint32_t)i;
            }
            if (--pending == 0) break;
        }
        if (pending == 0) break;
        do seg = seg->older; while (seg != NULL && seg->reach_epoch != ep);
        if (seg == NULL) break;     /* unreachable: children are never newer */
        i = (int64_t)seg->used - 1;
    }
    return record;
}

/* Apply the recorded order; stop at a Python node and return its h + 1. */
static int32_t run(pg_sweep *s) {
    while (s->pos < s->n) {
        uint32_t h = s->order[s->pos++];
        pg_node *n = pg_N(h);
        if (n->flags & PG_F_PY_BACKWARD) return (int32_t)(h + 1);
        pg_rules[n->op].backward(n);
    }
    return 0;
}

/* The recorded sweep ran to its end and Python has seen it return: its
 * grads stand (until then, a Ctrl-C raised as the last call returned would
 * have pg_sweep_restore put them back). */
void pg_sweep_keep(pg_sweep *s) {
    if (s != NULL) s->done = 1;
}

int32_t pg_backward(uint32_t root, pg_sweep *s) {
    pg_lock();
    int rc = pg_handle_valid(root) ? walk(&root, 1, 0, s) : PG_E_ARG;
    if (rc > 0) {
        if (save(s)) {
            s->done = 0;
            pg_N(root)->grad = 1.0;
        } else {
            rc = PG_E_NOMEM;
        }
    }
    pg_unlock();
    if (rc <= 0) return rc;
    return run(s);
}

int pg_record_order(const uint32_t *roots, uint32_t nroots, uint32_t **order, size_t *n) {
    pg_sweep s = {NULL, NULL, 0, 0, 0, 0};
    pg_lock();
    int rc = nroots > 0 ? 0 : PG_E_ARG;
    for (uint32_t j = 0; rc == 0 && j < nroots; j++)
        if (!pg_handle_valid(roots[j])) rc = PG_E_ARG;
    if (rc == 0) rc = walk(roots, nroots, 1, &s);
    pg_unlock();
    if (rc < 0) {
        pg_sweep_clear(&s);
        return rc;
    }
    *order = s.order;          /* the caller owns the buffer now */
    *n = s.n;
    return 0;
}

int32_t pg_backward_resume(pg_sweep *s) {
    return run(s);
}

void pg_node_backward(uint32_t h) {
    pg_node *n = pg_N(h);
    pg_rules[n->op].backward(n);
}
