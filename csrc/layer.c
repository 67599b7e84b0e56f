/*
 * A whole layer across rows (Program.map): the neurons of one layer run as
 * one unit instead of one LINEAR row rule each (batch.c finds the layers).
 * Each input's rows are then loaded once for four neurons, and every sum
 * stays in registers instead of going through memory once per neuron.
 *
 * The numbers are the per-neuron row rules' (ops.c), bit for bit: the same
 * operations in the same order, only interleaved differently.
 *  - forward: y_i[r] = act(((b_i + w_i0 x_0[r]) + w_i1 x_1[r]) + ...);
 *  - g_i[r] = act'(y_i[r]) gy_i[r];
 *  - a weight's grad: gw_ij + x_j[r] g_i[r], over the rows r in order (a
 *    bias's: gb_i + 1 g_i[r], and 1 g is g exactly);
 *  - an input's row grad: gx_j[r] + w_ij g_i[r], for i from the last
 *    neuron to the first, the order in which backward visits the slots.
 * The weights' row-order sums run side by side across neurons, one lane
 * per neuron, over a rows-outer copy of g (gt).  The kernels are written
 * once (layer_body.h) for vectors of four doubles (AVX2, or plain x86-64)
 * and of eight (AVX-512, picked at run time where the CPU has it).
 *
 * Vectors are GCC/clang vector extensions; other compilers get no layers
 * (PG_LAYERS 0) and run the per-neuron rules.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "activation.h"
#include "program.h"

#if PG_LAYERS

/* The vector helpers are always inlined, so the ABI the compilers warn of
 * (vectors passed without AVX in the default build) is never used.  The
 * AVX2 clones call only helpers that take pointers, which clang requires. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wunknown-warning-option"
#endif
#pragma GCC diagnostic ignored "-Wpsabi"

typedef double v4 __attribute__((vector_size(32)));
typedef int64_t v4i __attribute__((vector_size(32)));

#define INLINE static inline __attribute__((always_inline))

/* The kernels' tiles are small arrays of vectors (acc[t][u]) indexed by
 * loops of a few constant steps: unrolled, the arrays live in registers.
 * -O2 (the build's level: csrc/cffi_build.py) unrolls them only when told;
 * left as loops, the arrays go through memory, four times the instructions
 * of a layer's backward. */
#define UNROLL _Pragma("GCC unroll 8")

INLINE v4 load4(const double *p) {
    v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}
INLINE void store4(double *p, v4 v) { memcpy(p, &v, sizeof v); }
INLINE v4 splat4(double a) { return (v4){a, a, a, a}; }
typedef double v8 __attribute__((vector_size(64)));
typedef int64_t v8i __attribute__((vector_size(64)));
#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE(a, b, i, j, k, l) __builtin_shufflevector(a, b, i, j, k, l)
#else
#define SHUFFLE(a, b, i, j, k, l) __builtin_shuffle(a, b, (v4i){i, j, k, l})
#endif
/* gt = g rows-outer, by 4 x 4 blocks: rows r .. r + 3 of lanes i .. i + 3,
 * 32 rows at a time, so that those rows of gt stay in L1 while every lane
 * is written into them. */
INLINE void transpose_rows(const double *g, size_t S, double *gt, size_t lanes, size_t n4) {
    for (size_t r0 = 0; r0 < n4; r0 += 32) {
        size_t r1 = n4 - r0 < 32 ? n4 : r0 + 32;
        for (size_t i = 0; i < lanes; i += 4)
            for (size_t r = r0; r < r1; r += 4) {
                v4 a = load4(g + i * S + r), b = load4(g + (i + 1) * S + r),
                   c = load4(g + (i + 2) * S + r), d = load4(g + (i + 3) * S + r);
                v4 ab02 = SHUFFLE(a, b, 0, 4, 2, 6), ab13 = SHUFFLE(a, b, 1, 5, 3, 7);
                v4 cd02 = SHUFFLE(c, d, 0, 4, 2, 6), cd13 = SHUFFLE(c, d, 1, 5, 3, 7);
                store4(gt + r * lanes + i, SHUFFLE(ab02, cd02, 0, 1, 4, 5));
                store4(gt + (r + 1) * lanes + i, SHUFFLE(ab13, cd13, 0, 1, 4, 5));
                store4(gt + (r + 2) * lanes + i, SHUFFLE(ab02, cd02, 2, 3, 6, 7));
                store4(gt + (r + 3) * lanes + i, SHUFFLE(ab13, cd13, 2, 3, 6, 7));
            }
    }
}

