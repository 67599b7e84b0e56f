/*
 * The reverse sweep.  An iterative depth-first walk from the root (an
 * explicit stack, no recursion) lists every node below it, children
 * before parents; read backwards, that list is a topological order, and
 * each node's gradient rule runs once all its parents' have.  The walk
 * marks the nodes it visits and clears the marks when done, under the
 * sweep lock: two threads' sweeps over shared nodes run one after the
 * other.
 *
 * A node whose backward is a Python closure can't run here: when the walk
 * meets one, the order is kept in Python's sweep with every grad it will
 * touch, and the rules run handing Python one closure at a time
 * (pg_backward returns 1; pg_backward_resume goes on).  If a closure
 * fails, pg_sweep_restore puts every saved grad back.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L     /* nanosleep (lock.h) */
#endif
#include <stdlib.h>
#include <string.h>
#include "lock.h"
#include "node.h"

/* The sweep lock: held by a walk (its marks) and by a sweep's rules run
 * in one pass, never while Python code runs (a sweep with closures lets it
 * go once its order is recorded), so a thread that waits for it waits
 * only for C, and fork() (which takes it: below) never waits on Python. */
static pg_mutex sweep_lock = PG_MUTEX_INIT;

static void sweep_acquire(void) { pg_mutex_lock(&sweep_lock); }
static void sweep_release(void) { pg_mutex_unlock(&sweep_lock); }
void pg_sweep_hold(void) { sweep_acquire(); }
void pg_sweep_unhold(void) { sweep_release(); }

#ifdef PG_TEST_HOOKS
static _Atomic uint32_t sweep_lock_waits;
void pg_test_hold_sweep_lock(int hold) {
    if (hold) {
        sweep_acquire();
        sweep_lock_waits = 0;
    } else {
        sweep_release();
    }
}
uint32_t pg_sweep_lock_waits(void) { return sweep_lock_waits; }
#define COUNT_SWEEP_WAIT() (sweep_lock_waits++)
#else
#define COUNT_SWEEP_WAIT() ((void)0)
#endif

/* Take the lock within about `ms` milliseconds: 1, or 0 if another walk
 * still holds it (the caller, without the GIL, looks for signals and
 * tries again: a wait a Ctrl-C can end). */
static int sweep_acquire_within(unsigned ms) {
    for (unsigned waited = 0;; waited++) {
        if (pg_mutex_trylock(&sweep_lock)) return 1;
        COUNT_SWEEP_WAIT();
        if (waited >= 4 * ms) return 0;
        pg_nap_quarter_ms();
    }
}

#ifndef _WIN32
/* fork() copies the lock in whatever state another thread left it: take it
 * (and a test build's hook lock) around fork, so the child starts with both
 * free.  The forking thread holds the GIL, and no holder of this lock waits
 * for the GIL, so this wait ends. */
static void fork_prepare(void) { sweep_acquire(); pg_test_hooks_lock(); }
static void fork_parent(void) { pg_test_hooks_unlock(); sweep_release(); }
__attribute__((constructor)) static void register_fork_hooks(void) {
    pthread_atfork(fork_prepare, fork_parent, fork_parent);
}
#endif

/* A growable array of node pointers. */
typedef struct nodes {
    pg_node **p;
    size_t n, cap;
} nodes;

static int push(nodes *a, pg_node *x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 1024;
        pg_node **p = pg_realloc(a->p, cap * sizeof *p);
        if (p == NULL) return 0;
        a->p = p;
        a->cap = cap;
    }
    a->p[a->n++] = x;
    return 1;
}

static void unmark(const nodes *a) {
    for (size_t i = 0; i < a->n; i++) a->p[i]->mark = 0;
}

/* Where the walk stands in a node.  A unary or binary node's frame holds
 * its second child, still to be looked at (NULL once it has been), so that
 * going back up a deep chain reads only the stack, not node memory again:
 * node memory lies scattered, and reading it is most of a first backward's
 * time.  An n-ary node's frame holds its next child's index (its node
 * pointer tagged with the low bit: nodes are aligned). */
