/*
 * Every op's forward rule and local-gradient rule, as C.
 *
 * forward(n) computes n->data from the children's data, both when the node
 * is created and when a graph is replayed.  backward(n) adds the node's
 * contribution to its children's grads: child.grad += local * n->grad, in
 * child order, which is exactly how micrograd accumulates.  The plain ops'
 * rules are stated once, in pygrad/op_rules.py, from which come these and
 * the reference engine's (pygrad/reference.py), so the two agree bit for
 * bit; the fused ops below are written here, the same arithmetic as the
 * plain graph they stand for.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "activation.h"
#include "node.h"
#include "rule_helpers.h"
#include "program.h"

#define KID(n, i) ((n)->c.kid[i])

static void forward_NONE(pg_node *n) { (void)n; }
static void backward_NONE(pg_node *n) { (void)n; }

/*
 * Each plain op is written once, as expressions of doubles (rules.h): FWD gives the
 * output from the inputs, and each BWD the addend to one child's grad
 * (child.grad += BWD), from the inputs, the output y and the incoming
 * grad g.  The macros make from them the node rules (eager, replay) and
 * the row rules (Program.map: the same expressions across rows, in
 * structure-of-arrays form, so the compiler can vectorize them) and the
 * steps of flat programs (Program.forward / backward), so they can't
 * disagree.
 */
/* Row i of child j's data and grad: a stride of 0 is one shared value (a
 * shared leaf's data; the grad of a leaf used once, summed in row order). */
#define XR(r, j, i) ((r)->x[j][(i) * (r)->xs[j]])
#define GR(r, j, i) ((r)->gx[j][(i) * (r)->gxs[j]])

#define UNARY_OP(code, FWD, BWD)                                                   \
    static inline double fwd_##code(double x) { return FWD; }                       \
    static inline double bwd_##code(double x, double y, double g) {                 \
        (void)x; (void)y;                                                            \
        return BWD;                                                                  \
    }                                                                                \
    static void forward_##code(pg_node *n) { n->data = fwd_##code(KID(n, 0)->data); } \
    static void backward_##code(pg_node *n) {                                        \
        KID(n, 0)->grad += bwd_##code(KID(n, 0)->data, n->data, n->grad);           \
    }                                                                                \
    static void rows_forward_##code(const pg_rows *r) {                              \
        const double *x = r->x[0];                                                   \
        size_t s = r->xs[0];                                                         \
        for (size_t i = 0; i < r->n; i++) r->y[i] = fwd_##code(x[i * s]);           \
    }                                                                                \
    static void rows_backward_##code(const pg_rows *r) {                             \
        const double *x = r->x[0];                                                   \
        size_t s = r->xs[0];                                                         \
        double *gx = r->gx[0];                                                       \
        size_t gs = r->gxs[0];                                                       \
        for (size_t i = 0; i < r->n; i++) gx[i * gs] += bwd_##code(x[i * s], r->y[i], r->gy[i]); \
    }                                                                                \
    static inline void step_forward_##code(const pg_step *p, double *d,              \
                                           const pg_rows *rows) {                    \
        (void)rows;                                                                  \
        d[p->s] = fwd_##code(d[p->a]);                                               \
    }                                                                                \
    static inline void step_backward_##code(const pg_step *p, const double *d, double *g, \
                                            double gs, const pg_rows *rows) {        \
        (void)rows;                                                                  \
        g[p->a] += bwd_##code(d[p->a], d[p->s], gs);                                 \
    }

