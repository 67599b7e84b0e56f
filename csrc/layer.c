/*
 * A whole layer across rows (Program.map): the neurons of one layer run as
 * one unit instead of one LINEAR row rule each (batch.c finds the layers).
 * Each input's rows are then loaded once for four neurons, and every sum
 * stays in registers instead of going through memory once per neuron.
 *
 * The numbers are the per-neuron row rules' (ops.c), bit for bit: the same
 * operations in the same order, only interleaved differently.
 *  - forward: y_i[r] = act(((b_i + w_i0 x_0[r]) + w_i1 x_1[r]) + ...);
 *  - g_i[r] = act'(y_i[r]) gy_i[r];
 *  - a weight's grad: gw_ij + x_j[r] g_i[r], over the rows r in order (a
 *    bias's: gb_i + 1 g_i[r], and 1 g is g exactly);
 *  - an input's row grad: gx_j[r] + w_ij g_i[r], for i from the last
 *    neuron to the first, the order in which backward visits the slots.
 * The weights' row-order sums run side by side across neurons, four lanes
 * to a vector, over a rows-outer copy of g (gt).
 *
 * Vectors are GCC/clang vector extensions; other compilers get no layers
 * (PG_LAYERS 0) and run the per-neuron rules.
 */
#include <string.h>
#include "activation.h"
#include "program.h"

#if PG_LAYERS

/* The vector helpers are always inlined, so the ABI the compilers warn of
 * (vectors passed without AVX in the default build) is never used.  The
 * AVX2 clones call only helpers that take pointers, which clang requires. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wunknown-warning-option"
#endif
#pragma GCC diagnostic ignored "-Wpsabi"

typedef double v4 __attribute__((vector_size(32)));
typedef int64_t v4i __attribute__((vector_size(32)));

#define INLINE static inline __attribute__((always_inline))

INLINE v4 load4(const double *p) {
    v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}
INLINE void store4(double *p, v4 v) { memcpy(p, &v, sizeof v); }
INLINE v4 splat(double a) { return (v4){a, a, a, a}; }
#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE(a, b, i, j, k, l) __builtin_shufflevector(a, b, i, j, k, l)
#else
#define SHUFFLE(a, b, i, j, k, l) __builtin_shuffle(a, b, (v4i){i, j, k, l})
#endif
/* relu_of, four at a time: the mask keeps -0.0 and nan as they are. */
INLINE v4 relu4(v4 x) { return (v4)((v4i)x & ~(v4i)(x < (v4){0.0, 0.0, 0.0, 0.0})); }

/* Rows r .. r + 4U - 1 of neurons i0 .. i0 + 3 (a neuron past the last
 * writes into dump). */
INLINE void forward_tile(const pg_layer *L, uint32_t i0, size_t r, double *dump, const int U) {
    const uint32_t nin = L->nin;
    const double *w = L->w + (size_t)i0 * nin;
    uint32_t j = 0;
    v4 acc[4][2];
    if (L->variant & PG_LINEAR_BIAS) {
        for (uint32_t t = 0; t < 4; t++)
            for (int u = 0; u < U; u++) acc[t][u] = splat(L->bias[i0 + t]);
    } else {
        for (int u = 0; u < U; u++) {
            v4 x = load4(L->x[0] + r + 4 * u);
            for (uint32_t t = 0; t < 4; t++) acc[t][u] = splat(w[t * nin]) * x;
        }
        j = 1;
    }
    for (; j < nin; j++) {
        v4 x[2];
        for (int u = 0; u < U; u++) x[u] = load4(L->x[j] + r + 4 * u);
        for (uint32_t t = 0; t < 4; t++) {
            v4 wt = splat(w[t * nin + j]);
            for (int u = 0; u < U; u++) acc[t][u] = acc[t][u] + wt * x[u];
        }
    }
    int relu = (L->variant & PG_ACT_MASK) == PG_ACT_RELU;
    for (uint32_t t = 0; t < 4; t++) {
        double *y = i0 + t < L->m ? L->y + (i0 + t) * L->stride : dump;
        for (int u = 0; u < U; u++) store4(y + r + 4 * u, relu ? relu4(acc[t][u]) : acc[t][u]);
    }
}

ROW_LOOP void pg_layer_forward(const pg_layer *L, size_t n, double *dump) {
    size_t n4 = (n + 3) & ~(size_t)3;     /* the rows past n are a slot's padding */
    for (uint32_t i0 = 0; i0 < L->m; i0 += 4) {
        size_t r = 0;
        for (; r + 8 <= n4; r += 8) forward_tile(L, i0, r, dump, 2);
        for (; r < n4; r += 4) forward_tile(L, i0, r, dump, 1);
    }
    int act = L->variant & PG_ACT_MASK;
    if (act == PG_ACT_TANH || act == PG_ACT_SIGMOID)
        for (uint32_t i = 0; i < L->m; i++) {
            double *y = L->y + i * L->stride;
            for (size_t r = 0; r < n; r++) y[r] = pg_act(act, y[r]);
        }
}

/* gw[k] + x0[r] gt[r][k] over the rows in order, for the K vectors of
 * lanes from k0 (and the same with x1 into gw1, when J is 2). */
INLINE void sums_tile(double *gw0, double *gw1, const double *x0, const double *x1,
                      const double *gt, size_t lanes, size_t n, const int K, const int J) {
    v4 a0[4], a1[4];
    for (int k = 0; k < K; k++) {
        a0[k] = load4(gw0 + 4 * k);
        if (J == 2) a1[k] = load4(gw1 + 4 * k);
    }
    for (size_t r = 0; r < n; r++) {
        const double *g = gt + r * lanes;
        v4 s0 = splat(x0[r]), s1 = J == 2 ? splat(x1[r]) : s0;
        for (int k = 0; k < K; k++) {
            v4 gk = load4(g + 4 * k);
            a0[k] = a0[k] + s0 * gk;
            if (J == 2) a1[k] = a1[k] + s1 * gk;
        }
    }
    for (int k = 0; k < K; k++) {
        store4(gw0 + 4 * k, a0[k]);
        if (J == 2) store4(gw1 + 4 * k, a1[k]);
    }
}

