/*
 * Compiled programs (replay.c, batch.c): a graph laid out flat (layout.c:
 * backward()'s order, children first; batched programs by level), one slot
 * per node, numbers in arrays.
 *
 * Row rules: one op applied across the rows of a batch (Program.map), in
 * structure-of-arrays form.  Steps: one op of a one-row program
 * (Program.forward / backward).  Both are made in ops.c from the same
 * expressions as the node rules, so their numbers are the node rules',
 * bit for bit.
 */
#ifndef PG_PROGRAM_H
#define PG_PROGRAM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include "node.h"

/*
 * A run's mark: one run of a compiled program or batch at a time, kept by
 * C itself (Python's CallLock keeps runs apart too, but a caller may have
 * rebound it).  0 while idle, else (forks << 1) | 1 for the fork count
 * the run began under: a forked child's count differs, so a run that a
 * thread the child does not have left marked is taken over (its arrays
 * made good again by the caller: PG_RUN_CUT_SHORT), never waited for.
 */
extern _Atomic unsigned pg_forks;      /* replay.c; pg_replay_after_fork */
enum { PG_RUN_BUSY, PG_RUN_BEGUN, PG_RUN_CUT_SHORT };
static inline int pg_run_begin(_Atomic unsigned *mark) {
    unsigned mine = (atomic_load(&pg_forks) << 1) | 1u, seen = 0;
    if (atomic_compare_exchange_strong(mark, &seen, mine)) return PG_RUN_BEGUN;
    if (seen != mine && atomic_compare_exchange_strong(mark, &seen, mine)) return PG_RUN_CUT_SHORT;
    return PG_RUN_BUSY;
}
static inline void pg_run_end(_Atomic unsigned *mark) { atomic_store(mark, 0u); }

typedef struct pg_rows {
    size_t n;               /* rows */
    double k;               /* the node's constant (POWK's exponent) */
    uint32_t nk;            /* children */
    int variant;            /* the node's variant (LINEAR's activation, bias bit) */
    double *y;              /* the output, per row */
    const double *gy;       /* its grad, per row */
    const double *const *x; /* each child's data: per row, or one shared value */
    const size_t *xs;       /* each child's stride: 1 per row, 0 shared */
    double *const *gx;      /* each child's grad: per row, or one sum over rows */
    const size_t *gxs;      /* each child's grad stride: 1 per row, 0 one sum */
    double *tmp;            /* n doubles of scratch */
} pg_rows;

typedef struct pg_row_rule {
    void (*forward)(const pg_rows *r);
    void (*backward)(const pg_rows *r);
} pg_row_rule;

extern const pg_row_rule pg_row_rules[PG_OP_COUNT];

/* One node of a one-row program: d[s] = op(d[a], d[b]), slots as indices
 * into the program's array.  A unary op's b is its own slot s; POWK's b is
 * a constant slot holding its exponent; an n-ary op (LINEAR, SUM,
 * LOGSUMEXP) runs its row rule on rows[a] (n = 1). */
typedef struct pg_step {
    uint32_t s, a, b;
    uint8_t op;
    uint8_t fast;             /* pg_step_fast_kind(op) */
} pg_step;

/* The cheap ops run by selection instead of a jump (ops.c). */
enum { PG_FAST_ADD, PG_FAST_MUL, PG_FAST_SUB, PG_FAST_NEG, PG_FAST_RELU, PG_FAST_NONE };
int pg_step_fast_kind(int op);

typedef struct pg_steps {
    size_t n;
    const pg_step *step;      /* in topological order */
    pg_node *const *node;     /* each step's node, written back in the sweep; NULL: none */
    double *gout;             /* backward: each step's grad, by step; NULL: none */
    const pg_rows *rows;      /* the n-ary steps' arguments */
    int fetch_ahead;          /* operands often far away: prefetch them */
    /* NULL: backward runs every step, last first.  Else it runs these
     * (norder step indices, in order): those a gradient reaches, in
     * backward()'s order (a graph with a detached_max: pg_layout). */
    const uint32_t *order;
    size_t norder;
} pg_steps;

