/*
 * Node lifetime.  The whole design, once (Python's side: pygrad/_lifetime.py):
 *
 *   A node is kept while something holds it:
 *     - a parent node (refs counts them);
 *     - a node claim: one Python object holding this node (refs counts it);
 *     - the segment claim of its graph segment (one Python object per segment).
 *   When none holds it, it is freed, and its children lose a parent.
 *
 *         created ──► held ──(refs == 0 and segment unclaimed)──► freed
 *                       ▲                                           │
 *                       └──── never: a freed slot is reused only ◄──┘
 *                             as a new node (leaf pool), or after
 *                             its whole segment is recycled
 *
 * Two kinds of segment, both PG_SEG_NODES slots mapped from the OS and never
 * moved, so a handle (sid << PG_SEG_BITS | offset) stays valid while its
 * node lives:
 *   - graph segments take op results by bump allocation, so creation order
 *     is a topological order (backward.c relies on it).  Python holds one
 *     segment claim per graph segment, which every Value made there shares,
 *     so an op costs no per-node bookkeeping.  When that claim dies, one scan
 *     frees every node of the segment that nothing else holds;
 *   - leaf segments (the leaf pool) take Values made by ``Value(x)``; each is
 *     held by a node claim of its own, and its slot is reused once it dies,
 *     so kept leaves never pin graph nodes and pack densely.  Leaves have no
 *     children, so slot reuse can't break the topological order.
 *
 * Python's claims are pg_claim structs that Python allocates empty and wraps
 * with ffi.gc(claim, pg_release) *before* asking C to fill them: C fills a
 * claim and takes its hold in one call, and the release runs in C when the
 * Python object dies.  No Python code runs at release, so a KeyboardInterrupt
 * can't cut one in half, and no claim is ever released twice or lost.
 *
 * Freeing cascades over an intrusive work list (the dead node's `mark`),
 * never on the C stack.
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
#else
#include <sys/mman.h>
#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS MAP_ANON
#endif
static void *os_map(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static int os_unmap(void *p, size_t size) { return munmap(p, size); }
#endif

/* Freed segments kept mapped for reuse: mapping is a syscall and a page
 * fault per page, while a training loop frees and needs segments steadily. */
#define PG_POOL_MAX 32
#define PG_NO_NODE UINT32_MAX

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
static uint64_t births;
static pg_seg *newest;             /* tail of the live list (older links) */
static pg_seg *leaf_room;          /* leaf segments with a free slot */
static uint32_t n_py_backward;
static uint32_t seg_cap = PG_MAX_SEGS;   /* pg_limit_segments, for tests */

/* Is there a segment id left in the handle space? */
static int space_left(void) {
    return live_segs + 1 < seg_cap && (n_free_sids > 0 || next_sid < PG_MAX_SEGS);
}

void pg_lock(void) { pg_mutex_lock(&lock); }
void pg_unlock(void) { pg_mutex_unlock(&lock); }

#ifndef _WIN32
/* fork() copies the lock in whatever state another thread left it: take it
 * (and the allocation hook's) around fork, so the child starts with both
 * free and the graph consistent. */
static void fork_prepare(void) { pg_mutex_lock(&lock); pg_alloc_hook_lock(); }
static void fork_parent(void) { pg_alloc_hook_unlock(); pg_mutex_unlock(&lock); }
__attribute__((constructor)) static void register_fork_handlers(void) {
    pthread_atfork(fork_prepare, fork_parent, fork_parent);
}
#endif