typedef struct frame {
    uintptr_t node;
    union {
        pg_node *second;
        size_t next;
    } u;
} frame;

#define NARY_TAG ((uintptr_t)1)

static inline pg_node *frame_node(const frame *f) {
    return (pg_node *)(f->node & ~NARY_TAG);
}

/* How far below the node it enters the walk prefetches: 14 nodes in the
 * 96-byte blocks most CPythons give one node's memory, 12 in 3.11's 112-byte
 * ones (a whole number of both, so it lands on a node's mark). */
#define PREFETCH_BELOW 1344

/* The walks' scratch, kept between walks (under the sweep lock) up to
 * SCRATCH_KEPT entries each, so that a training loop's sweeps take fresh
 * pages from the OS only once: the stack, and backward()'s order. */
#ifdef PG_TEST_HOOKS
/* A test build lets go of a small graph's scratch too, so that every walk
 * over more than a few thousand nodes grows it again, and the tests' failed
 * allocations land in the middle of walks (tests/test_alloc_failure.py). */
#define SCRATCH_KEPT ((size_t)1 << 12)
#else
#define SCRATCH_KEPT ((size_t)1 << 20)
#endif
static frame *scratch_stack;
static size_t scratch_cap;
static nodes scratch_post;

/* Every node below the roots, children first, into *post (sweep lock
 * held), each marked; *flags gets the or of their flags.  Returns 0, or
 * PG_E_NOMEM with every mark it set cleared again.  `graded`: not below a
 * detached_max node (node.h: pg_record_order).
 *
 * The order is a recursive depth-first walk's: a node's children in turn,
 * each one looked at (is it marked?) only once the ones before it are
 * done, and the node listed after them. */
static int walk(pg_node *const *roots, uint32_t nroots, int graded, nodes *post,
                uint32_t *flags) {
    frame *stack = scratch_stack;
    size_t depth = 0, cap = scratch_cap;
    uint32_t seen = 0;
    int rc = 0;
    for (uint32_t r = 0; r < nroots && rc == 0; r++) {
        pg_node *next = roots[r];     /* a marked node to enter, or NULL */
        if (next->mark) continue;
        next->mark = 1;
        if (stack == NULL && (stack = pg_malloc((cap = 256) * sizeof *stack)) == NULL) {
            next->mark = 0;
            rc = PG_E_NOMEM;
            break;
        }
        for (;;) {
            if (next != NULL) {
                /* Enter it: a frame, and its first unmarked child to enter. */
                if (depth == cap) {
                    frame *grown = pg_realloc(stack, 2 * cap * sizeof *stack);
                    if (grown == NULL) {
                        next->mark = 0;
                        rc = PG_E_NOMEM;
                        break;
                    }
                    stack = grown;
                    cap *= 2;
                }
                pg_node *n = next;
                frame *f = &stack[depth++];
                /* A graph built op by op lies mostly at rising addresses
                 * (CPython's allocator hands out a pool's blocks in order),
                 * so the nodes this walk enters next lie a little below:
                 * ask for them now.  A wrong guess costs a wasted load. */
                __builtin_prefetch((const char *)&n->mark - PREFETCH_BELOW);
                seen |= n->flags;
                int arity = pg_rules[n->op].arity;
                next = NULL;
                if (arity < 0) {
                    f->node = (uintptr_t)n | NARY_TAG;
                    f->u.next = graded && n->op == PG_OP_MAX ? SIZE_MAX : 0;
                } else {
                    f->node = (uintptr_t)n;
                    f->u.second = arity == 2 ? n->c.kid[1] : NULL;
                    if (arity > 0 && !n->c.kid[0]->mark) {
                        next = n->c.kid[0];
                        next->mark = 1;
                    }
                }
                continue;
            }
            if (depth == 0) break;
            /* Back in the top frame: its next unmarked child, or list it. */
            frame *f = &stack[depth - 1];
            if (f->node & NARY_TAG) {
                pg_node *const *kids;
                uint32_t nk = pg_children(frame_node(f), &kids);
                while (f->u.next < nk && kids[f->u.next]->mark) f->u.next++;
                if (f->u.next < nk) next = kids[f->u.next++];
            } else if (f->u.second != NULL) {
                if (!f->u.second->mark) next = f->u.second;
                f->u.second = NULL;
            }
            if (next != NULL) {
                next->mark = 1;
                continue;
            }
            if (!push(post, frame_node(f))) {
                rc = PG_E_NOMEM;
                break;
            }
            depth--;
        }
    }
    if (rc < 0) {
        /* Marks come off every node that has one: those listed, and
         * those still on the stack. */
        unmark(post);
        for (size_t i = 0; i < depth; i++) frame_node(&stack[i])->mark = 0;
    }
    /* The stack stays for the next walk, unless it grew big. */
    if (cap > SCRATCH_KEPT) {
        free(stack);
        stack = NULL;
        cap = 0;
    }
    scratch_stack = stack;
    scratch_cap = cap;
    *flags = seen;
    return rc;
}

