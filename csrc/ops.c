/*
 * Every op's forward rule and local-gradient rule, side by side.
 *
 * forward(n) computes n->data from the children's data, both when the node
 * is created and when a graph is replayed.  backward(n) adds the node's
 * contribution to its children's grads: child.grad += local * n->grad, in
 * child order, which is exactly how micrograd accumulates.  The pure-Python
 * engine (pygrad/reference.py) mirrors each rule expression for expression,
 * so the two agree bit for bit; keep them in step.
 */
#include <math.h>
#include "node.h"

#define KID(n, i) pg_N((n)->kid[i])

static void forward_NONE(pg_node *n) { (void)n; }
static void backward_NONE(pg_node *n) { (void)n; }

static void forward_ADD(pg_node *n) { n->data = KID(n, 0)->data + KID(n, 1)->data; }
static void backward_ADD(pg_node *n) {
    double g = n->grad;
    KID(n, 0)->grad += g;
    KID(n, 1)->grad += g;
}

static void forward_MUL(pg_node *n) { n->data = KID(n, 0)->data * KID(n, 1)->data; }
static void backward_MUL(pg_node *n) {
    pg_node *a = KID(n, 0), *b = KID(n, 1);
    double g = n->grad;
    a->grad += b->data * g;
    b->grad += a->data * g;
}

static void forward_SUB(pg_node *n) { n->data = KID(n, 0)->data - KID(n, 1)->data; }
static void backward_SUB(pg_node *n) {
    double g = n->grad;
    KID(n, 0)->grad += g;
    KID(n, 1)->grad += -g;
}

/* Gradients as PyTorch writes them: g / b and -g * a / (b * b). */
static void forward_DIV(pg_node *n) { n->data = KID(n, 0)->data / KID(n, 1)->data; }
static void backward_DIV(pg_node *n) {
    pg_node *a = KID(n, 0), *b = KID(n, 1);
    double g = n->grad;
    double av = a->data, bv = b->data;
    a->grad += g / bv;
    b->grad += -g * av / (bv * bv);
}

static void forward_NEG(pg_node *n) { n->data = -KID(n, 0)->data; }
static void backward_NEG(pg_node *n) { KID(n, 0)->grad += -n->grad; }

/* x ** k, k constant.  micrograd's rule k * x**(k-1); for k == 0 the
 * gradient is 0 (as in PyTorch), not 0 * x**-1, which is nan at x == 0.
 * x ** 2 is x * x (the correctly rounded square; pow is within 0.52 ulp),
 * and x ** 1 is x, exactly what pow returns, without its cost. */
static void forward_POWK(pg_node *n) {
    double x = KID(n, 0)->data, k = n->aux.k;
    n->data = k == 2.0 ? x * x : pow(x, k);
}
static void backward_POWK(pg_node *n) {
    double x = KID(n, 0)->data, k = n->aux.k;
    if (k != 0.0) KID(n, 0)->grad += (k * (k == 2.0 ? x : pow(x, k - 1.0))) * n->grad;
}

/* x ** y, both nodes.  d/dy = x**y * log(x), taken as 0 where x == 0 and
 * y >= 0 (PyTorch's convention: the limit, instead of 0 * -inf). */
static void forward_POW(pg_node *n) { n->data = pow(KID(n, 0)->data, KID(n, 1)->data); }
static void backward_POW(pg_node *n) {
    pg_node *a = KID(n, 0), *b = KID(n, 1);
    double g = n->grad;
    double x = a->data, y = b->data;
    if (y != 0.0) a->grad += (y * pow(x, y - 1.0)) * g;
    if (!(x == 0.0 && y >= 0.0)) b->grad += (n->data * log(x)) * g;
}

static void forward_EXP(pg_node *n) { n->data = exp(KID(n, 0)->data); }
static void backward_EXP(pg_node *n) { KID(n, 0)->grad += n->data * n->grad; }

static void forward_LOG(pg_node *n) { n->data = log(KID(n, 0)->data); }
static void backward_LOG(pg_node *n) { KID(n, 0)->grad += n->grad / KID(n, 0)->data; }

