/*
 * Making nodes and reading their fields: the public API over node.h.
 *
 * A creator writes its nodes into memory the caller gives it (a node
 * object's: new_nodeobj in csrc/value_binding.h) and links them to their children by pointer; it
 * allocates nothing and touches no shared state, so it needs no lock.
 * Every argument is checked before anything is written: a creator either
 * makes all its nodes and returns 0, or writes nothing and returns a
 * PG_E_*.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "node.h"
#include "program.h"

static int fixed_op(int op, int arity) {
    return op >= 0 && op < PG_OP_COUNT && pg_rules[op].arity == arity;
}

/* Node n = op(a, b) (b unused for a unary op), its data computed. */
static void make_fixed(pg_node *n, int op, pg_node *a, pg_node *b, double k, uint8_t flags) {
    pg_node_init(n, op);
    /* SUB and DIV keep micrograd's hidden grad in aux (ops.c); -0.0 + g is
     * g for every g, signed zeros included. */
    n->aux.k = op == PG_OP_SUB || op == PG_OP_DIV ? -0.0 : k;
    n->c.kid[0] = a;
    n->c.kid[1] = pg_rules[op].arity == 2 ? b : NULL;
    n->flags = flags | ((a->flags | (n->c.kid[1] != NULL ? b->flags : 0)) & PG_F_TRACED);
    pg_rules[op].forward(n);
}

int32_t pg_leaf(pg_node *out, double data) {
    if (out == NULL) return PG_E_ARG;
    pg_node_init(out, PG_OP_LEAF);
    out->data = data;
    return 0;
}

int32_t pg_unary(pg_node *out, int op, pg_node *a) {
    if (!fixed_op(op, 1) || op == PG_OP_POWK || out == NULL || a == NULL) return PG_E_ARG;
    make_fixed(out, op, a, NULL, 0.0, 0);
    return 0;
}

int32_t pg_binary(pg_node *out, int op, pg_node *a, pg_node *b) {
    if (!fixed_op(op, 2) || out == NULL || a == NULL || b == NULL) return PG_E_ARG;
    make_fixed(out, op, a, b, 0.0, 0);
    return 0;
}

int32_t pg_powk(pg_node *out, pg_node *a, double k, int k_is_int) {
    if (out == NULL || a == NULL) return PG_E_ARG;
    make_fixed(out, PG_OP_POWK, a, NULL, k, k_is_int ? PG_F_INT_EXPONENT : 0);
    return 0;
}

/* `v op k` or `k op v` with k a number: micrograd wraps k in a leaf Value;
 * this makes the op node (out[0]) and the leaf (out[1]) in one call. */
int32_t pg_binary_k(pg_node *out, int op, pg_node *a, double k, int k_first) {
    if (!fixed_op(op, 2) || out == NULL || a == NULL) return PG_E_ARG;
    pg_node *leaf = out + 1;
    pg_leaf(leaf, k);
    if (k_first) make_fixed(out, op, leaf, a, 0.0, 0);
    else make_fixed(out, op, a, leaf, 0.0, 0);
    return 0;
}

static int kids_ok(pg_node *const *kids, uint32_t n) {
    if (n > 0 && kids == NULL) return 0;
    for (uint32_t i = 0; i < n; i++)
        if (kids[i] == NULL) return 0;
    return 1;
}

/* An n-ary node over the child list kids[0..n) (kept, not copied). */
static void make_list(pg_node *out, int op, int variant, pg_node **kids, uint32_t n, double data,
                      uint8_t flags) {
    pg_node_init(out, op);
    out->variant = (uint16_t)variant;
    out->data = data;
    out->c.list.n = n;
    out->aux.kids = kids;
    uint8_t traced = 0;
    for (uint32_t i = 0; i < n; i++) traced |= kids[i]->flags;
    out->flags = flags | (traced & PG_F_TRACED);
}

/* Over children, its gradient is its Value's closure from the start
 * (micrograd's `lambda: None` until one is set), so that setting one needs
 * no call: backward() hands the node to Python either way. */
int32_t pg_custom(pg_node *out, double data, pg_node **kids, uint32_t n, void *py) {
    if (out == NULL || !kids_ok(kids, n)) return PG_E_ARG;
    make_list(out, PG_OP_CUSTOM, 0, kids, n, data, n > 0 ? PG_F_PY_BACKWARD : 0);
    out->c.list.py = py;
    return 0;
}

