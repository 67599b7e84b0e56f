/*
 * pygrad's public C API: the only header Python's cffi layer sees.
 *
 * Lifetime is csrc/value_binding.h's (its five rules at its top): a node
 * lives in a node object of pygrad's own, which holds every node object
 * its nodes point to.  Every creator below writes new nodes into memory
 * the caller passes (the binding: a new node object's) and links them to
 * children by raw pointer; the caller holds the children as long as the
 * new nodes.  So a call that is given a node may walk everything below it
 * for as long as the caller holds it.
 *
 * Functions that create nodes return 0, or a negative PG_E_* (nothing
 * made).  Nothing here aborts, exits or prints.
 *
 * Thread safety: every function may be called from any thread, with the
 * GIL or without it (the module keeps it for short calls and lets it go
 * for long ones: csrc/cffi_build.py).  Creating a node touches only the
 * memory it is given.  A walk (backward, compile) takes the sweep lock,
 * because it marks the nodes it visits; reading and writing data/grad of
 * a node is not locked, so two threads writing the same node race exactly
 * as Python floats would.
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

/* A node (node.h has the rest of it).  48 bytes: enough to recompute the
 * forward value (op, children, constant) as well as to run the gradient
 * rule, so a graph can be replayed.  What backward()'s walk reads (the
 * children, mark and op) comes first, in 24 bytes: a node sits at any
 * 16-byte offset of a cache line, and so the walk mostly reads one line
 * of each node, not two. */
typedef struct pg_node {
    union {
        struct pg_node *kid[2]; /* a unary or binary node's children */
        struct {
            uint32_t n;         /* an n-ary node's child count */
            uint32_t unused;
            void *py;           /* CUSTOM: its Value, not held (the Value clears it), or NULL */
        } list;
    } c;
    uint32_t mark;              /* visited, during a walk under the sweep lock */
    uint8_t op;
    uint8_t flags;
    uint16_t variant;           /* op-specific: LINEAR's activation and bias bit */
    double data;
    double grad;
    union {
        double k;               /* POWK's exponent; SUB's and DIV's hidden grad (ops.c) */
        struct pg_node **kids;  /* an n-ary node's child list (caller's memory) */
    } aux;
} pg_node;

/* cdef-begin: everything up to cdef-end is read by csrc/cffi_build.py */

/* Error codes.  PG_E_SWEEP: backward() needs a sweep (see below). */
#define PG_E_NOMEM -2
#define PG_E_ARG -3
#define PG_E_SWEEP -5
#define PG_E_BUSY -8
/* pygrad.grad over a graph made from a token program's traced inputs. */
#define PG_E_TRACED -9

/* LINEAR's variant: activation (the PG_ACT_MASK bits) | PG_LINEAR_BIAS. */
#define PG_ACT_MASK 3
#define PG_ACT_NONE 0
#define PG_ACT_RELU 1
#define PG_ACT_TANH 2
#define PG_ACT_SIGMOID 3
#define PG_LINEAR_BIAS 4

/* Node flags visible to Python.  PY_BACKWARD: the node's gradient is a
 * Python closure (a custom op, or a _backward set on a node later).
 * TRACED: the node is, or depends on, an input of a program being traced
 * (pygrad/token_programs.py): a node made over a TRACED child is TRACED,
 * and its number, which changes with every run, can't be read.
 * REPLAYED: an interior node of a compiled program, whose numbers a run
 * writes back later (replay.c: deferred write-back). */
#define PG_F_INT_EXPONENT 1
#define PG_F_PY_BACKWARD 2
#define PG_F_TRACED 4
#define PG_F_REPLAYED 8

/* Creators: each writes its new node(s) into `out` (the caller's memory:
 * one pg_node, or as many as it says) and returns 0, or PG_E_ARG (a NULL
 * child, a bad op or size: nothing written).  Each op also has entry
 * points of its own, which pass no op code: see the end of this header. */
int32_t pg_leaf(pg_node *out, double data);
int32_t pg_unary(pg_node *out, int op, pg_node *a);
int32_t pg_binary(pg_node *out, int op, pg_node *a, pg_node *b);
/* a op k (k_first 0) or k op a (1): out[0] is the op node, out[1] the leaf
 * holding k (micrograd wraps a number in a Value). */
