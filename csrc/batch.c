/*
 * Batched replay (Program.map): one per-sample program, run over many rows.
 *
 * Compiling lays the graph below the outputs out flat in creation order,
 * children first: slot s is one node.  The leaves named as inputs take one
 * column of the rows each; every other leaf is shared by all rows (the
 * parameters, and the constants that number operands made).
 *
 * Running takes the rows in blocks of B.  Each slot holds B values and B
 * grads (structure of arrays), so each op is one loop across the block's
 * rows (the row rules of ops.c, made from the same expressions as the node
 * rules), which the compiler can vectorize; -ffp-contract=off still holds,
 * so every row's numbers are the eager ones, bit for bit.  A shared leaf's
 * data is one value (stride 0); its grad is per row.
 *
 * Backward, and so the order of every sum (docs/api.md, Program.map):
 * each row's sweep is backward()'s, with the output's grad set to w[r]
 * (output j: w[r, j]) instead of 1; a shared leaf's contributions within
 * row r add up in the sweep's order to g_r (from 0), and after each block
 * the leaf's grad becomes leaf.grad + g_r for each row r in row order.
 * Inputs' grads and the graph's own nodes are not touched.
 *
 * Everything is allocated by pg_batch_compile; running allocates nothing.
 * A program must not run in two threads at once (Python holds a lock).
 */
#include <stdlib.h>
#include <string.h>
#include "node.h"
#include "program.h"

/* Slots x rows x (data + grad) stays within this, so a block fits cache. */
#define BLOCK_BYTES (4u << 20)
#define MAX_BLOCK 256u
/* Rows a slot is padded by (see pg_batch_compile), and leaves summed at once. */
#define SLOT_PAD 8u
#define SUM_LANES 8u
#define NO_SLOT UINT32_MAX

typedef struct batch {
    uint32_t nslots, ninputs, nout, nshared;
    size_t block;             /* rows per block, B */
    size_t stride;            /* doubles from one slot's rows to the next's */
    uint8_t *op;              /* per slot */
    uint16_t *variant;
    double *k;
    uint32_t *nk;
    uint32_t *first_edge;     /* slot s's children: edges first_edge[s] .. + nk[s] */
    const double **x;         /* per edge: the child's data (a row vector or one value) */
    size_t *xs;               /* per edge: 1, or 0 for a shared leaf */
    double **gx;              /* per edge: the child's grad, per row or one sum */
    size_t *gxs;              /* per edge: 1, or 0 for a shared leaf used once */
    uint32_t *zero_slot, nzero;       /* slots whose grads are per row */
    uint32_t *summed, nsummed;        /* shared leaves used more than once: slots */
    double **summed_into;             /* ... and their grads' sums */
    uint32_t *input_slot;     /* per input column: its slot, or NO_SLOT if unused */
    uint32_t *out_slot;       /* per output: its slot */
    const double **out_x;     /* per output: its data, as an edge's */
    size_t *out_xs;
    uint32_t *shared_node;    /* per shared leaf: its handle */
    double *shared_data;      /* per shared leaf: its data, read at each run */
    double *shared_grad;      /* per shared leaf: its grad while a run accumulates */
    double *data, *grad;      /* nslots * stride each */
    double *tmp;              /* block */
    pg_layer *layer;          /* whole layers, run as one unit each (layer.c) */
    uint32_t nlayers;
    uint32_t *layer_at;       /* per slot: 1 + the layer that starts or ends there, else 0 */
    pg_layer_scratch scratch;
} batch;

static void batch_free(batch *b) {
    if (b == NULL) return;
    for (uint32_t l = 0; b->layer != NULL && l < b->nlayers; l++) {
        pg_layer *L = &b->layer[l];
        free(L->x); free(L->gx); free(L->w); free(L->bias); free(L->gw); free(L->gb);
        free(L->w_leaf); free(L->b_leaf);
    }
    free(b->layer); free(b->layer_at);
    free(b->scratch.g); free(b->scratch.gt); free(b->scratch.dump); free(b->scratch.ones);
    free(b->op); free(b->variant); free(b->k); free(b->nk); free(b->first_edge);
    free(b->x); free(b->xs); free(b->gx); free(b->gxs);
    free(b->zero_slot); free(b->summed); free(b->summed_into); free(b->input_slot); free(b->out_slot);
    free(b->out_x); free(b->out_xs);
    free(b->shared_node); free(b->shared_data); free(b->shared_grad);
    free(b->data); free(b->grad); free(b->tmp);
    free(b);
}

