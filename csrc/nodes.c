/*
 * Making nodes and reading their fields: the public API over node.h.
 * Creation takes the lock (allocation and the children's refs are shared
 * state); field reads and writes do not.
 *
 * Every creator takes the same three steps, under the lock:
 *   1. validate: every child is a live node;
 *   2. reserve: room for all the node slots in the calling thread's segment
 *      (pg_room: a new segment when the current one is full or older than
 *      a child), then the edge storage (the only steps that allocate);
 *   3. commit: take the slots, fill the nodes, link the children (refs,
 *      the held flag), run forward, and fill the caller's claim with the
 *      nodes Python gets Values for (memory.c): they are born held.
 * Steps 1 and 2 are begin(); every failure (PG_E_ARG, PG_E_NOMEM,
 * PG_E_SPACE) happens there, before any node is made.  Arguments that need
 * no lock (op, arity, sizes) are checked before it is taken.  A creator
 * returns the new handle h or a PG_E_*.
 */
#include <string.h>
#include "node.h"

/* Steps 1 and 2 for `nodes` new slots over the children kids[0..n) and
 * kids2[0..n2), with `nedges` edge words (written to *edges; none when 0).
 * Returns 0 or a PG_E_*; the slots are taken by pg_take_nodes once nothing
 * can fail.  Lock held. */
static int32_t begin(const uint32_t *kids, uint32_t n, const uint32_t *kids2, uint32_t n2,
                     uint32_t nodes, uint32_t nedges, uint32_t **edges, pg_seg **segp) {
    uint64_t birth = 0;
    for (uint32_t i = 0; i < n + n2; i++) {
        uint32_t h = i < n ? kids[i] : kids2[i - n];
        if (!pg_handle_valid(h)) return PG_E_ARG;
        uint64_t b = pg_segtab[h >> PG_SEG_BITS]->birth;
        if (b > birth) birth = b;
    }
    int32_t err = 0;
    pg_seg *seg = pg_room(nodes, birth, &err);
    if (seg == NULL) return err;
    if (nedges > 0 && (*edges = pg_alloc_edges(seg->sid, nedges)) == NULL) return PG_E_NOMEM;
    *segp = seg;
    return 0;
}

/* Step 3's links: node n holds child c (lock held). */
static void adopt(pg_node *n, uint32_t c) {
    pg_node *kid = pg_N(c);
    kid->refs++;
    kid->flags |= PG_F_HAS_PARENT;
    /* A Python-held child makes its parent Python-held: the parent's Value
     * must then hold the child's Value (and so its closure) alive. */
    n->flags |= kid->flags & PG_F_PY_HELD;
}

/* The claim a creator was given: usable (0), or why not. */
static int32_t claim_ok(const pg_claim *c) {
    if (c == NULL) return PG_E_NOMEM;       /* pg_claim_new had no memory */
    return c->n == 0 ? 0 : PG_E_ARG;
}

/* What a creator returns for the n new nodes from h on, which claim c
 * holds from now, or error h (lock held). */
static int32_t made(pg_claim *c, int32_t h, uint32_t n) {
    if (h >= 0) pg_claim_fill(c, (uint32_t)h, n);
    return h;
}

/* Unary and binary nodes: op over a (and b).  With konst, a leaf holding
 * k is made too, in the slot before the op node, and becomes the operand
 * b (konst 1: a op k) or a (konst 2: k op a, the leaf first). */
static int32_t make_fixed(pg_claim *c, int op, uint32_t a, uint32_t b, double k, uint8_t flags,
                          int konst) {
    uint32_t kids[2] = {a, b};
    int arity = pg_rules[op].arity;
    uint32_t nodes = konst ? 2 : 1;
    pg_seg *seg = NULL;
    int32_t bad = claim_ok(c);
    if (bad) return bad;
    pg_lock();
    int32_t h = begin(kids, konst ? 1 : (uint32_t)arity, NULL, 0, nodes, 0, NULL, &seg);
    if (h == 0) {
        h = pg_take_nodes(seg, nodes);
        uint32_t out = (uint32_t)h;
        if (konst) {
            uint32_t lh = out++;
            pg_node *leaf = pg_N(lh);
            pg_node_init(leaf, PG_OP_LEAF);
            leaf->data = k;
            k = 0.0;
            if (konst == 2) kids[1] = a, kids[0] = lh;
            else kids[1] = lh;
        }
        pg_node *n = pg_N(out);
        pg_node_init(n, op);
        /* SUB and DIV keep micrograd's hidden grad there (ops.c); -0.0 + g
         * is g for every g, signed zeros included. */
        n->aux.k = op == PG_OP_SUB || op == PG_OP_DIV ? -0.0 : k;
        n->flags = flags;
        for (int i = 0; i < arity; i++) {
            n->kid[i] = kids[i];
            adopt(n, kids[i]);
        }
        pg_rules[op].forward(n);
        h = (int32_t)out;
    }
    h = made(c, h, 1);
    pg_unlock();
    return h;
}

