/*
 * Internal layout shared by the C sources: nodes, segments, the op table.
 * Not part of the public API (pygrad.h is).
 */
#ifndef PG_NODE_H
#define PG_NODE_H

#include <stddef.h>
#include <stdint.h>
#include "pygrad.h"
#include "test_hooks.h"

/*
 * 48 bytes.  Enough to recompute the forward value (op, children, constant)
 * as well as to run the gradient rule, so a graph can be replayed.
 */
typedef struct pg_node {
    double data;
    double grad;
    union {
        double k;          /* constant operand: the exponent of POWK */
        uint32_t *kids;    /* child list of an n-ary node (arity -1) */
    } aux;
    uint32_t kid[2];       /* children; for n-ary nodes kid[0] is the count */
    uint32_t refs;         /* parents and node claims that hold this one */
    uint32_t mark;         /* DFS epoch; next link in the free list once dead */
    uint32_t spare;        /* unused: keeps the node at 48 bytes, aligned */
    uint8_t op;
    uint8_t flags;
    uint16_t variant;      /* op-specific: LINEAR's activation and bias bit */
} pg_node;

_Static_assert(sizeof(pg_node) <= 64, "a node fits a cache line");
_Static_assert(PG_SEG_NODES == 1 << PG_SEG_BITS, "a handle's offset bits index a segment");

/* The bits a LINEAR node's variant may have. */
#define PG_LINEAR_VARIANTS (PG_ACT_MASK | PG_LINEAR_BIAS)
_Static_assert(PG_ACT_SIGMOID <= PG_ACT_MASK && (PG_ACT_MASK & PG_LINEAR_BIAS) == 0,
               "activations fit the mask, apart from the bias bit");

/* Internal node flags (pygrad.h has those Python sees).  HAS_PARENT: some
 * node was made over it; LATE_PY: its closure came after a parent
 * (pg_set_py_backward); DEAD: a free slot (memory.c). */
#define PG_F_HAS_PARENT 16
#define PG_F_LATE_PY 32
#define PG_F_DEAD 128

static inline void pg_node_init(pg_node *n, int op) {
    n->grad = 0.0;
    n->aux.k = 0.0;
    n->kid[0] = n->kid[1] = 0;
    n->refs = 0;
    n->mark = 0;
    n->spare = 0;
    n->op = (uint8_t)op;
    n->flags = 0;
    n->variant = 0;
}

/* Child lists of n-ary nodes are bump-allocated from chunks owned by the
 * segment, and released with it. */
typedef struct pg_edge_chunk {
    struct pg_edge_chunk *next;
    uint32_t used, cap;
    uint32_t e[];
} pg_edge_chunk;

/* The header comes first so that a segment holding few nodes touches few
 * pages of its mapping.  Live segments form a list in creation order, and a
 * node is created after all of its children (pg_room), so (segment birth,
 * offset) orders every graph topologically.  Leaf segments reuse free
 * slots: a leaf has no children, and its parents come later, in newer
 * segments (pg_room), so any slot is below them. */
typedef struct pg_seg {
    uint32_t used;         /* bump index */
    uint32_t live;         /* allocated nodes not yet freed */
    uint32_t sid;
    uint8_t open;          /* some thread's current segment, or the leaf segment */
    uint8_t leaves;        /* a leaf segment: its free slots are reused */
    uint16_t unused;
    uint64_t birth;        /* creation counter: orders segments */
    uint32_t reach_epoch;  /* the backward sweep that reached a node here */
    uint32_t free_head;    /* a leaf segment's first free slot + 1 (0: none) */
    struct pg_seg *older, *newer;   /* live segments, by birth */
    struct pg_seg *next_leafy;      /* leaf segments with free slots */
    pg_edge_chunk *edges;
    struct pg_seg *next_free;
    pg_node nodes[PG_SEG_NODES];
} pg_seg;

extern pg_seg *pg_segtab[PG_MAX_SEGS];

static inline pg_node *pg_N(uint32_t h) {
    return &pg_segtab[h >> PG_SEG_BITS]->nodes[h & (PG_SEG_NODES - 1)];
}

