/*
 * pygrad's public C API: the only header Python's cffi layer sees.
 *
 * A node is named by a handle, a small integer (segment id << PG_SEG_BITS |
 * offset) that stays below 2^30 so that cffi converts it on its fast path;
 * PG_MAX_SEGS segments fill that handle space.
 * Functions that create nodes return the new handle, or a negative PG_E_*
 * code.  Nothing here aborts, exits or prints.
 *
 * Thread safety: every function may be called from any thread, with the
 * GIL or without it (the module keeps it for short calls and lets it go
 * for long ones: csrc/cffi_build.py).  Graph structure and lifetime are
 * guarded by one internal lock; reading and writing data/grad of a node is
 * not locked, so two threads writing the same node race exactly as Python
 * floats would.
 */
#ifndef PYGRAD_H
#define PYGRAD_H

#include <stddef.h>
#include <stdint.h>

#define PG_OP(code, name, arity, methods, act, doc) PG_OP_##code,
enum pg_op { 
#include "ops.def"
    PG_OP_COUNT
};
#undef PG_OP

/* cdef-begin: everything up to cdef-end is read by csrc/cffi_build.py */

#define PG_SEG_BITS 12
#define PG_SEG_NODES 4096
#define PG_MAX_SEGS 262144

/* Error codes.  PG_E_SWEEP: backward() needs a sweep (see below). */
#define PG_E_NOMEM -2
#define PG_E_ARG -3
#define PG_E_SPACE -4
#define PG_E_SWEEP -5

/* LINEAR's variant: activation (the PG_ACT_MASK bits) | PG_LINEAR_BIAS. */
#define PG_ACT_MASK 3
#define PG_ACT_NONE 0
#define PG_ACT_RELU 1
#define PG_ACT_TANH 2
#define PG_ACT_SIGMOID 3
#define PG_LINEAR_BIAS 4

/* Node flags visible to Python.  PY_HELD: a Python-defined node (a custom
 * op), or one with such a node below it (backward() then records first). */
#define PG_F_INT_EXPONENT 1
#define PG_F_PY_BACKWARD 2
#define PG_F_PY_HELD 4

/* Lifetime (memory.c has the design).  A claim is Python's hold on the
 * nodes h .. h + n - 1: pg_claim_new makes an empty one (NULL when out of
 * memory), Python owns it with ffi.gc(claim, pg_claim_drop), and a creator
 * (or pg_hold) fills it.  pg_claim_drop releases its nodes and the claim. */
typedef struct pg_claim {
    uint32_t h;
    uint32_t n;
    void *slab;
} pg_claim;
pg_claim *pg_claim_new(void);
void pg_claim_drop(pg_claim *c);
/* The empty claim c takes live node h: 0, PG_E_ARG (no such node, or c
 * not empty), or PG_E_NOMEM (c is NULL: pg_claim_new failed). */
int32_t pg_hold(pg_claim *c, uint32_t h);
/* 1 if h names a live node, else 0. */
int32_t pg_alive(uint32_t h);
/* Free slots left in the calling thread's segment (0: none open); close
 * it (its next node opens a new one).  For tests. */
uint32_t pg_room_left(void);
void pg_close_current(void);

/* Node creation, in the calling thread's segment: the new handle h, or a
 * PG_E_* (nothing made).  Each creator takes an empty claim c first, which
 * the new node (a run's nodes) is born held by: PG_E_NOMEM when c is NULL,
 * PG_E_ARG when it is not empty.  Each op also has entry points of its
 * own, which pass no op code: see the end of this header. */
