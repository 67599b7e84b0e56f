/*
 * The layer kernels of layer.c, written once for a vector of VW doubles
 * (4: AVX2 or plain x86-64; 8: AVX-512) and included once per width.
 * Before including, layer.c defines VW, V (the vector type), LOAD, STORE,
 * SPLAT, NAME(x) (x with the width's suffix), ATTR (the width's target),
 * KINLINE (an always-inlined helper for that target),
 * FU (forward: row vectors per tile), SJ (sums: inputs per tile) and
 * GJ, GU (input grads: inputs and row vectors per tile).  Each kernel
 * takes the rows a cache-sized tile at a time (FROWS, SROWS, GROWS rows,
 * multiples of VW): loop order across independent sums only, so every
 * sum still runs in its order.
 *
 * Every number is LINEAR's rule (activation.h: PG_LINEAR_FIRST, PG_LINEAR_TERM,
 * PG_LINEAR_WGRAD, PG_LINEAR_XGRAD, pg_act, pg_act_grad) applied in the
 * node rule's order; only which sums run side by side differs.
 */

/* Rows r .. r + FU*VW - 1 (U = FU or 1 vectors) of neurons i0 .. i0 + 3
 * (a neuron past the last writes into dump). */
KINLINE void NAME(forward_tile)(const pg_layer *L, uint32_t i0, size_t r, double *dump, const int U) {
    const uint32_t nin = L->nin;
    const double *w = L->w + (size_t)i0 * nin;
    uint32_t j = 0;
    V acc[4][FU];
    if (L->variant & PG_LINEAR_BIAS) {
        UNROLL for (uint32_t t = 0; t < 4; t++)
            UNROLL for (int u = 0; u < U; u++) acc[t][u] = SPLAT(L->bias[i0 + t]);
    } else {
        UNROLL for (int u = 0; u < U; u++) {
            V x = LOAD(L->x[0] + r + VW * u);
            UNROLL for (uint32_t t = 0; t < 4; t++) acc[t][u] = PG_LINEAR_FIRST(SPLAT(w[t * nin]), x);
        }
        j = 1;
    }
    for (; j < nin; j++) {
        V x[FU];
        UNROLL for (int u = 0; u < U; u++) x[u] = LOAD(L->x[j] + r + VW * u);
        UNROLL for (uint32_t t = 0; t < 4; t++) {
            V wt = SPLAT(w[t * nin + j]);
            UNROLL for (int u = 0; u < U; u++) acc[t][u] = PG_LINEAR_TERM(acc[t][u], wt, x[u]);
        }
    }
    UNROLL for (uint32_t t = 0; t < 4; t++) {
        double *y = i0 + t < L->m ? L->y + (i0 + t) * L->stride : dump;
        UNROLL for (int u = 0; u < U; u++) STORE(y + r + VW * u, acc[t][u]);
    }
}

ATTR void NAME(layer_forward)(const pg_layer *L, size_t n, double *dump) {
    size_t nv = PG_ROWS_ROUNDED(n);           /* the rows past n are a slot's padding */
    /* FROWS rows at a time, every neuron over them: the inputs' rows
     * stay in L1 while all the neurons read them. */
    for (size_t r0 = 0; r0 < nv; r0 += FROWS) {
        size_t r1 = nv - r0 < FROWS ? nv : r0 + FROWS;
        for (uint32_t i0 = 0; i0 < L->m; i0 += 4) {
            size_t r = r0;
            for (; r + FU * VW <= r1; r += FU * VW) NAME(forward_tile)(L, i0, r, dump, FU);
            for (; r < r1; r += VW) NAME(forward_tile)(L, i0, r, dump, 1);
        }
    }
    const int act = L->variant & PG_ACT_MASK;
    if (act)
        PG_FOR_ACT(act, A, for (uint32_t i = 0; i < L->m; i++) {
            double *y = L->y + i * L->stride;
            for (size_t r = 0; r < n; r++) y[r] = pg_act(A, y[r]);
        });
}

/* gw[k] + x_j[r] gt[r][k] over the rows in order, for the K vectors of
 * lanes from gt's first, and J inputs from j (gw_j: gw + j * lanes). */
KINLINE void NAME(sums_tile)(double *gw, const double *const *x, const double *gt, size_t lanes,
                            size_t r0, size_t n, const int K, const int J) {
    V a[SJ][4];
    UNROLL for (int q = 0; q < J; q++)
        UNROLL for (int k = 0; k < K; k++) a[q][k] = LOAD(gw + (size_t)q * lanes + VW * k);
    for (size_t r = r0; r < n; r++) {
        const double *g = gt + r * lanes;
        V gk[4];
        UNROLL for (int k = 0; k < K; k++) gk[k] = LOAD(g + VW * k);
        UNROLL for (int q = 0; q < J; q++) {
            V s = SPLAT(x[q][r]);
            UNROLL for (int k = 0; k < K; k++) a[q][k] = PG_LINEAR_WGRAD(a[q][k], s, gk[k]);
        }
    }
    UNROLL for (int q = 0; q < J; q++)
        UNROLL for (int k = 0; k < K; k++) STORE(gw + (size_t)q * lanes + VW * k, a[q][k]);
}

