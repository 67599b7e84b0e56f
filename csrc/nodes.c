/*
 * Making nodes and reading their fields: the public API over node.h.
 * Creation takes the lock (allocation and the children's refs are shared
 * state); field reads and writes do not.
 */
#include <string.h>
#include "node.h"

/* A Python-held child makes its parent Python-held: the parent's Value must
 * then hold the child's Value (and so its closure) alive. */
static uint8_t held_flag(uint32_t h) { return pg_N(h)->flags & PG_F_PY_HELD; }

/* What a creator returns for new node h (lock held). */
static int32_t made(int32_t h) {
    if (h >= 0 && (pg_N((uint32_t)h)->flags & PG_F_PY_HELD)) return PG_HELD - h;
    return h;
}

/* Fill node h of op `op` over children a (and b), lock held. */
static void link_node(uint32_t h, int op, uint32_t a, uint32_t b, double k, uint8_t flags) {
    pg_node *n = pg_N(h);
    pg_node_init(n, op);
    n->aux.k = k;
    n->kid[0] = a;
    pg_N(a)->refs++;
    flags |= held_flag(a);
    if (pg_rules[op].arity == 2) {
        n->kid[1] = b;
        pg_N(b)->refs++;
        flags |= held_flag(b);
    }
    n->flags = flags;
    pg_rules[op].forward(n);
}

static int32_t make(uint32_t sid, int op, int arity, uint32_t a, uint32_t b, double k,
                    uint8_t flags) {
    if (op < 0 || op >= PG_OP_COUNT || pg_rules[op].arity != arity) return PG_E_ARG;
    pg_lock();
    int32_t h = pg_alloc_nodes(sid, 0);    /* checks sid */
    if (h >= 0) h = pg_check_kid(sid, a);
    if (h >= 0 && arity == 2) h = pg_check_kid(sid, b);
    if (h >= 0) h = pg_alloc_nodes(sid, 1);
    if (h >= 0) link_node((uint32_t)h, op, a, b, k, flags);
    h = made(h);
    pg_unlock();
    return h;
}

int32_t pg_unary(uint32_t sid, int op, uint32_t a) {
    if (op == PG_OP_POWK) return PG_E_ARG;
    return make(sid, op, 1, a, 0, 0.0, 0);
}

int32_t pg_binary(uint32_t sid, int op, uint32_t a, uint32_t b) {
    return make(sid, op, 2, a, b, 0.0, 0);
}

int32_t pg_powk(uint32_t sid, uint32_t a, double k, int k_is_int) {
    return make(sid, PG_OP_POWK, 1, a, 0, k, k_is_int ? PG_F_INT_EXPONENT : 0);
}

/* `v op k` or `k op v` with k a number: micrograd wraps k in a leaf Value;
 * this makes the leaf and the op node in one call. */
int32_t pg_binary_k(uint32_t sid, int op, uint32_t a, double k, int k_first) {
    if (op < 0 || op >= PG_OP_COUNT || pg_rules[op].arity != 2) return PG_E_ARG;
    pg_lock();
    int32_t h = pg_alloc_nodes(sid, 0);
    if (h >= 0) h = pg_check_kid(sid, a);
    if (h >= 0) {
        h = pg_alloc_nodes(sid, 2);
        if (h >= 0) {
            uint32_t c = (uint32_t)h, out = c + 1;
            pg_node *leaf = pg_N(c);
            pg_node_init(leaf, PG_OP_LEAF);
            leaf->data = k;
            if (k_first) link_node(out, op, c, a, 0.0, 0);
            else link_node(out, op, a, c, 0.0, 0);
            h = (int32_t)out;
        }
    }
    h = made(h);
    pg_unlock();
    return h;
}

