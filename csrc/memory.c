/*
 * Node lifetime: segments, claims, and the release cascade.
 *
 * Nodes live in fixed segments of PG_SEG_NODES slots, mapped from the OS and
 * never moved, so a handle stays valid for the node's whole life.  Python
 * holds one "claim" per live segment object; every Python Value holds its
 * segment object.  A node is freed when nothing can reach it any more:
 *   - no parent node holds it (refs == 0), and
 *   - no Python object claims its segment (claims == 0).
 * The second condition is checked once per segment, when its last claim is
 * released, which is why no Python finalizer runs per node.  Freeing a node
 * drops its children's refs and may free them in turn: the cascade runs on
 * an intrusive work list (the dead node's `mark`), never on the C stack.
 * A slot is not reused until its whole segment is empty and recycled.
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
static void os_unmap(void *p, size_t size) { (void)size; VirtualFree(p, 0, MEM_RELEASE); }
#else
#include <sys/mman.h>
#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS MAP_ANON
#endif
static void *os_map(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static void os_unmap(void *p, size_t size) { munmap(p, size); }
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
static uint32_t scanning = 0;      /* segment being swept by pg_seg_release */
static uint64_t births;
static pg_seg *newest;             /* tail of the live list (older links) */

/*
 * Notices for Python, drained after each release:
 *   reaped:  extras of nodes that died, for Python to drop its records;
 *   orphans: pinned nodes (a Python backward whose Value is gone) that just
 *            lost their last parent, so Python can let go of the closure.
 * Each buffer always has room for every node that could be queued, so
 * freeing never needs to allocate.
 */
static uint32_t *reaped;
static uint32_t n_reaped, reaped_cap, n_with_extra;
static uint32_t *orphans;
static uint32_t n_orphans, orphans_cap, n_py_backward;

#define PG_F_PINNED 16
#define PG_F_ORPHAN_QUEUED 32

/* Room for `need` entries in *buf; lock held. */
static int reserve(uint32_t **buf, uint32_t *cap, uint32_t need) {
    if (need <= *cap) return 1;
    uint32_t cap2 = *cap ? 2 * *cap : 256;
    while (cap2 < need) cap2 *= 2;
    uint32_t *p = pg_realloc(*buf, (size_t)cap2 * sizeof(uint32_t));
    if (p == NULL) return 0;
    *buf = p;
    *cap = cap2;
    return 1;
}

void pg_lock(void) { pg_mutex_lock(&lock); }
void pg_unlock(void) { pg_mutex_unlock(&lock); }

static size_t seg_bytes(void) { return sizeof(pg_seg); }

int32_t pg_seg_new(void) {
    pg_lock();
    uint32_t sid;
    if (n_free_sids > 0) {
        sid = free_sids[--n_free_sids];
    } else if (next_sid < PG_MAX_SEGS) {
        sid = next_sid++;
    } else {
        pg_unlock();
        return PG_E_NOMEM;
    }
    pg_seg *seg = NULL;
    if (!pg_alloc_fails()) {
        seg = pool;
        if (seg != NULL) {
            pool = seg->next_free;
            pool_len--;
        } else {
            seg = os_map(seg_bytes());
        }
    }
    if (seg == NULL) {
        free_sids[n_free_sids++] = sid;
        pg_unlock();
        return PG_E_NOMEM;
    }
    seg->used = 0;
    seg->live = 0;
    seg->claims = 1;
    seg->sid = sid;
    seg->edges = NULL;
    seg->next_free = NULL;
    seg->birth = ++births;
    seg->reach_epoch = 0;
    seg->older = newest;
    seg->newer = NULL;
    if (newest != NULL) newest->newer = seg;
    newest = seg;
    pg_segtab[sid] = seg;
    live_segs++;
    pg_unlock();
    return (int32_t)sid;
}

static void recycle(pg_seg *seg) {
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
    if (pool_len < PG_POOL_MAX) {
        seg->next_free = pool;
        pool = seg;
        pool_len++;
    } else {
        os_unmap(seg, seg_bytes());
    }
}

