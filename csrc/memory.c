/*
 * Node lifetime.  The whole design, once.  Python decides when a node dies:
 * pygrad learns it only from the deallocation of an object that owns the
 * node (a claim), never from a reference count.
 *
 * Eight concepts:
 *   1. node     a slot of a segment.  It lives while its refs are above 0.
 *   2. refs     what holds a node: its parents (a parent holds each child
 *               once) and the claims on it.
 *   3. claim    Python's hold on a run of nodes (pg_claim: h, n), made
 *               empty by pg_claim_new and filled by a creator (or pg_hold),
 *               so no node is ever unheld.  The Value keeps the claim's
 *               cdata in its slot ``_s``: an object the collector does not
 *               track, so it dies only when CPython deallocates the Value
 *               (after every finalizer; never for a resurrected Value; after
 *               the resurrection check when the Value is cyclic garbage).
 *   4. owner    what turns that death into pg_claim_drop with no Python
 *               code run: a weak reference to the claim's cdata that
 *               carries an ffi.gc twin of the claim, kept in a set whose
 *               discard (in C) is the callback (pygrad/_lifetime.py).  The
 *               twin can't be the Value's own: the collector runs ffi.gc's
 *               destructor as a finalizer, before it knows whether the
 *               Value was resurrected.  Claims come from slabs mapped from
 *               the OS, so a freed graph's claims go back to it.
 *   5. segment  PG_SEG_NODES slots mapped from the OS, never moved, so a
 *               handle (sid << PG_SEG_BITS | offset) stays valid while its
 *               node lives.  Each thread bump-allocates in a segment of its
 *               own (its current one, open); a node is made after its
 *               children, so (birth, offset) is a topological order
 *               (backward.c walks it).  A closed segment with no live node
 *               is recycled (its mapping pooled or unmapped, its sid
 *               reused); its dead pages go back to the OS before that.
 *   6. leaves   user leaves (pg_leaf, pg_leaves) live in leaf segments,
 *               whose dead slots are reused through a free list: a leaf has
 *               no children, so an old slot is below every parent it will
 *               get (pg_room opens a newer segment for them).  A kept leaf
 *               then costs its own slot, not a segment.
 *   7. free     a node whose refs reach 0 is freed, and its children lose
 *               a parent: a cascade over an intrusive work list, never the
 *               C stack.
 *   8. lock     one mutex over all of it (cffi lets the GIL go, so the GIL
 *               guards nothing here); fork takes it so the child starts
 *               with it free.
 *
 *      claim made empty ──(registered: owner)──(creator fills it)──► holds nodes
 *        ──(Value deallocated ─► claim cdata dies ─► its owner leaves the
 *           set and dies ─► the ffi.gc twin dies ─► pg_claim_drop)──► its
 *           nodes' refs - 1
 *      node: made (refs: its claim) ──► held (claims, parents) ──(refs 0)──► freed
 *             ▲ a leaf reuses a free slot of a leaf segment ◄───────────────┘
 *      segment: open (one thread's) ──► closed ──(live 0)──► recycled
 */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE
#endif
#include <stdlib.h>
#include <string.h>
#include "node.h"
#include "lock.h"

