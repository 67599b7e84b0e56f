/*
 * Replay: the graph below a root, compiled once into a flat program, then
 * re-run in C.
 *
 * Compiling lays the graph out in the order backward() walks it, children
 * first (layout.c), one slot per node, with the nodes' data and grads in
 * one compact array and each interior node one step (program.h) naming its
 * children by slot.  The sweeps then read 8-byte neighbours instead of
 * nodes spread over the memory Python allocated them in.  The nodes stay the truth the user
 * sees: forward() writes every node's data back, backward() every node's
 * grad, so Python Values of the graph (the loss, the scores) show the
 * replayed numbers; leaves are the user's own Values.  The root's
 * numbers and the leaves' grads go back at once; the interior nodes' go
 * back later, when something first reads or writes a node's numbers
 * (deferred write-back, below), all in one pass in the nodes' address
 * order: written in the sweep's order, each would miss the cache, and a
 * random graph's write-back cost more than its sweeps.
 *
 * forward():  every step in order, from the leaves' current data.
 * backward(): what backward() does on a freshly built graph: interior
 *             grads start at 0, the root's at 1, leaves accumulate (from
 *             their current grads, in the sweep's order).  Each step zeroes
 *             its own grad slot once used, so no separate pass clears them.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "node.h"
#include "program.h"
#include "test_hooks.h"

/* Where a step's numbers go back to: its node, its slot and its index. */
typedef struct write_back {
    pg_node *node;
    uint32_t slot, step;
} write_back;

typedef struct flat {
    size_t n;                 /* slots of nodes; POWK's exponents follow them */
    size_t nsteps;
    pg_steps run;             /* interior nodes, in topological order */
    pg_step *steps;
    write_back *back;         /* per step, by node address */
    uint32_t *graded;         /* run.order: the steps backward runs, or NULL (all) */
    write_back *hidden;       /* the SUB and DIV steps (their hidden grad: ops.c) */
    size_t nhidden;
    double *gout;             /* per step: its grad, for the write-back */
    pg_node *root_node;       /* NULL if the root is a leaf */
    pg_rule_watch watch;      /* every node: refuse a backward once a rule is Python's */
    int defer;                /* write the interior nodes' numbers back (deferred) */
    _Atomic int pending;      /* PENDING_DATA | PENDING_GRAD: newer here than in the nodes */
    _Atomic uint64_t stamp[2];  /* when forward [0] and backward [1] last ran (run_clock) */
    struct flat *prev, *next; /* in `listed` (under the GIL) */
    int is_listed;
    uint32_t *leaf;           /* leaf slots */
    pg_node **leaf_node;
    size_t nleaves;
    uint32_t root;            /* the root's slot */
    double *d, *g;            /* per slot, interleaved (see lay_out); g is all 0 between calls */
    pg_rows *rows;            /* per step of a rule that works on rows */
    const double **x;         /* their children's data, grads and strides */
    double **gx;
    size_t *ones;
    double tmp;
    _Atomic unsigned running; /* set while a run uses d and g (program.h: pg_run_begin) */
    int making;               /* what the marked run makes: PENDING_DATA | PENDING_GRAD */
} flat;

/* The plain ops step on d and g directly; the n-ary ones through a row rule. */
static int plain(int op) { return pg_rules[op].arity > 0; }

static void flat_free(flat *f) {
    if (f == NULL) return;
    free(f->steps); free(f->back); free(f->graded); free(f->hidden); free(f->gout); free(f->leaf); free(f->leaf_node); free(f->d);
    free(f->rows); free(f->x); free(f->gx); free(f->ones);
    pg_rule_watch_free(&f->watch);
    free(f);
}

/*
 * Selection (ops.c) pays where a jump per op would be mispredicted, and
 * costs latency where it would not (a chain of a few ops repeated).  A
 * predictor that guesses each op from the two before it stands in for the
 * CPU's: if it misses more than one step in ten, the cheap ops run by
 * selection.
 */