int32_t pg_binary_k(pg_node *out, int op, pg_node *a, double k, int k_first);
int32_t pg_powk(pg_node *out, pg_node *a, double k, int k_is_int);
/* A Python-defined node (a custom op) over kids[0..n), which the node
 * keeps as its child list (the caller keeps the array alive, unchanged);
 * py is its Python handle, handed back by backward(). */
int32_t pg_custom(pg_node *out, double data, pg_node **kids, uint32_t n, void *py);
/* An n-ary node (LINEAR, SUM, LOGSUMEXP) over kids[0..n), kept as
 * pg_custom keeps them. */
int32_t pg_nary(pg_node *out, int op, int variant, pg_node **kids, uint32_t n);
/* A user-defined op (pygrad.Function): value `data`, and the partial
 * derivative of it by each child, captured at forward time; edges has
 * room for pg_function_words(n) words, and the node keeps it. */
int32_t pg_function(pg_node *out, double data, pg_node *const *kids, const double *partials,
                    uint32_t n, pg_node **edges);
size_t pg_function_words(uint32_t n);
/* A layer of nout LINEAR nodes out[0..nout) sharing inputs x[0..nin):
 * neuron j's parameters are params[j*(nin+1) ..] = b, w0, ..., w(nin-1).
 * edges has room for pg_layer_words(nin, nout) pointers. */
int32_t pg_linear_layer(pg_node *out, pg_node **edges, int act, pg_node *const *params,
                        pg_node *const *x, uint32_t nin, uint32_t nout);
size_t pg_layer_words(uint32_t nin, uint32_t nout);
/* The layers of an MLP in one call: layer l has sizes[l] inputs and
 * sizes[l + 1] neurons, parameters params[l] (as pg_linear_layer's) and
 * activation acts[l]; layer 0 reads x[0..sizes[0]), each next layer the
 * one before.  The layers' nodes follow each other in out, the last
 * layer's last; edges has room for the sum of the layers' words. */
int32_t pg_mlp(pg_node *out, pg_node **edges, uint32_t nlayers, const int *acts,
               pg_node *const *const *params, const uint32_t *sizes, pg_node *const *x);
/* n leaves out[0..n) (data.to_values). */
int32_t pg_leaves(pg_node *out, const double *data, uint32_t n);

/* Bulk access, one call for many nodes (parameters). */
void pg_gather_data(pg_node *const *p, uint32_t n, double *out);
void pg_gather_grad(pg_node *const *p, uint32_t n, double *out);
void pg_scatter_data(pg_node *const *p, uint32_t n, const double *in);
void pg_fill_grad(pg_node *const *p, uint32_t n, double v);

/* Optimizer steps over n parameters (pygrad.optim documents the maths).
 * Each state array comes with its length: PG_E_ARG, and nothing changed, if
 * one is shorter than n.  A step that ran adds 1 to *steps (the
 * optimizer's step count, a double: exact to 2**53). */
int32_t pg_sgd_step(pg_node *const *p, uint32_t n, double lr, double momentum,
                    double weight_decay, double *velocity, size_t nvelocity, double *steps);
int32_t pg_adam_step(pg_node *const *p, uint32_t n, double lr, double beta1, double beta2,
                     double eps, double weight_decay, double bias1, double bias2,
                     double *m, size_t nm, double *v, size_t nv, double *steps);

/* Node fields. */
double pg_data(const pg_node *n);
void pg_set_data(pg_node *n, double v);
double pg_grad(const pg_node *n);
void pg_set_grad(pg_node *n, double v);
int pg_op(const pg_node *n);
/* op | flags << 8, in one call. */
int64_t pg_describe(const pg_node *n);
int pg_flags(const pg_node *n);
int pg_variant(const pg_node *n);
double pg_exponent(const pg_node *n);
uint32_t pg_nkids(const pg_node *n);
/* Child i of n (NULL past the last). */
pg_node *pg_kid(const pg_node *n, uint32_t i);
/* A custom node's Python handle (pg_custom's py), else NULL. */
void *pg_py_handle(const pg_node *n);
/* n's local gradients (microgpt's _local_grads): out[i] is what n's rule
 * adds to child i's grad per unit of n's grad, in child order.  The count
 * of children, or PG_E_ARG for a node whose rule is Python's (a custom
 * op); nothing is written past out[cap), nothing of n or its children
 * changes. */