int32_t pg_nary(pg_node *out, int op, int variant, pg_node **kids, uint32_t n) {
    if (op < 0 || op >= PG_OP_COUNT || pg_rules[op].arity != -1 || op == PG_OP_CUSTOM
            || op == PG_OP_FUNCTION || out == NULL || !kids_ok(kids, n))
        return PG_E_ARG;
    if (op == PG_OP_LINEAR) {
        uint32_t bias = (variant & PG_LINEAR_BIAS) ? 1 : 0;
        if ((variant & ~PG_LINEAR_VARIANTS) || n == 0 || n < bias || (n - bias) % 2 != 0)
            return PG_E_ARG;
    } else if (n == 0 || variant != 0) {
        return PG_E_ARG;
    }
    make_list(out, op, variant, kids, n, 0.0, 0);
    pg_rules[op].forward(out);
    return 0;
}

size_t pg_function_words(uint32_t n) { return 2 * (size_t)n; }

int32_t pg_function(pg_node *out, double data, pg_node *const *kids, const double *partials,
                    uint32_t n, pg_node **edges) {
    if (out == NULL || !kids_ok(kids, n) || (n > 0 && (partials == NULL || edges == NULL)))
        return PG_E_ARG;
    if (n > 0) {
        memcpy(edges, kids, (size_t)n * sizeof *edges);
        memcpy(pg_function_partials(edges, n), partials, (size_t)n * sizeof(double));
    }
    make_list(out, PG_OP_FUNCTION, 0, edges, n, data, 0);
    return 0;
}

/* A layer's nodes out[0..nout), neuron j over params[j*(nin+1) ..] (b, w0,
 * ...) and the inputs x[0..nin), or when x is NULL the nodes xs[0..nin). */
static void fill_layer(pg_node *out, int act, pg_node *const *params, pg_node *const *x,
                       pg_node *xs, uint32_t nin, uint32_t nout, pg_node **edges) {
    uint32_t nk = 2 * nin + 1;
    for (uint32_t j = 0; j < nout; j++) {
        pg_node *const *p = params + (size_t)j * (nin + 1);
        pg_node **e = edges + (size_t)j * nk;
        e[0] = p[0];
        for (uint32_t i = 0; i < nin; i++) {
            e[1 + 2 * i] = p[1 + i];
            e[2 + 2 * i] = x != NULL ? x[i] : xs + i;
        }
        make_list(out + j, PG_OP_LINEAR, act | PG_LINEAR_BIAS, e, nk, 0.0, 0);
        pg_rules[PG_OP_LINEAR].forward(out + j);
    }
}

/* nin inputs and nout neurons make a layer whose edge count fits. */
static int layer_fits(int act, uint32_t nin, uint32_t nout) {
    return act >= 0 && act <= PG_ACT_MASK && nout > 0 && nin <= (UINT32_MAX / nout - 1) / 2;
}

size_t pg_layer_words(uint32_t nin, uint32_t nout) {
    return (size_t)nout * (2 * (size_t)nin + 1);
}

int32_t pg_linear_layer(pg_node *out, pg_node **edges, int act, pg_node *const *params,
                        pg_node *const *x, uint32_t nin, uint32_t nout) {
    if (!layer_fits(act, nin, nout) || out == NULL || edges == NULL || !kids_ok(x, nin) ||
            !kids_ok(params, nout * (nin + 1)))
        return PG_E_ARG;
    fill_layer(out, act, params, x, NULL, nin, nout, edges);
    return 0;
}

int32_t pg_mlp(pg_node *out, pg_node **edges, uint32_t nlayers, const int *acts,
               pg_node *const *const *params, const uint32_t *sizes, pg_node *const *x) {
    if (nlayers == 0 || out == NULL || edges == NULL || !kids_ok(x, sizes[0])) return PG_E_ARG;
    for (uint32_t l = 0; l < nlayers; l++) {
        if (!layer_fits(acts[l], sizes[l], sizes[l + 1]) || params[l] == NULL ||
                !kids_ok(params[l], sizes[l + 1] * (sizes[l] + 1)))
            return PG_E_ARG;
    }
    pg_node *prev = NULL;
    for (uint32_t l = 0; l < nlayers; l++) {
        fill_layer(out, acts[l], params[l], l == 0 ? x : NULL, prev, sizes[l], sizes[l + 1],
                   edges);
        edges += pg_layer_words(sizes[l], sizes[l + 1]);
        prev = out;
        out += sizes[l + 1];
    }
    return 0;
}

int32_t pg_leaves(pg_node *out, const double *data, uint32_t n) {
    if (out == NULL || (n > 0 && data == NULL)) return PG_E_ARG;
    for (uint32_t i = 0; i < n; i++) pg_leaf(out + i, data[i]);
    return 0;
}