static void choose_fast(pg_step *steps, size_t n) {
    static const size_t ops = PG_OP_COUNT;
    uint8_t guess[PG_OP_COUNT][PG_OP_COUNT];
    memset(guess, 0, sizeof guess);
    size_t misses = 0;
    for (size_t i = 2; i < n; i++) {
        uint8_t *g = &guess[steps[i - 2].op % ops][steps[i - 1].op % ops];
        misses += *g != steps[i].op;
        *g = steps[i].op;
    }
    if (misses * 10 <= n) return;
    for (size_t i = 0; i < n; i++) steps[i].fast = (uint8_t)pg_step_fast_kind(steps[i].op);
}

/* Whether more than one step in twenty reads an interior node over 64 KiB
 * of slots back (a random graph): the sweeps then prefetch (ops.c), which
 * a graph of near neighbours (a chain) would only pay for.  Leaves are
 * left out: they come first, read in order. */
#define FAR_SLOTS ((uint32_t)(64 * 1024 / sizeof(double)))   /* 64 KiB of slots */
static int far_apart(const pg_step *steps, size_t n, size_t nleaves) {
    const uint32_t near = FAR_SLOTS, interior = (uint32_t)(2 * nleaves);
    size_t far = 0;
    for (size_t i = 0; i < n; i++) {
        const pg_step *p = &steps[i];
        if (!plain(p->op)) continue;
        far += (p->a >= interior && p->s - p->a > near) ||
               (p->b >= interior && p->b < p->s && p->s - p->b > near);
    }
    return far * 20 > n;
}

static int by_node_address(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const write_back *)a)->node;
    uintptr_t y = (uintptr_t)((const write_back *)b)->node;
    return (x > y) - (x < y);
}