static int fixed_op(int op, int arity) {
    return op >= 0 && op < PG_OP_COUNT && pg_rules[op].arity == arity;
}

int32_t pg_unary(pg_claim *c, int op, uint32_t a) {
    if (!fixed_op(op, 1) || op == PG_OP_POWK) return PG_E_ARG;
    return make_fixed(c, op, a, 0, 0.0, 0, 0);
}

int32_t pg_binary(pg_claim *c, int op, uint32_t a, uint32_t b) {
    if (!fixed_op(op, 2)) return PG_E_ARG;
    return make_fixed(c, op, a, b, 0.0, 0, 0);
}

int32_t pg_powk(pg_claim *c, uint32_t a, double k, int k_is_int) {
    return make_fixed(c, PG_OP_POWK, a, 0, k, k_is_int ? PG_F_INT_EXPONENT : 0, 0);
}

/* `v op k` or `k op v` with k a number: micrograd wraps k in a leaf Value;
 * this makes the leaf and the op node in one call. */
int32_t pg_binary_k(pg_claim *c, int op, uint32_t a, double k, int k_first) {
    if (!fixed_op(op, 2)) return PG_E_ARG;
    return make_fixed(c, op, a, 0, k, 0, k_first ? 2 : 1);
}

/* N-ary nodes (n children in an edge run of nedges words, kids first):
 * one node of op/variant with value data (if forward is 0), its flags
 * or'ed with flags.  partials: FUNCTION's, stored after the kids. */
static int32_t make_list(int op, int variant, const uint32_t *kids, uint32_t n, uint32_t nedges,
                         double data, const double *partials, uint8_t flags, int forward,
                         pg_claim *claim) {
    uint32_t *edges = NULL;
    pg_seg *seg = NULL;
    int32_t bad = claim_ok(claim);
    if (bad) return bad;
    pg_lock();
    int32_t h = begin(kids, n, NULL, 0, 1, nedges, &edges, &seg);
    if (h == 0) {
        h = pg_take_nodes(seg, 1);
        if (partials != NULL) {
            if (((uintptr_t)edges & 7) != 0) edges++;       /* align the doubles */
            memcpy(pg_function_partials(edges, n), partials, (size_t)n * sizeof(double));
        }
        if (n > 0) memcpy(edges, kids, (size_t)n * sizeof(uint32_t));
        pg_node *node = pg_N((uint32_t)h);
        pg_node_init(node, op);
        node->variant = (uint16_t)variant;
        node->data = data;
        node->kid[0] = n;
        node->aux.kids = edges;
        node->flags = flags;
        for (uint32_t i = 0; i < n; i++) adopt(node, kids[i]);
        if (forward) pg_rules[op].forward(node);
    }
    h = made(claim, h, 1);
    pg_unlock();
    return h;
}

/* Over children, its gradient is its Value's closure from the start
 * (micrograd's `lambda: None` until one is set), so that setting one needs
 * no call: backward() hands the node to Python either way. */
int32_t pg_custom1(pg_claim *c, double data, uint32_t kid) {
    return make_list(PG_OP_CUSTOM, 0, &kid, 1, 1, data, NULL,
                     PG_F_PY_HELD | PG_F_PY_BACKWARD, 0, c);
}

int32_t pg_custom(pg_claim *c, double data, const uint32_t *kids, uint32_t n) {
    return make_list(PG_OP_CUSTOM, 0, kids, n, n, data, NULL,
                     PG_F_PY_HELD | (n > 0 ? PG_F_PY_BACKWARD : 0), 0, c);
}

int32_t pg_nary(pg_claim *c, int op, int variant, const uint32_t *kids, uint32_t n) {
    if (op < 0 || op >= PG_OP_COUNT || pg_rules[op].arity != -1 || op == PG_OP_CUSTOM
            || op == PG_OP_FUNCTION)
        return PG_E_ARG;
    if (op == PG_OP_LINEAR) {
        uint32_t bias = (variant & PG_LINEAR_BIAS) ? 1 : 0;
        if ((variant & ~PG_LINEAR_VARIANTS) || n == 0 || n < bias || (n - bias) % 2 != 0)
            return PG_E_ARG;
    } else if (n == 0 || variant != 0) {
        return PG_E_ARG;
    }
    return make_list(op, variant, kids, n, n, 0.0, NULL, 0, 1, c);
}