int32_t pg_leaf(pg_claim *c, double data);
int32_t pg_unary(pg_claim *c, int op, uint32_t a);
int32_t pg_binary(pg_claim *c, int op, uint32_t a, uint32_t b);
int32_t pg_binary_k(pg_claim *c, int op, uint32_t a, double k, int k_first);
int32_t pg_powk(pg_claim *c, uint32_t a, double k, int k_is_int);
/* A Python-defined node (a custom op; PY_HELD); pg_custom1 for one child. */
int32_t pg_custom(pg_claim *c, double data, const uint32_t *kids, uint32_t n);
int32_t pg_custom1(pg_claim *c, double data, uint32_t kid);
/* An n-ary node (LINEAR, SUM, LOGSUMEXP) over kids[0..n). */
int32_t pg_nary(pg_claim *c, int op, int variant, const uint32_t *kids, uint32_t n);
/* A layer of nout LINEAR nodes sharing inputs x[0..nin): neuron j's
 * parameters are params[j*(nin+1) ..] = b, w0, ..., w(nin-1).  The nodes
 * are consecutive handles, all held by c; returns the first. */
int32_t pg_linear_layer(pg_claim *c, int act, const uint32_t *params, const uint32_t *x, uint32_t nin,
                        uint32_t nout);
/* The layers of an MLP in one call: layer l has sizes[l] inputs and
 * sizes[l + 1] neurons, parameters params[l] (as pg_linear_layer's) and
 * activation acts[l]; layer 0 reads x[0..sizes[0]), each next layer the
 * one before.  Every layer's nodes are consecutive handles in one
 * segment; returns the last layer's first handle (c holds the last
 * layer's nodes, which hold the rest), or a PG_E_* (nothing made). */
int32_t pg_mlp(pg_claim *c, uint32_t nlayers, const int *acts, const uint32_t *const *params,
               const uint32_t *sizes, const uint32_t *x);
/* n leaves (data.to_values): consecutive handles held by c, returns the first. */
int32_t pg_leaves(pg_claim *c, const double *data, uint32_t n);
/* A user-defined op (pygrad.Function): value `data`, and the partial
 * derivative of it by each child, captured at forward time. */
int32_t pg_function(pg_claim *c, double data, const uint32_t *kids, const double *partials, uint32_t n);

/* Bulk access, one call for many nodes (parameters). */
void pg_gather_data(const uint32_t *h, uint32_t n, double *out);
void pg_gather_grad(const uint32_t *h, uint32_t n, double *out);
void pg_scatter_data(const uint32_t *h, uint32_t n, const double *in);
void pg_fill_grad(const uint32_t *h, uint32_t n, double v);

/* Optimizer steps over n parameters (pygrad.optim documents the maths).
 * Each state array comes with its length: PG_E_ARG, and nothing changed, if
 * one is shorter than n.  A step that ran adds 1 to *steps (the
 * optimizer's step count, a double: exact to 2**53). */
int32_t pg_sgd_step(const uint32_t *h, uint32_t n, double lr, double momentum,
                    double weight_decay, double *velocity, size_t nvelocity, double *steps);
int32_t pg_adam_step(const uint32_t *h, uint32_t n, double lr, double beta1, double beta2,
                     double eps, double weight_decay, double bias1, double bias2,
                     double *m, size_t nm, double *v, size_t nv, double *steps);

/* Node fields. */
double pg_data(uint32_t h);
void pg_set_data(uint32_t h, double v);
double pg_grad(uint32_t h);
void pg_set_grad(uint32_t h, double v);
/* Where node h keeps its data and grad, side by side (NULL: no such node).
 * Nodes never move, so a Value that holds its node may keep the address. */
double *pg_numbers(uint32_t h);
int pg_op(uint32_t h);
/* op | flags << 8, in one call (node h is live: its Value holds it). */
int64_t pg_describe(uint32_t h);
int pg_flags(uint32_t h);
int pg_variant(uint32_t h);
double pg_exponent(uint32_t h);
uint32_t pg_nkids(uint32_t h);
/* Test hook: a `-` or `/` node's hidden grad (ops.c) back to what a new
 * node has; nothing for other ops. */
