/*
 * Batched replay (Program.map, Program.train_step): one per-sample program,
 * run over many rows.
 *
 * Compiling lays the graph below the outputs out flat in topological order,
 * children first: slot s is one node.  The leaves named as inputs take one
 * column of the rows each; every other leaf is shared by all rows (the
 * parameters, and the constants that number operands made).
 *
 * Running takes the rows in blocks of B (a power of two, at most 256, so
 * that a block's per-row slots fit cache).  Each per-row slot holds B
 * values and B grads (structure of arrays), so each op is one loop across
 * the block's rows (the row rules of ops.c, made from the same expressions
 * as the node rules), which the compiler can vectorize; -ffp-contract=off
 * still holds, so every row's numbers are the eager ones, bit for bit.  A
 * shared leaf's data is one value (stride 0); its grad is per row, or one
 * sum when the leaf is used once.
 *
 * The order of every sum over rows (docs/batched-tier.md):
 *  - the rows are cut into chunks of PG_CHUNK_ROWS (256): rows 0..255,
 *    256..511, ...;
 *  - within chunk c, a shared leaf's grad adds up each row's contribution
 *    in row order, starting from the leaf's grad for chunk 0 and from -0.0
 *    (which changes no sum) for every other chunk; each row's contribution
 *    is its backward() sweep's, with the output's grad set to w[r] (output
 *    j: w[r, j]) instead of 1;
 *  - then leaf.grad = ((chunk 0) + chunk 1) + chunk 2 ..., in chunk order.
 * With up to 256 rows this is backward() row after row.  The chunks are
 * the same whatever the number of threads, which only decides who computes
 * which chunk, so every thread count gives the same bits.  The chunks run
 * in rounds of up to PG_ROUND_CHUNKS, each round's sums added into the
 * grads (in chunk order) before the next starts: the other chunks' sums
 * take room for one round, not for every row.  Inputs' grads and the
 * graph's own nodes are not touched.
 *
 * Threads: a round with threads > 1 and more than one chunk starts up to
 * threads - 1 POSIX threads for it (detached) and returns once every chunk
 * is done: there is no pool, so fork() finds none to repair, and a thread
 * that starts late finds no work and ends at once.  The threads, the
 * calling one included, take the chunks one at a time from a shared
 * counter.  Each thread works in a worker of its own (its rows' arrays and
 * sums), made the first time it is needed by copying worker 0's and moving
 * its pointers.  If a worker or a thread can't be had, the others run its
 * chunks (same bits).  Without pthreads (Windows) every run is one thread.
 *
 * Everything a run needs is allocated by the first run that needs it and
 * kept, but a threaded run's job record (one small calloc per run: a late
 * thread may hold it after the call); nothing is allocated per row or per
 * block.  A batch runs in one thread at a time: Python's lock keeps runs
 * apart, and a run that meets another (`running`: program.h's run mark)
 * returns PG_E_BUSY.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L     /* sched_yield */
#endif
#include <stdlib.h>
#include <string.h>
#include "node.h"
#include <stdatomic.h>
#include "program.h"
#include "test_hooks.h"
#if !defined(_WIN32) && !defined(__STDC_NO_ATOMICS__)
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#define PG_THREADS 1
#else
#define PG_THREADS 0
#endif

/* A block's per-row slots x rows x (data + grad) stays within this. */
#define BLOCK_BYTES (4u << 20)
#define MAX_BLOCK 256u
/* Rows a slot is padded by (see lay_out), and leaves summed at once. */
#define SLOT_PAD 8u
#define SUM_LANES 8u
#define NO_SLOT UINT32_MAX
#define MAX_WORKERS 64u
/* Chunks per round: a round's sums take PG_ROUND_CHUNKS x (shared leaves)
 * doubles, however many rows a run has. */
#define PG_ROUND_CHUNKS 64u

/* What one thread works in: every array a run writes, and the pointers
 * into them. */
typedef struct worker {
    double *data, *grad;      /* nslots * stride each */
    double *tmp;              /* block */
    const double **x;         /* per edge: the child's data (a row vector or one value) */
    double **gx;              /* per edge: the child's grad, per row or one sum */
    const double **out_x;     /* per output: its data, as an edge's */
    double **summed_into;     /* per leaf summed after each block: its chunk sum */
    double *shared_grad;      /* per shared leaf: the chunk's sum of its grad */
    pg_layer *layer;          /* whole layers, run as one unit each (layer.c) */
    pg_layer_scratch scratch;
} worker;