int32_t pg_local_grads(const pg_node *n, double *out, uint32_t cap);
/* Test hook: a `-` or `/` node's hidden grad (ops.c) back to what a new
 * node has; nothing for other ops. */
void pg_zero_hidden(pg_node *n);
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

/* Node n's backward is a Python closure from now on (a _backward set on a
 * node C made). */
void pg_set_py_backward(pg_node *n);
/* Mark leaf n TRACED (a traced program's input). */
void pg_set_traced(pg_node *n);

/* Backward from root.  The walk orders every node below the root (an
 * iterative depth-first walk, parents before children).  With no Python
 * closure among them, it runs every rule at once and returns 0.  Else it
 * needs a sweep (PG_E_SWEEP when sweep is NULL, before anything changed):
 * the order and every grad it will touch are saved in the sweep, and the
 * rules run until a node whose backward is Python's; it returns 1 with
 * that node in sweep->py, and pg_backward_resume goes on from it.
 * PG_E_TRACED, nothing done, if a node below is TRACED (its numbers are a
 * trace's).
 * The walk holds the sweep lock, the closures' sweep does not.  The
 * caller calls pg_sweep_restore last, whatever happened: it puts the
 * saved grads back unless pg_sweep_keep was called (once the sweep has run
 * to its end).  The sweep is Python's, zeroed, and released by the
 * binding's pg_sweep_release (ffi.gc), which restores and clears it, then
 * lets go of its hold on the nodes (csrc/value_binding.h). */
/* A sweep's, program's and batch's fields are C's: Python makes them
 * (ffi.new) and passes them, but cffi shows no field ("hidden from cffi":
 * csrc/cffi_build.py), so no write of Python's can point one elsewhere. */
typedef struct pg_sweep {
    pg_node **order;       /* the walk, parents first (hidden from cffi) */
    double *saved;         /* each node's grad and aux, before (hidden from cffi) */
    size_t n, pos;         /* (hidden from cffi) */
    int done;              /* (hidden from cffi) */
    int started;           /* its order is recorded (hidden from cffi) */
    pg_node *py;           /* the node whose Python backward is due (hidden from cffi) */
    void *hold;            /* the binding's: holds the nodes (hidden from cffi) */
} pg_sweep;
/* A recorded sweep's order, parents first: its length, and up to nout of
 * its nodes' addresses (for identity only) into out. */
size_t pg_sweep_order(const pg_sweep *s, uintptr_t *out, size_t nout);
int32_t pg_backward(pg_node *root, pg_sweep *sweep);
/* pg_backward, or PG_E_BUSY (nothing done) if another thread's walk holds
 * the sweep lock for about ms milliseconds more. */
int32_t pg_backward_wait(pg_node *root, pg_sweep *sweep, int ms);
int32_t pg_backward_resume(pg_sweep *sweep);
void pg_sweep_restore(pg_sweep *sweep);
void pg_sweep_keep(pg_sweep *sweep);
void pg_sweep_clear(pg_sweep *sweep);
void pg_node_backward(pg_node *n);

/* Replay: a graph compiled once, re-run forward and backward in C.  The
 * program is Python's, zeroed, and released by the binding's
 * pg_program_release (ffi.gc), which clears it, then lets go of its hold
 * on the nodes (csrc/value_binding.h). */
typedef struct pg_program {
    void *impl;            /* the flat program, replay.c's (hidden from cffi) */
    size_t n;              /* its nodes (hidden from cffi: pg_program_size) */
    void *hold;            /* the binding's: holds the nodes (hidden from cffi) */
} pg_program;
/* 1 while p holds a compiled program: 0 before its compile and after its
 * clear (a Program the collector freed, reached from a __del__). */
int pg_program_alive(const pg_program *p);
int32_t pg_compile(pg_node *root, pg_program *p, pg_node **bad_node);
/* The output's value; NaN, nothing done, while another thread runs p
 * (then pg_program_refused, in this thread, is 1 once). */
