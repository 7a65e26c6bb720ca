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

int parity_greedy(pt_model *m, const int32_t *ids, int n, int steps, int32_t *out, float *margin) {
    pt_session *s = NULL;
    pt_session_params sp = {.n_ctx = n + steps + 1 < pt_model_max_ctx(m) ? n + steps + 1 : pt_model_max_ctx(m)};
    if (pt_session_create(m, &sp, &s) != PT_OK) return 0;
    pt_sampling_params smp = pt_sampling_default_params(NULL);
    smp.temperature = 0;
    int ok = pt_session_prompt(s, ids, (size_t)n) == PT_OK;
    for (int i = 0; ok && i < steps; i++) {
        pt_token_info ti;
        ok = pt_session_sample(s, &smp, NULL, &ti) == PT_OK;
        out[i] = ti.id;
        const float *lg = pt_session_logits(s); /* top-1 and top-2 of this step's logits */
        float t1 = -INFINITY, t2 = -INFINITY;
        for (int v = 0; v < pt_model_vocab_size(m); v++) {
            if (lg[v] > t1) t2 = t1, t1 = lg[v];
            else if (lg[v] > t2) t2 = lg[v];
        }
        margin[2 * i] = t1 - t2;
        margin[2 * i + 1] = t1;
        if (ok && i + 1 < steps) ok = pt_session_prompt(s, &ti.id, 1) == PT_OK;
    }
    if (!ok) printf("    greedy: %s\n", pt_last_error());
    pt_session_free(&s);
    return ok;
}

float parity_ulp_bf16(float x) {
    int e;
    frexpf(fabsf(x), &e);
    return ldexpf(1.0f, e - 8);
}