static pg_seg *seg_new(int leaf) {
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
    seg->claimed = !leaf;
    seg->sid = sid;
    seg->leaf = (uint32_t)leaf;
    seg->free_slot = PG_NO_NODE;
    seg->edges = NULL;
    seg->next_free = NULL;
    seg->room_prev = seg->room_next = NULL;
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

static void room_remove(pg_seg *seg) {
    if (seg->room_prev != NULL) seg->room_prev->room_next = seg->room_next;
    else if (leaf_room == seg) leaf_room = seg->room_next;
    if (seg->room_next != NULL) seg->room_next->room_prev = seg->room_prev;
    seg->room_prev = seg->room_next = NULL;
}

static void room_add(pg_seg *seg) {
    seg->room_prev = NULL;
    seg->room_next = leaf_room;
    if (leaf_room != NULL) leaf_room->room_prev = seg;
    leaf_room = seg;
}

static void recycle(pg_seg *seg) {
    pg_edge_chunk *c = seg->edges;
    while (c != NULL) {
        pg_edge_chunk *next = c->next;
        free(c);
        c = next;
    }
    if (seg->leaf) room_remove(seg);
    if (seg->older != NULL) seg->older->newer = seg->newer;
    if (seg->newer != NULL) seg->newer->older = seg->older;
    else newest = seg->older;
    pg_segtab[seg->sid] = NULL;
    free_sids[n_free_sids++] = seg->sid;
    live_segs--;
    /* A mapping the OS would not take back stays pooled: never lost. */
    if (pool_len < PG_POOL_MAX || pg_unmap(seg, sizeof(pg_seg)) != 0) {
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

/* A freed leaf slot goes back to its segment's free list; the last empty
 * leaf segment is kept as the pool's spare, so that a loop making and
 * dropping leaves doesn't open a (newer) segment every step. */
static void leaf_slot_free(pg_seg *seg, uint32_t h) {
    pg_node *n = pg_N(h);
    n->mark = seg->free_slot;
    seg->free_slot = h & (PG_SEG_NODES - 1);
    if (seg->room_prev == NULL && leaf_room != seg) room_add(seg);
    if (seg->live == 0 && (seg->room_prev != NULL || seg->room_next != NULL)) recycle(seg);
}

/* Free node h (nothing holds it) and whatever that leaves unheld. */
static void free_cascade(uint32_t h) {
    pg_N(h)->flags |= PG_F_DEAD;
    pg_N(h)->mark = PG_NO_NODE;
    while (h != PG_NO_NODE) {
        pg_node *n = pg_N(h);
        uint32_t next = n->mark;
        const uint32_t *kids;
        uint32_t nk = pg_children(n, &kids);
        for (uint32_t i = 0; i < nk; i++) {
            pg_node *c = pg_N(kids[i]);
            if (--c->refs == 0 && !(c->flags & PG_F_DEAD)
                    && !pg_segtab[kids[i] >> PG_SEG_BITS]->claimed) {
                c->flags |= PG_F_DEAD;     /* queued: never queue it twice */
                c->mark = next;
                next = kids[i];
            }
        }
        n->extra = 0;
        if (n->flags & PG_F_PY_BACKWARD) n_py_backward--;
        live_nodes--;
        pg_seg *seg = pg_segtab[h >> PG_SEG_BITS];
        seg->live--;
        if (seg->leaf) leaf_slot_free(seg, h);
        else if (seg->live == 0 && !seg->claimed) recycle(seg);
        h = next;
    }
}

/* Give back to the OS the pages of seg that hold only dead nodes.  An
 * unclaimed graph segment never allocates again, so those slots are never
 * written again; reading them later (a backward walk) reads zeros, which
 * is no live node.  This is what lets a kept Value cost its own nodes, not
 * its segment's 192 KiB. */
static void discard_dead_pages(pg_seg *seg) {
#if defined(MADV_DONTNEED) && !defined(_WIN32)
    const uintptr_t page = 4096;
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
        if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
        i = j;
    }
#else
    (void)seg;
#endif
}

/* The segment claim died: free every node of it that nothing else holds. */
static void release_segment(uint32_t sid) {
    pg_seg *seg = pg_segtab[sid];
    seg->claimed = 0;
    seg->live++;        /* keep the segment while the scan walks it */
    uint32_t base = sid << PG_SEG_BITS;
    for (uint32_t i = 0; i < seg->used; i++) {
        pg_node *n = &seg->nodes[i];
        if (n->refs == 0 && !(n->flags & PG_F_DEAD)) free_cascade(base | i);
    }
    if (--seg->live == 0) recycle(seg);
    else if (seg->live < seg->used / 2) discard_dead_pages(seg);
}

static void release_node(uint32_t h) {
    pg_node *n = pg_N(h);
    if (--n->refs == 0 && !pg_segtab[h >> PG_SEG_BITS]->claimed) free_cascade(h);
}

void pg_release(pg_claim *c) {
    pg_lock();
    if (c->kind == PG_CLAIM_SEGMENT) release_segment(c->id);
    else if (c->kind == PG_CLAIM_NODE) release_node(c->id);
    c->kind = PG_CLAIM_NONE;
    pg_unlock();
}

int32_t pg_open_segment(pg_claim *c) {
    if (c->kind != PG_CLAIM_NONE) return PG_E_ARG;
    pg_lock();
    int32_t rc = space_left() ? PG_E_NOMEM : PG_E_SPACE;
    pg_seg *seg = seg_new(0);
    if (seg != NULL) {
        c->kind = PG_CLAIM_SEGMENT;
        c->id = seg->sid;
        rc = (int32_t)seg->sid;
    }
    pg_unlock();
    return rc;
}

int32_t pg_new_leaf(pg_claim *c, double data) {
    if (c->kind != PG_CLAIM_NONE) return PG_E_ARG;
    pg_lock();
    pg_seg *seg = leaf_room;
    int32_t rc = PG_E_NOMEM;
    if (seg == NULL) {
        if (!space_left()) rc = PG_E_SPACE;
        else if ((seg = seg_new(1)) != NULL) room_add(seg);
    }
    if (seg != NULL) {
        uint32_t off;
        if (seg->free_slot != PG_NO_NODE) {
            off = seg->free_slot;
            seg->free_slot = seg->nodes[off].mark;
        } else {
            off = seg->used++;
        }
        if (seg->free_slot == PG_NO_NODE && seg->used == PG_SEG_NODES) room_remove(seg);
        seg->live++;
        live_nodes++;
        uint32_t h = (seg->sid << PG_SEG_BITS) | off;
        pg_node *n = pg_N(h);
        pg_node_init(n, PG_OP_LEAF);
        n->data = data;
        n->refs = 1;
        c->kind = PG_CLAIM_NODE;
        c->id = h;
        rc = (int32_t)h;
    }
    pg_unlock();
    return rc;
}

int32_t pg_hold(pg_claim *c, uint32_t h) {
    if (c->kind != PG_CLAIM_NONE) return PG_E_ARG;
    pg_lock();
    int32_t rc = PG_E_ARG;
    if (pg_handle_valid(h)) {
        pg_N(h)->refs++;
        c->kind = PG_CLAIM_NODE;
        c->id = h;
        rc = 0;
    }
    pg_unlock();
    return rc;
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
        uint32_t cap = count > 4096 ? count : 4096;
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

void pg_reset_marks(void) {
    for (pg_seg *seg = newest; seg != NULL; seg = seg->older) {
        seg->reach_epoch = 0;
        for (uint32_t i = 0; i < seg->used; i++)
            if (!(seg->nodes[i].flags & PG_F_DEAD)) seg->nodes[i].mark = 0;
    }
}

uint32_t pg_seg_used(uint32_t sid) {
    pg_lock();
    uint32_t used = pg_seg_valid(sid) ? pg_segtab[sid]->used : 0;
    pg_unlock();
    return used;
}

uint32_t pg_extra(uint32_t h) {
    pg_lock();
    uint32_t e = pg_handle_valid(h) ? pg_N(h)->extra : 0;
    pg_unlock();
    return e;
}

int pg_set_extra(uint32_t h, uint32_t extra) {
    pg_lock();
    int ok = pg_handle_valid(h);
    if (ok) pg_N(h)->extra = extra;
    pg_unlock();
    return ok ? 0 : PG_E_ARG;
}

int pg_set_py_backward(uint32_t h) {
    pg_lock();
    pg_node *n = pg_N(h);
    if (!(n->flags & PG_F_PY_BACKWARD)) {
        n_py_backward++;
        n->flags |= PG_F_PY_BACKWARD | PG_F_PY_HELD;   /* parents made later hold it */
    }
    pg_unlock();
    return 0;
}

uint32_t pg_py_backward_nodes(void) { return n_py_backward; }

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

void pg_limit_segments(uint32_t n) {
    pg_lock();
    seg_cap = n == 0 || n > PG_MAX_SEGS ? PG_MAX_SEGS : n;
    pg_unlock();
}

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

uint64_t pg_live_nodes_locked(void) { return live_nodes; }
uint32_t pg_node_size(void) { return (uint32_t)sizeof(pg_node); }