#define BINARY_RULES(code, FWD, BWD_A, BWD_B)                                      \
    static inline double fwd_##code(double a, double b) { return FWD; }             \
    static inline double bwd_a_##code(double a, double b, double y, double g) {     \
        (void)a; (void)b; (void)y;                                                   \
        return BWD_A;                                                                \
    }                                                                                \
    static inline double bwd_b_##code(double a, double b, double y, double g) {     \
        (void)a; (void)b; (void)y;                                                   \
        return BWD_B;                                                                \
    }                                                                                \
    static void forward_##code(pg_node *n) {                                          \
        n->data = fwd_##code(KID(n, 0)->data, KID(n, 1)->data);                      \
    }                                                                                \
    static void rows_forward_##code(const pg_rows *r) {                              \
        const double *a = r->x[0], *b = r->x[1];                                     \
        size_t sa = r->xs[0], sb = r->xs[1];                                         \
        for (size_t i = 0; i < r->n; i++) r->y[i] = fwd_##code(a[i * sa], b[i * sb]); \
    }                                                                                \
    static void rows_backward_##code(const pg_rows *r) {                             \
        const double *a = r->x[0], *b = r->x[1];                                     \
        size_t sa = r->xs[0], sb = r->xs[1];                                         \
        double *ga = r->gx[0], *gb = r->gx[1];                                       \
        size_t gsa = r->gxs[0], gsb = r->gxs[1];                                     \
        for (size_t i = 0; i < r->n; i++) {                                          \
            double av = a[i * sa], bv = b[i * sb], y = r->y[i], g = r->gy[i];        \
            ga[i * gsa] += bwd_a_##code(av, bv, y, g);                               \
            gb[i * gsb] += bwd_b_##code(av, bv, y, g);                               \
        }                                                                            \
    }                                                                                \
    static inline void step_forward_##code(const pg_step *p, double *d,              \
                                           const pg_rows *rows) {                    \
        (void)rows;                                                                  \
        d[p->s] = fwd_##code(d[p->a], d[p->b]);                                      \
    }                                                                                \
    static inline void step_backward_##code(const pg_step *p, const double *d, double *g, \
                                            double gs, const pg_rows *rows) {        \
        (void)rows;                                                                  \
        double av = d[p->a], bv = d[p->b], y = d[p->s];                              \
        g[p->a] += bwd_a_##code(av, bv, y, gs);                                      \
        g[p->b] += bwd_b_##code(av, bv, y, gs);                                      \
    }

/* The node rule of a binary op: both children's addends from one g. */
#define BINARY_OP(code, FWD, BWD_A, BWD_B)                                         \
    BINARY_RULES(code, FWD, BWD_A, BWD_B)                                          \
    static void backward_##code(pg_node *n) {                                         \
        pg_node *ka = KID(n, 0), *kb = KID(n, 1);                                    \
        double a = ka->data, b = kb->data, y = n->data, g = n->grad;                 \
        ka->grad += bwd_a_##code(a, b, y, g);                                        \
        kb->grad += bwd_b_##code(a, b, y, g);                                        \
    }

/* Every plain op's forward and gradient rule, stated once in
 * pygrad/op_rules.py, as UNARY_OP / BINARY_OP / BINARY_RULES lines and
 * POW's and POWK's guarded adds (csrc/cffi_build.py writes the file). */
#include "rules.h"

/*
 * micrograd makes a - b as a + (b * -1) and a / b as a * b**-1: the inner
 * node is hidden from the user but keeps a grad of its own, which a second
 * backward() without zero_grad adds to again.  So the node rules of SUB and
 * DIV (eager backward; replay and rows start from zero grads, where the
 * two agree) keep that hidden grad in aux.k (-0.0 at creation): it
 * accumulates the incoming grad, and b's addend is taken from it.  On a
 * first backward it equals g, so results are the plain rule's, bit for bit.
 */
static void backward_SUB(pg_node *n) {
    pg_node *ka = KID(n, 0), *kb = KID(n, 1);
    double g = n->grad;
    n->aux.k += g;
    ka->grad += bwd_a_SUB(ka->data, kb->data, n->data, g);
    kb->grad += bwd_b_SUB(ka->data, kb->data, n->data, n->aux.k);
}
static void backward_DIV(pg_node *n) {
    pg_node *ka = KID(n, 0), *kb = KID(n, 1);
    double g = n->grad;
    n->aux.k += g;
    ka->grad += bwd_a_DIV(ka->data, kb->data, n->data, g);
    kb->grad += bwd_b_DIV(ka->data, kb->data, n->data, n->aux.k);
}

/* x ** k, k constant (in aux.k); where k == 0 nothing is added (so a -0.0
 * grad stays -0.0). */
static void forward_POWK(pg_node *n) { n->data = fwd_POWK(KID(n, 0)->data, n->aux.k); }
static void backward_POWK(pg_node *n) {
    grads_POWK(KID(n, 0)->data, n->aux.k, n->grad, &KID(n, 0)->grad);
}
static void rows_forward_POWK(const pg_rows *r) {
    for (size_t i = 0; i < r->n; i++) r->y[i] = fwd_POWK(XR(r, 0, i), r->k);
}
static void rows_backward_POWK(const pg_rows *r) {
    for (size_t i = 0; i < r->n; i++) grads_POWK(XR(r, 0, i), r->k, r->gy[i], &GR(r, 0, i));
}

/* x ** y, both nodes; nothing is added where a partial is taken as 0. */
static void forward_POW(pg_node *n) { n->data = fwd_POW(KID(n, 0)->data, KID(n, 1)->data); }
static void backward_POW(pg_node *n) {
    pg_node *a = KID(n, 0), *b = KID(n, 1);
    grads_POW(a->data, b->data, n->data, n->grad, &a->grad, &b->grad);
}
static void rows_forward_POW(const pg_rows *r) {
    for (size_t i = 0; i < r->n; i++) r->y[i] = fwd_POW(XR(r, 0, i), XR(r, 1, i));
}
static void rows_backward_POW(const pg_rows *r) {
    for (size_t i = 0; i < r->n; i++)
        grads_POW(XR(r, 0, i), XR(r, 1, i), r->y[i], r->gy[i], &GR(r, 0, i), &GR(r, 1, i));
}