double pg_program_forward(pg_program *p);
int pg_program_refused(void);
/* 0; PG_E_SWEEP, nothing done, if a node's _backward was set in Python
 * since compiling (its rule is no longer C's); PG_E_BUSY, nothing done,
 * while another thread runs p.  A run of another thread's that a fork cut
 * short (in a forked child) is taken over: the grads go back to 0 first,
 * as between runs (program.h: pg_run_begin). */
int32_t pg_program_backward(pg_program *p);
/* One per_length run in one mark (pygrad/token_programs.py): inputs[0..n)
 * (the program's one-hot leaves, nids x vocab) set to the one-hot rows of
 * ids, forward into *loss, and with `backward` backward.  PG_E_ARG (an id
 * out of range, n not nids x vocab), PG_E_SWEEP, PG_E_BUSY: nothing done. */
int32_t pg_program_run_onehot(pg_program *p, pg_node *const *inputs, size_t n,
                              const uint32_t *ids, size_t nids, uint32_t vocab, int backward,
                              double *loss);
/* 1 if pg_program_backward would refuse so (checked before a step zeroes
 * the grads: pygrad/token_programs.py), else 0. */
int pg_program_rules_changed(pg_program *p);
uint32_t pg_program_size(const pg_program *p);
/* Whether forward and backward write each interior node's data and grad
 * back into it (on, the default: its Values show the replayed numbers).
 * Off, only the leaves' grads are written, for a program whose interior
 * nodes no Value shows (pygrad/token_programs.py). */
void pg_program_write_back(pg_program *p, int on);
/* How many of the program's leaves have any of `flags` and are not among
 * known[0..nknown) (PG_E_ARG: no program; PG_E_NOMEM). */
int64_t pg_program_foreign_leaves(const pg_program *p, int flags, pg_node *const *known,
                                  uint32_t nknown);
/* Called in a forked child (pg_after_fork_in_child): a run mark made
 * before the fork is another thread's, cut short (program.h). */
void pg_replay_after_fork(void);

/* Batched replay (Program.map; csrc/batch.c): the graph below the outputs,
 * run over n rows of data for the input leaves (row-major, n x ninputs),
 * writing n x nout outputs; with w (n x nout), the other leaves' grads
 * accumulate sum_r w[r] . d out_r / d leaf, in the order batch.c states.
 * compile returns PG_E_ARG with *bad set to a node that can't run in C or
 * an input that is no leaf (NULL: no such node).  The batch is Python's,
 * zeroed, and released by pg_batch_clear; the caller holds the outputs
 * and inputs while it lives.  A run with w returns PG_E_SWEEP, nothing
 * done, if a node's _backward was set in Python since compiling. */
typedef struct pg_batch {
    void *impl;            /* batch.c's (hidden from cffi) */
    void *hold;            /* the binding's: holds the nodes (hidden from cffi) */
} pg_batch;
/* 1 while b holds a compiled batch (pg_program_alive's). */
int pg_batch_alive(const pg_batch *b);
int32_t pg_batch_compile(pg_node *const *outputs, uint32_t nout, pg_node *const *inputs,
                         uint32_t ninputs, pg_batch *b, pg_node **bad);
int32_t pg_batch_run(pg_batch *b, const double *rows, size_t n, double *out, const double *w,
                     uint32_t threads);
/* pg_batch_run and pg_batch_step return PG_E_BUSY, nothing done, while
 * another thread's run of the same batch goes on (in a forked child, a
 * run cut short by the fork is taken over). */
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
    uint32_t n;                 /* hidden from cffi: pg_batch_step_l fills */
    pg_node *const *params;     /* hidden from cffi: these two from a node list */
    double lr, momentum, beta1, beta2, eps, weight_decay, bias1, bias2;
    double *s1;
    size_t ns1;
    double *s2;
    size_t ns2;
    double *steps;
} pg_optimizer;
uint32_t pg_batch_slots(const pg_batch *b);
/* The outputs (outputs nonzero) or the inputs per row a batch was compiled
 * with, 0 before: what sizes a run's rows and out (Python reads them here,
 * never from its own attributes, which a user may rebind). */
uint32_t pg_batch_width(const pg_batch *b, int outputs);
/* How many whole layers run as one unit each (batch.c, layer.c); -1 in a
 * build without the layer kernels (a compiler without vector extensions). */