/* An n-ary node of op `op` over kids (lock taken here); forward not run. */
static int32_t make_nary(uint32_t sid, int op, int variant, const uint32_t *kids, uint32_t n) {
    int32_t h = pg_alloc_nodes(sid, 0);
    for (uint32_t i = 0; h >= 0 && i < n; i++) h = pg_check_kid(sid, kids[i]);
    if (h >= 0) h = pg_alloc_nodes(sid, 1);
    if (h < 0) return h;
    pg_node *node = pg_N((uint32_t)h);
    pg_node_init(node, PG_OP_LEAF);        /* freed as garbage if we stop here */
    uint32_t *edges = n > 0 ? pg_alloc_edges(sid, n) : NULL;
    if (n > 0 && edges == NULL) return PG_E_NOMEM;
    node->op = (uint8_t)op;
    node->variant = (uint16_t)variant;
    node->kid[0] = n;
    node->aux.kids = edges;
    if (n > 0) memcpy(edges, kids, (size_t)n * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) {
        pg_N(kids[i])->refs++;
        node->flags |= held_flag(kids[i]);
    }
    return h;
}

int32_t pg_linear_layer(uint32_t sid, int act, const uint32_t *params, const uint32_t *x,
                        uint32_t nin, uint32_t nout, uint32_t *out) {
    if (act < 0 || act > PG_ACT_MASK || nout == 0 || nout > PG_SEG_NODES) return PG_E_ARG;
    if (nin > (UINT32_MAX / nout - 1) / 2) return PG_E_ARG;    /* nout * nk fits */
    uint32_t nk = 2 * nin + 1;
    pg_lock();
    int32_t h = pg_alloc_nodes(sid, 0);
    for (uint32_t i = 0; h >= 0 && i < nin; i++) h = pg_check_kid(sid, x[i]);
    for (uint32_t i = 0; h >= 0 && i < nout * (nin + 1); i++) h = pg_check_kid(sid, params[i]);
    uint32_t *edges = NULL;
    if (h >= 0) {
        /* Reserve first so that an error leaves nothing half made. */
        pg_seg *seg = pg_segtab[sid];
        if (seg->used + nout > PG_SEG_NODES) h = PG_E_FULL;
        else if ((edges = pg_alloc_edges(sid, nout * nk)) == NULL) h = PG_E_NOMEM;
    }
    if (h >= 0) h = pg_alloc_nodes(sid, nout);
    for (uint32_t j = 0; h >= 0 && j < nout; j++) {
        uint32_t hj = (uint32_t)h + j;
        const uint32_t *p = params + (size_t)j * (nin + 1);
        uint32_t *e = edges + (size_t)j * nk;
        e[0] = p[0];
        for (uint32_t i = 0; i < nin; i++) {
            e[1 + 2 * i] = p[1 + i];
            e[2 + 2 * i] = x[i];
        }
        pg_node *node = pg_N(hj);
        pg_node_init(node, PG_OP_LINEAR);
        node->variant = (uint16_t)(act | PG_LINEAR_BIAS);
        node->kid[0] = nk;
        node->aux.kids = e;
        for (uint32_t i = 0; i < nk; i++) {
            pg_N(e[i])->refs++;
            node->flags |= held_flag(e[i]);
        }
        pg_rules[PG_OP_LINEAR].forward(node);
        out[j] = hj;
    }
    if (h >= 0) h = (pg_N((uint32_t)h)->flags & PG_F_PY_HELD) ? 1 : 0;
    pg_unlock();
    return h;
}

