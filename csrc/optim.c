/*
 * Optimizer steps over many parameters in one call.  pygrad/optim.py holds
 * the same update in Python for the reference engine; keep them in step.
 */
#include <math.h>
#include "node.h"

/* g = grad (+ weight_decay * data); with momentum, v = momentum * v + g and
 * the step uses v; data = data - lr * step.  Each step counts itself in
 * *steps, in the same call: no Ctrl-C can fall between update and count. */
int32_t pg_sgd_step(pg_node *const *params, uint32_t n, double lr, double momentum,
                    double weight_decay, double *velocity, size_t nvelocity, double *steps) {
    if (nvelocity < n) return PG_E_ARG;
    for (uint32_t i = 0; i < n; i++) {
        pg_node *p = params[i];
        double g = p->grad;
        if (weight_decay != 0.0) g = g + weight_decay * p->data;
        if (momentum != 0.0) {
            velocity[i] = momentum * velocity[i] + g;
            g = velocity[i];
        }
        p->data = p->data - lr * g;
    }
    *steps += 1.0;
    return 0;
}

/* Adam (Kingma & Ba), bias corrections bias1 = 1 - beta1**t and
 * bias2 = 1 - beta2**t given by the caller. */
int32_t pg_adam_step(pg_node *const *params, uint32_t n, double lr, double beta1, double beta2,
                     double eps, double weight_decay, double bias1, double bias2,
                     double *m, size_t nm, double *v, size_t nv, double *steps) {
    if (nm < n || nv < n) return PG_E_ARG;
    for (uint32_t i = 0; i < n; i++) {
        pg_node *p = params[i];
        double g = p->grad;
        if (weight_decay != 0.0) g = g + weight_decay * p->data;
        m[i] = beta1 * m[i] + (1.0 - beta1) * g;
        v[i] = beta2 * v[i] + (1.0 - beta2) * (g * g);
        double mhat = m[i] / bias1;
        double vhat = v[i] / bias2;
        p->data = p->data - lr * mhat / (sqrt(vhat) + eps);
    }
    *steps += 1.0;
    return 0;
}