int32_t pg_batch_layers(const pg_batch *b);
void pg_batch_clear(pg_batch *b);

/* The fault-injection hooks are in test_hooks.h: only a test build has them. */

uint32_t pg_node_size(void);

/* cdef-end */

/* Replay's deferred write-back (replay.c), the binding's under the GIL:
 * whether some run's numbers are not yet in their nodes (nonzero); write them all
 * back, the oldest run first; a compiled program joins the programs whose
 * numbers are written back (its interior nodes marked PG_F_REPLAYED), and
 * leaves them, its numbers written back first.  pg_program_clear frees a
 * program that is not listed. */
extern _Atomic int pg_replay_any_pending;   /* (read inline: every binding call asks) */
void pg_replay_settle(void);
void pg_replay_enlist(pg_program *p);
void pg_replay_unlist(pg_program *p);
void pg_program_clear(pg_program *p);

/* One training step in one call: the optimizer's parameters' grads set to
 * 0, pg_batch_run with the weights w, then the optimizer's step: the same
 * bits as the three calls.  PG_E_ARG (nothing changed) for no program, no
 * w, an unknown kind or state arrays shorter than n; PG_E_SWEEP (nothing
 * changed) as pg_batch_run's; PG_E_NOMEM.  (Python
 * calls pg_batch_step_l, which fills opt's params from a node list.) */
int32_t pg_batch_step(pg_batch *b, const double *rows, size_t n, double *out, const double *w,
                      uint32_t threads, const pg_optimizer *opt);

/* backward.c: pygrad.grad's numbers, every grad left as it was (not in the
 * cdef: the binding's pg_grad_numbers_l calls it with node lists). */
int32_t pg_grad_numbers(pg_node *const *outs, const double *seeds, uint32_t nout,
                        pg_node *const *ins, uint32_t nin, double *result, int ms);
/* second_order.c: pygrad.hvp's, hessian's and jvp's numbers (the binding's
 * pg_hvp_numbers_l calls it with node lists). */
int32_t pg_hvp_numbers(pg_node *root, pg_node *const *ins, uint32_t nin, const double *tangents,
                       uint32_t ntan, double *result, double *root_tangents, int reverse,
                       int ms);

/*
 * Per-op entry points: the calls Python makes most, with as few arguments
 * as possible (each one costs cffi a conversion).  For each row CODE of
 * ops.def:
 *   pg_binary_CODE(out, a, b)    a op b                  (pg_binary)
 *   pg_binary_k_CODE(out, a, k)  a op k, k a new leaf    (pg_binary_k)
 *   pg_binary_rk_CODE(out, k, a) k op a, k a new leaf
 *   pg_unary_CODE(out, a)        op a                    (pg_unary)
 * and for x ** number, pg_powk_float / pg_powk_int (pg_powk with
 * k_is_int 0 / 1).  They are static inline so that a row's forms can be
 * generated without the preprocessor knowing its arity: only the forms
 * that fit it are declared to cffi (cffi_build.py) and so compiled; a
 * form that does not fit would return PG_E_ARG from the generic creator.
 */
#define PG_OP(code, name, arity, methods, act, doc) \
    static inline int32_t pg_binary_##code(pg_node *out, pg_node *a, pg_node *b) { \
        return pg_binary(out, PG_OP_##code, a, b); \
    } \
    static inline int32_t pg_binary_k_##code(pg_node *out, pg_node *a, double k) { \
        return pg_binary_k(out, PG_OP_##code, a, k, 0); \
    } \
    static inline int32_t pg_binary_rk_##code(pg_node *out, double k, pg_node *a) { \
        return pg_binary_k(out, PG_OP_##code, a, k, 1); \
    } \
    static inline int32_t pg_unary_##code(pg_node *out, pg_node *a) { \
        return pg_unary(out, PG_OP_##code, a); \
    }
#include "ops.def"
#undef PG_OP

static inline int32_t pg_powk_float(pg_node *out, pg_node *a, double k) {
    return pg_powk(out, a, k, 0);
}
static inline int32_t pg_powk_int(pg_node *out, pg_node *a, double k) {
    return pg_powk(out, a, k, 1);
}

#endif