int32_t pg_function(uint32_t sid, double data, const uint32_t *kids, const double *partials,
                    uint32_t n) {
    pg_lock();
    /* kids, then the partials as doubles, 8-byte aligned, in one edge run */
    int32_t h = pg_alloc_nodes(sid, 0);
    for (uint32_t i = 0; h >= 0 && i < n; i++) h = pg_check_kid(sid, kids[i]);
    uint32_t *edges = NULL;
    if (h >= 0 && (edges = pg_alloc_edges(sid, PG_FUNCTION_EDGES(n))) == NULL) h = PG_E_NOMEM;
    if (h >= 0) h = pg_alloc_nodes(sid, 1);
    if (h >= 0) {
        if (((uintptr_t)edges & 7) != 0) edges++;       /* align the doubles below */
        double *d = pg_function_partials(edges, n);
        memcpy(d, partials, (size_t)n * sizeof(double));
        memcpy(edges, kids, (size_t)n * sizeof(uint32_t));
        pg_node *node = pg_N((uint32_t)h);
        pg_node_init(node, PG_OP_FUNCTION);
        node->data = data;
        node->kid[0] = n;
        node->aux.kids = edges;
        for (uint32_t i = 0; i < n; i++) {
            pg_N(kids[i])->refs++;
            node->flags |= held_flag(kids[i]);
        }
    }
    h = made(h);
    pg_unlock();
    return h;
}

void pg_gather_data(const uint32_t *h, uint32_t n, double *out) {
    for (uint32_t i = 0; i < n; i++) out[i] = pg_N(h[i])->data;
}
void pg_gather_grad(const uint32_t *h, uint32_t n, double *out) {
    for (uint32_t i = 0; i < n; i++) out[i] = pg_N(h[i])->grad;
}
void pg_scatter_data(const uint32_t *h, uint32_t n, const double *in) {
    for (uint32_t i = 0; i < n; i++) pg_N(h[i])->data = in[i];
}
void pg_fill_grad(const uint32_t *h, uint32_t n, double v) {
    for (uint32_t i = 0; i < n; i++) pg_N(h[i])->grad = v;
}

int32_t pg_custom(uint32_t sid, double data, const uint32_t *kids, uint32_t n) {
    pg_lock();
    int32_t h = make_nary(sid, PG_OP_CUSTOM, 0, kids, n);
    if (h >= 0) {
        pg_N((uint32_t)h)->data = data;
        pg_N((uint32_t)h)->flags |= PG_F_PY_HELD;
    }
    h = made(h);
    pg_unlock();
    return h;
}

int32_t pg_nary(uint32_t sid, int op, int variant, const uint32_t *kids, uint32_t n) {
    if (op < 0 || op >= PG_OP_COUNT || pg_rules[op].arity != -1 || op == PG_OP_CUSTOM)
        return PG_E_ARG;
    if (op == PG_OP_LINEAR) {
        uint32_t bias = (variant & PG_LINEAR_BIAS) ? 1 : 0;
        if ((variant & ~PG_LINEAR_VARIANTS) || n == 0 || n < bias || (n - bias) % 2 != 0)
            return PG_E_ARG;
    } else if (n == 0 || variant != 0) {
        return PG_E_ARG;
    }
    pg_lock();
    int32_t h = make_nary(sid, op, variant, kids, n);
    if (h >= 0) pg_rules[op].forward(pg_N((uint32_t)h));
    h = made(h);
    pg_unlock();
    return h;
}

double pg_data(uint32_t h) { return pg_N(h)->data; }
void pg_set_data(uint32_t h, double v) { pg_N(h)->data = v; }
double pg_grad(uint32_t h) { return pg_N(h)->grad; }
void pg_set_grad(uint32_t h, double v) { pg_N(h)->grad = v; }
int pg_op(uint32_t h) { return pg_N(h)->op; }
int pg_flags(uint32_t h) { return pg_N(h)->flags; }
int pg_variant(uint32_t h) { return pg_N(h)->variant; }
double pg_exponent(uint32_t h) { return pg_N(h)->aux.k; }

uint32_t pg_nkids(uint32_t h) {
    const uint32_t *kids;
    return pg_children(pg_N(h), &kids);
}

uint32_t pg_kid(uint32_t h, uint32_t i) {
    const uint32_t *kids;
    uint32_t n = pg_children(pg_N(h), &kids);
    return i < n ? kids[i] : 0;
}

const char *pg_op_name(int op) {
    return op >= 0 && op < PG_OP_COUNT ? pg_rules[op].name : "";
}
