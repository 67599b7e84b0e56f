/*
 * The activations as functions of a double, shared by the unary ops, LINEAR
 * (ops.c) and whole layers across rows (layer.c); each local gradient is
 * written in terms of the output.
 */
#ifndef PG_ACTIVATION_H
#define PG_ACTIVATION_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "pygrad.h"

/* 0 if x < 0 else x, by a mask rather than a branch (a random sign would
 * mispredict): the same bits as the comparison form, -0.0 and nan kept. */
static inline double relu_of(double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits &= -(uint64_t)!(x < 0.0);
    memcpy(&x, &bits, sizeof x);
    return x;
}
/* 1.0 if out > 0 else 0.0, by a mask of 1.0's bits, as relu_of: loops of
 * it vectorize (AVX2), where GCC makes the plain form a branch per row. */
static inline double relu_slope(double out) {
    uint64_t bits = UINT64_C(0x3FF0000000000000) & -(uint64_t)(out > 0.0);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}
static inline double tanh_slope(double t) { return 1.0 - t * t; }
/* Never exp of a large positive number, so no overflow to inf / inf. */
static inline double sigmoid_of(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
static inline double sigmoid_slope(double s) { return s * (1.0 - s); }

/* The one dispatch on a LINEAR node's or layer's activation (PG_ACT_*, 0
 * for none): its value at x, and the grad g carried back through it, from
 * its output y.  Loops over rows call these with act fixed: the compiler
 * hoists the switch out of the loop. */
static inline double pg_act(int act, double x) {
    switch (act) {
    case PG_ACT_RELU: return relu_of(x);
    case PG_ACT_TANH: return tanh(x);
    case PG_ACT_SIGMOID: return sigmoid_of(x);
    default: return x;
    }
}
static inline double pg_act_grad(int act, double y, double g) {
    switch (act) {
    case PG_ACT_RELU: return relu_slope(y) * g;
    case PG_ACT_TANH: return tanh_slope(y) * g;
    case PG_ACT_SIGMOID: return sigmoid_slope(y) * g;
    default: return g;
    }
}

/* The statement (a loop over rows using pg_act(A, ...) or pg_act_grad(A, ...)) in
 * one copy per activation, A a constant in each: the switch then folds
 * away and each copy vectorizes (GCC does not unswitch every such loop). */
#define PG_FOR_ACT(act, A, ...)                                         \
    do {                                                                \
        switch (act) {                                                  \
        case PG_ACT_RELU: { const int A = PG_ACT_RELU; __VA_ARGS__; break; }    \
        case PG_ACT_TANH: { const int A = PG_ACT_TANH; __VA_ARGS__; break; }    \
        case PG_ACT_SIGMOID: { const int A = PG_ACT_SIGMOID; __VA_ARGS__; break; } \
        default: { const int A = 0; __VA_ARGS__; break; }                     \
        }                                                               \
    } while (0)

/* LINEAR's arithmetic, written once for every tier (the node rule, a
 * program's row loops, whole layers): for doubles, or for vectors of them
 * (GCC/clang vector extensions), whose IEEE operations round alike lane
 * by lane.  act(b + w0 x0 + w1 x1 + ...): the running sum's first product
 * (no bias) and its next term; backward: a weight's grad w.grad + x g and
 * an input's x.grad + w g. */
#define PG_LINEAR_FIRST(w, x) ((w) * (x))
#define PG_LINEAR_TERM(acc, w, x) ((acc) + (w) * (x))
#define PG_LINEAR_WGRAD(gw, x, g) ((gw) + (x) * (g))
#define PG_LINEAR_XGRAD(gx, w, g) ((gx) + (w) * (g))
/* A bias's grad: b.grad + g (a layer's sums take it as + 1 g: the same). */
#define PG_LINEAR_BGRAD(gb, g) ((gb) + (g))

#endif