void pg_gather_data(pg_node *const *p, uint32_t n, double *out) {
    for (uint32_t i = 0; i < n; i++) out[i] = p[i]->data;
}
void pg_gather_grad(pg_node *const *p, uint32_t n, double *out) {
    for (uint32_t i = 0; i < n; i++) out[i] = p[i]->grad;
}
void pg_scatter_data(pg_node *const *p, uint32_t n, const double *in) {
    for (uint32_t i = 0; i < n; i++) p[i]->data = in[i];
}
void pg_fill_grad(pg_node *const *p, uint32_t n, double v) {
    for (uint32_t i = 0; i < n; i++) p[i]->grad = v;
}

double pg_data(const pg_node *n) { return n->data; }
void pg_set_data(pg_node *n, double v) { n->data = v; }
double pg_grad(const pg_node *n) { return n->grad; }
void pg_set_grad(pg_node *n, double v) { n->grad = v; }
int pg_op(const pg_node *n) { return n->op; }
int64_t pg_describe(const pg_node *n) { return (int64_t)(n->op | (uint32_t)n->flags << 8); }
int pg_flags(const pg_node *n) { return n->flags; }
int pg_variant(const pg_node *n) { return n->variant; }
double pg_exponent(const pg_node *n) { return n->aux.k; }
void pg_zero_hidden(pg_node *n) {
    if (n->op == PG_OP_SUB || n->op == PG_OP_DIV) n->aux.k = -0.0;
}
/* Rules made Python's: a compiled program checks its nodes when this moves
 * (program.h, pg_rule_watch). */
static _Atomic uint64_t py_rules_set;

uint64_t pg_py_rules_now(void) {
    return atomic_load_explicit(&py_rules_set, memory_order_acquire);
}

void pg_set_py_backward(pg_node *n) {
    if (n->flags & PG_F_PY_BACKWARD) return;
    n->flags |= PG_F_PY_BACKWARD;
    atomic_fetch_add_explicit(&py_rules_set, 1, memory_order_acq_rel);
}
void pg_set_traced(pg_node *n) { n->flags |= PG_F_TRACED; }
void *pg_py_handle(const pg_node *n) { return n->op == PG_OP_CUSTOM ? n->c.list.py : NULL; }

uint32_t pg_nkids(const pg_node *n) {
    pg_node *const *kids;
    return pg_children((pg_node *)n, &kids);
}

pg_node *pg_kid(const pg_node *n, uint32_t i) {
    pg_node *const *kids;
    return i < pg_children((pg_node *)n, &kids) ? kids[i] : NULL;
}

/* The rule itself, run on copies: n's with grad 1 and its children's with
 * grad 0, so each number is the one backward() would use.  A FUNCTION
 * node's partials are read as given (its rule reads them after the child
 * list, which the copies don't have). */
int32_t pg_local_grads(const pg_node *n, double *out, uint32_t cap) {
    pg_node *const *kids;
    uint32_t nk = pg_children((pg_node *)n, &kids);
    if (n->op == PG_OP_CUSTOM) return PG_E_ARG;
    if (n->op == PG_OP_FUNCTION) {
        const double *d = pg_function_partials((pg_node **)kids, nk);
        for (uint32_t i = 0; i < nk && i < cap; i++) out[i] = d[i];
        return (int32_t)nk;
    }
    if (nk == 0) return 0;
    pg_node *copies = pg_malloc((size_t)nk * sizeof *copies);
    pg_node **ptrs = pg_malloc((size_t)nk * sizeof *ptrs);
    if (copies == NULL || ptrs == NULL) {
        free(copies);
        free(ptrs);
        return PG_E_NOMEM;
    }
    pg_node m = *n;
    m.grad = 1.0;
    pg_zero_hidden(&m);          /* SUB/DIV: as on a first backward */
    for (uint32_t i = 0; i < nk; i++) {
        copies[i] = *kids[i];
        copies[i].grad = 0.0;
        ptrs[i] = copies + i;
    }
    if (pg_rules[n->op].arity >= 0) {
        for (uint32_t i = 0; i < nk; i++) m.c.kid[i] = ptrs[i];
    } else {
        m.aux.kids = ptrs;
    }
    pg_rules[n->op].backward(&m);
    for (uint32_t i = 0; i < nk && i < cap; i++) out[i] = copies[i].grad;
    free(copies);
    free(ptrs);
    return (int32_t)nk;
}

uint32_t pg_node_size(void) { return (uint32_t)sizeof(pg_node); }

const char *pg_op_name(int op) {
    return op >= 0 && op < PG_OP_COUNT ? pg_rules[op].name : "";
}