/*
 * The fused ops.  Each computes exactly what the same expression written
 * with the plain ops computes (same operations, same order), and adds to
 * the children's grads in the order the plain graph's nodes would, so a
 * fused model and an unfused one agree bit for bit after one backward().
 * (A fused node is one node: a second backward() without zeroing adds
 * through it as through any node, not through the plain graph's hidden
 * intermediates.)
 */

/* act(b + w0*x0 + w1*x1 + ...): micrograd's neuron, sum((wi*xi ...), b).
 * Children: [b,] w0, x0, w1, x1, ...  Written once for any way of reading
 * its numbers: a node's (below) or one row of a program's (a replay step),
 * with COUNT children, VARIANT its activation and bias bit, Y and GY its
 * data and grad, X(src, j) and G(src, j) child j's data and grad.
 * Backward adds as the plain graph would: its mul nodes last term first,
 * and b's add node just before the first term's mul. */
#define LINEAR_RULES(prefix, src_t, COUNT, VARIANT, Y, GY, X, G, PAIR_GRAD)    \
    static void prefix##_forward_LINEAR(src_t src) {                            \
        uint32_t nk = COUNT(src), j = 2;                                        \
        double acc;                                                             \
        if (VARIANT(src) & PG_LINEAR_BIAS) {                                    \
            acc = X(src, 0);                                                    \
            j = 1;                                                              \
        } else {                                                                \
            acc = PG_LINEAR_FIRST(X(src, 0), X(src, 1));                        \
        }                                                                       \
        for (; j < nk; j += 2) acc = PG_LINEAR_TERM(acc, X(src, j), X(src, j + 1)); \
        Y(src) = pg_act(VARIANT(src) & PG_ACT_MASK, acc);                       \
    }                                                                           \
    static void prefix##_backward_LINEAR(src_t src) {                           \
        uint32_t nk = COUNT(src);                                               \
        double g = pg_act_grad(VARIANT(src) & PG_ACT_MASK, Y(src), GY(src));    \
        uint32_t first = (VARIANT(src) & PG_LINEAR_BIAS) ? 1 : 0;               \
        for (uint32_t j = nk; j > first; j -= 2) {                              \
            if (first && j - 2 == first) G(src, 0) = PG_LINEAR_BGRAD(G(src, 0), g); \
            PAIR_GRAD(src, j - 2, j - 1, g);                                    \
        }                                                                       \
        if (first && nk == 1) G(src, 0) = PG_LINEAR_BGRAD(G(src, 0), g);       \
    }
#define NODE_COUNT(node) ((node)->c.list.n)
#define NODE_VARIANT(n) ((n)->variant)
#define NODE_Y(n) ((n)->data)
#define NODE_GY(n) ((n)->grad)
#define NODE_X(n, j) (((n)->aux.kids[j])->data)
#define NODE_G(n, j) (((n)->aux.kids[j])->grad)
/* A weight w times an input x: w.grad += x * g, then x.grad += w * g.  The
 * two nodes are looked up once, not once per access. */
#define NODE_PAIR_GRAD(n, a, b, g)                                      \
    do {                                                                \
        pg_node *w_ = (n)->aux.kids[a], *x_ = (n)->aux.kids[b]; \
        w_->grad = PG_LINEAR_WGRAD(w_->grad, x_->data, g);              \
        x_->grad = PG_LINEAR_XGRAD(x_->grad, w_->data, g);              \
    } while (0)
LINEAR_RULES(node, pg_node *, NODE_COUNT, NODE_VARIANT, NODE_Y, NODE_GY, NODE_X, NODE_G,
             NODE_PAIR_GRAD)
#define forward_LINEAR node_forward_LINEAR
#define backward_LINEAR node_backward_LINEAR

/* v0 + v1 + ... + vn-1, left to right.  Backward adds in the plain
 * graph's order, its last add first: v(n-1), ..., v2, then v0, v1; ADD(j)
 * adds to child j, for a node and for a program's rows alike. */
#define SUM_GRAD_ORDER(nk, ADD)                                  \
    do {                                                         \
        for (uint32_t j_ = (nk) - 1; j_ >= 2; j_--) ADD(j_);     \
        ADD(0);                                                  \
        if ((nk) > 1) ADD(1);                                    \
    } while (0)