typedef struct batch {
    uint32_t nslots, ninputs, nout, nshared, nedges;
    size_t block;             /* rows per block, B */
    size_t stride;            /* doubles from one slot's rows to the next's */
    uint8_t *op;              /* per slot */
    uint16_t *variant;
    double *k;
    uint32_t *nk;
    uint32_t *first_edge;     /* slot s's children: edges first_edge[s] .. + nk[s] */
    size_t *xs;               /* per edge: 1, or 0 for a shared leaf */
    size_t *gxs;              /* per edge: 1, or 0 for a shared leaf used once */
    uint32_t *zero_slot, nzero;       /* slots whose grads are per row */
    uint32_t *summed, nsummed;        /* shared leaves used more than once: slots */
    uint32_t *input_slot;     /* per input column: its slot, or NO_SLOT if unused */
    uint32_t *out_slot;       /* per output: its slot */
    size_t *out_xs;
    pg_node **shared_node;    /* per shared leaf: its node (nodes never move; the
                               * batch's hold keeps them alive: value_binding.h) */
    double *shared_data;      /* per shared leaf: its data, read at each run */
    double *base;             /* per shared leaf: its grad at the start, then chunk 0's sum */
    double *seen;             /* per shared leaf: its grad at the start, kept (batch_run) */
    uint32_t locked_runs;     /* runs left that take the sweep lock first (batch_run) */
    double *partial;          /* PG_ROUND_CHUNKS x nshared: a round's other chunks' sums */
    uint32_t nlayers;
    uint32_t *layer_at;       /* per slot: 1 + the layer that starts or ends there, else 0 */
    uint32_t *run, nrun;      /* what a sweep runs, in order: each op's slot, or a
                               * layer's first slot for the whole layer (no leaves) */
    uint32_t *back, nback;    /* what backward runs, last first: run but the ops
                               * below a detached_max only (pg_layout) */
    uint8_t *detached;        /* pg_layout's, or NULL */
    int eager_order;          /* back is backward()'s order, and no layers (check_order) */
    worker *work;             /* MAX_WORKERS; work[0] made by compiling, the rest on demand */
    uint32_t nwork;           /* workers made */
    pg_rule_watch watch;      /* every node: refuse grads once a rule is Python's */
    /* set while a run uses the workers' arrays (program.h: pg_run_begin) */
    _Atomic unsigned running;
} batch;

static void worker_free(worker *wk, uint32_t nlayers, int owner) {
    for (uint32_t l = 0; wk->layer != NULL && l < nlayers; l++) {
        pg_layer *L = &wk->layer[l];
        free(L->x); free(L->gx); free(L->gw); free(L->gb);
        if (owner) {
            free(L->w); free(L->bias); free(L->w_leaf); free(L->b_leaf);
        }
    }
    free(wk->layer);
    free(wk->scratch.g); free(wk->scratch.gt); free(wk->scratch.dump);
    if (owner) free(wk->scratch.ones);
    free(wk->data); free(wk->grad); free(wk->tmp);
    free(wk->x); free(wk->gx); free(wk->out_x); free(wk->summed_into); free(wk->shared_grad);
    memset(wk, 0, sizeof *wk);
}

static void batch_free(batch *b) {
    if (b == NULL) return;
    for (uint32_t i = 0; b->work != NULL && i < MAX_WORKERS; i++)
        worker_free(&b->work[i], b->nlayers, i == 0);
    free(b->work); free(b->layer_at); free(b->run); free(b->back); free(b->detached);
    free(b->op); free(b->variant); free(b->k); free(b->nk); free(b->first_edge);
    free(b->xs); free(b->gxs);
    free(b->zero_slot); free(b->summed); free(b->input_slot); free(b->out_slot);
    free(b->out_xs);
    free(b->shared_node); free(b->shared_data); free(b->base); free(b->seen); free(b->partial);
    pg_rule_watch_free(&b->watch);
    free(b);
}

void pg_batch_clear(pg_batch *p) {
    if (p == NULL) return;
    batch_free(p->impl);
    p->impl = NULL;
}

/* The back end: each slot's rows and each edge's strides, from L, into
 * b and its worker 0. */