void pg_batch_clear(pg_batch *p) {
    if (p == NULL) return;
    batch_free(p->impl);
    p->impl = NULL;
}

/* The back end: each slot's rows and each edge's strides, from L. */
static int32_t lay_out(batch *b, const pg_layout *L, const uint32_t *inputs,
                       const uint32_t *outputs, uint32_t *bad) {
    const size_t n = L->n, edges = L->nedges;
    int32_t *col = NULL;      /* per slot: its input column, or -1 */
    uint32_t *uses = NULL;    /* per slot: edges to it (+2 for an output) */
    uint32_t *shared_of = NULL;
    int32_t rc = 0;
    if (!(PG_ALLOC(col, n) && PG_ALLOC(uses, n) && PG_ALLOC(shared_of, n))) rc = PG_E_NOMEM;
    for (size_t s = 0; rc == 0 && s < n; s++) col[s] = -1;
    for (uint32_t c = 0; rc == 0 && c < b->ninputs; c++) {
        uint32_t s = pg_layout_slot(L, inputs[c]);
        b->input_slot[c] = s;
        if (s == NO_SLOT) continue;                 /* an input the outputs don't use */
        if (pg_N(inputs[c])->op != PG_OP_LEAF || col[s] >= 0) {
            *bad = inputs[c];
            rc = PG_E_ARG;
        } else {
            col[s] = (int32_t)c;
        }
    }
    for (size_t e = 0; rc == 0 && e < edges; e++) uses[L->kid[e]]++;
    for (uint32_t o = 0; rc == 0 && o < b->nout; o++) uses[pg_layout_slot(L, outputs[o])] += 2;

    /* Shared leaves: one value of data; a grad summed in place (used once)
     * or per row, then summed after each block (used more than once). */
    uint32_t nsummed = 0, nzero = 0;
    for (size_t s = 0; rc == 0 && s < n; s++) {
        if (L->leaf[s] && col[s] < 0) {
            shared_of[s] = b->nshared++;
            if (uses[s] != 1) nsummed++;
        }
        if (!(L->leaf[s] && col[s] < 0 && uses[s] == 1)) nzero++;
    }

    if (rc == 0) {
        size_t per_row = (size_t)n * 2 * sizeof(double);
        size_t block = BLOCK_BYTES / (per_row ? per_row : 1);
        b->block = block < 1 ? 1 : block > MAX_BLOCK ? MAX_BLOCK : block;
        /* Not a power of two: slots a power of two apart would fall into
         * the same cache sets, and a sweep touches hundreds of them. */
        b->stride = b->block + SLOT_PAD;
        if (!(PG_ALLOC(b->op, n) && PG_ALLOC(b->variant, n) && PG_ALLOC(b->k, n) && PG_ALLOC(b->nk, n) &&
              PG_ALLOC(b->first_edge, n) && PG_ALLOC(b->x, edges) && PG_ALLOC(b->xs, edges) &&
              PG_ALLOC(b->gx, edges) && PG_ALLOC(b->gxs, edges) && PG_ALLOC(b->zero_slot, nzero) &&
              PG_ALLOC(b->summed, nsummed) && PG_ALLOC(b->summed_into, nsummed) && PG_ALLOC(b->shared_node, b->nshared) &&
              PG_ALLOC(b->shared_data, b->nshared) && PG_ALLOC(b->shared_grad, b->nshared) &&
              PG_ALLOC(b->data, n * b->stride) && PG_ALLOC(b->grad, n * b->stride) &&
              PG_ALLOC(b->tmp, b->block)))
            rc = PG_E_NOMEM;
    }

    for (size_t s = 0; rc == 0 && s < n; s++) {
        const pg_node *node = pg_N(L->handle[s]);
        int shared = L->leaf[s] && col[s] < 0;
        b->op[s] = L->leaf[s] ? PG_OP_LEAF : node->op;
        b->variant[s] = node->variant;
        b->k[s] = node->aux.k;
        b->nk[s] = (uint32_t)(L->first_edge[s + 1] - L->first_edge[s]);
        b->first_edge[s] = (uint32_t)L->first_edge[s];
        if (!(shared && uses[s] == 1)) b->zero_slot[b->nzero++] = (uint32_t)s;
        if (shared) {
            b->shared_node[shared_of[s]] = L->handle[s];
            if (uses[s] != 1) {
                b->summed_into[b->nsummed] = &b->shared_grad[shared_of[s]];
                b->summed[b->nsummed++] = (uint32_t)s;
            }
        }
    }
    for (size_t e = 0; rc == 0 && e < edges; e++) {
        uint32_t c = L->kid[e];
        int shared = L->leaf[c] && col[c] < 0;
        int direct = shared && uses[c] == 1;
        b->x[e] = shared ? &b->shared_data[shared_of[c]] : b->data + c * b->stride;
        b->xs[e] = shared ? 0 : 1;
        b->gx[e] = direct ? &b->shared_grad[shared_of[c]] : b->grad + c * b->stride;
        b->gxs[e] = direct ? 0 : 1;
    }
    for (uint32_t o = 0; rc == 0 && o < b->nout; o++) {
        uint32_t c = pg_layout_slot(L, outputs[o]);
        int shared = L->leaf[c] && col[c] < 0;
        b->out_x[o] = shared ? &b->shared_data[shared_of[c]] : b->data + c * b->stride;
        b->out_xs[o] = shared ? 0 : 1;
        b->out_slot[o] = c;
    }
    b->nslots = (uint32_t)n;
    free(shared_of);
    free(uses);
    free(col);
    return rc;
}

