/*
 * Second order: Hessian-vector products (pygrad.hvp, hessian) and forward
 * tangents (pygrad.jvp) over a graph, in one call, by forward-over-reverse
 * mode.  A forward pass gives every node the tangent of its value along
 * the inputs' tangents; the reverse pass then runs each gradient rule over
 * duals (a number and its tangent), so each node gets its adjoint and the
 * adjoint's tangent: at the inputs, the gradient and the Hessian times the
 * tangents.  Every rule comes from pygrad/op_rules.py (csrc/cffi_build.py
 * writes second_order_rules.h): an op's tangent is its gradient rules read
 * forward, and a rule over duals is the rule's own tree of ops, each one's
 * dual.  pygrad/_second_order.py does the same over Python floats, the
 * same operations in the same order, so the two engines agree bit for bit.
 *
 * A dual's `has` says whether it depends on the inputs at all: what
 * doesn't has no tangent, and adds none (so a constant's inf or nan, times
 * a tangent of 0, makes no nan), as a graph of gradients has no path from
 * a constant to the inputs.  In the same way an input whose tangent in a
 * row is 0 has none in that row (a Hessian column is the derivative along
 * one input, the others held), and a node that no gradient reaches (below
 * x ** 0, detached_max, or a guard) runs no rule in the reverse pass.
 *
 * Nodes are known by their index in the walk's order, which the sweep
 * keeps in their marks while it holds the sweep lock (backward.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "activation.h"
#include "node.h"
#include "rule_helpers.h"

typedef struct pg_dual {
    double v, t;        /* the number, and its tangent (0 without one) */
    int has;            /* 1 if it has a tangent: it depends on the inputs */
} pg_dual;

static inline pg_dual dual_const(double v) { return (pg_dual){v, 0.0, 0}; }

/* A sum of tangent parts: the first as it is, then each added. */
static inline void add_tangent(pg_dual *r, double part) {
    r->t = r->has ? r->t + part : part;
    r->has = 1;
}

#include "second_order_rules.h"

/* The graph, read once from node memory into arrays by node index (the
 * sweeps, one per row of tangents, then read nothing else): each node's
 * op, variant, constant (POWK's k) and value, and its children's indices
 * (node i's are kid[start[i]] .. kid[start[i + 1] - 1]).  Then one sweep's
 * numbers: each value's tangent, each adjoint and its tangent, and which
 * of the two tangents a node has. */
typedef struct sweep {
    const uint8_t *op;
    const uint16_t *variant;
    const double *k, *d;
    const size_t *start;
    const uint32_t *kid;
    double *t, *adj, *gt;
    uint8_t *has_t, *has_gt, *reached;
} sweep;

typedef struct hvp_call {
    pg_node *root;
    pg_node *const *ins;
    uint32_t nin, ntan;
    const double *tangents;     /* ntan rows of nin */
    double *result;             /* ntan rows of nin, or NULL */
    double *root_tangents;      /* ntan, or NULL */
    int reverse;
} hvp_call;

/* A node's index, while the sweep holds the lock (its mark: below). */
static inline uint32_t idx(const pg_node *n) { return n->mark - 1; }

/* Node j's value as a dual of the forward pass. */
static inline pg_dual value_of(const sweep *s, uint32_t j) {
    return (pg_dual){s->d[j], s->t[j], s->has_t[j]};
}

/* The activation of a LINEAR node as its unary op (PG_ACT_*), or -1. */
static int act_op(int act) {
    switch (act) {
    case PG_ACT_RELU: return PG_OP_RELU;
    case PG_ACT_TANH: return PG_OP_TANH;
    case PG_ACT_SIGMOID: return PG_OP_SIGMOID;
    default: return -1;
    }
}

/* The tangent of unary op `op` at input x and output y, or its gradient
 * rule over duals. */
static pg_dual unary_tangent(int op, pg_dual x, double y) {
    switch (op) {
#define CASE(code) case PG_OP_##code: return tangent_##code(x, y);
        PG_UNARY_RULES(CASE)
#undef CASE
    default: return dual_const(y);
    }
}
static pg_dual unary_dual_grad(int op, pg_dual x, pg_dual y, pg_dual g) {
    switch (op) {
#define CASE(code) case PG_OP_##code: return dual_grad_##code(x, y, g);
        PG_UNARY_RULES(CASE)
#undef CASE
    default: return g;
    }
}