/* The forward, written once for any way of reading input j of row i (as
 * LSE_RULES below): a node's children (row 0), or a program's rows. */
#define SUM_RULES(prefix, src_t, count, X)                              \
    static double prefix##_total(src_t src, size_t i) {                 \
        double acc = X(src, 0, i);                                      \
        for (uint32_t j = 1; j < (count); j++) acc = acc + X(src, j, i); \
        return acc;                                                     \
    }
#define NODE_INPUT(n, j, i) ((void)(i), ((n)->aux.kids[j])->data)
SUM_RULES(sum, const pg_node *, src->c.list.n, NODE_INPUT)
static void forward_SUM(pg_node *n) { n->data = sum_total(n, 0); }
static void backward_SUM(pg_node *n) {
    pg_node *const *k = n->aux.kids;
    double g = n->grad;
#define NODE_ADD(j) (k[j]->grad += g)
    SUM_GRAD_ORDER(n->c.list.n, NODE_ADD);
#undef NODE_ADD
}

/* The largest input, as Python's max() picks it (a later one only if
 * greater), for any way of reading input j (of count) of row i. */
#define MAX_RULES(prefix, src_t, count, X)                                  \
    static double prefix##_largest(src_t src, size_t i) {                   \
        double m = X(src, 0, i);                                            \
        for (uint32_t j = 1; j < (count); j++) {                            \
            double x = X(src, j, i);                                        \
            if (x > m) m = x;                                               \
        }                                                                   \
        return m;                                                           \
    }
MAX_RULES(max, const pg_node *, src->c.list.n, NODE_INPUT)
/* pygrad.detached_max: the largest child's value as a constant, through
 * which no gradient flows: a traced `max(v.data for v in logits)`, the
 * shift of microgpt's softmax, which a replayed program recomputes. */
static void forward_MAX(pg_node *n) { n->data = max_largest(n, 0); }
#define backward_MAX backward_NONE

/* log(sum(exp(x - m))) + m with m the largest x (0 if it is infinite, as in
 * PyTorch), so no exp overflows.  m is a constant: its gradient cancels.
 * The shift and the sum are written once, for any way of reading input j
 * (of count) of row i: a node's children (row 0), or a program's rows;
 * LARGEST is MAX_RULES's for the same reading. */
#define LSE_RULES(prefix, src_t, count, X, G, LARGEST)                      \
    static double prefix##_shift(src_t src, size_t i) {                     \
        double m = LARGEST(src, i);                                         \
        return isinf(m) ? 0.0 : m;                                          \
    }                                                                       \
    static double prefix##_total(src_t src, size_t i, double m) {           \
        double s = exp(X(src, 0, i) - m);                                   \
        for (uint32_t j = 1; j < (count); j++) s = s + exp(X(src, j, i) - m); \
        return s;                                                           \
    }                                                                       \
    static double prefix##_value(src_t src, size_t i) {                     \
        double m = prefix##_shift(src, i);                                  \
        return log(prefix##_total(src, i, m)) + m;                          \
    }                                                                       \
    /* Plain graph: x_j.grad += exp(x_j - m) * (g / s), last term first. */ \
    static void prefix##_grads(src_t src, size_t i, double g) {             \
        double m = prefix##_shift(src, i);                                  \
        double q = g / prefix##_total(src, i, m);                           \
        for (uint32_t j = (count); j-- > 0;) G(src, j, i) += exp(X(src, j, i) - m) * q; \
    }
#define NODE_GRAD(n, j, i) (*((void)(i), &((n)->aux.kids[j])->grad))
LSE_RULES(lse, const pg_node *, src->c.list.n, NODE_INPUT, NODE_GRAD, max_largest)
static void forward_LOGSUMEXP(pg_node *n) { n->data = lse_value(n, 0); }
static void backward_LOGSUMEXP(pg_node *n) { lse_grads(n, 0, n->grad); }

/* The fused ops across rows: per row, exactly the node rules above.  The
 * common LINEAR case (a shared weight times a per-row input) goes through
 * these loops over distinct arrays, which the compiler vectorizes (and
 * builds for AVX2 too: ROW_LOOP, program.h).  A whole layer of such
 * neurons runs as one unit instead (layer.c). */

/* A shared weight w's term across rows: y + w x (forward), or the input's
 * grads x.grad + w g (backward). */
