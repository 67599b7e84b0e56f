/*
 * Replay: the graph below a root, compiled once into its topological order,
 * then re-run in C.  The program works on the graph's own nodes, which
 * never change after creation, so Python Values of the graph (the loss, the
 * scores) see the replayed numbers; leaves are the user's own Values.
 *
 * forward():  every node's forward rule, children first.
 * backward(): what backward() does on a freshly built graph: interior
 *             grads start at 0, the root's at 1, leaves accumulate.
 */
#include <stdlib.h>
#include "node.h"

/* Nodes whose forward value or gradient lives in Python can't replay. */
static int replayable(const pg_node *n) {
    if (n->flags & PG_F_PY_BACKWARD) return 0;
    if (n->op == PG_OP_FUNCTION) return 0;          /* partials were captured once */
    if (n->op == PG_OP_CUSTOM && n->kid[0] > 0) return 0;
    return 1;
}

int32_t pg_compile(uint32_t root, pg_program *p, uint32_t *bad_node) {
    pg_program_clear(p);
    uint32_t *order;
    size_t n;
    int rc = pg_record_order(&root, 1, &order, &n);
    if (rc < 0) return rc;
    for (size_t i = 0; i < n; i++) {
        if (!replayable(pg_N(order[i]))) {
            *bad_node = order[i];
            free(order);
            return PG_E_ARG;
        }
    }
    p->order = order;
    p->n = n;
    return 0;
}

double pg_program_forward(pg_program *p) {
    for (size_t i = p->n; i-- > 0;) {
        pg_node *n = pg_N(p->order[i]);
        pg_rules[n->op].forward(n);
    }
    return pg_N(p->order[0])->data;
}

void pg_program_backward(pg_program *p) {
    for (size_t i = 0; i < p->n; i++) {
        pg_node *n = pg_N(p->order[i]);
        const uint32_t *kids;
        if (pg_children(n, &kids) > 0) n->grad = 0.0;
    }
    pg_N(p->order[0])->grad = 1.0;
    for (size_t i = 0; i < p->n; i++) {
        pg_node *n = pg_N(p->order[i]);
        pg_rules[n->op].backward(n);
    }
}

uint32_t pg_program_size(const pg_program *p) { return (uint32_t)p->n; }

void pg_program_clear(pg_program *p) {
    if (p == NULL) return;
    free(p->order);
    p->order = NULL;
    p->n = 0;
}