/* LINEAR's pre-activation act(b + w0*x0 + ...) over duals, as its plain
 * graph computes it: b (or w0 * x0), then each product added. */
static pg_dual linear_pre(const sweep *s, const uint32_t *kids, uint32_t nk, int bias) {
    pg_dual acc;
    uint32_t j;
    if (bias) {
        acc = value_of(s, kids[0]);
        j = 1;
    } else {
        acc = dual_MUL(value_of(s, kids[0]), value_of(s, kids[1]));
        j = 2;
    }
    for (; j < nk; j += 2) acc = dual_ADD(acc, dual_MUL(value_of(s, kids[j]), value_of(s, kids[j + 1])));
    return acc;
}

/* logsumexp's shift (ops.c): the largest input, 0 if it is infinite. */
static double lse_shift(const sweep *s, const uint32_t *kids, uint32_t nk) {
    double m = s->d[kids[0]];
    for (uint32_t j = 1; j < nk; j++)
        if (s->d[kids[j]] > m) m = s->d[kids[j]];
    return isinf(m) ? 0.0 : m;
}

/* Node i's tangent from its inputs' (forward pass). */
static pg_dual node_tangent(const sweep *s, size_t i) {
    const uint32_t *kids = s->kid + s->start[i];
    uint32_t nk = (uint32_t)(s->start[i + 1] - s->start[i]);
    double y = s->d[i];
    switch (s->op[i]) {
#define CASE(code) case PG_OP_##code: return tangent_##code(value_of(s, kids[0]), value_of(s, kids[1]), y);
        PG_BINARY_RULES(CASE)
#undef CASE
    case PG_OP_POWK: return tangent_POWK(value_of(s, kids[0]), s->k[i], y);
    case PG_OP_SUM: {
        pg_dual r = {y, 0.0, 0};
        for (uint32_t j = 0; j < nk; j++)
            if (s->has_t[kids[j]]) add_tangent(&r, s->t[kids[j]]);
        return r;
    }
    case PG_OP_LINEAR: {
        pg_dual pre = linear_pre(s, kids, nk, (s->variant[i] & PG_LINEAR_BIAS) != 0);
        int act = act_op(s->variant[i] & PG_ACT_MASK);
        return act < 0 ? (pg_dual){y, pre.t, pre.has} : unary_tangent(act, pre, y);
    }
    case PG_OP_LOGSUMEXP: {
        /* the plain graph's: (exp(x_0 - m) t_0 + exp(x_1 - m) t_1 + ...) / s */
        double m = lse_shift(s, kids, nk), total = exp(s->d[kids[0]] - m);
        for (uint32_t j = 1; j < nk; j++) total = total + exp(s->d[kids[j]] - m);
        pg_dual r = {y, 0.0, 0};
        for (uint32_t j = 0; j < nk; j++)
            if (s->has_t[kids[j]]) add_tangent(&r, exp(s->d[kids[j]] - m) * s->t[kids[j]]);
        if (r.has) r.t = r.t / total;
        return r;
    }
    case PG_OP_LEAF: case PG_OP_MAX: case PG_OP_CUSTOM: case PG_OP_FUNCTION:
        return dual_const(y);
    default:
        return nk == 1 ? unary_tangent(s->op[i], value_of(s, kids[0]), y) : dual_const(y);
    }
}

/* Node j's adjoint += r (and its tangent, if r has one). */
static inline void add_adjoint(sweep *s, uint32_t j, pg_dual r) {
    s->adj[j] = s->adj[j] + r.v;
    s->reached[j] = 1;
    if (r.has) {
        s->gt[j] = s->has_gt[j] ? s->gt[j] + r.t : r.t;
        s->has_gt[j] = 1;
    }
}

/* Node i's gradient rules over duals (reverse pass), adding to its
 * children in backward()'s order (ops.c). */