int pg_record_order(pg_node *const *roots, uint32_t nroots, int graded, pg_node ***order,
                    size_t *n) {
    if (nroots == 0) return PG_E_ARG;
    for (uint32_t j = 0; j < nroots; j++)
        if (roots[j] == NULL) return PG_E_ARG;
    nodes post = {NULL, 0, 0};
    uint32_t flags;
    /* (PG_E_BUSY: the caller's Python tries again, running signals between) */
    if (!sweep_acquire_within(50)) return PG_E_BUSY;
    int rc = walk(roots, nroots, graded, &post, &flags);
    if (rc == 0) unmark(&post);
    sweep_release();
    if (rc < 0) {
        free(post.p);
        return rc;
    }
    /* parents first */
    for (size_t i = 0, j = post.n; i + 1 < j; i++, j--) {
        pg_node *t = post.p[i];
        post.p[i] = post.p[j - 1];
        post.p[j - 1] = t;
    }
    *order = post.p;          /* the caller owns the buffer now */
    *n = post.n;
    return 0;
}

size_t pg_sweep_order(const pg_sweep *s, uintptr_t *out, size_t nout) {
    if (s == NULL || !s->started) return 0;
    for (size_t i = 0; i < s->n && i < nout; i++) out[i] = (uintptr_t)s->order[i];
    return s->n;
}

void pg_sweep_clear(pg_sweep *s) {
    if (s == NULL) return;
    /* A sweep whose pg_sweep_restore never ran (an exception at the wrong
     * instruction of Python's `finally`) is restored when Python frees it. */
    pg_sweep_restore(s);
    free(s->order);
    free(s->saved);
    s->order = NULL;
    s->saved = NULL;
    s->n = s->pos = 0;
    s->py = NULL;
}

/* Save the grad and aux word (SUB and DIV keep a hidden grad there: ops.c)
 * of every recorded node, before any changes. */
static int save(pg_sweep *s) {
    s->saved = pg_malloc((s->n ? s->n : 1) * 2 * sizeof(double));
    if (s->saved == NULL) return 0;
    for (size_t i = 0; i < s->n; i++) {
        pg_node *n = s->order[i];
        s->saved[2 * i] = n->grad;
        memcpy(&s->saved[2 * i + 1], &n->aux, sizeof(double));
    }
    return 1;
}

/* Put the saved grads back unless the sweep was kept (every sweep ends
 * here: Python calls it last). */
void pg_sweep_restore(pg_sweep *s) {
    if (s == NULL) return;
    if (!s->done && s->saved != NULL) {
        for (size_t i = 0; i < s->n; i++) {
            pg_node *n = s->order[i];
            n->grad = s->saved[2 * i];
            memcpy(&n->aux, &s->saved[2 * i + 1], sizeof(double));
        }
        s->done = 1;
    }
}