ROW_LOOP static void add_term(double *restrict y, double w, const double *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = PG_LINEAR_TERM(y[i], w, x[i]);
}
ROW_LOOP static void add_xgrad(double *restrict gx, double w, const double *restrict g, size_t n) {
    for (size_t i = 0; i < n; i++) gx[i] = PG_LINEAR_XGRAD(gx[i], w, g[i]);
}
/* Per-row weights' grads: gw + x g. */
ROW_LOOP static void add_wgrad(double *restrict gw, const double *restrict x,
                               const double *restrict g, size_t n) {
    for (size_t i = 0; i < n; i++) gw[i] = PG_LINEAR_WGRAD(gw[i], x[i], g[i]);
}
/* y + w0 v0 + w1 v1 + w2 v2 + w3 v3, left to right. */
ROW_LOOP static void add_terms4(double *restrict y, const double *w,
                                const double *const *v, size_t n) {
    double w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
    const double *restrict v0 = v[0], *restrict v1 = v[1], *restrict v2 = v[2],
                 *restrict v3 = v[3];
    for (size_t i = 0; i < n; i++)
        y[i] = PG_LINEAR_TERM(PG_LINEAR_TERM(PG_LINEAR_TERM(PG_LINEAR_TERM(y[i], w0, v0[i]),
                                                            w1, v1[i]), w2, v2[i]), w3, v3[i]);
}

/* Are the k pairs from child j on all a shared weight times a per-row input? */
static int shared_weights(const pg_rows *r, uint32_t j, uint32_t k) {
    for (uint32_t t = 0; t < k; t++)
        if (r->xs[j + 2 * t] != 0 || r->xs[j + 2 * t + 1] != 1) return 0;
    return 1;
}

/* One row (a replay step): the node rule over the rows' arrays, row 0. */
#define ROW_COUNT(r) ((r)->nk)
#define ROW_VARIANT(r) ((r)->variant)
#define ROW_Y(r) ((r)->y[0])
#define ROW_GY(r) ((r)->gy[0])
#define ROW_X(r, j) ((r)->x[j][0])
#define ROW_G(r, j) ((r)->gx[j][0])
#define ROW_PAIR_GRAD(r, a, b, g)                   \
    do {                                            \
        ROW_G(r, a) = PG_LINEAR_WGRAD(ROW_G(r, a), ROW_X(r, b), g); \
        ROW_G(r, b) = PG_LINEAR_XGRAD(ROW_G(r, b), ROW_X(r, a), g); \
    } while (0)
LINEAR_RULES(row, const pg_rows *, ROW_COUNT, ROW_VARIANT, ROW_Y, ROW_GY, ROW_X, ROW_G,
             ROW_PAIR_GRAD)