/* Layers: runs of at least MIN_LAYER neurons that layer.c can take. */
#define MIN_LAYER 4

static uint32_t bias_of(const batch *b, uint32_t s) {
    return (b->variant[s] & PG_LINEAR_BIAS) ? 1 : 0;
}
static uint32_t inputs_of(const batch *b, uint32_t s) {
    return (b->nk[s] - bias_of(b, s)) / 2;
}
/* The edge of slot s's weight j; its input's is the next. */
static uint32_t weight_edge(const batch *b, uint32_t s, uint32_t j) {
    return b->first_edge[s] + bias_of(b, s) + 2 * j;
}

/* Can slot s be a layer's neuron?  A LINEAR whose bias and weights are
 * parameters used only here, each weight times a per-row input, the inputs
 * distinct (mark: per slot, stamped s + 1 for the inputs of s). */
static int layer_neuron(const batch *b, uint32_t s, uint32_t *mark) {
    if (b->op[s] != PG_OP_LINEAR || b->nk[s] <= bias_of(b, s) || (b->nk[s] - bias_of(b, s)) % 2)
        return 0;
    uint32_t e = b->first_edge[s];
    if (bias_of(b, s) && (b->xs[e] != 0 || b->gxs[e] != 0)) return 0;
    for (uint32_t j = 0; j < inputs_of(b, s); j++) {
        uint32_t w = weight_edge(b, s, j);
        if (b->xs[w] != 0 || b->gxs[w] != 0 || b->xs[w + 1] != 1 || b->gxs[w + 1] != 1) return 0;
        size_t in = (size_t)(b->x[w + 1] - b->data) / b->stride;
        if (mark[in] == s + 1) return 0;
        mark[in] = s + 1;
    }
    return 1;
}

