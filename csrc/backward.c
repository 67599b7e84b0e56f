/*
 * The reverse sweep.  Topological order comes from an iterative depth-first
 * search (explicit stack, children in creation order, post-order), so graph
 * depth never touches the C stack; visited nodes carry the sweep's epoch in
 * `mark` instead of sitting in a hash set.  The sweep then walks the order
 * backwards and applies each node's gradient rule, exactly like micrograd's
 * `for v in reversed(topo): v._backward()`.
 *
 * A node whose backward is written in Python stops the sweep: pg_backward
 * returns its handle + 1, Python runs it, and pg_backward_resume goes on.
 */
#include <stdlib.h>
#include "node.h"

struct pg_sweep {
    uint32_t *order;
    size_t n;
    size_t pos;
};

typedef struct {
    uint32_t h;
    uint32_t next_kid;
} frame;

static uint32_t epoch;

static int grow(void **buf, size_t *cap, size_t elem) {
    size_t cap2 = *cap ? 2 * *cap : 1024;
    void *p = realloc(*buf, cap2 * elem);
    if (p == NULL) return 0;
    *buf = p;
    *cap = cap2;
    return 1;
}

/* Post-order DFS from root into s->order.  Lock held. */
static int32_t topo_order(uint32_t root, pg_sweep *s) {
    if (++epoch == 0) {
        pg_reset_marks();
        epoch = 1;
    }
    uint32_t ep = epoch;
    frame *stack = NULL;
    size_t depth = 0, stack_cap = 0, order_cap = 0;
    s->order = NULL;
    s->n = 0;
    if (!grow((void **)&stack, &stack_cap, sizeof(frame))) return PG_E_NOMEM;
    stack[depth++] = (frame){root, 0};
    pg_N(root)->mark = ep;
    while (depth > 0) {
        frame *f = &stack[depth - 1];
        const uint32_t *kids;
        uint32_t nk = pg_children(pg_N(f->h), &kids);
        if (f->next_kid < nk) {
            uint32_t c = kids[f->next_kid++];
            pg_node *cn = pg_N(c);
            if (cn->mark == ep) continue;
            cn->mark = ep;
            if (depth == stack_cap && !grow((void **)&stack, &stack_cap, sizeof(frame))) goto nomem;
            stack[depth++] = (frame){c, 0};
        } else {
            if (s->n == order_cap && !grow((void **)&s->order, &order_cap, sizeof(uint32_t))) goto nomem;
            s->order[s->n++] = f->h;
            depth--;
        }
    }
    free(stack);
    return 0;
nomem:
    free(stack);
    free(s->order);
    s->order = NULL;
    return PG_E_NOMEM;
}

static int32_t run(pg_sweep *s) {
    while (s->pos > 0) {
        uint32_t h = s->order[--s->pos];
        pg_node *n = pg_N(h);
        if (n->flags & PG_F_PY_BACKWARD) return (int32_t)(h + 1);
        pg_rules[n->op].backward(n);
    }
    return 0;
}

void pg_sweep_free(pg_sweep *s) {
    if (s == NULL) return;
    free(s->order);
    free(s);
}

int32_t pg_backward(uint32_t root, pg_sweep **out) {
    *out = NULL;
    pg_sweep *s = malloc(sizeof *s);
    if (s == NULL) return PG_E_NOMEM;
    pg_lock();
    int32_t rc = pg_handle_valid(root) ? topo_order(root, s) : PG_E_ARG;
    pg_unlock();
    if (rc < 0) {
        free(s);
        return rc;
    }
    pg_N(root)->grad = 1.0;
    s->pos = s->n;
    rc = run(s);
    if (rc > 0) *out = s;
    else pg_sweep_free(s);
    return rc;
}

int32_t pg_backward_resume(pg_sweep *s) {
    int32_t rc = run(s);
    if (rc <= 0) pg_sweep_free(s);
    return rc;
}

void pg_node_backward(uint32_t h) {
    pg_node *n = pg_N(h);
    pg_rules[n->op].backward(n);
}