#ifdef _WIN32
#include <windows.h>
static void *os_map(size_t size) {
    return VirtualAlloc(NULL, size, MEM_COMMIT | MEM_RESERVE, PAGE_READWRITE);
}
static int os_unmap(void *p, size_t size) { (void)size; return VirtualFree(p, 0, MEM_RELEASE) ? 0 : -1; }
static size_t os_page(void) { return 0; }
#else
#include <sys/mman.h>
#include <unistd.h>
#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS MAP_ANON
#endif
static void *os_map(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static int os_unmap(void *p, size_t size) { return munmap(p, size); }
static size_t os_page(void) {
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 0;
}
#endif

/* Child slots per edge chunk (a chunk holds a longer list whole). */
#define PG_EDGE_CHUNK 4096u
/* Freed segments kept mapped for reuse: mapping is a syscall and a page
 * fault per page, while a training loop frees and needs segments steadily. */
#define PG_POOL_MAX 32
#define PG_NO_NODE UINT32_MAX
_Static_assert((uint64_t)PG_MAX_SEGS << PG_SEG_BITS <= (1u << 30),
               "handles stay below 2^30 (cffi's fast path for ints)");

pg_seg *pg_segtab[PG_MAX_SEGS];

static pg_mutex lock = PG_MUTEX_INIT;
static uint32_t free_sids[PG_MAX_SEGS];
static uint32_t n_free_sids;
static uint32_t next_sid = 1;      /* sid 0 is never used: handle 0 is "none" */
static pg_seg *pool;
static uint32_t pool_len;
static uint64_t live_nodes;
static uint32_t live_segs;
static uint32_t unmap_failures;
static uint32_t advice_refused;     /* madvise calls the OS declined */
static uint64_t births;
static pg_seg *newest;             /* tail of the live list (older links) */
static pg_seg *leafy;              /* leaf segments with a free slot */
static pg_seg *leaf_seg;           /* the open leaf segment (bump allocation) */
static uint32_t n_late_py;         /* see pg_set_py_backward */
#ifdef PG_TEST_HOOKS
static uint32_t seg_cap = PG_MAX_SEGS;   /* lowered by pg_limit_segments */
#else
static const uint32_t seg_cap = PG_MAX_SEGS;
#endif

/* The calling thread's current segment (0: none yet). */
static _Thread_local uint32_t current;

/* Is there a segment id left in the handle space? */
static int space_left(void) {
    return live_segs + 1 < seg_cap && (n_free_sids > 0 || next_sid < PG_MAX_SEGS);
}

void pg_lock(void) {
    while (!pg_mutex_trylock(&lock)) {
        /* Taken, maybe by a long call that runs without the GIL.  A short
         * call holds the GIL: it waits without it, so that other Python
         * threads go on, and takes it back without the lock, so that a
         * thread stopped as it retakes the GIL (at exit) holds nothing. */
        void *gil = pg_gil_let_go();
        pg_mutex_lock(&lock);
        if (gil == NULL) return;
        pg_mutex_unlock(&lock);
        pg_gil_take_back(gil);
    }
}
void pg_unlock(void) { pg_mutex_unlock(&lock); }

static void close_segment(pg_seg *seg);
static void discard_pool_pages(pg_seg *seg);

#ifndef _WIN32
/* fork() copies the lock in whatever state another thread left it: take it
 * (and a test build's hook lock) around fork, so the child starts with both
 * free and the graph consistent. */
static void fork_prepare(void) { pg_mutex_lock(&lock); pg_test_hooks_lock(); }
static void fork_parent(void) { pg_test_hooks_unlock(); pg_mutex_unlock(&lock); }

/* A thread that ends closes its current segment, so that it can be
 * recycled once its nodes die.  The key's value is the sid + 1 of the calling
 * thread's current segment (NULL: none), kept in step with `current`. */
static pthread_key_t thread_key;
static int have_thread_key;
static void thread_ended(void *value) {
    uint32_t sid = (uint32_t)((uintptr_t)value - 1);
    pg_mutex_lock(&lock);
    if (pg_seg_valid(sid) && pg_segtab[sid]->open) close_segment(pg_segtab[sid]);
    pg_mutex_unlock(&lock);
}
__attribute__((constructor)) static void register_thread_hooks(void) {
    pthread_atfork(fork_prepare, fork_parent, fork_parent);
    have_thread_key = pthread_key_create(&thread_key, thread_ended) == 0;
}
#endif

static pg_seg *seg_new(void) {
    uint32_t sid;
    if (!space_left()) return NULL;
    if (n_free_sids > 0) sid = free_sids[--n_free_sids];
    else if (next_sid < PG_MAX_SEGS) sid = next_sid++;
    else return NULL;
    pg_seg *seg = NULL;
    if (!pg_alloc_fails()) {
        seg = pool;
        if (seg != NULL) {
            pool = seg->next_free;
            pool_len--;
        } else {
            seg = os_map(sizeof(pg_seg));
        }
    }
    if (seg == NULL) {
        free_sids[n_free_sids++] = sid;
        return NULL;
    }
    seg->used = 0;
    seg->live = 0;
    seg->open = 1;
    seg->leaves = 0;
    seg->free_head = 0;
    seg->sid = sid;
    seg->edges = NULL;
    seg->next_free = NULL;
    seg->next_leafy = NULL;
    seg->birth = ++births;
    seg->reach_epoch = 0;
    seg->older = newest;
    seg->newer = NULL;
    if (newest != NULL) newest->newer = seg;
    newest = seg;
    pg_segtab[sid] = seg;
    live_segs++;
    return seg;
}

static void recycle(pg_seg *seg) {
    if (seg->free_head != 0) {          /* listed in leafy: unlink it */
        pg_seg **p = &leafy;
        while (*p != seg) p = &(*p)->next_leafy;
        *p = seg->next_leafy;
    }
    pg_edge_chunk *c = seg->edges;
    while (c != NULL) {
        pg_edge_chunk *next = c->next;
        free(c);
        c = next;
    }
    if (seg->older != NULL) seg->older->newer = seg->newer;
    if (seg->newer != NULL) seg->newer->older = seg->older;
    else newest = seg->older;
    pg_segtab[seg->sid] = NULL;
    free_sids[n_free_sids++] = seg->sid;
    live_segs--;
    /* A mapping the OS would not take back stays pooled: never lost.  A
     * pooled mapping's pages past the header go back to the OS (advice: a
     * page fault each when reused), so a pool of freed graphs holds no
     * resident memory. */
    if (pool_len < PG_POOL_MAX || pg_unmap(seg, sizeof(pg_seg)) != 0) {
        discard_pool_pages(seg);
        seg->next_free = pool;
        pool = seg;
        pool_len++;
    }
}

int pg_unmap(void *p, size_t size) {
    if (pg_unmap_fails() || os_unmap(p, size) != 0) {
        unmap_failures++;
        return -1;
    }
    return 0;
}

/* A segment may go once no node in it lives and no thread allocates in it. */
static int recyclable(const pg_seg *seg) {
    return seg->live == 0 && !seg->open;
}

static int unheld(const pg_node *n) {
    return n->refs == 0 && !(n->flags & PG_F_DEAD);
}

static void discard_dead_pages(pg_seg *seg);

/* Free node h (nothing holds it) and whatever that leaves unheld.  A
 * leaf segment's slot goes on its free list; a closed segment gives its
 * dead pages back to the OS as it passes three quarters dead, 31/32 dead
 * and one node left (live only falls; the first PG_DISCARD_MAX segments of
 * a cascade: the pages are only advice). */
#define PG_DISCARD_MAX 64u
/* A cascade that frees many nodes, in a call that holds the GIL (a Value's
 * claim released as it dies), lets the GIL go once it is long, so other
 * Python threads go on meanwhile; the call takes it back after it has let
 * go of the lock (unlock_after_cascade), never while holding it. */
#define PG_CASCADE_GIL_NODES 65536u
static _Thread_local void *cascade_gil;

static void unlock_after_cascade(void) {
    pg_unlock();
    if (cascade_gil != NULL) {
        void *gil = cascade_gil;
        cascade_gil = NULL;
        pg_gil_take_back(gil);
    }
}

static void free_cascade(uint32_t h) {
    uint32_t discard[PG_DISCARD_MAX], ndiscard = 0, freed = 0;
    pg_N(h)->flags |= PG_F_DEAD;
    pg_N(h)->mark = PG_NO_NODE;
    while (h != PG_NO_NODE) {
        pg_node *n = pg_N(h);
        uint32_t next = n->mark;
        const uint32_t *kids;
        uint32_t nk = pg_children(n, &kids);
        for (uint32_t i = 0; i < nk; i++) {
            pg_node *c = pg_N(kids[i]);
            c->refs--;
            if (unheld(c)) {
                c->flags |= PG_F_DEAD;     /* queued: never queue it twice */
                c->mark = next;
                next = kids[i];
            }
        }
        if (n->flags & PG_F_LATE_PY) n_late_py--;
        live_nodes--;
        if (++freed == PG_CASCADE_GIL_NODES && cascade_gil == NULL) cascade_gil = pg_gil_let_go();
        pg_seg *seg = pg_segtab[h >> PG_SEG_BITS];
        if (seg->leaves) {
            /* its slot goes on the segment's free list (the work list has
             * moved on: `next` was read above) */
            n->mark = seg->free_head;
            if (seg->free_head == 0) {
                seg->next_leafy = leafy;
                leafy = seg;
            }
            seg->free_head = (h & (PG_SEG_NODES - 1)) + 1;
        }
        if (--seg->live == 0) {
            if (recyclable(seg)) recycle(seg);
        } else if (!seg->open && !seg->leaves && ndiscard < PG_DISCARD_MAX
                   && (seg->live == seg->used / 4 || seg->live == seg->used / 32
                       || seg->live == 1)) {
            discard[ndiscard++] = seg->sid;
        }
        h = next;
    }
    /* After the cascade, whose work list runs through dead nodes' marks; a
     * segment recycled meanwhile has left the table. */
    for (uint32_t i = 0; i < ndiscard; i++)
        if (pg_segtab[discard[i]] != NULL) discard_dead_pages(pg_segtab[discard[i]]);
}

/* Give back to the OS the pages of a closed segment that hold only dead
 * nodes.  A closed segment never allocates again, so those slots are never
 * written again; reading them later (a backward walk) reads zeros, which
 * is no live node.  This is what lets a kept Value cost its own nodes, not
 * its segment's 192 KiB. */
static void discard_dead_pages(pg_seg *seg) {
#if defined(MADV_DONTNEED) && !defined(_WIN32)
    const uintptr_t page = os_page();
    if (page == 0 || (page & (page - 1)) != 0) return;
    uint32_t i = 0;
    while (i < seg->used) {
        if (!(seg->nodes[i].flags & PG_F_DEAD)) {
            i++;
            continue;
        }
        uint32_t j = i;
        while (j < seg->used && (seg->nodes[j].flags & PG_F_DEAD)) j++;
        uintptr_t lo = ((uintptr_t)&seg->nodes[i] + page - 1) & ~(page - 1);
        uintptr_t hi = (uintptr_t)&seg->nodes[j] & ~(page - 1);
        if (j == seg->used) hi = ((uintptr_t)(seg + 1)) & ~(page - 1);
        /* Advice only: pages it declines stay resident (counted), nothing
         * else changes. */
        if (hi > lo && madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0) advice_refused++;
        i = j;
    }
#else
    (void)seg;
#endif
}

static void discard_pool_pages(pg_seg *seg) {
#if defined(MADV_DONTNEED) && !defined(_WIN32)
    const uintptr_t page = os_page();
    if (page == 0 || (page & (page - 1)) != 0) return;
    uintptr_t lo = ((uintptr_t)seg->nodes + page - 1) & ~(page - 1);
    uintptr_t hi = ((uintptr_t)(seg + 1)) & ~(page - 1);
    if (hi > lo && madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0) advice_refused++;
#else
    (void)seg;
#endif
}

static void close_segment(pg_seg *seg) {
    seg->open = 0;
    if (seg->live == 0) recycle(seg);
}

pg_seg *pg_room(uint32_t nodes, uint64_t birth, int32_t *err) {
    pg_seg *seg = pg_seg_valid(current) ? pg_segtab[current] : NULL;
    if (seg != NULL && seg->open && seg->birth >= birth && PG_SEG_NODES - seg->used >= nodes)
        return seg;
    pg_seg *fresh = seg_new();
    if (fresh == NULL) {
        *err = space_left() ? PG_E_NOMEM : PG_E_SPACE;
        return NULL;
    }
    if (seg != NULL && seg->open) close_segment(seg);
    current = fresh->sid;
#ifndef _WIN32
    if (have_thread_key) pthread_setspecific(thread_key, (void *)(uintptr_t)(fresh->sid + 1));
#endif
    return fresh;
}

int32_t pg_take_nodes(pg_seg *seg, uint32_t count) {
    uint32_t off = seg->used;
    seg->used += count;
    seg->live += count;
    live_nodes += count;
    return (int32_t)((seg->sid << PG_SEG_BITS) | off);
}

uint32_t *pg_alloc_edges(uint32_t sid, uint32_t count) {
    pg_seg *seg = pg_segtab[sid];
    pg_edge_chunk *c = seg->edges;
    if (c == NULL || c->cap - c->used < count) {
        uint32_t cap = count > PG_EDGE_CHUNK ? count : PG_EDGE_CHUNK;
        c = pg_malloc(sizeof(pg_edge_chunk) + (size_t)cap * sizeof(uint32_t));
        if (c == NULL) return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = seg->edges;
        seg->edges = c;
    }
    uint32_t *e = c->e + c->used;
    c->used += count;
    return e;
}

/* -- leaves ---------------------------------------------------------------- */

int32_t pg_take_leaf(void) {
    pg_seg *seg = leafy;
    if (seg != NULL) {
        uint32_t off = seg->free_head - 1;
        seg->free_head = seg->nodes[off].mark;
        if (seg->free_head == 0) {
            leafy = seg->next_leafy;
            seg->next_leafy = NULL;
        }
        seg->live++;
        live_nodes++;
        return (int32_t)((seg->sid << PG_SEG_BITS) | off);
    }
    if (leaf_seg == NULL || leaf_seg->used == PG_SEG_NODES) {
        pg_seg *fresh = seg_new();
        if (fresh == NULL) return space_left() ? PG_E_NOMEM : PG_E_SPACE;
        fresh->leaves = 1;
        if (leaf_seg != NULL) close_segment(leaf_seg);
        leaf_seg = fresh;
    }
    return pg_take_nodes(leaf_seg, 1);
}

/* Leaves in a run (pg_leaves): consecutive slots of the leaf segment. */
pg_seg *pg_leaf_room(uint32_t nodes, int32_t *err) {
    if (leaf_seg == NULL || PG_SEG_NODES - leaf_seg->used < nodes) {
        pg_seg *fresh = seg_new();
        if (fresh == NULL) {
            *err = space_left() ? PG_E_NOMEM : PG_E_SPACE;
            return NULL;
        }
        fresh->leaves = 1;
        if (leaf_seg != NULL) close_segment(leaf_seg);
        leaf_seg = fresh;
    }
    return leaf_seg;
}

/* -- claims ------------------------------------------------------------------ */

/* Claims are carved from slabs of PG_CLAIM_SLAB (no malloc per Value); a
 * free claim keeps its slab's next free index + 1 in h.  Slabs are mapped
 * from the OS, not the heap: a slab with no claim in use is unmapped (but
 * for one kept for the next), so a freed big graph's claims go back to the
 * OS at once, where the heap would keep them below its trim threshold. */
#define PG_CLAIM_SLAB 16382u
typedef struct pg_claim_slab {
    struct pg_claim_slab *prev, *next;   /* slabs with room */
    uint32_t free, used, live, listed;
    pg_claim c[PG_CLAIM_SLAB];
} pg_claim_slab;
_Static_assert(sizeof(pg_claim_slab) <= 256 * 1024, "a claim slab is one 256 KiB mapping");
static pg_claim_slab *roomy;
static uint32_t empty_slabs;

static void slab_link(pg_claim_slab *s) {
    s->prev = NULL;
    s->next = roomy;
    if (roomy != NULL) roomy->prev = s;
    roomy = s;
    s->listed = 1;
}
static void slab_unlink(pg_claim_slab *s) {
    if (s->prev != NULL) s->prev->next = s->next;
    else roomy = s->next;
    if (s->next != NULL) s->next->prev = s->prev;
    s->listed = 0;
}

pg_claim *pg_claim_new(void) {
    pg_lock();
    pg_claim_slab *s = roomy;
    if (s == NULL) {
        s = pg_alloc_fails() ? NULL : os_map(sizeof(pg_claim_slab));
        if (s == NULL) {
            pg_unlock();
            return NULL;
        }
        s->free = s->used = s->live = 0;
        slab_link(s);
        empty_slabs++;
    }
    pg_claim *c;
    if (s->free != 0) {
        c = &s->c[s->free - 1];
        s->free = c->h;
    } else {
        c = &s->c[s->used++];
    }
    if (s->live++ == 0) empty_slabs--;
    if (s->free == 0 && s->used == PG_CLAIM_SLAB) slab_unlink(s);
    c->h = 0;
    c->n = 0;
    c->slab = s;
    pg_unlock();
    return c;
}

void pg_claim_fill(pg_claim *c, uint32_t h, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) pg_N(h + i)->refs++;
    c->h = h;
    c->n = n;
}