static void node_reverse(sweep *s, size_t i) {
    const uint32_t *kids = s->kid + s->start[i];
    uint32_t nk = (uint32_t)(s->start[i + 1] - s->start[i]);
    if (!s->reached[i]) return;         /* no gradient reaches it */
    pg_dual g = {s->adj[i], s->gt[i], s->has_gt[i]}, y = value_of(s, (uint32_t)i);
    switch (s->op[i]) {
#define CASE(code)                                                                      \
    case PG_OP_##code: {                                                                \
        pg_dual a = value_of(s, kids[0]), b = value_of(s, kids[1]);                     \
        if (guard_a_##code(a.v, b.v, y.v)) add_adjoint(s, kids[0], dual_grad_a_##code(a, b, y, g)); \
        if (guard_b_##code(a.v, b.v, y.v)) add_adjoint(s, kids[1], dual_grad_b_##code(a, b, y, g)); \
        return;                                                                         \
    }
        PG_BINARY_RULES(CASE)
#undef CASE
    case PG_OP_POWK:
        if (guard_POWK(s->d[kids[0]], s->k[i], y.v))
            add_adjoint(s, kids[0], dual_grad_POWK(value_of(s, kids[0]), s->k[i], y, g));
        return;
    case PG_OP_SUM:
        for (uint32_t j = nk - 1; j >= 2; j--) add_adjoint(s, kids[j], g);
        add_adjoint(s, kids[0], g);
        if (nk > 1) add_adjoint(s, kids[1], g);
        return;
    case PG_OP_LINEAR: {
        int act = act_op(s->variant[i] & PG_ACT_MASK);
        uint32_t first = (s->variant[i] & PG_LINEAR_BIAS) ? 1 : 0;
        if (act >= 0) {
            g = unary_dual_grad(act, dual_const(0.0), y, g);   /* reads y only */
            g.v = 0.0 + g.v;    /* the plain graph's sum node's adjoint, from 0.0 */
        }
        for (uint32_t j = nk; j > first; j -= 2) {
            if (first && j - 2 == first) add_adjoint(s, kids[0], g);
            pg_dual w = value_of(s, kids[j - 2]), x = value_of(s, kids[j - 1]);
            add_adjoint(s, kids[j - 2], dual_grad_a_MUL(w, x, y, g));
            add_adjoint(s, kids[j - 1], dual_grad_b_MUL(w, x, y, g));
        }
        if (first && nk == 1) add_adjoint(s, kids[0], g);
        return;
    }
    case PG_OP_LOGSUMEXP: {
        /* the plain graph: e_j = exp(x_j - m), s = e_0 + ..., x_j += e_j * (g / s),
         * last term first */
        pg_dual m = dual_const(lse_shift(s, kids, nk));
        pg_dual total = dual_EXP(dual_SUB(value_of(s, kids[0]), m));
        for (uint32_t j = 1; j < nk; j++) total = dual_ADD(total, dual_EXP(dual_SUB(value_of(s, kids[j]), m)));
        pg_dual q = dual_DIV(g, total);
        for (uint32_t j = nk; j-- > 0;)
            add_adjoint(s, kids[j], dual_MUL(dual_EXP(dual_SUB(value_of(s, kids[j]), m)), q));
        return;
    }
    case PG_OP_LEAF: case PG_OP_MAX: case PG_OP_CUSTOM: case PG_OP_FUNCTION:
        return;
    default:
        if (nk == 1) add_adjoint(s, kids[0], unary_dual_grad(s->op[i], value_of(s, kids[0]), y, g));
        return;
    }
}

/* One row of tangents (tan, one per input): the forward pass, root's
 * tangent, and (reverse) the reverse pass and the inputs' adjoint
 * tangents into out. */
static void sweep_row(sweep *s, size_t n, const hvp_call *c, const double *tan,
                      double *root_tangent, double *out) {
    memset(s->has_t, 0, n);
    for (uint32_t i = 0; i < c->nin; i++) {
        pg_node *x = c->ins[i];
        if (!x->mark || tan[i] == 0.0) continue;     /* (0: held, in this row) */
        uint32_t k = idx(x);
        s->t[k] = s->has_t[k] ? s->t[k] + tan[i] : tan[i];
        s->has_t[k] = 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (s->has_t[i]) continue;           /* an input */
        pg_dual d = node_tangent(s, i);
        s->t[i] = d.t;
        s->has_t[i] = (uint8_t)d.has;
    }
    uint32_t r = idx(c->root);
    if (root_tangent != NULL) *root_tangent = s->has_t[r] ? s->t[r] : 0.0;
    if (out == NULL) return;
    for (size_t i = 0; i < n; i++) {
        s->adj[i] = 0.0;
        s->gt[i] = 0.0;
    }
    memset(s->has_gt, 0, n);
    memset(s->reached, 0, n);
    s->adj[r] += 1.0;
    s->reached[r] = 1;
    for (size_t i = n; i-- > 0;) node_reverse(s, i);
    for (uint32_t i = 0; i < c->nin; i++) {
        pg_node *x = c->ins[i];
        out[i] = x->mark && s->has_gt[idx(x)] ? s->gt[idx(x)] : 0.0;
    }
}

/* Whether the sweep has op's rules: Python's sweep takes any other (a
 * Function's partials are numbers, which only Python can differentiate). */
static int has_rules(int op) {
    switch (op) {
#define CASE(code) case PG_OP_##code:
        PG_UNARY_RULES(CASE)
        PG_BINARY_RULES(CASE)
#undef CASE
    case PG_OP_POWK: case PG_OP_SUM: case PG_OP_LINEAR: case PG_OP_LOGSUMEXP:
    case PG_OP_LEAF: case PG_OP_MAX: case PG_OP_CUSTOM:
        return 1;
    default:
        return 0;
    }
}

/* The children the graded order holds (node.h: pg_record_order): none of
 * a detached_max node's. */
static uint32_t graded_children(pg_node *x, pg_node *const **kids) {
    if (x->op != PG_OP_MAX) return pg_children(x, kids);
    *kids = NULL;
    return 0;
}

static int32_t hvp_over(pg_node *const *order, size_t n, void *ctx) {
    const hvp_call *c = ctx;
    if (n >= UINT32_MAX) return PG_E_NOMEM;
    size_t edges = 0;
    for (size_t i = 0; i < n; i++) {
        pg_node *const *kids;
        if (!has_rules(order[i]->op)) return PG_E_SWEEP;
        edges += graded_children(order[i], &kids);
        order[i]->mark = (uint32_t)(i + 1);
    }
    size_t m = n ? n : 1;
    double *numbers = pg_malloc(5 * m * sizeof(double));
    size_t *start = pg_malloc((n + 1) * sizeof *start);
    uint32_t *kid = pg_malloc((edges ? edges : 1) * sizeof *kid);
    uint16_t *variant = pg_malloc(m * sizeof *variant);
    uint8_t *bytes = pg_malloc(4 * m);
    int32_t rc = PG_E_NOMEM;
    if (numbers != NULL && start != NULL && kid != NULL && variant != NULL && bytes != NULL) {
        sweep s = {bytes, variant, numbers, numbers + m, start, kid, numbers + 2 * m,
                   numbers + 3 * m, numbers + 4 * m, bytes + m, bytes + 2 * m, bytes + 3 * m};
        double *k = numbers, *d = numbers + m;
        start[0] = 0;
        for (size_t i = 0; i < n; i++) {
            pg_node *x = order[i], *const *kids;
            uint32_t nk = graded_children(x, &kids);
            bytes[i] = x->op;
            variant[i] = x->variant;
            k[i] = x->op == PG_OP_POWK ? x->aux.k : 0.0;
            d[i] = x->data;
            for (uint32_t j = 0; j < nk; j++) kid[start[i] + j] = idx(kids[j]);
            start[i + 1] = start[i] + nk;
        }
        for (uint32_t r = 0; r < c->ntan; r++)
            sweep_row(&s, n, c, c->tangents + (size_t)r * c->nin,
                      c->root_tangents != NULL ? &c->root_tangents[r] : NULL,
                      c->reverse ? c->result + (size_t)r * c->nin : NULL);
        rc = 0;
    }
    free(numbers);
    free(start);
    free(kid);
    free(variant);
    free(bytes);
    return rc;
}

/* Forward-over-reverse from `root` (seed 1.0), for each of ntan rows of
 * tangents (nin each, one per input): the Hessian of root times the row,
 * into that row of result (if reverse), and root's tangent along it into
 * root_tangents (if not NULL).  An input not below root gets 0.  Under the
 * sweep lock, writing no node's numbers.  PG_E_SWEEP (nothing done) if a
 * Python closure or a Function lies below: their partials are numbers,
 * which Python differentiates; else errors as pg_with_order's. */
int32_t pg_hvp_numbers(pg_node *root, pg_node *const *ins, uint32_t nin, const double *tangents,
                       uint32_t ntan, double *result, double *root_tangents, int reverse,
                       int ms) {
    if (root == NULL || (ntan > 0 && nin > 0 && tangents == NULL)
        || (reverse && ntan > 0 && nin > 0 && result == NULL))
        return PG_E_ARG;
    for (uint32_t i = 0; i < nin; i++)
        if (ins[i] == NULL) return PG_E_ARG;
    hvp_call c = {root, ins, nin, ntan, tangents, result, root_tangents, reverse};
    return pg_with_order(&root, 1, ms, hvp_over, &c);
}