/* Apply the recorded order (no lock: the order is the sweep's own, and
 * Python runs between calls); stop at a Python node and return 1. */
static int32_t run(pg_sweep *s) {
    while (s->pos < s->n) {
        pg_node *n = s->order[s->pos++];
        if (n->flags & PG_F_PY_BACKWARD) {
            s->py = n;
            return 1;
        }
        pg_rules[n->op].backward(n);
    }
    return 0;
}

/* The recorded sweep ran to its end and Python has seen it return: its
 * grads stand (until then, a Ctrl-C raised as the last call returned would
 * have pg_sweep_restore put them back). */
void pg_sweep_keep(pg_sweep *s) {
    if (s != NULL) s->done = 1;
}

/* pg_backward, with the sweep lock taken (`ms` < 0: waited for; else
 * PG_E_BUSY if not free within about ms milliseconds, nothing done). */
static int32_t backward_locked(pg_node *root, pg_sweep *s, int ms) {
    if (root == NULL) return PG_E_ARG;
    uint32_t flags = 0;
    if (ms < 0) sweep_acquire();
    else if (!sweep_acquire_within((unsigned)ms)) return PG_E_BUSY;
    nodes post = scratch_post;
    post.n = 0;
    int32_t rc = walk(&root, 1, 1, &post, &flags);
    if (rc == 0 && (flags & PG_F_TRACED)) {
        /* A trace's numbers are not the program's: no grad from them. */
        unmark(&post);
        rc = PG_E_TRACED;
    }
    int py = (flags & PG_F_PY_BACKWARD) != 0;
    if (rc == 0 && !py) {
        /* One pass, parents first: each node's rule, and its mark off. */
        root->grad = 1.0;
        for (size_t i = post.n; i-- > 0;) {
            pg_node *n = post.p[i];
            n->mark = 0;
            pg_rules[n->op].backward(n);
        }
    } else if (rc == 0) {
        unmark(&post);
    }
    /* A sweep takes its own copy of the order, parents first. */
    pg_node **order = NULL;
    if (rc == 0 && py && s != NULL) {
        order = pg_malloc((post.n ? post.n : 1) * sizeof *order);
        if (order == NULL) rc = PG_E_NOMEM;
        for (size_t i = 0; order != NULL && i < post.n; i++) order[i] = post.p[post.n - 1 - i];
    }
    size_t n = post.n;
    if (post.cap > SCRATCH_KEPT) {
        free(post.p);
        post = (nodes){NULL, 0, 0};
    }
    scratch_post = post;
    sweep_release();
    if (rc < 0 || !py || s == NULL) return rc < 0 || !py ? rc : PG_E_SWEEP;
    /* The rules run with Python's closures between them: no lock held. */
    pg_sweep_clear(s);
    s->started = 1;
    s->order = order;
    s->n = n;
    s->pos = 0;
    if (!save(s)) return PG_E_NOMEM;
    s->done = 0;
    root->grad = 1.0;
    return run(s);
}

int32_t pg_backward(pg_node *root, pg_sweep *s) {
    return backward_locked(root, s, -1);
}

int32_t pg_backward_wait(pg_node *root, pg_sweep *s, int ms) {
    return backward_locked(root, s, ms < 0 ? 0 : ms);
}

int32_t pg_backward_resume(pg_sweep *s) {
    if (s == NULL || !s->started) return PG_E_ARG;
    return run(s);
}

void pg_node_backward(pg_node *n) {
    pg_rules[n->op].backward(n);
}

/* Every node below the roots, children first, handed to `use` under the
 * sweep lock with each one marked (use may set a mark to any nonzero
 * value: the walk clears them all after).  Nothing is handed over, and
 * PG_E_TRACED if a node below is a traced program's (its numbers are a
 * trace's, not the program's), PG_E_SWEEP if a Python closure lies below,
 * PG_E_BUSY if another walk holds the lock for about ms milliseconds more;
 * else use's result. */