static void rows_forward_LINEAR(const pg_rows *r) {
    if (r->n == 1) {
        row_forward_LINEAR(r);
        return;
    }
    double *y = r->y;
    uint32_t j = 2;
    if (r->variant & PG_LINEAR_BIAS) {
        for (size_t i = 0; i < r->n; i++) y[i] = XR(r, 0, i);
        j = 1;
    } else {
        for (size_t i = 0; i < r->n; i++) y[i] = PG_LINEAR_FIRST(XR(r, 0, i), XR(r, 1, i));
    }
    for (; j < r->nk; j += 2) {
        if (j + 7 < r->nk && shared_weights(r, j, 4)) {
            /* Four terms per pass over y, added in the same order. */
            double w[4] = {r->x[j][0], r->x[j + 2][0], r->x[j + 4][0], r->x[j + 6][0]};
            const double *v[4] = {r->x[j + 1], r->x[j + 3], r->x[j + 5], r->x[j + 7]};
            add_terms4(y, w, v, r->n);
            j += 6;
        } else if (r->xs[j] == 0 && r->xs[j + 1] == 1) {      /* shared weight, per-row input */
            add_term(y, r->x[j][0], r->x[j + 1], r->n);
        } else {
            for (size_t i = 0; i < r->n; i++) y[i] = PG_LINEAR_TERM(y[i], XR(r, j, i), XR(r, j + 1, i));
        }
    }
    const int act = r->variant & PG_ACT_MASK;
    if (act) PG_FOR_ACT(act, A, for (size_t i = 0; i < r->n; i++) y[i] = pg_act(A, y[i]));
}
/* Four sums side by side, each in row order: acc[t] += v[t][i] * g[i]. */
static void sums4(double *acc, const double *const *v, const double *g, size_t n) {
    double a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    for (size_t i = 0; i < n; i++) {
        double gi = g[i];
        a0 = PG_LINEAR_WGRAD(a0, v[0][i], gi);
        a1 = PG_LINEAR_WGRAD(a1, v[1][i], gi);
        a2 = PG_LINEAR_WGRAD(a2, v[2][i], gi);
        a3 = PG_LINEAR_WGRAD(a3, v[3][i], gi);
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

/* A pair of a shared weight and a per-row input whose weight is used only
 * here: the weight's grad is one sum, in row order. */
static int direct_pair(const pg_rows *r, uint32_t w) {
    return r->xs[w] == 0 && r->xs[w + 1] == 1 && r->gxs[w] == 0 && r->gxs[w + 1] == 1;
}

static void rows_backward_LINEAR(const pg_rows *r) {
    if (r->n == 1) {
        row_backward_LINEAR(r);
        return;
    }
    double *g = r->tmp;
    const double *y = r->y, *gy = r->gy;
    const int act = r->variant & PG_ACT_MASK;
    PG_FOR_ACT(act, A, for (size_t i = 0; i < r->n; i++) g[i] = pg_act_grad(A, y[i], gy[i]));
    uint32_t first = (r->variant & PG_LINEAR_BIAS) ? 1 : 0;
    /* A bias used only here sums alone: where its adds fall among the
     * others' changes nothing. */
    int bias_alone = first && r->xs[0] == 0 && r->gxs[0] == 0;
    if (bias_alone) {
        double acc = *r->gx[0];
        for (size_t i = 0; i < r->n; i++) acc = PG_LINEAR_BGRAD(acc, g[i]);
        *r->gx[0] = acc;
    }
    uint32_t j = r->nk;
    while (j > first) {
        if (first && !bias_alone && j - 2 == first)
            for (size_t i = 0; i < r->n; i++) GR(r, 0, i) = PG_LINEAR_BGRAD(GR(r, 0, i), g[i]);
        /* Up to eight direct pairs at once: their sums side by side (each
         * in row order), where one alone would wait on its own adds. */
        uint32_t q = 0;
        while (q < 8 && j - 2 * q > first && direct_pair(r, j - 2 * q - 2) &&
               (bias_alone || !(q > 0 && first && j - 2 * q - 2 == first)))
            q++;
        if (q > 0) {
            double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
            const double *v[8] = {g, g, g, g, g, g, g, g};
            for (uint32_t t = 0; t < q; t++) {
                acc[t] = *r->gx[j - 2 * t - 2];
                v[t] = r->x[j - 2 * t - 1];
            }
            uint32_t u = 0;
            for (; u + 4 <= q; u += 4) sums4(acc + u, v + u, g, r->n);
            for (; u < q; u++) {
                double a = acc[u];
                for (size_t i = 0; i < r->n; i++) a = PG_LINEAR_WGRAD(a, v[u][i], g[i]);
                acc[u] = a;
            }
            for (uint32_t t = 0; t < q; t++) {
                *r->gx[j - 2 * t - 2] = acc[t];
                add_xgrad(r->gx[j - 2 * t - 1], r->x[j - 2 * t - 2][0], g, r->n);
            }
            j -= 2 * q;
            continue;
        }
        double *gw = r->gx[j - 2], *gv = r->gx[j - 1];
        if (r->xs[j - 2] == 0 && r->xs[j - 1] == 1 && r->gxs[j - 2] == 1 && r->gxs[j - 1] == 1 &&
            gw != gv) {
            add_wgrad(gw, r->x[j - 1], g, r->n);
            add_xgrad(gv, r->x[j - 2][0], g, r->n);
        } else {
            for (size_t i = 0; i < r->n; i++) {
                GR(r, j - 2, i) = PG_LINEAR_WGRAD(GR(r, j - 2, i), XR(r, j - 1, i), g[i]);
                GR(r, j - 1, i) = PG_LINEAR_XGRAD(GR(r, j - 1, i), XR(r, j - 2, i), g[i]);
            }
        }
        j -= 2;
    }
    if (first && !bias_alone && r->nk == 1)
        for (size_t i = 0; i < r->n; i++) GR(r, 0, i) = PG_LINEAR_BGRAD(GR(r, 0, i), g[i]);
}

SUM_RULES(rows_sum, const pg_rows *, src->nk, XR)
static void rows_forward_SUM(const pg_rows *r) {
    for (size_t i = 0; i < r->n; i++) r->y[i] = rows_sum_total(r, i);
}
static void rows_backward_SUM(const pg_rows *r) {
#define ROWS_ADD(j) for (size_t i = 0; i < r->n; i++) GR(r, j, i) += r->gy[i]
    SUM_GRAD_ORDER(r->nk, ROWS_ADD);
#undef ROWS_ADD
}

MAX_RULES(rows_max, const pg_rows *, src->nk, XR)
static void rows_forward_MAX(const pg_rows *r) {
    for (size_t i = 0; i < r->n; i++) r->y[i] = rows_max_largest(r, i);
}

/* One row at a time: the shift m is per row. */
LSE_RULES(rows_lse, const pg_rows *, src->nk, XR, GR, rows_max_largest)
static void rows_forward_LOGSUMEXP(const pg_rows *r) {
    for (size_t i = 0; i < r->n; i++) r->y[i] = rows_lse_value(r, i);
}
static void rows_backward_LOGSUMEXP(const pg_rows *r) {
    for (size_t i = 0; i < r->n; i++) rows_lse_grads(r, i, r->gy[i]);
}

/* pygrad.Function: the user's partials, captured at forward time (a scalar
 * op's gradient is linear in the incoming grad), child order. */
static void forward_FUNCTION(pg_node *n) { (void)n; }
static void backward_FUNCTION(pg_node *n) {
    const double *d = pg_function_partials(n->aux.kids, n->c.list.n);
    for (uint32_t i = 0; i < n->c.list.n; i++) n->aux.kids[i]->grad += d[i] * n->grad;
}

/* Leaves have no rule.  A Python-made node (Value(x, children, op)) has its
 * data given, and its backward, if any, runs in Python. */
#define forward_LEAF forward_NONE
#define backward_LEAF backward_NONE
#define forward_CUSTOM forward_NONE
#define backward_CUSTOM backward_NONE

/* Rows: a leaf has none; a Python-made node or a Function never gets into
 * a batched program (Program.map refuses them when compiling). */
static void rows_NONE(const pg_rows *r) { (void)r; }
#define rows_forward_LEAF rows_NONE
#define rows_backward_LEAF rows_NONE
#define rows_forward_CUSTOM rows_NONE
#define rows_backward_CUSTOM rows_NONE
#define rows_forward_FUNCTION rows_NONE
#define rows_backward_FUNCTION rows_NONE
#define rows_backward_MAX rows_NONE

#define PG_OP(code, name, arity, methods, act, doc) \
    [PG_OP_##code] = {name, arity, forward_##code, backward_##code},
const pg_op_rule pg_rules[PG_OP_COUNT] = {
#include "ops.def"
};
#undef PG_OP

#define PG_OP(code, name, arity, methods, act, doc) \
    [PG_OP_##code] = {rows_forward_##code, rows_backward_##code},
const pg_row_rule pg_row_rules[PG_OP_COUNT] = {
#include "ops.def"
};
#undef PG_OP

/* POWK's and POW's steps: POWK's exponent sits in a constant slot, b. */
static inline void step_forward_POWK(const pg_step *p, double *d, const pg_rows *rows) {
    (void)rows;
    d[p->s] = fwd_POWK(d[p->a], d[p->b]);
}
static inline void step_backward_POWK(const pg_step *p, const double *d, double *g, double gs,
                                      const pg_rows *rows) {
    (void)rows;
    grads_POWK(d[p->a], d[p->b], gs, &g[p->a]);
}
static inline void step_forward_POW(const pg_step *p, double *d, const pg_rows *rows) {
    (void)rows;
    d[p->s] = fwd_POW(d[p->a], d[p->b]);
}
static inline void step_backward_POW(const pg_step *p, const double *d, double *g, double gs,
                                     const pg_rows *rows) {
    (void)rows;
    grads_POW(d[p->a], d[p->b], d[p->s], gs, &g[p->a], &g[p->b]);
}

/* Steps of the n-ary ops: their row rule, on one row (a indexes rows). */
#define ROW_STEPS(code)                                                                \
    static inline void step_forward_##code(const pg_step *p, double *d,               \
                                           const pg_rows *rows) {                      \
        (void)d;                                                                       \
        rows_forward_##code(&rows[p->a]);                                              \
    }                                                                                  \
    static inline void step_backward_##code(const pg_step *p, const double *d, double *g, \
                                            double gs, const pg_rows *rows) {          \
        (void)d; (void)g; (void)gs;                                                    \
        rows_backward_##code(&rows[p->a]);                                             \
    }
ROW_STEPS(LINEAR)
ROW_STEPS(SUM)
ROW_STEPS(LOGSUMEXP)
ROW_STEPS(MAX)
/* Leaves and Python's nodes are never steps (replay.c). */
ROW_STEPS(LEAF)
ROW_STEPS(CUSTOM)
ROW_STEPS(FUNCTION)

/*
 * The cheap ops a random graph is mostly made of run without a jump per
 * step: every candidate result is computed from the same operands and the
 * step's kind picks one, so a random sequence of them costs no branch
 * mispredictions.  The candidates are the ops' own expressions (above).
 * A unary step's b is its own slot (read, unused; its grad slot takes the
 * unused addend and is zeroed right after).
 */
int pg_step_fast_kind(int op) {
    switch (op) {
    case PG_OP_ADD: return PG_FAST_ADD;
    case PG_OP_MUL: return PG_FAST_MUL;
    case PG_OP_SUB: return PG_FAST_SUB;
    case PG_OP_NEG: return PG_FAST_NEG;
    case PG_OP_RELU: return PG_FAST_RELU;
    default: return PG_FAST_NONE;
    }
}

static inline void fast_forward(const pg_step *p, double *d) {
    double a = d[p->a], b = d[p->b];
    const double y[PG_FAST_NONE] = {fwd_ADD(a, b), fwd_MUL(a, b), fwd_SUB(a, b), fwd_NEG(a),
                                    fwd_RELU(a)};
    d[p->s] = y[p->fast];
}

static inline void fast_backward(const pg_step *p, const double *d, double *g, double gs) {
    double a = d[p->a], b = d[p->b], y = d[p->s];
    const double ga[PG_FAST_NONE] = {bwd_a_ADD(a, b, y, gs), bwd_a_MUL(a, b, y, gs),
                                     bwd_a_SUB(a, b, y, gs), bwd_NEG(a, y, gs),
                                     bwd_RELU(a, y, gs)};
    const double gb[PG_FAST_NONE] = {bwd_b_ADD(a, b, y, gs), bwd_b_MUL(a, b, y, gs),
                                     bwd_b_SUB(a, b, y, gs), 0.0, 0.0};
    g[p->a] += ga[p->fast];
    g[p->b] += gb[p->fast];
}

/* In a graph whose children sit anywhere in the slot array (replay.c
 * decides), a step's operands are fetched PG_FETCH_AHEAD steps ahead. */
static inline void fetch_operands(const pg_step *p, const double *d) {
    PG_PREFETCH(&d[p->a]);
    PG_PREFETCH(&d[p->b]);
}

/* The sweeps of a flat program: the fast kinds by selection, the rest by
 * one switch over the table, each case the op's inline step. */
void pg_steps_forward(const pg_steps *ps, double *d) {
    const pg_rows *rows = ps->rows;
    const pg_step *step = ps->step;
    pg_node *const *node = ps->node;
    for (size_t i = 0, n = ps->n; i < n; i++) {
        const pg_step *p = &step[i];
        if (ps->fetch_ahead && i + PG_FETCH_AHEAD < n) fetch_operands(&step[i + PG_FETCH_AHEAD], d);
        if (p->fast != PG_FAST_NONE) {
            fast_forward(p, d);
        } else {
            switch (p->op) {
#define PG_OP(code, name, arity, methods, act, doc) \
            case PG_OP_##code: step_forward_##code(p, d, rows); break;
#include "ops.def"
#undef PG_OP
            }
        }
        if (node != NULL) node[i]->data = d[p->s];
    }
}

/* Step i of ps backward: its grad out (gout, node), its rule, its grad
 * slot back to 0.  (Inlined in both of pg_steps_backward's loops: as a
 * call, a replayed backward ran 1.1x the instructions.) */
static inline __attribute__((always_inline)) void step_backward(const pg_steps *ps, size_t i, const double *d, double *g) {
    const pg_step *p = &ps->step[i];
    double gs = g[p->s];
    if (ps->gout != NULL) ps->gout[i] = gs;
    if (ps->node != NULL) ps->node[i]->grad = gs;
    if (p->fast != PG_FAST_NONE) {
        fast_backward(p, d, g, gs);
    } else {
        switch (p->op) {
#define PG_OP(code, name, arity, methods, act, doc) \
        case PG_OP_##code: step_backward_##code(p, d, g, gs, ps->rows); break;
#include "ops.def"
#undef PG_OP
        }
    }
    g[p->s] = 0.0;
}

void pg_steps_backward(const pg_steps *ps, const double *d, double *g) {
    const pg_step *step = ps->step;
    if (ps->order != NULL) {
        /* (a graph with a detached_max: the steps below it only are left out) */
        const uint32_t *order = ps->order;
        for (size_t k = 0, n = ps->norder; k < n; k++) {
            if (ps->fetch_ahead && k + PG_FETCH_AHEAD < n)
                fetch_operands(&step[order[k + PG_FETCH_AHEAD]], g);
            step_backward(ps, order[k], d, g);
        }
        return;
    }
    for (size_t i = ps->n; i-- > 0;) {
        if (ps->fetch_ahead && i >= PG_FETCH_AHEAD) fetch_operands(&step[i - PG_FETCH_AHEAD], g);
        step_backward(ps, i, d, g);
    }
}

#define PG_OP(code, name, arity, methods, act, doc) \
    [PG_OP_##code] = {#code, name, arity, methods, act, doc},
static const pg_op_desc op_descs[PG_OP_COUNT] = {
#include "ops.def"
};
#undef PG_OP

const pg_op_desc *pg_op_info(int op) {
    return op >= 0 && op < PG_OP_COUNT ? &op_descs[op] : NULL;
}