/* The back end: slots renumbered leaves first, steps and rows from L. */
static int32_t lay_out(flat *f, const pg_layout *L) {
    const size_t n = L->n, nleaves = L->nleaves, nsteps = n - nleaves;
    size_t nrows = 0, edges = 0, most = 1, nconst = 0, nhidden = 0;
    for (size_t s = 0; s < n; s++) {
        if (L->leaf[s]) continue;
        int op = L->node[s]->op;
        nconst += op == PG_OP_POWK;
        nhidden += op == PG_OP_SUB || op == PG_OP_DIV;
        if (!plain(op)) {
            size_t nk = L->first_edge[s + 1] - L->first_edge[s];
            nrows++;
            edges += nk;
            if (nk > most) most = nk;
        }
    }
    int32_t rc = 0;
    uint32_t *slot = NULL;     /* by the layout's slot */
    if (!(PG_ALLOC(slot, n) && PG_ALLOC(f->steps, nsteps) && PG_ALLOC(f->back, nsteps) &&
          PG_ALLOC(f->hidden, nhidden) && PG_ALLOC(f->gout, nsteps) &&
          PG_ALLOC(f->leaf, nleaves) && PG_ALLOC(f->leaf_node, nleaves) &&
          PG_ALLOC(f->d, 2 * (n + nconst)) && PG_ALLOC(f->rows, nrows) && PG_ALLOC(f->x, edges) &&
          PG_ALLOC(f->gx, edges) && PG_ALLOC(f->ones, most)))
        rc = PG_E_NOMEM;
    for (size_t j = 0; rc == 0 && j < most; j++) f->ones[j] = 1;
    /* Slot s's data is d[2s] and its grad g[2s] = d[2s + 1]: a step reads
     * and writes a child's data and grad together, so one cache line
     * serves both.  Steps and leaves name slots by that index, 2s.  The
     * leaves come first, then the interior nodes, each in topological order:
     * the passes over the leaves (reading their data and grads, writing
     * grads back) then walk the array in order instead of all over it. */
    if (rc == 0) f->g = f->d + 1;
    for (size_t i = 0, nl = 0, ni = nleaves; rc == 0 && i < n; i++)
        slot[i] = (uint32_t)(2 * (L->leaf[i] ? nl++ : ni++));
    size_t st = 0, lf = 0, rw = 0, e = 0, kc = 2 * n;
    for (size_t i = 0; rc == 0 && i < n; i++) {        /* topological order */
        const uint32_t s = slot[i], *kid = L->kid + L->first_edge[i];
        const uint32_t nk = (uint32_t)(L->first_edge[i + 1] - L->first_edge[i]);
        pg_node *node = L->node[i];
        f->d[s] = node->data;
        if (L->leaf[i]) {
            f->leaf[lf] = s;
            f->leaf_node[lf++] = node;
            continue;
        }
        f->back[st] = (write_back){node, s, (uint32_t)st};
        if (node->op == PG_OP_SUB || node->op == PG_OP_DIV)
            f->hidden[f->nhidden++] = f->back[st];
        pg_step *p = &f->steps[st++];
        p->op = node->op;
        p->fast = PG_FAST_NONE;
        p->s = s;
        if (plain(node->op)) {
            p->a = slot[kid[0]];
            p->b = nk > 1 ? slot[kid[1]] : p->s;
            if (node->op == PG_OP_POWK) {
                p->b = (uint32_t)kc;
                f->d[kc] = node->aux.k;
                kc += 2;
            }
            continue;
        }
        /* One row: every stride 1 at row 0 is the value itself. */
        pg_rows *r = &f->rows[rw++];
        r->n = 1;
        r->k = node->aux.k;
        r->nk = nk;
        r->variant = node->variant;
        r->y = &f->d[s];
        r->gy = &f->g[s];
        r->x = f->x + e;
        r->gx = f->gx + e;
        r->xs = f->ones;
        r->gxs = f->ones;
        r->tmp = &f->tmp;
        for (uint32_t k = 0; k < nk; k++, e++) {
            f->x[e] = &f->d[slot[kid[k]]];
            f->gx[e] = &f->g[slot[kid[k]]];
        }
        p->a = p->b = (uint32_t)(rw - 1);
    }
    f->n = n;
    f->nsteps = nsteps;
    f->nleaves = nleaves;
    f->root = rc == 0 ? slot[n - 1] : 0;
    if (rc == 0) {
        choose_fast(f->steps, nsteps);
        f->root_node = nsteps > 0 ? f->back[nsteps - 1].node : NULL;
        qsort(f->back, nsteps, sizeof *f->back, by_node_address);
    }
    f->defer = 1;
    /* (a detached_max's steps below it: forward runs them, backward not,
     * and their gout stays 0, as a fresh graph's grads) */
    if (rc == 0 && L->graded != NULL && !PG_ALLOC(f->graded, L->ngraded)) rc = PG_E_NOMEM;
    for (uint32_t k = 0; rc == 0 && f->graded != NULL && k < L->ngraded; k++)
        f->graded[k] = L->graded[k] - (uint32_t)nleaves;     /* (leaves first: one step per slot after) */
    f->run = (pg_steps){nsteps, f->steps, NULL, f->gout, f->rows,
                        rc == 0 && far_apart(f->steps, nsteps, nleaves), f->graded,
                        f->graded != NULL ? L->ngraded : 0};
    free(slot);
    return rc;
}

static int is_listed(const pg_program *p);

int32_t pg_compile(pg_node *root, pg_program *p, pg_node **bad_node) {
    if (p == NULL || is_listed(p)) return PG_E_ARG;
    pg_program_clear(p);
    const uint64_t rules = pg_py_rules_now();
    pg_layout L;
    int32_t rc = pg_lay_out(&root, 1, &L, bad_node, 0);
    if (rc < 0) return rc;
    flat *f = pg_calloc(1, sizeof *f);
    rc = f == NULL ? PG_E_NOMEM : lay_out(f, &L);
    if (rc == 0) pg_rule_watch_take(&f->watch, &L, rules);
    pg_layout_free(&L);
    if (rc < 0) {
        flat_free(f);
        return rc;
    }
    p->impl = f;
    p->n = f->n;
    return 0;
}