static int seg_valid(uint32_t sid) {
    return sid > 0 && sid < PG_MAX_SEGS && pg_segtab[sid] != NULL;
}

void pg_seg_claim(uint32_t sid) {
    pg_lock();
    if (seg_valid(sid)) pg_segtab[sid]->claims++;
    pg_unlock();
}

/* After a child lost a parent or pin: queue it if it is now held only by
 * its own pin (a Python backward nobody above needs any more). */
static void note_orphan(pg_node *c, uint32_t h) {
    if (c->refs == 1 && (c->flags & PG_F_PINNED) && !(c->flags & PG_F_ORPHAN_QUEUED)) {
        c->flags |= PG_F_ORPHAN_QUEUED;
        orphans[n_orphans++] = h;
    }
}

/* Free node h (refs == 0, segment unclaimed) and whatever that orphans. */
static void free_cascade(uint32_t h) {
    pg_N(h)->mark = PG_NO_NODE;
    while (h != PG_NO_NODE) {
        pg_node *n = pg_N(h);
        uint32_t next = n->mark;
        const uint32_t *kids;
        uint32_t nk = pg_children(n, &kids);
        for (uint32_t i = 0; i < nk; i++) {
            pg_node *c = pg_N(kids[i]);
            if (--c->refs == 0 && !(c->flags & PG_F_DEAD)
                    && pg_segtab[kids[i] >> PG_SEG_BITS]->claims == 0) {
                c->flags |= PG_F_DEAD;     /* queued: never queue it twice */
                c->mark = next;
                next = kids[i];
            } else {
                note_orphan(c, kids[i]);
            }
        }
        n->flags |= PG_F_DEAD;
        if (n->extra != 0) {
            reaped[n_reaped++] = n->extra;
            n_with_extra--;
            n->extra = 0;
        }
        if (n->flags & PG_F_PY_BACKWARD) n_py_backward--;
        live_nodes--;
        pg_seg *seg = pg_segtab[h >> PG_SEG_BITS];
        if (--seg->live == 0 && seg->claims == 0 && seg->sid != scanning)
            recycle(seg);
        h = next;
    }
}

int32_t pg_seg_release(uint32_t sid) {
    pg_lock();
    if (!seg_valid(sid) || pg_segtab[sid]->claims == 0) {
        pg_unlock();
        return PG_E_ARG;
    }
    pg_seg *seg = pg_segtab[sid];
    if (--seg->claims == 0) {
        scanning = sid;
        uint32_t base = sid << PG_SEG_BITS;
        for (uint32_t i = 0; i < seg->used; i++) {
            pg_node *n = &seg->nodes[i];
            if (n->refs == 0 && !(n->flags & PG_F_DEAD)) {
                n->flags |= PG_F_DEAD;
                free_cascade(base | i);
            }
        }
        scanning = 0;
        if (seg->live == 0) recycle(seg);
    }
    int32_t pending = (int32_t)(n_reaped + n_orphans);
    pg_unlock();
    return pending;
}

