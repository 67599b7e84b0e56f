/*
 * The helpers pygrad/op_rules.py's rules call that C's libm lacks, shared by
 * the first-order rules (ops.c) and the second-order sweep (second_order.c).
 */
#ifndef PG_RULE_HELPERS_H
#define PG_RULE_HELPERS_H

#include <math.h>

/* micrograd's x ** k (x ** 2 is x * x, the correctly rounded square; pow is
 * within 0.52 ulp), pow with an exponent of 1 as its base without a call
 * (the gradient of x ** 2; pow gives the same number), and d|x|/dx =
 * sign(x): 0 at +-0, nan at nan. */
static inline double powk(double x, double k) { return k == 2.0 ? x * x : pow(x, k); }
static inline double pg_pow(double x, double e) { return e == 1.0 ? x : pow(x, e); }
static inline double sign_of(double x) { return x != x ? x : (double)((x > 0.0) - (x < 0.0)); }

#endif