static int32_t lay_out(batch *b, const pg_layout *L, pg_node *const *inputs,
                       pg_node *const *outputs, pg_node **bad) {
    const size_t n = L->n, edges = L->nedges;
    worker *w0 = &b->work[0];
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
        if (inputs[c]->op != PG_OP_LEAF || col[s] >= 0) {
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
        /* Only the per-row slots count: a shared leaf's rows are never
         * read (its data is one value).  A power of two, so that blocks
         * tile a chunk (PG_CHUNK_ROWS). */
        size_t per_row = ((size_t)n - b->nshared) * 2 * sizeof(double) + nsummed * sizeof(double);
        size_t block = MAX_BLOCK;
        while (block > 1 && block * per_row > BLOCK_BYTES) block /= 2;
        b->block = block;
        /* Not a power of two: slots a power of two apart would fall into
         * the same cache sets, and a sweep touches hundreds of them. */
        b->stride = b->block + SLOT_PAD;
        if (!(PG_ALLOC(b->op, n) && PG_ALLOC(b->variant, n) && PG_ALLOC(b->k, n) && PG_ALLOC(b->nk, n) &&
              PG_ALLOC(b->first_edge, n) && PG_ALLOC(w0->x, edges) && PG_ALLOC(b->xs, edges) &&
              PG_ALLOC(w0->gx, edges) && PG_ALLOC(b->gxs, edges) && PG_ALLOC(b->zero_slot, nzero) &&
              PG_ALLOC(b->summed, nsummed) && PG_ALLOC(w0->summed_into, nsummed) &&
              PG_ALLOC(b->shared_node, b->nshared) && PG_ALLOC(b->shared_data, b->nshared) &&
              PG_ALLOC(w0->shared_grad, b->nshared) && PG_ALLOC(b->base, b->nshared) &&
              PG_ALLOC(b->seen, b->nshared) &&
              PG_ALLOC(w0->data, n * b->stride) && PG_ALLOC(w0->grad, n * b->stride) &&
              PG_ALLOC(w0->tmp, b->block)))
            rc = PG_E_NOMEM;
    }

    for (size_t s = 0; rc == 0 && s < n; s++) {
        const pg_node *node = L->node[s];
        int shared = L->leaf[s] && col[s] < 0;
        b->op[s] = L->leaf[s] ? PG_OP_LEAF : node->op;
        b->variant[s] = node->variant;
        b->k[s] = node->aux.k;
        b->nk[s] = (uint32_t)(L->first_edge[s + 1] - L->first_edge[s]);
        b->first_edge[s] = (uint32_t)L->first_edge[s];
        if (!(shared && uses[s] == 1)) b->zero_slot[b->nzero++] = (uint32_t)s;
        if (shared) {
            b->shared_node[shared_of[s]] = L->node[s];
            if (uses[s] != 1) {
                w0->summed_into[b->nsummed] = &w0->shared_grad[shared_of[s]];
                b->summed[b->nsummed++] = (uint32_t)s;
            }
        }
    }
    for (size_t e = 0; rc == 0 && e < edges; e++) {
        uint32_t c = L->kid[e];
        int shared = L->leaf[c] && col[c] < 0;
        int direct = shared && uses[c] == 1;
        w0->x[e] = shared ? &b->shared_data[shared_of[c]] : w0->data + c * b->stride;
        b->xs[e] = shared ? 0 : 1;
        w0->gx[e] = direct ? &w0->shared_grad[shared_of[c]] : w0->grad + c * b->stride;
        b->gxs[e] = direct ? 0 : 1;
    }
    for (uint32_t o = 0; rc == 0 && o < b->nout; o++) {
        uint32_t c = pg_layout_slot(L, outputs[o]);
        int shared = L->leaf[c] && col[c] < 0;
        w0->out_x[o] = shared ? &b->shared_data[shared_of[c]] : w0->data + c * b->stride;
        b->out_xs[o] = shared ? 0 : 1;
        b->out_slot[o] = c;
    }
    b->nslots = (uint32_t)n;
    b->nedges = (uint32_t)edges;
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
/* The slot whose rows an edge reads (a per-row edge). */
static size_t slot_of_rows(const batch *b, const double *x) {
    return (size_t)(x - b->work[0].data) / b->stride;
}

/* Can slot s be a layer's neuron?  A LINEAR whose bias and weights are
 * parameters used only here, each weight times a per-row input, the inputs
 * distinct (mark: per slot, stamped s + 1 for the inputs of s). */
/*
 * Backward in the level order (slots last first) gives a node the same
 * grad bits as backward() only if its parents add into it in the same
 * order: true of a model's layers, not of every graph (a node read at
 * three levels by parents the walk meets in another order).  Where some
 * node's parents would add in another order, the batch runs backward in
 * backward()'s own order, op by op (`back`, and no layers); 0 or an error.
 */
static int32_t check_order(batch *b, const pg_layout *L, pg_node *const *outputs,
                           uint32_t nout) {
    pg_node **order;          /* backward()'s: parents first */
    size_t n;
    int32_t rc = pg_record_order(outputs, nout, 1, &order, &n);
    if (rc < 0) return rc;
    const uint32_t ns = L->n;
    uint32_t *rank = NULL, *start = NULL, *parent = NULL, *at = NULL;
    if (!(PG_ALLOC(rank, ns) && PG_ALLOC(start, (size_t)ns + 1) && PG_ALLOC(at, ns) &&
          PG_ALLOC(parent, L->nedges))) {
        rc = PG_E_NOMEM;
        goto done;
    }
    for (uint32_t s = 0; s < ns; s++) rank[s] = UINT32_MAX;     /* (not reached by a grad) */
    for (size_t i = 0; i < n; i++) {
        uint32_t s = pg_layout_slot(L, order[i]);
        if (s != UINT32_MAX) rank[s] = (uint32_t)i;
    }
    /* each node's parents that run backward, by slot */
    for (uint32_t s = 0; s < ns; s++)
        if (!L->leaf[s] && rank[s] != UINT32_MAX)
            for (size_t e = L->first_edge[s]; e < L->first_edge[s + 1]; e++) start[L->kid[e] + 1]++;
    for (uint32_t s = 0; s < ns; s++) start[s + 1] += start[s];
    for (uint32_t s = 0; s < ns; s++) at[s] = start[s];
    for (uint32_t s = 0; s < ns; s++)
        if (!L->leaf[s] && rank[s] != UINT32_MAX)
            for (size_t e = L->first_edge[s]; e < L->first_edge[s + 1]; e++)
                parent[at[L->kid[e]]++] = s;
    /* the level order runs them highest slot first; backward() lowest rank first */
    int agree = 1;
    for (uint32_t c = 0; c < ns && agree; c++)
        for (uint32_t j = start[c] + 1; j < start[c + 1] && agree; j++)
            agree = rank[parent[j]] <= rank[parent[j - 1]];
    if (!agree) {
        b->eager_order = 1;
        if (!PG_ALLOC(b->back, n)) {
            rc = PG_E_NOMEM;
            goto done;
        }
        for (size_t i = n; i-- > 0;) {        /* children first: back is run last first */
            uint32_t s = pg_layout_slot(L, order[i]);
            if (s != UINT32_MAX && !L->leaf[s]) b->back[b->nback++] = s;
        }
    }
done:
    free(order); free(rank); free(start); free(at); free(parent);
    return rc;
}

static int layer_neuron(const batch *b, uint32_t s, uint32_t *mark) {
    /* (a node below a detached_max only runs forward, as a node: a layer's
     * backward would add its inputs times 0, a nan for an inf input) */
    if (b->detached != NULL && b->detached[s]) return 0;
    if (b->op[s] != PG_OP_LINEAR || b->nk[s] <= bias_of(b, s) || (b->nk[s] - bias_of(b, s)) % 2)
        return 0;
    uint32_t e = b->first_edge[s];
    if (bias_of(b, s) && (b->xs[e] != 0 || b->gxs[e] != 0)) return 0;
    for (uint32_t j = 0; j < inputs_of(b, s); j++) {
        uint32_t w = weight_edge(b, s, j);
        if (b->xs[w] != 0 || b->gxs[w] != 0 || b->xs[w + 1] != 1 || b->gxs[w + 1] != 1) return 0;
        size_t in = slot_of_rows(b, b->work[0].x[w + 1]);
        if (mark[in] == s + 1) return 0;
        mark[in] = s + 1;
    }
    return 1;
}

/* Does slot t have slot s's variant and inputs? */
static int same_layer(const batch *b, uint32_t s, uint32_t t) {
    const double *const *x = b->work[0].x;
    if (b->op[t] != PG_OP_LINEAR || b->variant[t] != b->variant[s] || b->nk[t] != b->nk[s])
        return 0;
    for (uint32_t j = 0; j < inputs_of(b, s); j++)
        if (x[weight_edge(b, t, j) + 1] != x[weight_edge(b, s, j) + 1]) return 0;
    return 1;
}

static int make_layer(batch *b, pg_layer *L, uint32_t s0, uint32_t m) {
    const worker *w0 = &b->work[0];
    L->s0 = s0;
    L->m = m;
    L->nin = inputs_of(b, s0);
    L->lanes = (m + 7) & ~7u;
    L->variant = b->variant[s0];
    L->stride = b->stride;
    L->y = w0->data + (size_t)s0 * b->stride;
    L->gy = w0->grad + (size_t)s0 * b->stride;
    if (!(PG_ALLOC(L->x, L->nin) && PG_ALLOC(L->gx, L->nin) &&
          PG_ALLOC(L->w, (size_t)L->lanes * L->nin) && PG_ALLOC(L->bias, L->lanes) &&
          PG_ALLOC(L->gw, (size_t)L->lanes * L->nin) && PG_ALLOC(L->gb, L->lanes) &&
          PG_ALLOC(L->w_leaf, (size_t)m * L->nin) && PG_ALLOC(L->b_leaf, m)))
        return 0;
    for (uint32_t i = 0; i < m; i++) {
        uint32_t s = s0 + i;
        if (bias_of(b, s)) L->b_leaf[i] = (uint32_t)(w0->x[b->first_edge[s]] - b->shared_data);
        for (uint32_t j = 0; j < L->nin; j++)
            L->w_leaf[(size_t)i * L->nin + j] = (uint32_t)(w0->x[weight_edge(b, s, j)] - b->shared_data);
    }
    for (uint32_t j = 0; j < L->nin; j++) {
        uint32_t e = weight_edge(b, s0, j) + 1;
        L->x[j] = w0->x[e];
        /* An input column's row grads are read by no one. */
        L->gx[j] = b->op[slot_of_rows(b, w0->x[e])] == PG_OP_LEAF ? NULL : w0->gx[e];
    }
    return 1;
}

static int32_t find_layers(batch *b) {
    if (!PG_LAYERS || b->eager_order) return 0;
    const uint32_t n = b->nslots;
    worker *w0 = &b->work[0];
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
                    ok = make_layer(b, &w0->layer[count], s, t - s);
                    b->nlayers = count + 1;
                    b->layer_at[s] = b->layer_at[t - 1] = count + 1;
                    if (w0->layer[count].lanes > lanes) lanes = w0->layer[count].lanes;
                }
                count++;
            }
            s = t;
        }
        if (!fill && count > 0) ok = PG_ALLOC(w0->layer, count);
        if (!fill && count == 0) break;
    }
    free(mark);
    pg_layer_scratch *sc = &w0->scratch;
    if (ok && b->nlayers > 0) {
        ok = PG_ALLOC(sc->g, (size_t)lanes * b->stride) && PG_ALLOC(sc->gt, (size_t)lanes * b->stride) &&
             PG_ALLOC(sc->dump, b->stride) && PG_ALLOC(sc->ones, b->stride);
        for (size_t i = 0; ok && i < b->stride; i++) sc->ones[i] = 1.0;
    }
    return ok ? 0 : PG_E_NOMEM;
}