int32_t pg_alloc_nodes(uint32_t sid, uint32_t count) {
    if (!seg_valid(sid)) return PG_E_ARG;
    pg_seg *seg = pg_segtab[sid];
    if (seg->claims == 0) return PG_E_ARG;
    if (seg->used + count > PG_SEG_NODES) return PG_E_FULL;
    uint32_t off = seg->used;
    seg->used += count;
    seg->live += count;
    live_nodes += count;
    return (int32_t)((sid << PG_SEG_BITS) | off);
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

int pg_handle_valid(uint32_t h) {
    uint32_t sid = h >> PG_SEG_BITS;
    if (!seg_valid(sid)) return 0;
    if ((h & (PG_SEG_NODES - 1)) >= pg_segtab[sid]->used) return 0;
    return !(pg_N(h)->flags & PG_F_DEAD);
}

int pg_check_kid(uint32_t sid, uint32_t h) {
    if (!pg_handle_valid(h)) return PG_E_ARG;
    if (pg_segtab[h >> PG_SEG_BITS]->birth > pg_segtab[sid]->birth) return PG_E_FULL;
    return 0;
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
    uint32_t used = seg_valid(sid) ? pg_segtab[sid]->used : 0;
    pg_unlock();
    return used;
}

uint32_t pg_extra(uint32_t h) { return pg_N(h)->extra; }

int pg_set_extra(uint32_t h, uint32_t extra) {
    pg_lock();
    pg_node *n = pg_N(h);
    if (n->extra == 0 && extra != 0) {
        if (!reserve(&reaped, &reaped_cap, n_reaped + n_with_extra + 1)) {
            pg_unlock();
            return PG_E_NOMEM;
        }
        n_with_extra++;
    } else if (n->extra != 0 && extra == 0) {
        n_with_extra--;
    }
    n->extra = extra;
    pg_unlock();
    return 0;
}

uint32_t pg_take_reaped(uint32_t *out, uint32_t cap) {
    pg_lock();
    uint32_t k = 0;
    while (k < cap && n_reaped > 0) out[k++] = reaped[--n_reaped];
    pg_unlock();
    return k;
}

int pg_set_py_backward(uint32_t h) {
    pg_lock();
    pg_node *n = pg_N(h);
    if (!(n->flags & PG_F_PY_BACKWARD)) {
        if (!reserve(&orphans, &orphans_cap, n_py_backward + 1)) {
            pg_unlock();
            return PG_E_NOMEM;
        }
        n_py_backward++;
        n->flags |= PG_F_PY_BACKWARD;
    }
    pg_unlock();
    return 0;
}

int pg_pin_if_parented(uint32_t h) {
    pg_lock();
    pg_node *n = pg_N(h);
    int pinned = 0;
    if (n->refs > 0 && !(n->flags & PG_F_PINNED)) {
        n->refs++;
        n->flags |= PG_F_PINNED;
        pinned = 1;
    }
    pg_unlock();
    return pinned;
}

void pg_unpin(uint32_t h) {
    pg_lock();
    pg_node *n = pg_N(h);
    if (n->flags & PG_F_PINNED) {
        n->flags &= (uint8_t)~PG_F_PINNED;
        n->refs--;
    }
    pg_unlock();
}

int pg_unpin_orphan(uint32_t h) {
    pg_lock();
    pg_node *n = pg_N(h);
    int done = 0;
    if ((n->flags & PG_F_PINNED) && n->refs == 1) {
        n->flags &= (uint8_t)~PG_F_PINNED;
        n->refs = 0;
        if (pg_segtab[h >> PG_SEG_BITS]->claims == 0) {
            n->flags |= PG_F_DEAD;
            free_cascade(h);
        }
        done = 1;
    }
    pg_unlock();
    return done;
}

void pg_ref(uint32_t h) {
    pg_lock();
    pg_N(h)->refs++;
    pg_unlock();
}

int32_t pg_unref(uint32_t h) {
    pg_lock();
    pg_node *n = pg_N(h);
    if (--n->refs == 0 && !(n->flags & PG_F_DEAD) && pg_segtab[h >> PG_SEG_BITS]->claims == 0) {
        n->flags |= PG_F_DEAD;
        free_cascade(h);
    } else {
        note_orphan(n, h);
    }
    int32_t pending = (int32_t)(n_reaped + n_orphans);
    pg_unlock();
    return pending;
}

uint32_t pg_take_orphans(uint32_t *out, uint32_t cap) {
    pg_lock();
    uint32_t k = 0;
    while (k < cap && n_orphans > 0) {
        uint32_t h = orphans[--n_orphans];
        pg_N(h)->flags &= (uint8_t)~PG_F_ORPHAN_QUEUED;
        out[k++] = h;
    }
    pg_unlock();
    return k;
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

uint64_t pg_live_nodes_locked(void) { return live_nodes; }
uint32_t pg_node_size(void) { return (uint32_t)sizeof(pg_node); }