/* Each input's sums (and the bias's, with ones as its rows) for lanes
 * k0 .. k0 + 4K - 1, two inputs at a time: more sums under way at once
 * than an add takes cycles. */
INLINE void sums_lanes(const pg_layer *L, size_t k0, const double *gt, const double *ones,
                       size_t n, const int K) {
    const size_t lanes = L->lanes;
    uint32_t j = 0;
    for (; j + 2 <= L->nin; j += 2)
        sums_tile(L->gw + (size_t)j * lanes + k0, L->gw + (size_t)(j + 1) * lanes + k0,
                  L->x[j], L->x[j + 1], gt + k0, lanes, n, K, 2);
    for (; j < L->nin; j++)
        sums_tile(L->gw + (size_t)j * lanes + k0, NULL, L->x[j], NULL, gt + k0, lanes, n, K, 1);
    if (L->variant & PG_LINEAR_BIAS)
        sums_tile(L->gb + k0, NULL, ones, NULL, gt + k0, lanes, n, K, 1);
}

/* Input j's row grads, rows r .. r + 4U - 1: + w_ij g_i, last neuron first. */
INLINE void input_grad_tile(const pg_layer *L, uint32_t j, const double *g, size_t r, const int U) {
    double *gx = L->gx[j] + r;
    v4 acc[8];
    for (int u = 0; u < U; u++) acc[u] = load4(gx + 4 * u);
    for (uint32_t i = L->m; i-- > 0;) {
        v4 w = splat(L->w[(size_t)i * L->nin + j]);
        const double *gi = g + i * L->stride + r;
        for (int u = 0; u < U; u++) acc[u] = acc[u] + w * load4(gi + 4 * u);
    }
    for (int u = 0; u < U; u++) store4(gx + 4 * u, acc[u]);
}

/* gt = g rows-outer, by 4 x 4 blocks: rows r .. r + 3 of lanes i .. i + 3. */
INLINE void transpose_rows(const double *g, size_t S, double *gt, size_t lanes, size_t n4) {
    for (size_t i = 0; i < lanes; i += 4)
        for (size_t r = 0; r < n4; r += 4) {
            v4 a = load4(g + i * S + r), b = load4(g + (i + 1) * S + r),
               c = load4(g + (i + 2) * S + r), d = load4(g + (i + 3) * S + r);
            v4 ab02 = SHUFFLE(a, b, 0, 4, 2, 6), ab13 = SHUFFLE(a, b, 1, 5, 3, 7);
            v4 cd02 = SHUFFLE(c, d, 0, 4, 2, 6), cd13 = SHUFFLE(c, d, 1, 5, 3, 7);
            store4(gt + r * lanes + i, SHUFFLE(ab02, cd02, 0, 1, 4, 5));
            store4(gt + (r + 1) * lanes + i, SHUFFLE(ab13, cd13, 0, 1, 4, 5));
            store4(gt + (r + 2) * lanes + i, SHUFFLE(ab02, cd02, 2, 3, 6, 7));
            store4(gt + (r + 3) * lanes + i, SHUFFLE(ab13, cd13, 2, 3, 6, 7));
        }
}

ROW_LOOP void pg_layer_backward(const pg_layer *L, size_t n, const pg_layer_scratch *s) {
    const size_t S = L->stride, lanes = L->lanes, n4 = (n + 3) & ~(size_t)3;
    double *g = s->g, *gt = s->gt;
    for (uint32_t i = 0; i < L->m; i++) {
        const double *y = L->y + i * S, *gy = L->gy + i * S;
        double *gi = g + i * S;
        switch (L->variant & PG_ACT_MASK) {
        case PG_ACT_RELU: for (size_t r = 0; r < n4; r++) gi[r] = relu_slope(y[r]) * gy[r]; break;
        case PG_ACT_TANH: for (size_t r = 0; r < n4; r++) gi[r] = tanh_slope(y[r]) * gy[r]; break;
        case PG_ACT_SIGMOID:
            for (size_t r = 0; r < n4; r++) gi[r] = sigmoid_slope(y[r]) * gy[r];
            break;
        default: memcpy(gi, gy, n4 * sizeof *gi);
        }
    }
    /* The lanes past m: zeros, not what an earlier layer left there. */
    for (size_t i = L->m; i < lanes; i++) memset(g + i * S, 0, n4 * sizeof *g);
    transpose_rows(g, S, gt, lanes, n4);

    size_t k0 = 0;
    for (; k0 + 16 <= lanes; k0 += 16) sums_lanes(L, k0, gt, s->ones, n, 4);
    switch ((lanes - k0) / 4) {
    case 3: sums_lanes(L, k0, gt, s->ones, n, 3); break;
    case 2: sums_lanes(L, k0, gt, s->ones, n, 2); break;
    case 1: sums_lanes(L, k0, gt, s->ones, n, 1); break;
    }

    for (uint32_t j = 0; j < L->nin; j++) {
        if (L->gx[j] == NULL) continue;
        size_t r = 0;
        for (; r + 32 <= n4; r += 32) input_grad_tile(L, j, g, r, 8);
        for (; r < n4; r += 4) input_grad_tile(L, j, g, r, 1);
    }
}

#endif