int32_t pg_with_order(pg_node *const *roots, uint32_t nroots, int ms,
                      int32_t (*use)(pg_node *const *order, size_t n, void *ctx), void *ctx) {
    if (!sweep_acquire_within(ms < 0 ? 0 : (unsigned)ms)) return PG_E_BUSY;
    nodes post = scratch_post;
    post.n = 0;
    uint32_t flags = 0;
    int32_t rc = walk(roots, nroots, 1, &post, &flags);
    int walked = rc == 0;       /* (a failed walk has cleared its marks) */
    if (rc == 0 && (flags & PG_F_TRACED)) rc = PG_E_TRACED;
    if (rc == 0 && (flags & PG_F_PY_BACKWARD)) rc = PG_E_SWEEP;
    if (rc == 0) rc = use(post.p, post.n, ctx);
    if (walked) unmark(&post);
    if (post.cap > SCRATCH_KEPT) {
        free(post.p);
        post = (nodes){NULL, 0, 0};
    }
    scratch_post = post;
    sweep_release();
    return rc;
}

typedef struct grad_numbers_call {
    pg_node *const *outs, *const *ins;
    const double *seeds;
    uint32_t nout, nin;
    double *result;
} grad_numbers_call;

static int32_t grad_numbers_over(pg_node *const *post, size_t n, void *ctx) {
    const grad_numbers_call *c = ctx;
    double *saved = pg_malloc((n ? n : 1) * 2 * sizeof *saved);
    if (saved == NULL) return PG_E_NOMEM;
    for (size_t i = 0; i < n; i++) {
        pg_node *x = post[i];
        saved[2 * i] = x->grad;
        memcpy(&saved[2 * i + 1], &x->aux, sizeof(double));
        x->grad = 0.0;
        if (x->op == PG_OP_SUB || x->op == PG_OP_DIV) x->aux.k = -0.0;   /* as made */
    }
    for (uint32_t j = 0; j < c->nout; j++) c->outs[j]->grad += c->seeds[j];
    for (size_t i = n; i-- > 0;) pg_rules[post[i]->op].backward(post[i]);
    for (uint32_t i = 0; i < c->nin; i++) c->result[i] = c->ins[i]->mark ? c->ins[i]->grad : 0.0;
    for (size_t i = 0; i < n; i++) {
        pg_node *x = post[i];
        x->grad = saved[2 * i];
        memcpy(&x->aux, &saved[2 * i + 1], sizeof(double));
    }
    free(saved);
    return 0;
}

/* pygrad.grad's numbers: the gradient of sum(seeds[j] * outs[j]) with
 * respect to each of ins, into result (0 for an input not below any
 * output), with every grad below the outputs (and SUB's and DIV's hidden
 * grads) left as it was.  Under the sweep lock, in one pass: walk, save,
 * zero, seed, run the rules, read, restore; so a thread that holds the GIL
 * throughout never shows another a grad in between.  A write to one of
 * those grads made meanwhile without the GIL or the lock (a closure
 * sweep's rule, another thread's program run) is undone by the restore:
 * numbers outside a locked walk race as floats do (lock.h, rule 4).
 * Errors as pg_with_order's. */
int32_t pg_grad_numbers(pg_node *const *outs, const double *seeds, uint32_t nout,
                        pg_node *const *ins, uint32_t nin, double *result, int ms) {
    if (nout == 0 || (nin > 0 && result == NULL)) return PG_E_ARG;
    for (uint32_t j = 0; j < nout; j++)
        if (outs[j] == NULL) return PG_E_ARG;
    for (uint32_t i = 0; i < nin; i++)
        if (ins[i] == NULL) return PG_E_ARG;
    grad_numbers_call c = {outs, ins, seeds, nout, nin, result};
    return pg_with_order(outs, nout, ms, grad_numbers_over, &c);
}