/* Leaves sit among the graph's nodes, at irregular distances: fetch ahead. */
static inline void fetch_leaf(const flat *f, size_t j) {
    if (j + PG_FETCH_AHEAD < f->nleaves) PG_PREFETCH(f->leaf_node[j + PG_FETCH_AHEAD]);
}

static void read_leaves(flat *f) {
    for (size_t j = 0; j < f->nleaves; j++) {
        fetch_leaf(f, j);
        f->d[f->leaf[j]] = f->leaf_node[j]->data;
    }
}

/*
 * Deferred write-back.  A run leaves its interior nodes' numbers in the
 * program's arrays, says so in `pending` and stamps it (forward its data,
 * backward its grads); pg_replay_settle, which the binding calls before
 * anything reads or writes a node's numbers (csrc/value_binding.h:
 * settle_replays), writes every pending program's numbers back, the oldest run
 * first, so that where programs share nodes the last run's numbers stand,
 * as if each run had written them as it went.
 * Compiling marks each interior node PG_F_REPLAYED, so a .data or .grad
 * read asks only for those nodes.  The list of programs and the settling
 * are the binding's, under the GIL; a run, without it, writes its own flat
 * and these counters.  A settle while another thread runs a program reads
 * that program's arrays as the run writes them (a mix of two runs, as an
 * eager write-back showed mid-run): the run marks them pending again as it
 * ends, and the next settle writes the whole run.
 */
_Atomic int pg_replay_any_pending;
static _Atomic uint64_t run_clock;
static flat *listed;
enum { PENDING_DATA = 1, PENDING_GRAD = 2 };

static void ran(flat *f, int what) {
    if (!f->defer) return;
    atomic_store(&f->stamp[what == PENDING_GRAD], atomic_fetch_add(&run_clock, 1));
    atomic_fetch_or(&f->pending, what);
    atomic_store(&pg_replay_any_pending, 1);
}

static void write_back_now(flat *f, int what) {
    const write_back *w = f->back;
    for (size_t i = 0, n = f->nsteps; i < n; i++) {
        if (i + PG_FETCH_AHEAD < n) {
            const write_back *ahead = &w[i + PG_FETCH_AHEAD];
            PG_PREFETCH(ahead->node);
            PG_PREFETCH(&f->d[ahead->slot]);
            PG_PREFETCH(&f->gout[ahead->step]);
        }
        if (what & PENDING_DATA) w[i].node->data = f->d[w[i].slot];
        if (what & PENDING_GRAD) w[i].node->grad = f->gout[w[i].step];
    }
    /* A `-` or `/` node's hidden grad (micrograd's b * -1 or b ** -1, ops.c)
     * as a fresh graph's backward leaves it: so an eager backward() after
     * a replayed one adds to what micrograd's would. */
    for (size_t i = 0; (what & PENDING_GRAD) && i < f->nhidden; i++)
        f->hidden[i].node->aux.k = -0.0 + f->gout[f->hidden[i].step];
}

/* A program's pending numbers of one kind (PENDING_DATA or _GRAD), and
 * when the run that made them ended. */
typedef struct pending_run {
    flat *f;
    int what;
    uint64_t when;
} pending_run;

static void consider(pending_run *first, pending_run *second, flat *f, int what) {
    pending_run r = {f, what, atomic_load(&f->stamp[what == PENDING_GRAD])};
    if (first->f == NULL || r.when < first->when) {
        *second = *first;
        *first = r;
    } else if (second->f == NULL || r.when < second->when) {
        *second = r;
    }
}

