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

/* 0 if x < 0 else x, by a mask rather than a branch (a random sign would
 * mispredict): the same bits as the comparison form, -0.0 and nan kept. */
static inline double relu_of(double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits &= -(uint64_t)!(x < 0.0);
    memcpy(&x, &bits, sizeof x);
    return x;
}
static inline double relu_slope(double out) { return (double)(out > 0.0); }
static inline double tanh_slope(double t) { return 1.0 - t * t; }
/* Never exp of a large positive number, so no overflow to inf / inf. */
static inline double sigmoid_of(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
static inline double sigmoid_slope(double s) { return s * (1.0 - s); }

#endif