typedef struct pg_op_rule {
    const char *name;
    int arity;
    void (*forward)(pg_node *n);     /* data from the children's data */
    void (*backward)(pg_node *n);    /* children's grad += local * n->grad */
} pg_op_rule;

extern const pg_op_rule pg_rules[PG_OP_COUNT];

static inline uint32_t pg_children(const pg_node *n, const uint32_t **kids) {
    int arity = pg_rules[n->op].arity;
    if (arity >= 0) {
        *kids = n->kid;
        return (uint32_t)arity;
    }
    *kids = n->aux.kids;
    return n->kid[0];
}

/* FUNCTION nodes keep their partials after the child list, 8-byte aligned:
 * an edge run of PG_FUNCTION_EDGES(n) words holds n kids, a padding word
 * (n odd), n doubles, and a word to align the run's start. */
static inline double *pg_function_partials(uint32_t *kids, uint32_t n) {
    return (double *)(kids + n + (n & 1));
}
#define PG_FUNCTION_EDGES(n) (3 * (n) + 2)

/* alloc.c: the core's heap (through the test build's failure hook). */
void *pg_malloc(size_t size);
void *pg_calloc(size_t count, size_t size);
void *pg_realloc(void *p, size_t size);

/* memory.c: the lock and node allocation, for nodes.c and backward.c.
 * pg_unmap returns a mapping to the OS, or -1 (counted) if it refused. */
int pg_unmap(void *p, size_t size);
void pg_lock(void);
void pg_unlock(void);
/* The extension module's (cffi_build.py): a thread that must wait for the
 * lock in a call made with Python's GIL lets the GIL go while it waits, so
 * that other Python threads run meanwhile (NULL: it did not hold it). */
void *pg_gil_let_go(void);
void pg_gil_take_back(void *state);
/* The calling thread's segment with room for `nodes` new slots whose
 * children are no newer than segment birth `birth`: its current one, or a
 * new one (the old one is closed).  NULL with *err set (PG_E_NOMEM,
 * PG_E_SPACE) when none can be had.  Lock held. */
pg_seg *pg_room(uint32_t nodes, uint64_t birth, int32_t *err);
/* Take `count` slots of seg, which has room for them (lock held): the
 * handle of the first.  Cannot fail: pg_room checked the room. */
int32_t pg_take_nodes(pg_seg *seg, uint32_t count);
/* A free leaf slot (lock held): its handle, a dead slot to initialise, or
 * a PG_E_*. */
int32_t pg_take_leaf(void);
/* Room for a run of `nodes` leaves in the leaf segment (lock held); NULL
 * with *err set when none can be had. */
pg_seg *pg_leaf_room(uint32_t nodes, int32_t *err);
/* The new nodes h .. h + n - 1 are born held by claim c (lock held). */
void pg_claim_fill(pg_claim *c, uint32_t h, uint32_t n);
/* Child list storage for an n-ary node in segment sid (lock held); NULL
 * (nothing changed) when out of memory. */
uint32_t *pg_alloc_edges(uint32_t sid, uint32_t count);
/* Live nodes; live nodes whose closure came after a parent. */
uint64_t pg_live_nodes_locked(void);
uint32_t pg_late_py_nodes(void);
/* Zero every DFS mark, when the epoch counter wraps (lock held). */
void pg_reset_marks(void);

/* Handle checks, inline: node creation makes them for every child.
 * A live segment's id (lock held). */
static inline int pg_seg_valid(uint32_t sid) {
    return sid > 0 && sid < PG_MAX_SEGS && pg_segtab[sid] != NULL;
}

/* A live node's handle (lock held). */
static inline int pg_handle_valid(uint32_t h) {
    uint32_t sid = h >> PG_SEG_BITS;
    if (!pg_seg_valid(sid)) return 0;
    if ((h & (PG_SEG_NODES - 1)) >= pg_segtab[sid]->used) return 0;
    return !(pg_N(h)->flags & PG_F_DEAD);
}

/* backward.c: every node reachable from the roots, newest first (a
 * topological order, parents before children), in a malloc'd buffer. */
int pg_record_order(const uint32_t *roots, uint32_t nroots, uint32_t **order, size_t *n);

#endif