void pg_claim_drop(pg_claim *c) {
    if (c == NULL) return;
    pg_lock();
    for (uint32_t i = 0; i < c->n; i++) {
        pg_node *n = pg_N(c->h + i);
        n->refs--;
        if (unheld(n)) free_cascade(c->h + i);
    }
    pg_claim_slab *s = c->slab;
    c->n = 0;
    c->h = s->free;
    s->free = (uint32_t)(c - s->c) + 1;
    if (!s->listed) slab_link(s);
    /* A slab the OS would not take back stays listed, empty: never lost. */
    if (--s->live == 0 && ++empty_slabs > 1) {
        slab_unlink(s);
        if (pg_unmap(s, sizeof(pg_claim_slab)) == 0) empty_slabs--;
        else slab_link(s);
    }
    unlock_after_cascade();
}

int32_t pg_hold(pg_claim *c, uint32_t h) {
    if (c == NULL) return PG_E_NOMEM;
    pg_lock();
    int32_t rc = PG_E_ARG;
    if (c->n == 0 && pg_handle_valid(h)) {
        pg_claim_fill(c, h, 1);
        rc = 0;
    }
    pg_unlock();
    return rc;
}

uint32_t pg_room_left(void) {
    pg_lock();
    uint32_t n = pg_seg_valid(current) && pg_segtab[current]->open
                 ? PG_SEG_NODES - pg_segtab[current]->used : 0;
    pg_unlock();
    return n;
}