/* Does slot t have slot s's variant and inputs? */
static int same_layer(const batch *b, uint32_t s, uint32_t t) {
    if (b->op[t] != PG_OP_LINEAR || b->variant[t] != b->variant[s] || b->nk[t] != b->nk[s])
        return 0;
    for (uint32_t j = 0; j < inputs_of(b, s); j++)
        if (b->x[weight_edge(b, t, j) + 1] != b->x[weight_edge(b, s, j) + 1]) return 0;
    return 1;
}

static int make_layer(batch *b, pg_layer *L, uint32_t s0, uint32_t m) {
    L->s0 = s0;
    L->m = m;
    L->nin = inputs_of(b, s0);
    L->lanes = (m + 3) & ~3u;
    L->variant = b->variant[s0];
    L->stride = b->stride;
    L->y = b->data + (size_t)s0 * b->stride;
    L->gy = b->grad + (size_t)s0 * b->stride;
    if (!(PG_ALLOC(L->x, L->nin) && PG_ALLOC(L->gx, L->nin) &&
          PG_ALLOC(L->w, (size_t)L->lanes * L->nin) && PG_ALLOC(L->bias, L->lanes) &&
          PG_ALLOC(L->gw, (size_t)L->lanes * L->nin) && PG_ALLOC(L->gb, L->lanes) &&
          PG_ALLOC(L->w_leaf, (size_t)m * L->nin) && PG_ALLOC(L->b_leaf, m)))
        return 0;
    for (uint32_t i = 0; i < m; i++) {
        uint32_t s = s0 + i;
        if (bias_of(b, s)) L->b_leaf[i] = (uint32_t)(b->x[b->first_edge[s]] - b->shared_data);
        for (uint32_t j = 0; j < L->nin; j++)
            L->w_leaf[(size_t)i * L->nin + j] = (uint32_t)(b->x[weight_edge(b, s, j)] - b->shared_data);
    }
    for (uint32_t j = 0; j < L->nin; j++) {
        uint32_t e = weight_edge(b, s0, j) + 1;
        size_t in = (size_t)(b->x[e] - b->data) / b->stride;
        L->x[j] = b->x[e];
        /* An input column's row grads are read by no one. */
        L->gx[j] = b->op[in] == PG_OP_LEAF ? NULL : b->gx[e];
    }
    return 1;
}

static int32_t find_layers(batch *b) {
    if (!PG_LAYERS) return 0;
    const uint32_t n = b->nslots;
    uint32_t *mark = NULL;
    uint32_t lanes = 0;
    int ok = PG_ALLOC(mark, n) && PG_ALLOC(b->layer_at, n);
    for (int fill = 0; ok && fill < 2; fill++) {      /* count, then make */
        uint32_t count = 0;
        memset(mark, 0, n * sizeof *mark);
        for (uint32_t s = 0; ok && s < n;) {
            uint32_t t = s + 1;
            if (layer_neuron(b, s, mark))
                while (t < n && same_layer(b, s, t) && layer_neuron(b, t, mark)) t++;
            if (t - s >= MIN_LAYER) {
                if (fill) {
                    ok = make_layer(b, &b->layer[count], s, t - s);
                    b->nlayers = count + 1;
                    b->layer_at[s] = b->layer_at[t - 1] = count + 1;
                    if (b->layer[count].lanes > lanes) lanes = b->layer[count].lanes;
                }
                count++;
            }
            s = t;
        }
        if (!fill && count > 0) ok = PG_ALLOC(b->layer, count);
        if (!fill && count == 0) break;
    }
    free(mark);
    pg_layer_scratch *sc = &b->scratch;
    if (ok && b->nlayers > 0) {
        ok = PG_ALLOC(sc->g, (size_t)lanes * b->stride) && PG_ALLOC(sc->gt, (size_t)lanes * b->stride) &&
             PG_ALLOC(sc->dump, b->stride) && PG_ALLOC(sc->ones, b->stride);
        for (size_t i = 0; ok && i < b->stride; i++) sc->ones[i] = 1.0;
    }
    return ok ? 0 : PG_E_NOMEM;
}

/* Each layer's parameters and grads into its arrays (at a run's start),
 * and the grads' sums back (at its end). */