/* The kernels, four doubles to a vector (AVX2 where the CPU has it, else
 * plain x86-64 or any GCC/clang target): tiles that fit 16 registers. */
#define VW 4
#define V v4
#define LOAD load4
#define STORE store4
#define SPLAT splat4
#define NAME(x) x##_4
#define ATTR ROW_LOOP static
#define KINLINE INLINE
#define FU 2
#define SJ 2
#define GJ 2
#define GU 4
#define FROWS 32
#define SROWS 32
#define GROWS 32
#include "layer_body.h"
#undef VW
#undef V
#undef LOAD
#undef STORE
#undef SPLAT
#undef NAME
#undef ATTR
#undef KINLINE
#undef FU
#undef SJ
#undef GJ
#undef GU
#undef FROWS
#undef SROWS
#undef GROWS

#if PG_AVX512
#include <immintrin.h>
/* Eight doubles to a vector, where the CPU has AVX-512: tiles that fit its
 * 32 registers.  The same operations lane by lane, so the same bits. */
/* AVX-512's own broadcast: GCC builds a plain {a, a, ...} initializer
 * lane by lane here (eight masked broadcasts for one splat). */
#define INLINE512 static inline __attribute__((always_inline, target("avx512f")))
INLINE512 v8 load8(const double *p) { return (v8)_mm512_loadu_pd(p); }
INLINE512 void store8(double *p, v8 v) { _mm512_storeu_pd(p, (__m512d)v); }
INLINE512 v8 splat8(double a) { return (v8)_mm512_set1_pd(a); }
#define VW 8
#define V v8
#define LOAD load8
#define STORE store8
#define SPLAT splat8
#define NAME(x) x##_8
#define ATTR static __attribute__((target("avx512f")))
#define KINLINE INLINE512
#define FU 4
#define SJ 4
#define GJ 4
#define GU 3
#define FROWS 32
#define SROWS 32
#define GROWS 48
#include "layer_body.h"

/* Checked once: __builtin_cpu_supports also asks whether the OS saves the
 * AVX-512 registers.  PYGRAD_NO_AVX512 (set to anything) picks the
 * four-wide kernels instead: for the tests, which compare the two, and for
 * measuring. */
static int have_avx512(void) {
    /* Atomic: the first threaded run's threads may all ask at once (each
     * then works out the same answer). */
    static atomic_int known = -1;
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k < 0) {
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx512f") && getenv("PYGRAD_NO_AVX512") == NULL ? 1 : 0;
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k;
}
#else
static int have_avx512(void) { return 0; }
static void layer_forward_8(const pg_layer *L, size_t n, double *dump) { layer_forward_4(L, n, dump); }
static void layer_backward_8(const pg_layer *L, size_t n, const pg_layer_scratch *s) {
    layer_backward_4(L, n, s);
}
#endif

void pg_layer_forward(const pg_layer *L, size_t n, double *dump) {
    if (have_avx512()) {
        layer_forward_8(L, n, dump);
    } else {
        layer_forward_4(L, n, dump);
    }
}

void pg_layer_backward(const pg_layer *L, size_t n, const pg_layer_scratch *s) {
    if (have_avx512()) {
        layer_backward_8(L, n, s);
    } else {
        layer_backward_4(L, n, s);
    }
}

#endif