/* Every step in order, writing each node's data back if node is set.
 * Backward runs them in reverse (or as `order` says) from g (the root's grad set, every other
 * interior grad 0), leaves each step's own g slot at 0 again, and writes
 * step i's grad to its node if node is set, to gout[i] if gout is (for a
 * write-back after the sweep, in the nodes' address order: replay.c). */
void pg_steps_forward(const pg_steps *p, double *d);
void pg_steps_backward(const pg_steps *p, const double *d, double *g);

/* A node a program reads as given data: a leaf, or a Python-made node
 * without children. */
static inline int pg_program_leaf(const pg_node *n) {
    if (n->flags & PG_F_PY_BACKWARD) return 0;     /* a hook on a leaf: Python's */
    return n->op == PG_OP_LEAF || (n->op == PG_OP_CUSTOM && n->c.list.n == 0);
}

/* Can a program recompute it in C?  Not if its value or gradient lives in
 * Python (a closure, a Function's captured partials, a Python-made node
 * over children). */
static inline int pg_program_runs(const pg_node *n) {
    if (n->flags & PG_F_PY_BACKWARD) return 0;
    if (n->op == PG_OP_FUNCTION) return 0;
    return n->op != PG_OP_CUSTOM || n->c.list.n == 0;
}

/* How many steps (or leaves) ahead the sweeps fetch what they will read
 * from scattered memory, so that the cache misses overlap. */
#define PG_FETCH_AHEAD 16

/* Ask for the cache line at p, to be written soon: the sweeps' prefetch.
 * Only a hint, so nothing where the compiler has no such builtin (MSVC). */
#if defined(__GNUC__) || defined(__clang__)
#define PG_PREFETCH(p) __builtin_prefetch((p), 1)
#else
#define PG_PREFETCH(p) ((void)(p))
#endif

/* The loops across rows are also built for AVX2 on x86-64 Linux and picked
 * at load time: the same IEEE operations, four doubles at a time (no FMA,
 * which AVX2 does not imply, and -ffp-contract=off holds). */
/* (target_clones needs ifunc: glibc has it, musl does not.) */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && \
    !defined(__SANITIZE_ADDRESS__)
#define ROW_LOOP __attribute__((target_clones("avx2", "default")))
/* Whole layers (layer.c) also have AVX-512 kernels, picked at run time. */
#define PG_AVX512 1
#else
#define ROW_LOOP
#define PG_AVX512 0
#endif

/* Rows a layer computes for n rows: n rounded up to a vector of eight (a
 * slot's padding, SLOT_PAD in batch.c, holds the rows past n). */
#define PG_ROWS_ROUNDED(n) (((n) + 7) & ~(size_t)7)

/* A layer across rows (layer.c): m neurons, consecutive LINEAR slots of one
 * variant over the same nin per-row inputs (distinct), each weight and bias
 * a parameter used nowhere else.  batch.c finds them and gathers their
 * parameters into w and bias, and their grads' sums into gw and gb, around
 * each run. */
#if defined(__GNUC__) || defined(__clang__)
#define PG_LAYERS 1
#else
#define PG_LAYERS 0
#endif
typedef struct pg_layer {
    uint32_t s0, m, nin;      /* first slot, neurons, inputs */
    uint32_t lanes;           /* m rounded up to a multiple of 8 */
    int variant;              /* LINEAR's: activation | PG_LINEAR_BIAS */
    size_t stride;            /* doubles from one slot's rows to the next's */
    double *y, *gy;           /* neuron i's rows: y + i * stride, and their grads */
    const double **x;         /* nin: each input's rows */
    double **gx;              /* nin: each input's row grads; NULL where no one reads them */
    double *w;                /* lanes x nin weights, neuron-major (neurons past m: 0) */
    double *bias;             /* lanes */
    double *gw;               /* nin x lanes weights' grad sums, input-major */
    double *gb;               /* lanes */
    uint32_t *w_leaf, *b_leaf;  /* each weight's (m x nin) and bias's (m) shared leaf in batch.c */
} pg_layer;
typedef struct pg_layer_scratch {
    double *g;                /* lanes x stride: act'(y) gy, rows inner (rows past m: 0) */
    double *gt;               /* stride x lanes: the same, rows outer */
    double *dump;             /* stride: where the neurons past m write */
    double *ones;             /* stride ones: the bias's "input" */
} pg_layer_scratch;
/* n rows (rows up to PG_ROWS_ROUNDED(n) may be computed too: a slot's
 * padding). */