static void layers_gather(batch *b) {
    for (uint32_t l = 0; l < b->nlayers; l++) {
        pg_layer *L = &b->layer[l];
        for (uint32_t i = 0; i < L->m; i++) {
            if (L->variant & PG_LINEAR_BIAS) {
                L->bias[i] = b->shared_data[L->b_leaf[i]];
                L->gb[i] = b->shared_grad[L->b_leaf[i]];
            }
            const uint32_t *leaf = L->w_leaf + (size_t)i * L->nin;
            for (uint32_t j = 0; j < L->nin; j++) {
                L->w[(size_t)i * L->nin + j] = b->shared_data[leaf[j]];
                L->gw[(size_t)j * L->lanes + i] = b->shared_grad[leaf[j]];
            }
        }
    }
}
static void layers_scatter(batch *b) {
    for (uint32_t l = 0; l < b->nlayers; l++) {
        const pg_layer *L = &b->layer[l];
        for (uint32_t i = 0; i < L->m; i++) {
            if (L->variant & PG_LINEAR_BIAS) b->shared_grad[L->b_leaf[i]] = L->gb[i];
            const uint32_t *leaf = L->w_leaf + (size_t)i * L->nin;
            for (uint32_t j = 0; j < L->nin; j++)
                b->shared_grad[leaf[j]] = L->gw[(size_t)j * L->lanes + i];
        }
    }
}

int32_t pg_batch_compile(const uint32_t *outputs, uint32_t nout, const uint32_t *inputs,
                         uint32_t ninputs, pg_batch *p, uint32_t *bad) {
    pg_batch_clear(p);
    *bad = 0;
    if (nout == 0) return PG_E_ARG;
    pg_layout L;
    int32_t rc = pg_lay_out(outputs, nout, &L, bad);
    if (rc < 0) return rc;
    batch *b = pg_calloc(1, sizeof *b);
    if (b == NULL || !PG_ALLOC(b->input_slot, ninputs) || !PG_ALLOC(b->out_slot, nout) ||
        !PG_ALLOC(b->out_x, nout) || !PG_ALLOC(b->out_xs, nout)) {
        batch_free(b);
        pg_layout_free(&L);
        return PG_E_NOMEM;
    }
    b->ninputs = ninputs;
    b->nout = nout;
    pg_lock();        /* inputs may name dead nodes: check them with the nodes still there */
    for (uint32_t c = 0; c < ninputs && rc == 0; c++)
        if (!pg_handle_valid(inputs[c])) {
            *bad = inputs[c];
            rc = PG_E_ARG;
        }
    pg_unlock();
    if (rc == 0) rc = lay_out(b, &L, inputs, outputs, bad);
    if (rc == 0) rc = find_layers(b);
    pg_layout_free(&L);
    if (rc < 0) {
        batch_free(b);
        return rc;
    }
    p->impl = b;
    return 0;
}

/* Point r (its rows count and scratch set) at slot s's op and arrays. */
static void point_rows(const batch *b, uint32_t s, pg_rows *r) {
    uint32_t e = b->first_edge[s];
    r->k = b->k[s];
    r->nk = b->nk[s];
    r->variant = b->variant[s];
    r->y = b->data + (size_t)s * b->stride;
    r->gy = b->grad + (size_t)s * b->stride;
    r->x = b->x + e;
    r->xs = b->xs + e;
    r->gx = b->gx + e;
    r->gxs = b->gxs + e;
}

