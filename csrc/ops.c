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

static void forward_TANH(pg_node *n) { n->data = tanh(KID(n, 0)->data); }
static void backward_TANH(pg_node *n) {
    double t = n->data;
    KID(n, 0)->grad += (1.0 - t * t) * n->grad;
}

/* micrograd: 0 if x < 0 else x (so relu(-0.0) is -0.0 and relu(nan) nan);
 * gradient (out > 0) * g. */
static void forward_RELU(pg_node *n) {
    double x = KID(n, 0)->data;
    n->data = x < 0.0 ? 0.0 : x;
}
static void backward_RELU(pg_node *n) { KID(n, 0)->grad += (double)(n->data > 0.0) * n->grad; }

/* Never exp of a large positive number, so no overflow to inf / inf. */
static void forward_SIGMOID(pg_node *n) {
    double x = KID(n, 0)->data;
    if (x >= 0.0) {
        n->data = 1.0 / (1.0 + exp(-x));
    } else {
        double e = exp(x);
        n->data = e / (1.0 + e);
    }
}
static void backward_SIGMOID(pg_node *n) {
    double s = n->data;
    KID(n, 0)->grad += (s * (1.0 - s)) * n->grad;
}

/* Leaves have no rule.  A Python-made node (Value(x, children, op)) has its
 * data given, and its backward, if any, runs in Python. */
#define forward_LEAF forward_NONE
#define backward_LEAF backward_NONE
#define forward_CUSTOM forward_NONE
#define backward_CUSTOM backward_NONE

#define PG_OP(code, name, arity) [PG_OP_##code] = {name, arity, forward_##code, backward_##code},
const pg_op_rule pg_rules[PG_OP_COUNT] = {
#include "ops.def"
};
#undef PG_OP
