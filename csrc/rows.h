/*
 * Row rules: one op applied across the rows of a batch (Program.map), in
 * structure-of-arrays form.  Made in ops.c from the same expressions as the
 * node rules, so a row's numbers are the node rule's, bit for bit.
 */
#ifndef PG_ROWS_H
#define PG_ROWS_H

#include <stddef.h>
#include "node.h"

typedef struct pg_rows {
    size_t n;               /* rows */
    double k;               /* the node's constant (POWK's exponent) */
    uint32_t nk;            /* children */
    int variant;            /* the node's variant (LINEAR's activation, bias bit) */
    double *y;              /* the output, per row */
    const double *gy;       /* its grad, per row */
    const double *const *x; /* each child's data: per row, or one shared value */
    const size_t *xs;       /* each child's stride: 1 per row, 0 shared */
    double *const *gx;      /* each child's grad: per row, or one sum over rows */
    const size_t *gxs;      /* each child's grad stride: 1 per row, 0 one sum */
    double *tmp;            /* n doubles of scratch */
} pg_rows;

typedef struct pg_row_rule {
    void (*forward)(const pg_rows *r);
    void (*backward)(const pg_rows *r);
} pg_row_rule;

extern const pg_row_rule pg_row_rules[PG_OP_COUNT];

#endif