static void run_block(batch *b, const double *rows, size_t m, double *out, const double *w) {
    const size_t B = b->stride;
    for (uint32_t c = 0; c < b->ninputs; c++) {
        uint32_t s = b->input_slot[c];
        if (s == NO_SLOT) continue;
        double *d = b->data + (size_t)s * B;
        for (size_t i = 0; i < m; i++) d[i] = rows[i * b->ninputs + c];
    }
    pg_rows r;
    r.n = m;
    r.tmp = b->tmp;
    for (uint32_t s = 0; s < b->nslots; s++) {
        if (b->op[s] == PG_OP_LEAF) continue;
#if PG_LAYERS
        if (b->layer_at && b->layer_at[s]) {
            const pg_layer *L = &b->layer[b->layer_at[s] - 1];
            pg_layer_forward(L, m, b->scratch.dump);
            s = L->s0 + L->m - 1;
            continue;
        }
#endif
        point_rows(b, s, &r);
        pg_row_rules[b->op[s]].forward(&r);
    }
    for (uint32_t j = 0; j < b->nout; j++)
        for (size_t i = 0; i < m; i++) out[i * b->nout + j] = b->out_x[j][i * b->out_xs[j]];
    if (w == NULL) return;

    /* Up to a multiple of 4 rows: the layers run over a slot's padding too
     * (layer.c), which must not pile up sums from block to block. */
    for (uint32_t z = 0; z < b->nzero; z++)
        memset(b->grad + (size_t)b->zero_slot[z] * B, 0, ((m + 3) & ~(size_t)3) * sizeof(double));
    for (uint32_t j = 0; j < b->nout; j++) {
        double *g = b->grad + (size_t)b->out_slot[j] * B;
        for (size_t i = 0; i < m; i++) g[i] += w[i * b->nout + j];
    }
    for (uint32_t s = b->nslots; s-- > 0;) {
        if (b->op[s] == PG_OP_LEAF) continue;
#if PG_LAYERS
        if (b->layer_at && b->layer_at[s]) {
            const pg_layer *L = &b->layer[b->layer_at[s] - 1];
            pg_layer_backward(L, m, &b->scratch);
            s = L->s0;
            continue;
        }
#endif
        point_rows(b, s, &r);
        pg_row_rules[b->op[s]].backward(&r);
    }
    /* A leaf used more than once: its row's contributions were summed per
     * row; add those in row order.  SUM_LANES leaves at a time, rows
     * outer, so the adds don't wait on one another. */
    for (uint32_t j0 = 0; j0 < b->nsummed; j0 += SUM_LANES) {
        uint32_t nj = b->nsummed - j0 < SUM_LANES ? b->nsummed - j0 : SUM_LANES;
        const double *g[SUM_LANES];
        double acc[SUM_LANES];
        double *into[SUM_LANES];
        for (uint32_t j = 0; j < nj; j++) {
            g[j] = b->grad + (size_t)b->summed[j0 + j] * B;
            into[j] = b->summed_into[j0 + j];
            acc[j] = *into[j];
        }
        for (size_t i = 0; i < m; i++)
            for (uint32_t j = 0; j < nj; j++) acc[j] = acc[j] + g[j][i];
        for (uint32_t j = 0; j < nj; j++) *into[j] = acc[j];
    }
}

int32_t pg_batch_run(pg_batch *p, const double *rows, size_t n, double *out, const double *w) {
    batch *b = p->impl;
    if (b == NULL) return PG_E_ARG;
    for (uint32_t j = 0; j < b->nshared; j++) {
        const pg_node *node = pg_N(b->shared_node[j]);
        b->shared_data[j] = node->data;
        b->shared_grad[j] = node->grad;
    }
    layers_gather(b);
    for (size_t r0 = 0; r0 < n; r0 += b->block) {
        size_t m = n - r0 < b->block ? n - r0 : b->block;
        run_block(b, rows + r0 * b->ninputs, m, out + r0 * b->nout, w ? w + r0 * b->nout : NULL);
    }
    if (w != NULL) layers_scatter(b);
    if (w != NULL)
        for (uint32_t j = 0; j < b->nshared; j++) pg_N(b->shared_node[j])->grad = b->shared_grad[j];
    return 0;
}

uint32_t pg_batch_slots(const pg_batch *p) {
    const batch *b = p->impl;
    return b ? b->nslots : 0;
}

int32_t pg_batch_layers(const pg_batch *p) {
    const batch *b = p->impl;
    if (!PG_LAYERS) return -1;
    return b ? (int32_t)b->nlayers : 0;
}