void pg_zero_hidden(uint32_t h);
/* Node h's children, at most two, in one int: n | kid0 << 2 | kid1 << 32
 * (handles are below 2^30); -n when it has n > 2 (then use pg_kids). */
int64_t pg_kid_pair(uint32_t h);
/* Node h's children: copies up to cap of them to out, returns how many it has. */
uint32_t pg_kids(uint32_t h, uint32_t *out, uint32_t cap);
const char *pg_op_name(int op);

/* The op table (csrc/ops.def), row by row: pg_op_info(op) for op in
 * [0, PG_OP_COUNT), NULL otherwise.  pygrad/_ops.py reads it. */
typedef struct pg_op_desc {
    const char *code;      /* "ADD" */
    const char *name;      /* the node's _op: "+" */
    int arity;
    const char *methods;   /* "__sub__ ~__rsub__" */
    int act;               /* PG_ACT_* when it may be a fused activation, else 0 */
    const char *doc;       /* docstrings, |-separated */
} pg_op_desc;
const pg_op_desc *pg_op_info(int op);

/* Node h's backward is a Python closure. */
int pg_set_py_backward(uint32_t h);

/* Backward.  Returns 0 when done, h + 1 when node h needs its Python
 * backward run (then call pg_backward_resume), or a negative PG_E_*:
 * PG_E_SWEEP asks for a sweep (sweep was NULL and a Python backward may be
 * met), before anything changed.  With a sweep, the grads it will touch
 * are saved first; pg_sweep_restore puts them back unless pg_sweep_keep
 * was called (once the sweep has run to its end).  The sweep is Python's,
 * zeroed, and released by pg_sweep_clear (ffi.gc). */
typedef struct pg_sweep {
    uint32_t *order;       /* the recorded walk, parents first */
    double *saved;         /* each recorded node's grad and aux, before */
    size_t n, cap, pos;
    int done;
} pg_sweep;
int32_t pg_backward(uint32_t root, pg_sweep *sweep);
int32_t pg_backward_resume(pg_sweep *sweep);
void pg_sweep_restore(pg_sweep *sweep);
void pg_sweep_keep(pg_sweep *sweep);
void pg_sweep_clear(pg_sweep *sweep);
void pg_node_backward(uint32_t h);

/* Replay: a graph compiled once, re-run forward and backward in C.  The
 * program is Python's, zeroed, and released by pg_program_clear. */
typedef struct pg_program {
    void *impl;            /* the flat program (replay.c) */
    size_t n;              /* its nodes */
} pg_program;
int32_t pg_compile(uint32_t root, pg_program *p, uint32_t *bad_node);
double pg_program_forward(pg_program *p);
void pg_program_backward(pg_program *p);
uint32_t pg_program_size(const pg_program *p);
void pg_program_clear(pg_program *p);

/* Batched replay (Program.map; csrc/batch.c): the graph below the outputs,
 * run over n rows of data for the input leaves (row-major, n x ninputs),
 * writing n x nout outputs; with w (n x nout), the other leaves' grads
 * accumulate sum_r w[r] . d out_r / d leaf, in the order batch.c states.
 * compile returns PG_E_ARG with *bad set to a node that can't run in C or
 * an input that is no leaf (0: no such node).  The batch is Python's,
 * zeroed, and released by pg_batch_clear. */
typedef struct pg_batch {
    void *impl;
} pg_batch;
int32_t pg_batch_compile(const uint32_t *outputs, uint32_t nout, const uint32_t *inputs,
                         uint32_t ninputs, pg_batch *b, uint32_t *bad);
int32_t pg_batch_run(pg_batch *b, const double *rows, size_t n, double *out, const double *w,
                     uint32_t threads);
/* The rows of one chunk: sums over rows run chunk by chunk (batch.c), and a
 * run splits its chunks between up to `threads` threads (PG_E_ARG for 0);
 * every thread count gives the same bits. */