/* Where worker 0's pointer p points, the same place in wk: its own data,
 * grads and chunk sums; anything else (the shared data) is shared. */
static void *moved(const batch *b, const worker *wk, const void *p) {
    const worker *w0 = &b->work[0];
    uintptr_t a = (uintptr_t)p;
    size_t rows = (size_t)b->nslots * b->stride * sizeof(double);
    size_t sums = (size_t)b->nshared * sizeof(double);
    if (a >= (uintptr_t)w0->data && a < (uintptr_t)w0->data + rows)
        return (char *)wk->data + (a - (uintptr_t)w0->data);
    if (a >= (uintptr_t)w0->grad && a < (uintptr_t)w0->grad + rows)
        return (char *)wk->grad + (a - (uintptr_t)w0->grad);
    if (a >= (uintptr_t)w0->shared_grad && a < (uintptr_t)w0->shared_grad + sums)
        return (char *)wk->shared_grad + (a - (uintptr_t)w0->shared_grad);
    return (void *)(uintptr_t)p;
}

/* Worker k (> 0), a copy of worker 0 with arrays of its own: 0 or
 * PG_E_NOMEM (then nothing is left half made). */
static int32_t make_worker(batch *b, uint32_t k) {
    const worker *w0 = &b->work[0];
    worker *wk = &b->work[k];
    const size_t n = b->nslots, edges = b->nedges;
    int ok = PG_ALLOC(wk->data, n * b->stride) && PG_ALLOC(wk->grad, n * b->stride) &&
             PG_ALLOC(wk->tmp, b->block) && PG_ALLOC(wk->x, edges) && PG_ALLOC(wk->gx, edges) &&
             PG_ALLOC(wk->out_x, b->nout) && PG_ALLOC(wk->summed_into, b->nsummed) &&
             PG_ALLOC(wk->shared_grad, b->nshared);
    if (ok && b->nlayers > 0) ok = PG_ALLOC(wk->layer, b->nlayers);
    for (size_t e = 0; ok && e < edges; e++) {
        wk->x[e] = moved(b, wk, w0->x[e]);
        wk->gx[e] = moved(b, wk, w0->gx[e]);
    }
    for (uint32_t o = 0; ok && o < b->nout; o++) wk->out_x[o] = moved(b, wk, w0->out_x[o]);
    for (uint32_t j = 0; ok && j < b->nsummed; j++) wk->summed_into[j] = moved(b, wk, w0->summed_into[j]);
    uint32_t lanes = 0;
    for (uint32_t l = 0; ok && l < b->nlayers; l++) {
        const pg_layer *L0 = &w0->layer[l];
        pg_layer *L = &wk->layer[l];
        *L = *L0;                 /* w, bias and the leaf maps stay worker 0's: read only */
        L->x = NULL; L->gx = NULL; L->gw = NULL; L->gb = NULL;
        ok = PG_ALLOC(L->x, L->nin) && PG_ALLOC(L->gx, L->nin) &&
             PG_ALLOC(L->gw, (size_t)L->lanes * L->nin) && PG_ALLOC(L->gb, L->lanes);
        L->y = moved(b, wk, L0->y);
        L->gy = moved(b, wk, L0->gy);
        for (uint32_t j = 0; ok && j < L->nin; j++) {
            L->x[j] = moved(b, wk, L0->x[j]);
            L->gx[j] = L0->gx[j] ? moved(b, wk, L0->gx[j]) : NULL;
        }
        if (L->lanes > lanes) lanes = L->lanes;
    }
    if (ok && b->nlayers > 0) {
        pg_layer_scratch *sc = &wk->scratch;
        ok = PG_ALLOC(sc->g, (size_t)lanes * b->stride) && PG_ALLOC(sc->gt, (size_t)lanes * b->stride) &&
             PG_ALLOC(sc->dump, b->stride);
        sc->ones = w0->scratch.ones;
    }
    if (!ok) {
        worker_free(wk, b->nlayers, 0);
        return PG_E_NOMEM;
    }
    return 0;
}