void pg_layer_forward(const pg_layer *L, size_t n, double *dump);
void pg_layer_backward(const pg_layer *L, size_t n, const pg_layer_scratch *s);

/* calloc of count elements (at least one, so NULL means out of memory),
 * into ptr; true when it worked. */
#define PG_ALLOC(ptr, count) \
    (((ptr) = pg_calloc((size_t)(count) > 0 ? (size_t)(count) : 1, sizeof *(ptr))) != NULL)

/*
 * The one compiler front of both kinds of program (layout.c): the graph
 * below the roots laid out in a topological order, children first, one slot per
 * node, each interior node's children named by slot.  replay.c and batch.c
 * each build their own storage from it.
 */
typedef struct pg_slot_of {
    pg_node *node;
    uint32_t slot;
} pg_slot_of;
typedef struct pg_layout {
    uint32_t n;               /* slots */
    uint32_t nleaves;         /* slots a program reads as data (pg_program_leaf) */
    size_t nedges;
    pg_node **node;           /* per slot: its node */
    uint8_t *leaf;            /* per slot: 1 for a leaf */
    size_t *first_edge;       /* per slot, and one past: slot s's children are */
    uint32_t *kid;            /* kid[first_edge[s] .. first_edge[s + 1]), as slots */
    pg_slot_of *by_node;      /* node -> slot: a hash table of cap entries (node NULL: free) */
    size_t cap;
    /* With a detached_max node (PG_OP_MAX) among them, else NULL and 0:
     * the interior slots a gradient reaches, in backward()'s order
     * (parents first: node.h, pg_record_order), and per slot 1 for an
     * interior node below a detached_max only, which forward runs and
     * backward skips. */
    uint32_t *graded, ngraded;
    uint8_t *detached;
} pg_layout;
/* Lay out the graph below roots[0..nroots), leaves first, then in
 * backward()'s order, or with `levels` level by level (layout.c).
 * PG_E_ARG with *bad set if a node can't run in C (pg_program_runs);
 * PG_E_NOMEM.  On error nothing is left to free. */
int32_t pg_lay_out(pg_node *const *roots, uint32_t nroots, pg_layout *L, pg_node **bad,
                   int levels);
void pg_layout_free(pg_layout *L);
/* node's slot, or UINT32_MAX if it is not in the program. */
uint32_t pg_layout_slot(const pg_layout *L, const pg_node *node);

/* A program runs C's gradient rule for every node it was compiled over; a
 * _backward set in Python on one of them afterwards (pg_set_py_backward)
 * would be skipped, a silently wrong grad.  Every such set is counted
 * (pg_py_rules_now); a program keeps its nodes and the count it last
 * checked, and before a backward looks at its nodes again only if the
 * count moved (one load on the common path). */
typedef struct pg_rule_watch {
    pg_node **node;
    uint32_t n;
    uint64_t seen;
} pg_rule_watch;
/* How many node rules have become Python's in this process. */
uint64_t pg_py_rules_now(void);
/* Watch L's nodes, taking its node array (L stays fit only to be freed);
 * seen is pg_py_rules_now() from before L was laid out. */
void pg_rule_watch_take(pg_rule_watch *w, pg_layout *L, uint64_t seen);
void pg_rule_watch_free(pg_rule_watch *w);
/* 1 if a watched node's backward has become Python's, else 0. */
int pg_rules_changed(pg_rule_watch *w);

#endif