int32_t pg_function(pg_claim *c, double data, const uint32_t *kids, const double *partials,
                    uint32_t n) {
    if (n > (UINT32_MAX - 2) / 3) return PG_E_ARG;
    /* kids, then the partials as doubles, 8-byte aligned, in one edge run */
    return make_list(PG_OP_FUNCTION, 0, kids, n, PG_FUNCTION_EDGES(n), data, partials, 0, 0, c);
}

/* Step 3 of a layer: nout LINEAR nodes from slot h on, neuron j over
 * params[j*(nin+1) ..] (b, w0, ...) and the inputs x[0..nin), or when x is
 * NULL the consecutive handles xbase, xbase + 1, ... (lock held). */
static void fill_layer(uint32_t h, int act, const uint32_t *params, const uint32_t *x,
                       uint32_t xbase, uint32_t nin, uint32_t nout, uint32_t *edges) {
    uint32_t nk = 2 * nin + 1;
    for (uint32_t j = 0; j < nout; j++) {
        const uint32_t *p = params + (size_t)j * (nin + 1);
        uint32_t *e = edges + (size_t)j * nk;
        e[0] = p[0];
        for (uint32_t i = 0; i < nin; i++) {
            e[1 + 2 * i] = p[1 + i];
            e[2 + 2 * i] = x != NULL ? x[i] : xbase + i;
        }
        pg_node *node = pg_N(h + j);
        pg_node_init(node, PG_OP_LINEAR);
        node->variant = (uint16_t)(act | PG_LINEAR_BIAS);
        node->kid[0] = nk;
        node->aux.kids = e;
        for (uint32_t i = 0; i < nk; i++) adopt(node, e[i]);
        pg_rules[PG_OP_LINEAR].forward(node);
    }
}

/* nin inputs and nout neurons make a layer whose edge count fits. */
static int layer_fits(int act, uint32_t nin, uint32_t nout) {
    return act >= 0 && act <= PG_ACT_MASK && nout > 0 && nout <= PG_SEG_NODES &&
           nin <= (UINT32_MAX / nout - 1) / 2;
}

int32_t pg_linear_layer(pg_claim *c, int act, const uint32_t *params, const uint32_t *x,
                        uint32_t nin, uint32_t nout) {
    if (!layer_fits(act, nin, nout)) return PG_E_ARG;
    int32_t bad = claim_ok(c);
    if (bad) return bad;
    uint32_t nk = 2 * nin + 1;
    uint32_t *edges = NULL;
    pg_seg *seg = NULL;
    pg_lock();
    int32_t h = begin(x, nin, params, nout * (nin + 1), nout, nout * nk, &edges, &seg);
    if (h == 0) {
        h = pg_take_nodes(seg, nout);
        fill_layer((uint32_t)h, act, params, x, 0, nin, nout, edges);
        h = made(c, h, nout);
    }
    pg_unlock();
    return h;
}

int32_t pg_mlp(pg_claim *c, uint32_t nlayers, const int *acts, const uint32_t *const *params,
               const uint32_t *sizes, const uint32_t *x) {
    if (nlayers == 0) return PG_E_ARG;
    int32_t bad = claim_ok(c);
    if (bad) return bad;
    uint64_t nodes = 0, nedges = 0;
    for (uint32_t l = 0; l < nlayers; l++) {
        if (!layer_fits(acts[l], sizes[l], sizes[l + 1])) return PG_E_ARG;
        nodes += sizes[l + 1];
        nedges += (uint64_t)sizes[l + 1] * (2 * (uint64_t)sizes[l] + 1);
    }
    if (nodes > PG_SEG_NODES || nedges > UINT32_MAX) return PG_E_ARG;
    pg_seg *seg = NULL;
    uint32_t *edges = NULL;
    pg_lock();
    /* Validate the inputs and every layer's parameters, then reserve. */
    int32_t h = 0;
    uint64_t birth = 0;
    for (uint32_t l = 0; h == 0 && l <= nlayers; l++) {
        const uint32_t *k = l == 0 ? x : params[l - 1];
        uint32_t n = l == 0 ? sizes[0] : sizes[l] * (sizes[l - 1] + 1);
        for (uint32_t i = 0; h == 0 && i < n; i++) {
            if (!pg_handle_valid(k[i])) h = PG_E_ARG;
            else if (pg_segtab[k[i] >> PG_SEG_BITS]->birth > birth)
                birth = pg_segtab[k[i] >> PG_SEG_BITS]->birth;
        }
    }
    if (h == 0) {
        seg = pg_room((uint32_t)nodes, birth, &h);
        if (seg != NULL && (edges = pg_alloc_edges(seg->sid, (uint32_t)nedges)) == NULL)
            h = PG_E_NOMEM;
    }
    if (h == 0) {
        h = pg_take_nodes(seg, (uint32_t)nodes);
        uint32_t first = (uint32_t)h, prev = 0;
        for (uint32_t l = 0; l < nlayers; l++) {
            fill_layer(first, acts[l], params[l], l == 0 ? x : NULL, prev, sizes[l], sizes[l + 1],
                       edges);
            edges += (size_t)sizes[l + 1] * (2 * sizes[l] + 1);
            prev = first;
            first += sizes[l + 1];
        }
        h = made(c, (int32_t)prev, sizes[nlayers]);
    }
    pg_unlock();
    return h;
}