/* The sweeps' list: a program of 4,554 slots (MLP(2, [64, 64, 1])) has
 * about 4,400 leaves and 3 layers, and runs 20 entries. */
static int32_t list_runs(batch *b) {
    if (!PG_ALLOC(b->run, b->nslots) || (!b->eager_order && !PG_ALLOC(b->back, b->nslots)))
        return PG_E_NOMEM;
    for (uint32_t s = 0; s < b->nslots; s++) {
        if (b->op[s] == PG_OP_LEAF) continue;
        b->run[b->nrun++] = s;
        if (!b->eager_order && (b->detached == NULL || !b->detached[s]))
            b->back[b->nback++] = s;                   /* (no layer is detached) */
#if PG_LAYERS
        if (b->layer_at && b->layer_at[s]) {
            const pg_layer *L = &b->work[0].layer[b->layer_at[s] - 1];
            s = L->s0 + L->m - 1;
        }
#endif
    }
    return 0;
}

int32_t pg_batch_compile(pg_node *const *outputs, uint32_t nout, pg_node *const *inputs,
                         uint32_t ninputs, pg_batch *p, pg_node **bad) {
    pg_batch_clear(p);
    *bad = NULL;
    if (nout == 0) return PG_E_ARG;
    const uint64_t rules = pg_py_rules_now();
    pg_layout L;
    int32_t rc = pg_lay_out(outputs, nout, &L, bad, 1);
    if (rc < 0) return rc;
    batch *b = pg_calloc(1, sizeof *b);
    if (b == NULL || !PG_ALLOC(b->work, MAX_WORKERS) || !PG_ALLOC(b->input_slot, ninputs) ||
        !PG_ALLOC(b->out_slot, nout) || !PG_ALLOC(b->work[0].out_x, nout) ||
        !PG_ALLOC(b->out_xs, nout)) {
        batch_free(b);
        pg_layout_free(&L);
        return PG_E_NOMEM;
    }
    b->ninputs = ninputs;
    b->nout = nout;
    b->nwork = 1;
    for (uint32_t c = 0; c < ninputs && rc == 0; c++)
        if (inputs[c] == NULL) rc = PG_E_ARG;
    if (rc == 0) rc = lay_out(b, &L, inputs, outputs, bad);
    b->detached = L.detached;           /* (list_runs reads it) */
    L.detached = NULL;
    if (rc == 0) rc = check_order(b, &L, outputs, nout);
    if (rc == 0) rc = find_layers(b);
    if (rc == 0) rc = list_runs(b);
    if (rc == 0) pg_rule_watch_take(&b->watch, &L, rules);
    pg_layout_free(&L);
    if (rc < 0) {
        batch_free(b);
        return rc;
    }
    p->impl = b;
    return 0;
}

/* Point r (its rows count and scratch set) at slot s's op and arrays. */
static void point_rows(const batch *b, const worker *wk, uint32_t s, pg_rows *r) {
    uint32_t e = b->first_edge[s];
    r->k = b->k[s];
    r->nk = b->nk[s];
    r->variant = b->variant[s];
    r->y = wk->data + (size_t)s * b->stride;
    r->gy = wk->grad + (size_t)s * b->stride;
    r->x = wk->x + e;
    r->xs = b->xs + e;
    r->gx = wk->gx + e;
    r->gxs = b->gxs + e;
}

