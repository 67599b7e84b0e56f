/* Bind the few libc/libm symbols whose newest versions are younger than
 * glibc 2.17 to their 2.2.5 versions (x86_64's baseline), so that the Linux
 * wheel's tag is manylinux_2_17 (manylinux2014: CentOS 7, Ubuntu 18.04 and
 * later) rather than manylinux_2_34.  Force-included into every translation
 * unit by csrc/cffi_build.py (-include), because a .symver binds only the
 * references of the object it is in.
 *
 * Why this keeps results bit-identical to Python's math module:
 * - exp, log, log2 and pow @GLIBC_2.2.5 are, in glibc >= 2.29, wrappers that
 *   compute with the same implementation as the 2.29 versions and differ only
 *   in SVID-style errno handling, which the core never reads; on an older
 *   glibc both the core and Python's math call the one implementation there.
 * - pthread_mutex_trylock and
 *   pthread_create/pthread_detach (batch.c's threads)
 *   @GLIBC_2.2.5 are the same functions, exported under the old version
 *   since they moved into libc in 2.34.
 * The test suite compares every op with the reference engine, which calls
 * Python's math, bit for bit. */
#ifndef PG_GLIBC_VERSIONS_H
#define PG_GLIBC_VERSIONS_H
/* It includes nothing: a header read before a file's own feature macros
 * (test_hooks.c's _POSIX_C_SOURCE) would fix them too early.  glibc, not musl,
 * is told apart by a header only glibc has. */
#if defined(__linux__) && defined(__x86_64__) && defined(__has_include)
#if __has_include(<gnu/libc-version.h>)
__asm__(".symver exp,exp@GLIBC_2.2.5");
__asm__(".symver log,log@GLIBC_2.2.5");
__asm__(".symver log2,log2@GLIBC_2.2.5");
__asm__(".symver pow,pow@GLIBC_2.2.5");
__asm__(".symver pthread_mutex_trylock,pthread_mutex_trylock@GLIBC_2.2.5");
__asm__(".symver pthread_create,pthread_create@GLIBC_2.2.5");
__asm__(".symver pthread_detach,pthread_detach@GLIBC_2.2.5");
#endif
#endif
#endif