void pg_replay_settle(void) {
    if (!atomic_exchange(&pg_replay_any_pending, 0)) return;
    for (;;) {       /* the oldest pending run first: usually one program's two */
        pending_run first = {NULL, 0, 0}, second = {NULL, 0, 0};
        for (flat *f = listed; f != NULL; f = f->next) {
            int pending = atomic_load(&f->pending);
            if (pending & PENDING_DATA) consider(&first, &second, f, PENDING_DATA);
            if (pending & PENDING_GRAD) consider(&first, &second, f, PENDING_GRAD);
        }
        if (first.f == NULL) return;
        /* one pass for both kinds where no other run came between them */
        int what = first.what | (second.f == first.f ? second.what : 0);
        /* (taken before the numbers are read: a run that ends meanwhile
         * marks them again, for the next settle) */
        write_back_now(first.f, atomic_fetch_and(&first.f->pending, ~what) & what);
    }
}

void pg_replay_enlist(pg_program *p) {
    flat *f = p != NULL ? p->impl : NULL;
    if (f == NULL || f->is_listed) return;
    for (size_t i = 0; i < f->nsteps; i++) f->back[i].node->flags |= PG_F_REPLAYED;
    f->next = listed;
    f->prev = NULL;
    if (listed != NULL) listed->prev = f;
    listed = f;
    f->is_listed = 1;
}

void pg_replay_unlist(pg_program *p) {
    flat *f = p != NULL ? p->impl : NULL;
    if (f == NULL || !f->is_listed) return;
    pg_replay_settle();
    if (f->prev != NULL) f->prev->next = f->next;
    else listed = f->next;
    if (f->next != NULL) f->next->prev = f->prev;
    f->prev = f->next = NULL;
    f->is_listed = 0;
}

_Atomic unsigned pg_forks;

void pg_replay_after_fork(void) { atomic_fetch_add(&pg_forks, 1u); }

/* Whether this thread's last pg_program_forward was refused (a NaN). */
static _Thread_local int refused;

int pg_program_refused(void) {
    int r = refused;
    refused = 0;
    return r;
}

/* Marks f's run of what it makes (PENDING_DATA, _GRAD) begun (0:
 * another thread's goes on).  A run that a fork cut short left grads in g:
 * they go back to 0, as between runs, and the kind of numbers it was
 * making is not written back (half made); the other kind, an earlier
 * run's, still is. */
static int run_begin(flat *f, int what) {
    int r = pg_run_begin(&f->running);
    if (r == PG_RUN_CUT_SHORT) {
        for (size_t s = 0; s < f->n; s++) f->g[2 * s] = 0.0;
        atomic_fetch_and(&f->pending, ~f->making);
    }
    if (r == PG_RUN_BUSY) return 0;
    f->making = what;
    pg_test_run_begun();
    return 1;
}

/* The runs themselves, f's run mark held. */
static double forward_run(flat *f) {
    read_leaves(f);
    pg_steps_forward(&f->run, f->d);
    if (f->defer && f->root_node != NULL) f->root_node->data = f->d[f->root];
    ran(f, PENDING_DATA);
    return f->d[f->root];
}

static void backward_run(flat *f);

/* (A released program runs nothing: Python refuses it first, replay.py's
 * alive.) */
double pg_program_forward(pg_program *p) {
    flat *f = p != NULL ? p->impl : NULL;
    if (f == NULL) return 0.0 / 0.0;
    if (!run_begin(f, PENDING_DATA)) {
        refused = 1;
        return 0.0 / 0.0;
    }
    double out = forward_run(f);
    pg_run_end(&f->running);
    return out;
}

int32_t pg_program_backward(pg_program *p) {
    flat *f = p != NULL ? p->impl : NULL;
    if (f == NULL) return PG_E_ARG;
    if (pg_rules_changed(&f->watch)) return PG_E_SWEEP;
    if (!run_begin(f, PENDING_GRAD)) return PG_E_BUSY;
    backward_run(f);
    pg_run_end(&f->running);
    return 0;
}