static void run_block(const batch *b, worker *wk, const double *rows, size_t m, double *out,
                      const double *w) {
    const size_t B = b->stride;
    for (uint32_t c = 0; c < b->ninputs; c++) {
        uint32_t s = b->input_slot[c];
        if (s == NO_SLOT) continue;
        double *d = wk->data + (size_t)s * B;
        for (size_t i = 0; i < m; i++) d[i] = rows[i * b->ninputs + c];
    }
    pg_rows r;
    r.n = m;
    r.tmp = wk->tmp;
    for (uint32_t k = 0; k < b->nrun; k++) {
        uint32_t s = b->run[k];
#if PG_LAYERS
        if (b->layer_at && b->layer_at[s]) {
            pg_layer_forward(&wk->layer[b->layer_at[s] - 1], m, wk->scratch.dump);
            continue;
        }
#endif
        point_rows(b, wk, s, &r);
        pg_row_rules[b->op[s]].forward(&r);
    }
    for (uint32_t j = 0; j < b->nout; j++)
        for (size_t i = 0; i < m; i++) out[i * b->nout + j] = wk->out_x[j][i * b->out_xs[j]];
    if (w == NULL) return;

    /* Up to PG_ROWS_ROUNDED(m) rows: the layers run over a slot's padding
     * too (layer.c), which must not pile up sums from block to block. */
    for (uint32_t z = 0; z < b->nzero; z++)
        memset(wk->grad + (size_t)b->zero_slot[z] * B, 0, PG_ROWS_ROUNDED(m) * sizeof(double));
    for (uint32_t j = 0; j < b->nout; j++) {
        double *g = wk->grad + (size_t)b->out_slot[j] * B;
        for (size_t i = 0; i < m; i++) g[i] += w[i * b->nout + j];
    }
    for (uint32_t k = b->nback; k-- > 0;) {
        uint32_t s = b->back[k];
#if PG_LAYERS
        if (b->layer_at && b->layer_at[s]) {
            pg_layer_backward(&wk->layer[b->layer_at[s] - 1], m, &wk->scratch);
            continue;
        }
#endif
        point_rows(b, wk, s, &r);
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
            g[j] = wk->grad + (size_t)b->summed[j0 + j] * B;
            into[j] = wk->summed_into[j0 + j];
            acc[j] = *into[j];
        }
        for (size_t i = 0; i < m; i++)
            for (uint32_t j = 0; j < nj; j++) acc[j] = acc[j] + g[j][i];
        for (uint32_t j = 0; j < nj; j++) *into[j] = acc[j];
    }
}

/* The layers' parameters into their arrays, once per run (every worker
 * reads worker 0's). */
static void layers_gather_data(batch *b) {
    for (uint32_t l = 0; l < b->nlayers; l++) {
        pg_layer *L = &b->work[0].layer[l];
        for (uint32_t i = 0; i < L->m; i++) {
            if (L->variant & PG_LINEAR_BIAS) L->bias[i] = b->shared_data[L->b_leaf[i]];
            const uint32_t *leaf = L->w_leaf + (size_t)i * L->nin;
            for (uint32_t j = 0; j < L->nin; j++) L->w[(size_t)i * L->nin + j] = b->shared_data[leaf[j]];
        }
    }
}
/* A worker's chunk sums into its layers' arrays (at a chunk's start), and
 * back (at its end). */
static void layers_gather_grads(const batch *b, worker *wk) {
    for (uint32_t l = 0; l < b->nlayers; l++) {
        pg_layer *L = &wk->layer[l];
        for (uint32_t i = 0; i < L->m; i++) {
            if (L->variant & PG_LINEAR_BIAS) L->gb[i] = wk->shared_grad[L->b_leaf[i]];
            const uint32_t *leaf = L->w_leaf + (size_t)i * L->nin;
            for (uint32_t j = 0; j < L->nin; j++)
                L->gw[(size_t)j * L->lanes + i] = wk->shared_grad[leaf[j]];
        }
    }
}
static void layers_scatter_grads(const batch *b, worker *wk) {
    for (uint32_t l = 0; l < b->nlayers; l++) {
        const pg_layer *L = &wk->layer[l];
        for (uint32_t i = 0; i < L->m; i++) {
            if (L->variant & PG_LINEAR_BIAS) wk->shared_grad[L->b_leaf[i]] = L->gb[i];
            const uint32_t *leaf = L->w_leaf + (size_t)i * L->nin;
            for (uint32_t j = 0; j < L->nin; j++)
                wk->shared_grad[leaf[j]] = L->gw[(size_t)j * L->lanes + i];
        }
    }
}

/* A run's chunks, taken one at a time by its threads from a shared
 * counter: a thread that the scheduler keeps waiting leaves its chunks to
 * the others, and which thread computes a chunk changes no bit (each
 * chunk's sums are kept apart and added in chunk order).  The caller waits
 * for every chunk to be done, not for the threads: a thread that starts
 * after the work is gone finds no chunk and ends, touching only the job,
 * which the last of the caller and the threads frees. */
typedef struct job job;
typedef struct task {
    job *j;
    worker *wk;
    int thread;               /* a started thread's task (not the caller's) */
} task;
struct job {
    batch *b;
    const double *rows;
    double *out;
    const double *w;
    size_t n;
    size_t first, end;        /* the round's chunks: first .. end - 1 */
#if PG_THREADS
    atomic_size_t next;       /* the next chunk to take */
    atomic_size_t done;       /* chunks finished */
    atomic_uint refs;         /* the caller and each thread started */
#else
    size_t next, done;
#endif
    task tasks[MAX_WORKERS];
};

static size_t next_chunk(job *j) {
#if PG_THREADS
    return atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
#else
    return j->next++;
#endif
}

/* Where chunk c (not 0, whose sum is the grads' base) keeps its sum in its
 * round: round 0 holds chunks 1 .. PG_ROUND_CHUNKS - 1. */