/* Activations as functions of a double, shared by the unary ops and
 * LINEAR; each local gradient is written in terms of the output. */
static double relu_of(double x) { return x < 0.0 ? 0.0 : x; }
static double relu_slope(double out) { return (double)(out > 0.0); }
static double tanh_slope(double t) { return 1.0 - t * t; }
/* Never exp of a large positive number, so no overflow to inf / inf. */
static double sigmoid_of(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
static double sigmoid_slope(double s) { return s * (1.0 - s); }

static void forward_TANH(pg_node *n) { n->data = tanh(KID(n, 0)->data); }
static void backward_TANH(pg_node *n) { KID(n, 0)->grad += tanh_slope(n->data) * n->grad; }

/* micrograd: 0 if x < 0 else x (so relu(-0.0) is -0.0 and relu(nan) nan);
 * gradient (out > 0) * g. */
static void forward_RELU(pg_node *n) { n->data = relu_of(KID(n, 0)->data); }
static void backward_RELU(pg_node *n) { KID(n, 0)->grad += relu_slope(n->data) * n->grad; }

static void forward_SIGMOID(pg_node *n) { n->data = sigmoid_of(KID(n, 0)->data); }
static void backward_SIGMOID(pg_node *n) { KID(n, 0)->grad += sigmoid_slope(n->data) * n->grad; }

/*
 * Elementary functions: libm's, with PyTorch's derivative formulas (the
 * local gradient from the input x, or from the output where PyTorch uses
 * it).  At a boundary they give what the formula gives in IEEE arithmetic:
 * d sqrt at 0, asin / acos / atanh at +-1, acosh at 1 are +-inf.
 */
#define X0(n) (KID(n, 0)->data)
#define LN2 0.6931471805599453          /* log(2), rounded */
#define LN10 2.302585092994046          /* log(10), rounded */
#define TWO_OVER_SQRT_PI 1.1283791670955126

static void forward_SIN(pg_node *n) { n->data = sin(X0(n)); }
static void backward_SIN(pg_node *n) { KID(n, 0)->grad += cos(X0(n)) * n->grad; }

static void forward_COS(pg_node *n) { n->data = cos(X0(n)); }
static void backward_COS(pg_node *n) { KID(n, 0)->grad += -sin(X0(n)) * n->grad; }

static void forward_TAN(pg_node *n) { n->data = tan(X0(n)); }
static void backward_TAN(pg_node *n) { KID(n, 0)->grad += (1.0 + n->data * n->data) * n->grad; }

static void forward_ASIN(pg_node *n) { n->data = asin(X0(n)); }
static void backward_ASIN(pg_node *n) {
    double x = X0(n);
    KID(n, 0)->grad += n->grad / sqrt(1.0 - x * x);
}

static void forward_ACOS(pg_node *n) { n->data = acos(X0(n)); }
static void backward_ACOS(pg_node *n) {
    double x = X0(n);
    KID(n, 0)->grad += -n->grad / sqrt(1.0 - x * x);
}

static void forward_ATAN(pg_node *n) { n->data = atan(X0(n)); }
static void backward_ATAN(pg_node *n) {
    double x = X0(n);
    KID(n, 0)->grad += n->grad / (1.0 + x * x);
}

static void forward_SINH(pg_node *n) { n->data = sinh(X0(n)); }
static void backward_SINH(pg_node *n) { KID(n, 0)->grad += cosh(X0(n)) * n->grad; }

static void forward_COSH(pg_node *n) { n->data = cosh(X0(n)); }
static void backward_COSH(pg_node *n) { KID(n, 0)->grad += sinh(X0(n)) * n->grad; }

static void forward_ASINH(pg_node *n) { n->data = asinh(X0(n)); }
static void backward_ASINH(pg_node *n) {
    double x = X0(n);
    KID(n, 0)->grad += n->grad / sqrt(x * x + 1.0);
}

static void forward_ACOSH(pg_node *n) { n->data = acosh(X0(n)); }
static void backward_ACOSH(pg_node *n) {
    double x = X0(n);
    KID(n, 0)->grad += n->grad / sqrt(x * x - 1.0);
}

static void forward_ATANH(pg_node *n) { n->data = atanh(X0(n)); }
static void backward_ATANH(pg_node *n) {
    double x = X0(n);
    KID(n, 0)->grad += n->grad / (1.0 - x * x);
}

static void forward_SQRT(pg_node *n) { n->data = sqrt(X0(n)); }
static void backward_SQRT(pg_node *n) { KID(n, 0)->grad += n->grad / (2.0 * n->data); }

static void forward_LOG2(pg_node *n) { n->data = log2(X0(n)); }
static void backward_LOG2(pg_node *n) { KID(n, 0)->grad += n->grad / (X0(n) * LN2); }

static void forward_LOG10(pg_node *n) { n->data = log10(X0(n)); }
static void backward_LOG10(pg_node *n) { KID(n, 0)->grad += n->grad / (X0(n) * LN10); }

static void forward_LOG1P(pg_node *n) { n->data = log1p(X0(n)); }
static void backward_LOG1P(pg_node *n) { KID(n, 0)->grad += n->grad / (X0(n) + 1.0); }

static void forward_EXPM1(pg_node *n) { n->data = expm1(X0(n)); }
static void backward_EXPM1(pg_node *n) { KID(n, 0)->grad += (n->data + 1.0) * n->grad; }

static void forward_ERF(pg_node *n) { n->data = erf(X0(n)); }
static void backward_ERF(pg_node *n) {
    double x = X0(n);
    KID(n, 0)->grad += (TWO_OVER_SQRT_PI * exp(-(x * x))) * n->grad;
}

static void forward_ERFC(pg_node *n) { n->data = erfc(X0(n)); }
static void backward_ERFC(pg_node *n) {
    double x = X0(n);
    KID(n, 0)->grad += (-TWO_OVER_SQRT_PI * exp(-(x * x))) * n->grad;
}

/* d|x|/dx = sign(x): 0 at +-0 (PyTorch), nan at nan. */
static double sign_of(double x) { return x != x ? x : (double)((x > 0.0) - (x < 0.0)); }
static void forward_ABS(pg_node *n) { n->data = fabs(X0(n)); }
static void backward_ABS(pg_node *n) { KID(n, 0)->grad += sign_of(X0(n)) * n->grad; }

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
 * Children: [b,] w0, x0, w1, x1, ... */
static void forward_LINEAR(pg_node *n) {
    const uint32_t *k = n->aux.kids;
    uint32_t nk = n->kid[0], i = 0;
    double acc;
    if (n->variant & PG_LINEAR_BIAS) {
        acc = pg_N(k[0])->data;
        i = 1;
    } else {
        acc = pg_N(k[0])->data * pg_N(k[1])->data;
        i = 2;
    }
    for (; i < nk; i += 2) acc = acc + pg_N(k[i])->data * pg_N(k[i + 1])->data;
    switch (n->variant & PG_ACT_MASK) {
    case PG_ACT_RELU: acc = relu_of(acc); break;
    case PG_ACT_TANH: acc = tanh(acc); break;
    case PG_ACT_SIGMOID: acc = sigmoid_of(acc); break;
    }
    n->data = acc;
}
/* The plain graph runs its mul nodes last term first, and b's add node just
 * before the first term's mul. */
static void backward_LINEAR(pg_node *n) {
    const uint32_t *k = n->aux.kids;
    uint32_t nk = n->kid[0];
    double g = n->grad;
    switch (n->variant & PG_ACT_MASK) {
    case PG_ACT_RELU: g = relu_slope(n->data) * g; break;
    case PG_ACT_TANH: g = tanh_slope(n->data) * g; break;
    case PG_ACT_SIGMOID: g = sigmoid_slope(n->data) * g; break;
    }
    uint32_t first = (n->variant & PG_LINEAR_BIAS) ? 1 : 0;
    for (uint32_t i = nk; i > first; i -= 2) {
        pg_node *w = pg_N(k[i - 2]), *x = pg_N(k[i - 1]);
        if (first && i - 2 == first) pg_N(k[0])->grad += g;
        w->grad += x->data * g;
        x->grad += w->data * g;
    }
    if (first && nk == 1) pg_N(k[0])->grad += g;
}

/* v0 + v1 + ... + vn-1, left to right. */
static void forward_SUM(pg_node *n) {
    const uint32_t *k = n->aux.kids;
    double acc = pg_N(k[0])->data;
    for (uint32_t i = 1; i < n->kid[0]; i++) acc = acc + pg_N(k[i])->data;
    n->data = acc;
}
/* The plain graph's last add runs first: v(n-1), ..., v2, then v0, v1. */
static void backward_SUM(pg_node *n) {
    const uint32_t *k = n->aux.kids;
    uint32_t nk = n->kid[0];
    double g = n->grad;
    for (uint32_t i = nk - 1; i >= 2; i--) pg_N(k[i])->grad += g;
    pg_N(k[0])->grad += g;
    if (nk > 1) pg_N(k[1])->grad += g;
}

/* log(sum(exp(x - m))) + m with m the largest x (0 if it is infinite, as in
 * PyTorch), so no exp overflows.  m is a constant: its gradient cancels. */
static double lse_shift(const pg_node *n) {
    const uint32_t *k = n->aux.kids;
    double m = pg_N(k[0])->data;
    for (uint32_t i = 1; i < n->kid[0]; i++) {
        double x = pg_N(k[i])->data;
        if (x > m) m = x;
    }
    return isinf(m) ? 0.0 : m;
}
static double lse_total(const pg_node *n, double m) {
    const uint32_t *k = n->aux.kids;
    double s = exp(pg_N(k[0])->data - m);
    for (uint32_t i = 1; i < n->kid[0]; i++) s = s + exp(pg_N(k[i])->data - m);
    return s;
}
static void forward_LOGSUMEXP(pg_node *n) {
    double m = lse_shift(n);
    n->data = log(lse_total(n, m)) + m;
}
/* Plain graph: x_i.grad += exp(x_i - m) * (g / s), last term first. */
static void backward_LOGSUMEXP(pg_node *n) {
    const uint32_t *k = n->aux.kids;
    double m = lse_shift(n);
    double q = n->grad / lse_total(n, m);
    for (uint32_t i = n->kid[0]; i-- > 0;) {
        pg_node *x = pg_N(k[i]);
        x->grad += exp(x->data - m) * q;
    }
}

/* pygrad.Function: the user's partials, captured at forward time (a scalar
 * op's gradient is linear in the incoming grad), child order. */
static void forward_FUNCTION(pg_node *n) { (void)n; }
static void backward_FUNCTION(pg_node *n) {
    const double *d = pg_function_partials(n->aux.kids, n->kid[0]);
    for (uint32_t i = 0; i < n->kid[0]; i++) pg_N(n->aux.kids[i])->grad += d[i] * n->grad;
}

/* Leaves have no rule.  A Python-made node (Value(x, children, op)) has its
 * data given, and its backward, if any, runs in Python. */
#define forward_LEAF forward_NONE
#define backward_LEAF backward_NONE
#define forward_CUSTOM forward_NONE
#define backward_CUSTOM backward_NONE

#define PG_OP(code, name, arity, methods, act, doc) \
    [PG_OP_##code] = {name, arity, forward_##code, backward_##code},
const pg_op_rule pg_rules[PG_OP_COUNT] = {
#include "ops.def"
};
#undef PG_OP

#define PG_OP(code, name, arity, methods, act, doc) \
    [PG_OP_##code] = {#code, name, arity, methods, act, doc},
static const pg_op_desc op_descs[PG_OP_COUNT] = {
#include "ops.def"
};
#undef PG_OP

const pg_op_desc *pg_op_info(int op) {
    return op >= 0 && op < PG_OP_COUNT ? &op_descs[op] : NULL;
}
