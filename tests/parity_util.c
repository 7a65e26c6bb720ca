/* Parity-test helpers (see parity_util.h). */
#include "parity_util.h"

#include <math.h>
#include <stdio.h>

int parity_eval(pt_model *m, const int32_t *ids, int n, float *out) {
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = n + 40 < pt_model_max_ctx(m) ? n + 40 : pt_model_max_ctx(m)};
    int ok = pt_session_create(m, &sp, &s) == PT_OK && pt_session_eval_logits(s, ids, (size_t)n, out) == PT_OK;
    if (!ok) printf("    eval: %s\n", pt_last_error());
    pt_session_free(&s);
    return ok;
}

double parity_kl_row(const float *p, const float *q, int V) {
    double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0, kl = 0;
    for (int v = 0; v < V; v++) {
        mp = fmax(mp, p[v]);
        mq = fmax(mq, q[v]);
    }
    for (int v = 0; v < V; v++) {
        zp += exp(p[v] - mp);
        zq += exp(q[v] - mq);
    }
    double lzp = log(zp), lzq = log(zq);
    for (int v = 0; v < V; v++) {
        double lp = p[v] - mp - lzp, lq = q[v] - mq - lzq;
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}