static size_t partial_slot(const job *jb, size_t c) {
    return c - (jb->first > 0 ? jb->first : 1);
}

/* Only the job until a chunk is taken: a thread that comes late finds
 * none, and by then the batch may be gone. */
static void run_chunks(const task *t) {
    job *jb = t->j;
    int first = 1;
    for (size_t c = next_chunk(jb); c < jb->end; c = next_chunk(jb)) {
        batch *b = jb->b;
        worker *wk = t->wk;
        const size_t nin = b->ninputs, nout = b->nout;
        if (t->thread && first) pg_test_worker_started();   /* test builds: hold here */
        first = 0;
        size_t r0 = c * PG_CHUNK_ROWS, r1 = r0 + PG_CHUNK_ROWS < jb->n ? r0 + PG_CHUNK_ROWS : jb->n;
        if (jb->w != NULL) {
            if (c == 0) {
                memcpy(wk->shared_grad, b->base, b->nshared * sizeof(double));
            } else {
                for (uint32_t j = 0; j < b->nshared; j++) wk->shared_grad[j] = -0.0;
            }
            layers_gather_grads(b, wk);
        }
        for (size_t i = r0; i < r1; i += b->block) {
            size_t m = r1 - i < b->block ? r1 - i : b->block;
            run_block(b, wk, jb->rows + i * nin, m, jb->out + i * nout, jb->w ? jb->w + i * nout : NULL);
        }
        if (jb->w != NULL) {
            layers_scatter_grads(b, wk);
            double *into = c == 0 ? b->base : b->partial + partial_slot(jb, c) * b->nshared;
            memcpy(into, wk->shared_grad, b->nshared * sizeof(double));
        }
#if PG_THREADS
        atomic_fetch_add_explicit(&jb->done, 1, memory_order_release);
#else
        jb->done++;
#endif
    }
}

#if PG_THREADS
static void release_job(job *jb) {
    if (atomic_fetch_sub_explicit(&jb->refs, 1, memory_order_acq_rel) == 1) free(jb);
}

static void *thread_main(void *arg) {
    const task *t = arg;
    job *jb = t->j;
    run_chunks(t);
    release_job(jb);
    return NULL;
}
#endif

/* The room a run's sums need, had before anything changes: a step that
 * can't have it fails with every grad as it was. */
static int32_t batch_prepare(batch *b, size_t n, const double *w) {
    if (w == NULL || n <= PG_CHUNK_ROWS || b->partial != NULL) return 0;
    b->partial = pg_calloc((size_t)PG_ROUND_CHUNKS * (b->nshared ? b->nshared : 1), sizeof(double));
    return b->partial == NULL ? PG_E_NOMEM : 0;
}

/* One round: chunks first .. end - 1 on up to t threads, back when every
 * one is done.  One thread: the job on the stack.  More: on the heap, since
 * a thread may still hold it after this returns (made once per round; if it
 * can't be had, one thread). */
static void run_round(batch *b, const double *rows, size_t n, double *out, const double *w,
                      size_t first, size_t end, size_t t) {
    job one, *jb = t > 1 ? pg_calloc(1, sizeof *jb) : NULL;
    if (jb == NULL) {
        memset(&one, 0, sizeof one);
        jb = &one;
        t = 1;
    }
    jb->b = b;
    jb->rows = rows;
    jb->out = out;
    jb->w = w;
    jb->n = n;
    jb->first = first;
    jb->end = end;
    for (size_t k = 0; k < t; k++) jb->tasks[k] = (task){jb, &b->work[k], k > 0};
#if PG_THREADS
    atomic_init(&jb->next, first);
    atomic_init(&jb->done, 0);
    atomic_init(&jb->refs, 1);
    if (jb == &one) {
        run_chunks(&jb->tasks[0]);
        return;
    }
    /* A thread that can't be started leaves its chunks to the others. */
    uint32_t started = 0;
    for (size_t k = 1; k < t; k++) {
        pthread_t id;
        atomic_fetch_add_explicit(&jb->refs, 1, memory_order_relaxed);
        if (pthread_create(&id, NULL, thread_main, &jb->tasks[k]) == 0) {
            pthread_detach(id);
            started++;
        } else {
            atomic_fetch_sub_explicit(&jb->refs, 1, memory_order_relaxed);
        }
    }
    pg_test_caller_waits(started);              /* test builds: until they are held */
    run_chunks(&jb->tasks[0]);
    while (atomic_load_explicit(&jb->done, memory_order_acquire) < end - first) sched_yield();
    release_job(jb);
#else
    jb->next = first;
    run_chunks(&jb->tasks[0]);
#endif
}

/* How many runs take the sweep lock first after a run's sums clashed with
 * another thread's writes to the same grads. */
#define LOCKED_RUNS_AFTER_A_CLASH 16