void pg_close_current(void) {
    pg_lock();
    if (pg_seg_valid(current) && pg_segtab[current]->open) close_segment(pg_segtab[current]);
    current = 0;
#ifndef _WIN32
    /* The key names the thread's current segment, or none: once this one
     * is recycled its sid goes to another thread, whose segment this
     * thread's end must not close. */
    if (have_thread_key) pthread_setspecific(thread_key, NULL);
#endif
    pg_unlock();
}

/* -- records and accounting ---------------------------------------------------- */

void pg_reset_marks(void) {
    for (pg_seg *seg = newest; seg != NULL; seg = seg->older) {
        seg->reach_epoch = 0;
        for (uint32_t i = 0; i < seg->used; i++)
            if (!(seg->nodes[i].flags & PG_F_DEAD)) seg->nodes[i].mark = 0;
    }
}

int32_t pg_alive(uint32_t h) {
    pg_lock();
    int32_t alive = pg_handle_valid(h);
    pg_unlock();
    return alive;
}

/* A closure set on a node that already has parents: those parents are not
 * Python-held, so backward() can't tell from its root that a closure may
 * lie below.  While any such node lives, every backward records. */
int pg_set_py_backward(uint32_t h) {
    pg_lock();
    int rc = PG_E_ARG;
    if (pg_handle_valid(h)) {
        pg_node *n = pg_N(h);
        if (!(n->flags & PG_F_PY_BACKWARD)) {
            if (n->flags & PG_F_HAS_PARENT) {
                n->flags |= PG_F_LATE_PY;
                n_late_py++;
            }
            n->flags |= PG_F_PY_BACKWARD | PG_F_PY_HELD;   /* parents made later hold it */
        }
        rc = 0;
    }
    pg_unlock();
    return rc;
}

uint32_t pg_late_py_nodes(void) { return n_late_py; }

uint64_t pg_live_nodes(void) {
    pg_lock();
    uint64_t n = live_nodes;
    pg_unlock();
    return n;
}

uint32_t pg_live_segments(void) {
    pg_lock();
    uint32_t n = live_segs;
    pg_unlock();
    return n;
}

#ifdef PG_TEST_HOOKS
void pg_limit_segments(uint32_t n) {
    pg_lock();
    seg_cap = n == 0 || n > PG_MAX_SEGS ? PG_MAX_SEGS : n;
    pg_unlock();
}
#endif

uint64_t pg_segment_births(void) {
    pg_lock();
    uint64_t n = births;
    pg_unlock();
    return n;
}

uint32_t pg_unmap_failed(void) {
    pg_lock();
    uint32_t n = unmap_failures;
    pg_unlock();
    return n;
}

uint32_t pg_advice_refused(void) {
    pg_lock();
    uint32_t n = advice_refused;
    pg_unlock();
    return n;
}

uint64_t pg_live_nodes_locked(void) { return live_nodes; }
uint32_t pg_node_size(void) { return (uint32_t)sizeof(pg_node); }