int32_t pg_program_run_onehot(pg_program *p, pg_node *const *inputs, size_t n,
                              const uint32_t *ids, size_t nids, uint32_t vocab, int backward,
                              double *loss) {
    flat *f = p != NULL ? p->impl : NULL;
    if (f == NULL || vocab == 0 || nids != n / vocab || n % vocab != 0 || loss == NULL)
        return PG_E_ARG;
    for (size_t i = 0; i < nids; i++)
        if (ids[i] >= vocab) return PG_E_ARG;
    if (backward && pg_rules_changed(&f->watch)) return PG_E_SWEEP;
    if (!run_begin(f, backward ? PENDING_DATA | PENDING_GRAD : PENDING_DATA)) return PG_E_BUSY;
    for (size_t i = 0; i < n; i++) inputs[i]->data = 0.0;
    for (size_t i = 0; i < nids; i++) inputs[i * vocab + ids[i]]->data = 1.0;
    *loss = forward_run(f);
    if (backward) backward_run(f);
    pg_run_end(&f->running);
    return 0;
}

static void backward_run(flat *f) {
    /* Under the sweep lock: the leaves' grads read, added to and written
     * back as one step, as a backward() of the same nodes is. */
    pg_sweep_hold();
    /* The leaves' current data, as node rules would read, and grads. */
    for (size_t j = 0; j < f->nleaves; j++) {
        fetch_leaf(f, j);
        const pg_node *leaf = f->leaf_node[j];
        f->d[f->leaf[j]] = leaf->data;
        f->g[f->leaf[j]] = leaf->grad;
    }
    f->g[f->root] = 1.0;
    pg_steps_backward(&f->run, f->d, f->g);
    for (size_t j = 0; j < f->nleaves; j++) {
        fetch_leaf(f, j);
        f->leaf_node[j]->grad = f->g[f->leaf[j]];
        f->g[f->leaf[j]] = 0.0;
    }
    if (f->defer && f->root_node != NULL) f->root_node->grad = f->gout[f->nsteps - 1];
    pg_sweep_unhold();
    ran(f, PENDING_GRAD);
}

int pg_program_rules_changed(pg_program *p) {
    flat *f = p != NULL ? p->impl : NULL;
    return f != NULL && pg_rules_changed(&f->watch);
}

uint32_t pg_program_size(const pg_program *p) { return (uint32_t)p->n; }

int pg_program_alive(const pg_program *p) { return p != NULL && p->impl != NULL; }

static int by_address(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)*(pg_node *const *)a, y = (uintptr_t)*(pg_node *const *)b;
    return (x > y) - (x < y);
}

int64_t pg_program_foreign_leaves(const pg_program *p, int flags, pg_node *const *known,
                                  uint32_t nknown) {
    const flat *f = p != NULL ? p->impl : NULL;
    if (f == NULL || (nknown > 0 && known == NULL)) return PG_E_ARG;
    pg_node **sorted = pg_malloc(((size_t)nknown + 1) * sizeof *sorted);
    if (sorted == NULL) return PG_E_NOMEM;
    if (nknown > 0) memcpy(sorted, known, (size_t)nknown * sizeof *sorted);
    qsort(sorted, nknown, sizeof *sorted, by_address);
    int64_t n = 0;
    for (size_t j = 0; j < f->nleaves; j++) {
        pg_node *leaf = f->leaf_node[j];
        if ((leaf->flags & flags) && bsearch(&leaf, sorted, nknown, sizeof *sorted, by_address) == NULL)
            n++;
    }
    free(sorted);
    return n;
}

void pg_program_write_back(pg_program *p, int on) {
    flat *f = p != NULL ? p->impl : NULL;
    if (f != NULL) f->defer = on;
}

static int is_listed(const pg_program *p) {
    return p->impl != NULL && ((const flat *)p->impl)->is_listed;
}

/* (A listed program is the binding's to unlist first, under the GIL: it
 * is left as it is.) */
void pg_program_clear(pg_program *p) {
    if (p == NULL || is_listed(p)) return;
    flat_free(p->impl);
    p->impl = NULL;
    p->n = 0;
}