static int32_t batch_run(batch *b, const double *rows, size_t n, double *out, const double *w,
                         uint32_t threads) {
    if (threads == 0) return PG_E_ARG;
    if (w != NULL && pg_rules_changed(&b->watch)) return PG_E_SWEEP;
    if (batch_prepare(b, n, w) < 0) return PG_E_NOMEM;
    const size_t chunks = (n + PG_CHUNK_ROWS - 1) / PG_CHUNK_ROWS;
    size_t t = threads < chunks ? threads : chunks;
    if (t > MAX_WORKERS) t = MAX_WORKERS;
    if (t < 1 || !PG_THREADS) t = 1;              /* no rows: one empty run */
    while (b->nwork < t && make_worker(b, b->nwork) == 0) b->nwork++;
    if (t > b->nwork) t = b->nwork;              /* out of memory: fewer threads, same bits */

    /* The sums are made without the sweep lock, from the grads read here,
     * and written under it if no other thread wrote one meanwhile (a
     * backward(), another program's run over the same parameters); if one
     * did, they are made again under the lock: each run adds its whole sum,
     * as one of the serial orders would (csrc/lock.h, rule 2).  After one
     * such clash the next runs take the lock first (another thread's
     * program steps the same parameters: a run made twice each time would
     * cost more than waiting), then try again without it. */
    int locked = 0;
    if (w != NULL && b->locked_runs > 0) {      /* (one run of a batch at a time) */
        b->locked_runs--;
        pg_sweep_hold();
        locked = 1;
    }
again:
    for (uint32_t j = 0; j < b->nshared; j++) {
        const pg_node *node = b->shared_node[j];
        b->shared_data[j] = node->data;
        b->base[j] = b->seen[j] = node->grad;
    }
    layers_gather_data(b);

    size_t first = 0;
    do {
        size_t end = chunks - first > PG_ROUND_CHUNKS ? first + PG_ROUND_CHUNKS : chunks;
        run_round(b, rows, n, out, w, first, end, t < end - first ? t : end - first);
        if (w != NULL) {
            /* Chunk order: leaf.grad = ((chunk 0) + chunk 1) + ... */
            for (size_t c = first > 0 ? first : 1; c < end; c++) {
                const double *part = b->partial + (c - (first > 0 ? first : 1)) * b->nshared;
                for (uint32_t j = 0; j < b->nshared; j++) b->base[j] = b->base[j] + part[j];
            }
        }
        first = end;
    } while (first < chunks);
    if (w == NULL) return 0;
    if (!locked) {
        pg_sweep_hold();
        locked = 1;
        for (uint32_t j = 0; j < b->nshared; j++) {
            if (memcmp(&b->shared_node[j]->grad, &b->seen[j], sizeof(double)) != 0) {
                b->locked_runs = LOCKED_RUNS_AFTER_A_CLASH;
                goto again;
            }
        }
    }
    for (uint32_t j = 0; j < b->nshared; j++) b->shared_node[j]->grad = b->base[j];
    pg_sweep_unhold();
    return 0;
}

uint32_t pg_batch_slots(const pg_batch *p) {
    const batch *b = p->impl;
    return b ? b->nslots : 0;
}

int pg_batch_alive(const pg_batch *p) { return p != NULL && p->impl != NULL; }

uint32_t pg_batch_width(const pg_batch *p, int outputs) {
    const batch *b = p->impl;
    return b == NULL ? 0 : outputs ? b->nout : b->ninputs;
}

int32_t pg_batch_layers(const pg_batch *p) {
    const batch *b = p->impl;
    if (!PG_LAYERS) return -1;
    return b ? (int32_t)b->nlayers : 0;
}

int32_t pg_batch_run(pg_batch *p, const double *rows, size_t n, double *out, const double *w,
                     uint32_t threads) {
    batch *b = p->impl;
    if (b == NULL) return PG_E_ARG;
    /* (a run cut short by a fork leaves nothing to mend: each run starts
     * its workers' arrays afresh) */
    if (pg_run_begin(&b->running) == PG_RUN_BUSY) return PG_E_BUSY;
    int32_t rc = batch_run(b, rows, n, out, w, threads);
    pg_run_end(&b->running);
    return rc;
}

static int32_t batch_step(pg_batch *p, const double *rows, size_t n, double *out,
                          const double *w, uint32_t threads, const pg_optimizer *opt);

int32_t pg_batch_step(pg_batch *p, const double *rows, size_t n, double *out, const double *w,
                      uint32_t threads, const pg_optimizer *opt) {
    batch *b = p->impl;
    if (b == NULL) return PG_E_ARG;
    if (pg_run_begin(&b->running) == PG_RUN_BUSY) return PG_E_BUSY;
    int32_t rc = batch_step(p, rows, n, out, w, threads, opt);
    pg_run_end(&b->running);
    return rc;
}

static int32_t batch_step(pg_batch *p, const double *rows, size_t n, double *out,
                          const double *w, uint32_t threads, const pg_optimizer *opt) {
    if (w == NULL || opt == NULL) return PG_E_ARG;
    if (opt->kind == PG_OPT_SGD) {
        if (opt->ns1 < opt->n) return PG_E_ARG;
    } else if (opt->kind == PG_OPT_ADAM) {
        if (opt->ns1 < opt->n || opt->ns2 < opt->n) return PG_E_ARG;
    } else {
        return PG_E_ARG;
    }
    if (pg_rules_changed(&((batch *)p->impl)->watch)) return PG_E_SWEEP;
    /* What zero_grad(), map() and step() do, one after the other; the
     * room for the sums first, so that a step without it changes nothing. */
    if (batch_prepare(p->impl, n, w) < 0) return PG_E_NOMEM;
    for (uint32_t i = 0; i < opt->n; i++) opt->params[i]->grad = 0.0;
    int32_t rc = batch_run(p->impl, rows, n, out, w, threads);
    if (rc < 0) return rc;
    if (opt->kind == PG_OPT_SGD)
        return pg_sgd_step(opt->params, opt->n, opt->lr, opt->momentum, opt->weight_decay,
                           opt->s1, opt->ns1, opt->steps);
    return pg_adam_step(opt->params, opt->n, opt->lr, opt->beta1, opt->beta2, opt->eps,
                        opt->weight_decay, opt->bias1, opt->bias2, opt->s1, opt->ns1, opt->s2,
                        opt->ns2, opt->steps);
}