#define PG_CHUNK_ROWS 256
/* An optimizer's step over params[0..n) (pg_sgd_step, pg_adam_step), for
 * pg_batch_step: s1 is SGD's velocity or Adam's m, s2 Adam's v, each with
 * its length; *steps counts the steps. */
#define PG_OPT_SGD 1
#define PG_OPT_ADAM 2
typedef struct pg_optimizer {
    int32_t kind;
    uint32_t n;
    const uint32_t *params;
    double lr, momentum, beta1, beta2, eps, weight_decay, bias1, bias2;
    double *s1;
    size_t ns1;
    double *s2;
    size_t ns2;
    double *steps;
} pg_optimizer;
/* One training step in one call: the optimizer's parameters' grads set to
 * 0, pg_batch_run with the weights w, then the optimizer's step: the same
 * bits as the three calls.  PG_E_ARG (nothing changed) for no program, no
 * w, an unknown kind or state arrays shorter than n; PG_E_NOMEM. */
int32_t pg_batch_step(pg_batch *b, const double *rows, size_t n, double *out, const double *w,
                      uint32_t threads, const pg_optimizer *opt);
uint32_t pg_batch_slots(const pg_batch *b);
/* How many whole layers run as one unit each (batch.c, layer.c); -1 in a
 * build without the layer kernels (a compiler without vector extensions). */
int32_t pg_batch_layers(const pg_batch *b);
void pg_batch_clear(pg_batch *b);

/* Segment mappings the OS refused to take back (kept pooled instead), and
 * madvise(MADV_DONTNEED) calls it declined (those pages stay resident). */
uint32_t pg_unmap_failed(void);
uint32_t pg_advice_refused(void);

/* The fault-injection hooks are in test_hooks.h: only a test build has them. */

/* Accounting, for tests and benchmarks. */
uint64_t pg_live_nodes(void);
uint32_t pg_live_segments(void);
/* Segments opened so far. */
uint64_t pg_segment_births(void);
uint32_t pg_node_size(void);

/* cdef-end */

/*
 * Per-op entry points: the calls Python makes most, with as few arguments
 * as possible (each one costs cffi a conversion).  For each row CODE of
 * ops.def:
 *   pg_binary_CODE(c, a, b)    a op b                  (pg_binary)
 *   pg_binary_k_CODE(c, a, k)  a op k, k a new leaf    (pg_binary_k)
 *   pg_binary_rk_CODE(c, k, a) k op a, k a new leaf
 *   pg_unary_CODE(c, a)        op a                    (pg_unary)
 * and for x ** number, pg_powk_float / pg_powk_int (pg_powk with
 * k_is_int 0 / 1).  They are static inline so that a row's forms can be
 * generated without the preprocessor knowing its arity: only the forms
 * that fit it are declared to cffi (pygrad/_build.py) and so compiled; a
 * form that does not fit would return PG_E_ARG from the generic creator.
 */
#define PG_OP(code, name, arity, methods, act, doc) \
    static inline int32_t pg_binary_##code(pg_claim *c, uint32_t a, uint32_t b) { \
        return pg_binary(c, PG_OP_##code, a, b); \
    } \
    static inline int32_t pg_binary_k_##code(pg_claim *c, uint32_t a, double k) { \
        return pg_binary_k(c, PG_OP_##code, a, k, 0); \
    } \
    static inline int32_t pg_binary_rk_##code(pg_claim *c, double k, uint32_t a) { \
        return pg_binary_k(c, PG_OP_##code, a, k, 1); \
    } \
    static inline int32_t pg_unary_##code(pg_claim *c, uint32_t a) { \
        return pg_unary(c, PG_OP_##code, a); \
    }
#include "ops.def"
#undef PG_OP

static inline int32_t pg_powk_float(pg_claim *c, uint32_t a, double k) {
    return pg_powk(c, a, k, 0);
}
static inline int32_t pg_powk_int(pg_claim *c, uint32_t a, double k) {
    return pg_powk(c, a, k, 1);
}

#endif
