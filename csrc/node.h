/*
 * Internal layout shared by the C sources: the op table and how a node's
 * children are read.  Not part of the public API (pygrad.h is, and holds
 * the node struct).
 */
#ifndef PG_NODE_H
#define PG_NODE_H

#include <stddef.h>
#include <stdint.h>
#include "pygrad.h"
#include "test_hooks.h"

_Static_assert(sizeof(pg_node) == 48, "a node is 48 bytes");
/* FUNCTION's partials share its edge run with its children. */
_Static_assert(sizeof(double) == sizeof(pg_node *), "a partial fits a child's word");

/* The bits a LINEAR node's variant may have. */
#define PG_LINEAR_VARIANTS (PG_ACT_MASK | PG_LINEAR_BIAS)
_Static_assert(PG_ACT_SIGMOID <= PG_ACT_MASK && (PG_ACT_MASK & PG_LINEAR_BIAS) == 0,
               "activations fit the mask, apart from the bias bit");

static inline void pg_node_init(pg_node *n, int op) {
    n->grad = 0.0;
    n->aux.k = 0.0;
    n->c.kid[0] = n->c.kid[1] = NULL;
    n->mark = 0;
    n->op = (uint8_t)op;
    n->flags = 0;
    n->variant = 0;
}

typedef struct pg_op_rule {
    const char *name;
    int arity;
    void (*forward)(pg_node *n);     /* data from the children's data */
    void (*backward)(pg_node *n);    /* children's grad += local * n->grad */
} pg_op_rule;

extern const pg_op_rule pg_rules[PG_OP_COUNT];

/* Node n's children: their count, and *kids pointing to them. */
static inline uint32_t pg_children(pg_node *n, pg_node *const **kids) {
    int arity = pg_rules[n->op].arity;
    if (arity >= 0) {
        *kids = n->c.kid;
        return (uint32_t)arity;
    }
    *kids = n->aux.kids;
    return n->c.list.n;
}

/* FUNCTION nodes keep their partials after the child list. */
static inline double *pg_function_partials(pg_node **kids, uint32_t n) {
    return (double *)(void *)(kids + n);
}

/* alloc.c: the core's heap (through the test build's failure hook), for
 * the walks' and programs' scratch: never for nodes. */
void *pg_malloc(size_t size);
void *pg_calloc(size_t count, size_t size);
void *pg_realloc(void *p, size_t size);

/* backward.c: every node reachable from the roots, parents before
 * children, in a malloc'd buffer (the caller frees it); PG_E_BUSY (nothing
 * done) if another walk holds the sweep lock for about 50 ms more.  With
 * `graded`, only the nodes a gradient reaches: backward()'s order, which
 * does not go below a detached_max node (PG_OP_MAX: its number is its
 * largest child's, a constant to every gradient); without, the nodes a
 * forward pass needs too (a compiled program's). */
int pg_record_order(pg_node *const *roots, uint32_t nroots, int graded, pg_node ***order,
                    size_t *n);
/* backward.c: the graded order handed to use() under the sweep lock,
 * every node in it marked (use may set a mark to any nonzero value). */
int32_t pg_with_order(pg_node *const *roots, uint32_t nroots, int ms,
                      int32_t (*use)(pg_node *const *order, size_t n, void *ctx), void *ctx);
/* backward.c: the sweep lock, taken and let go by a compiled run that adds
 * into nodes' grads (a program's backward, a batch's sums), so that it is
 * one step among backward()s and other runs (csrc/lock.h, rule 2).  Taken
 * with the GIL let go, inside a call that is one C call anyway: its
 * holders wait for nothing but C. */
void pg_sweep_hold(void);
void pg_sweep_unhold(void);

#endif