/* Leaves go to leaf segments (memory.c): a run takes consecutive slots,
 * a single leaf reuses a free one. */
int32_t pg_leaves(pg_claim *c, const double *data, uint32_t n) {
    if (n == 0 || n > PG_SEG_NODES) return PG_E_ARG;
    int32_t h = claim_ok(c);
    if (h) return h;
    pg_lock();
    pg_seg *seg = pg_leaf_room(n, &h);
    if (seg != NULL) {
        h = pg_take_nodes(seg, n);
        for (uint32_t i = 0; i < n; i++) {
            pg_node *leaf = pg_N((uint32_t)h + i);
            pg_node_init(leaf, PG_OP_LEAF);
            leaf->data = data[i];
        }
        h = made(c, h, n);
    }
    pg_unlock();
    return h;
}

int32_t pg_leaf(pg_claim *c, double data) {
    int32_t h = claim_ok(c);
    if (h) return h;
    pg_lock();
    h = pg_take_leaf();
    if (h >= 0) {
        pg_node *leaf = pg_N((uint32_t)h);
        pg_node_init(leaf, PG_OP_LEAF);
        leaf->data = data;
        h = made(c, h, 1);
    }
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

double pg_data(uint32_t h) { return pg_N(h)->data; }
void pg_set_data(uint32_t h, double v) { pg_N(h)->data = v; }
double pg_grad(uint32_t h) { return pg_N(h)->grad; }
void pg_set_grad(uint32_t h, double v) { pg_N(h)->grad = v; }
_Static_assert(offsetof(pg_node, grad) == offsetof(pg_node, data) + sizeof(double),
               "pg_numbers hands out data and grad as one array");
double *pg_numbers(uint32_t h) { return pg_handle_valid(h) ? &pg_N(h)->data : NULL; }
int pg_op(uint32_t h) { return pg_N(h)->op; }
int64_t pg_describe(uint32_t h) {
    const pg_node *n = pg_N(h);
    return (int64_t)(n->op | (uint32_t)n->flags << 8);
}
int pg_flags(uint32_t h) { return pg_N(h)->flags; }
int pg_variant(uint32_t h) { return pg_N(h)->variant; }
double pg_exponent(uint32_t h) { return pg_N(h)->aux.k; }
void pg_zero_hidden(uint32_t h) {
    pg_node *n = pg_N(h);
    if (n->op == PG_OP_SUB || n->op == PG_OP_DIV) n->aux.k = -0.0;
}

uint32_t pg_nkids(uint32_t h) {
    const uint32_t *kids;
    return pg_children(pg_N(h), &kids);
}

int64_t pg_kid_pair(uint32_t h) {
    const uint32_t *kids;
    uint32_t n = pg_children(pg_N(h), &kids);
    if (n > 2) return -(int64_t)n;
    return (int64_t)n | (n > 0 ? (int64_t)kids[0] << 2 : 0) | (n > 1 ? (int64_t)kids[1] << 32 : 0);
}

uint32_t pg_kids(uint32_t h, uint32_t *out, uint32_t cap) {
    const uint32_t *kids;
    uint32_t n = pg_children(pg_N(h), &kids);
    memcpy(out, kids, (size_t)(n < cap ? n : cap) * sizeof(uint32_t));
    return n;
}

const char *pg_op_name(int op) {
    return op >= 0 && op < PG_OP_COUNT ? pg_rules[op].name : "";
}