/* Each input's sums (and the bias's, with ones as its rows) for lanes
 * k0 .. k0 + K*VW - 1, SJ inputs at a time: more sums under way at once
 * than an add takes cycles. */
KINLINE void NAME(sums_lanes)(const pg_layer *L, size_t k0, const double *gt, const double *ones,
                             size_t r0, size_t n, const int K) {
    const size_t lanes = L->lanes;
    uint32_t j = 0;
    for (; j + SJ <= L->nin; j += SJ)
        NAME(sums_tile)(L->gw + (size_t)j * lanes + k0, L->x + j, gt + k0, lanes, r0, n, K, SJ);
    for (; j < L->nin; j++)
        NAME(sums_tile)(L->gw + (size_t)j * lanes + k0, L->x + j, gt + k0, lanes, r0, n, K, 1);
    if (L->variant & PG_LINEAR_BIAS)
        NAME(sums_tile)(L->gb + k0, &ones, gt + k0, lanes, r0, n, K, 1);
}

/* Inputs j .. j + J - 1's row grads, rows r .. r + U*VW - 1:
 * + w_ij g_i, last neuron first. */
KINLINE void NAME(input_grad_tile)(const pg_layer *L, uint32_t j, const double *g, size_t r,
                                  const int J, const int U) {
    V acc[GJ][GU];
    UNROLL for (int q = 0; q < J; q++)
        UNROLL for (int u = 0; u < U; u++) acc[q][u] = LOAD(L->gx[j + (uint32_t)q] + r + VW * u);
    for (uint32_t i = L->m; i-- > 0;) {
        const double *gi = g + i * L->stride + r;
        const double *wi = L->w + (size_t)i * L->nin + j;
        V gv[GU];
        UNROLL for (int u = 0; u < U; u++) gv[u] = LOAD(gi + VW * u);
        UNROLL for (int q = 0; q < J; q++) {
            V w = SPLAT(wi[q]);
            UNROLL for (int u = 0; u < U; u++) acc[q][u] = PG_LINEAR_XGRAD(acc[q][u], w, gv[u]);
        }
    }
    UNROLL for (int q = 0; q < J; q++)
        UNROLL for (int u = 0; u < U; u++) STORE(L->gx[j + (uint32_t)q] + r + VW * u, acc[q][u]);
}

/* Inputs j .. j + J - 1 over every row. */
KINLINE void NAME(input_grads)(const pg_layer *L, uint32_t j, const double *g, size_t r0,
                               size_t r1, const int J) {
    size_t r = r0;
    for (; r + GU * VW <= r1; r += GU * VW) NAME(input_grad_tile)(L, j, g, r, J, GU);
    for (; r < r1; r += VW) NAME(input_grad_tile)(L, j, g, r, J, 1);
}

ATTR void NAME(layer_backward)(const pg_layer *L, size_t n, const pg_layer_scratch *s) {
    const size_t S = L->stride, lanes = L->lanes, nv = PG_ROWS_ROUNDED(n);
    const int act = L->variant & PG_ACT_MASK;
    double *g = s->g, *gt = s->gt;
    PG_FOR_ACT(act, A, for (uint32_t i = 0; i < L->m; i++) {
        const double *restrict y = L->y + i * S, *restrict gy = L->gy + i * S;
        double *restrict gi = g + i * S;
        for (size_t r = 0; r < nv; r++) gi[r] = pg_act_grad(A, y[r], gy[r]);
    });
    /* The lanes past m: zeros, not what an earlier layer left there. */
    for (size_t i = L->m; i < lanes; i++) memset(g + i * S, 0, nv * sizeof *g);
    transpose_rows(g, S, gt, lanes, nv);

    /* The sums over rows: SROWS rows of gt at a time (they stay in L1
     * while every sum takes them in), each sum carried from tile to tile
     * through gw, so still over the rows in order. */
    for (size_t r0 = 0; r0 < n; r0 += SROWS) {
        size_t r1 = n - r0 < SROWS ? n : r0 + SROWS;
        size_t k0 = 0;
        for (; k0 + 4 * VW <= lanes; k0 += 4 * VW) NAME(sums_lanes)(L, k0, gt, s->ones, r0, r1, 4);
        switch ((lanes - k0) / VW) {
        case 3: NAME(sums_lanes)(L, k0, gt, s->ones, r0, r1, 3); break;
        case 2: NAME(sums_lanes)(L, k0, gt, s->ones, r0, r1, 2); break;
        case 1: NAME(sums_lanes)(L, k0, gt, s->ones, r0, r1, 1); break;
        }
    }

    /* The inputs' row grads: GROWS rows of every neuron's g at a time
     * (they stay in L1 while every input takes them in). */
    for (size_t r0 = 0; r0 < nv; r0 += GROWS) {
        size_t r1 = nv - r0 < GROWS ? nv : r0 + GROWS;
        uint32_t j = 0;
        while (j < L->nin) {
            if (L->gx[j] == NULL) {
                j++;
                continue;
            }
            uint32_t k = 1;
            while (k < GJ && j + k < L->nin && L->gx[j + k] != NULL) k++;
            if (k == GJ) {
                NAME(input_grads)(L, j, g, r0, r1, GJ);
            } else {
                for (uint32_t q = 0; q < k; q++) NAME(input_grads)(L, j + q, g, r0, r1, 1);
            }
            j += k;
        }
    }
}
