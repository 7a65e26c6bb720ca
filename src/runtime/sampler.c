/* The token sampler (see sampler.h for the pipeline and its order). */
#include "runtime/sampler.h"

#include "base/error.h"
#include "runtime/sample_math.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

pt_status pt_sampler_init(pt_sampler *s, int vocab) {
    memset(s, 0, sizeof *s);
    if (vocab <= 0) return pt_error(PT_ERR_INVALID_ARG, "sampler: vocabulary size %d", vocab);
    s->vocab = vocab;
    s->work = malloc((size_t)vocab * sizeof *s->work);
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    s->count = calloc((size_t)vocab, sizeof *s->count);
    s->prob = malloc((size_t)vocab * sizeof *s->prob);
    s->seq = malloc((size_t)vocab * sizeof *s->seq);
    if (!s->work || !s->idx || !s->count || !s->prob || !s->seq) {
        pt_sampler_free(s);
        return pt_error(PT_ERR_NOMEM, "sampler: out of memory for a vocabulary of %d", vocab);
    }
    pt_sampler_seed(s, 0);
    s->seeded = 0;
    return PT_OK;
}

void pt_sampler_free(pt_sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->idx);
    free(s->count);
    free(s->prob);
    free(s->seq);
    s->prob = NULL;
    s->seq = NULL;
    s->work = NULL;
    s->idx = NULL;
    s->count = NULL;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void pt_sampler_seed(pt_sampler *s, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->seed = seed;
    s->seeded = 1;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t *st) {
    uint64_t result = rotl(st[1] * 5, 7) * 9;
    uint64_t t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl(st[3], 45);
    return result;
}

double pt_sampler_uniform(pt_sampler *s) {
    /* top 53 bits -> [0, 1) exactly representable */
    return (double)(xoshiro_next(s->rng) >> 11) * (1.0 / 9007199254740992.0);
}

pt_status pt_sampling_validate(const pt_sampling_params *sp) {
    if (!sp) return pt_error(PT_ERR_INVALID_ARG, "sampling parameters: NULL");
    if (!isfinite(sp->temperature) || sp->temperature < 0)
        return pt_error(PT_ERR_INVALID_ARG, "sampling: temperature must be >= 0, got %g",
                        (double)sp->temperature);
    if (sp->top_k < 0) return pt_error(PT_ERR_INVALID_ARG, "sampling: top_k must be >= 0, got %d", sp->top_k);
    if (!isfinite(sp->top_p) || sp->top_p <= 0 || sp->top_p > 1)
        return pt_error(PT_ERR_INVALID_ARG, "sampling: top_p must be in (0, 1], got %g", (double)sp->top_p);
    if (!isfinite(sp->min_p) || sp->min_p < 0 || sp->min_p > 1)
        return pt_error(PT_ERR_INVALID_ARG, "sampling: min_p must be in [0, 1], got %g", (double)sp->min_p);
    if (!isfinite(sp->repetition_penalty) || sp->repetition_penalty <= 0)
        return pt_error(PT_ERR_INVALID_ARG, "sampling: repetition_penalty must be > 0, got %g",
                        (double)sp->repetition_penalty);
    if (!isfinite(sp->presence_penalty))
        return pt_error(PT_ERR_INVALID_ARG, "sampling: presence_penalty must be finite");
    if (!isfinite(sp->frequency_penalty))
        return pt_error(PT_ERR_INVALID_ARG, "sampling: frequency_penalty must be finite");
    if (sp->repeat_last_n < 0)
        return pt_error(PT_ERR_INVALID_ARG, "sampling: repeat_last_n must be >= 0, got %d", sp->repeat_last_n);
    if (sp->n_logprobs < 0 || sp->n_logprobs > 20)
        return pt_error(PT_ERR_INVALID_ARG, "sampling: n_logprobs must be in 0..20, got %d", sp->n_logprobs);
    return PT_OK;
}

/* exp(x) for x <= 0, 4 lanes at a time in f32 (GCC/Clang vector extensions:
 * SSE/AVX code on x86, NEON on Arm, no libm call): x = n*ln2 + r with
 * |r| <= ln2/2 (Cody-Waite, ln2 split in two so n*ln2_hi is exact), exp(r)
 * by its degree-6 Taylor polynomial (error < 2e-7 relative on that interval,
 * below the f32 rounding of the result), times 2^n built in the exponent
 * bits. x below -87 (incl. -inf and NaN, whose comparison is false) clamps
 * to exp(-87) ~ 1.6e-38, which is 0 for every sum this is used in. */
typedef float pt_v4f __attribute__((vector_size(16))); /* 16 bytes: the base ABI */
typedef int32_t pt_v4i __attribute__((vector_size(16)));

static inline pt_v4f exp_nonpos4(pt_v4f x) {
    const pt_v4f lo = (pt_v4f){0} - 87.0f;
    pt_v4i keep = x > lo; /* lanes: -1 where x > -87 */
    x = (pt_v4f)(((pt_v4i)x & keep) | ((pt_v4i)lo & ~keep));
    const float magic = 12582912.0f; /* 1.5*2^23: adding it rounds to an integer */
    pt_v4f n = (x * 1.44269504088896341f + magic) - magic;
    pt_v4f r = x - n * 0.693145751953125f; /* ln2_hi: 12 significant bits */
    r = r - n * 1.428606765330187045e-06f; /* ln2_lo = ln2 - ln2_hi */
    pt_v4f p = (pt_v4f){0} + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    pt_v4i k = __builtin_convertvector(n, pt_v4i) + 127; /* n in [-126, 0] */
    return p * (pt_v4f)(k << 23);
}

/* log(sum_i exp(logits[i])) over the vocabulary, with its max in *max_out.
 * This runs once per generated token over vocabularies up to ~256k entries,
 * so it must cost tens of microseconds, not the milliseconds a libm exp per
 * entry in double costs. Sums run in f32 over blocks of 128 in 4 lanes of 32
 * terms (every term is <= 1, so a block sum's relative error is below
 * 36 * 2^-24 ~ 2.1e-6) and the blocks add up in double. */
static double log_sum_exp(const float *logits, int vocab, float *max_out) {
    /* the max, 4 lanes wide (NaN lanes compare false and never win) */
    pt_v4f m4 = (pt_v4f){0} - INFINITY;
    int i0 = 0;
    for (; i0 + 4 <= vocab; i0 += 4) {
        pt_v4f x;
        memcpy(&x, logits + i0, sizeof x);
        pt_v4i gt = x > m4;
        m4 = (pt_v4f)(((pt_v4i)x & gt) | ((pt_v4i)m4 & ~gt));
    }
    float mx = -INFINITY;
    for (int j = 0; j < 4; j++)
        if (m4[j] > mx) mx = m4[j];
    for (; i0 < vocab; i0++)
        if (logits[i0] > mx) mx = logits[i0];
    *max_out = mx;
    /* the block sums in double, in sample_math.h's structured order (the
     * GPU sampler computes the same bits with one thread per chunk) */
    const int64_t nparts = ((int64_t)vocab + 127) / 128, c = pt_ss_chunk(nparts);
    double T[PT_SS_CHUNKS];
    for (int k = 0; k < PT_SS_CHUNKS; k++) {
        double S = 0;
        for (int64_t q = (int64_t)k * c; q < (int64_t)(k + 1) * c && q < nparts; q++) {
            const int b = (int)(q * 128);
            int e = vocab - b < 128 ? vocab - b : 128;
            pt_v4f acc = {0};
            for (int i = 0; i < e; i += 4) {
                pt_v4f x;
                if (i + 4 <= e) {
                    memcpy(&x, logits + b + i, sizeof x);
                } else { /* the vocabulary's tail: missing lanes are -inf (they add exp(-87)) */
                    for (int j = 0; j < 4; j++) x[j] = i + j < e ? logits[b + i + j] : -INFINITY;
                }
                acc += exp_nonpos4(x - mx);
            }
            float part = 0;
            for (int j = 0; j < 4; j++) part += acc[j];
            S += part;
        }
        T[k] = S;
    }
    for (int d = 1; d < PT_SS_CHUNKS; d <<= 1)
        for (int i = PT_SS_CHUNKS - 1; i >= d; i--) T[i] = T[i - d] + T[i];
    const double sum = T[PT_SS_CHUNKS - 1];
    return (double)mx + log(sum);
}

float pt_logprob_of(const float *logits, int vocab, int32_t id) {
    float mx;
    double lse = log_sum_exp(logits, vocab, &mx);
    return (float)((double)logits[id] - lse);
}

/* Fills out->logprob and out->top_* from the raw logits (nothing when
 * neither is wanted: no_logprob and no top entries). */
static void fill_logprobs(const float *logits, int vocab, int n_top, int no_logprob, pt_token_info *out) {
    if (no_logprob && n_top == 0) return;
    float mx;
    double lse = log_sum_exp(logits, vocab, &mx);
    out->logprob = (float)((double)logits[out->id] - lse);
    /* top n by insertion: n <= 20, so O(vocab * n) worst case, usually ~vocab */
    int n = 0;
    for (int i = 0; i < vocab && n_top > 0; i++) {
        float v = logits[i];
        if (n == n_top && !(v > logits[out->top_ids[n - 1]])) continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && v > logits[out->top_ids[j - 1]]) {
            out->top_ids[j] = out->top_ids[j - 1];
            j--;
        }
        out->top_ids[j] = i;
    }
    out->n_top = n;
    for (int j = 0; j < n; j++) out->top_logprobs[j] = (float)((double)logits[out->top_ids[j]] - lse);
}

/* qsort comparator state: sort ids by work value descending, id ascending. */
static _Thread_local const float *t_sort_vals;
static int cmp_desc(const void *a, const void *b) {
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    float va = t_sort_vals[ia], vb = t_sort_vals[ib];
    if (va > vb) return -1;
    if (va < vb) return 1;
    return (ia > ib) - (ia < ib);
}

/* The structured sum of sample_math.h over the first m of n terms v[]:
 * T[k] = the scanned chunk sums (T[k] exact for every chunk k that lies
 * within the first m terms). */
static void ss_scan(const float *v, int64_t n, int64_t m, double *T) {
    const int64_t c = pt_ss_chunk(n);
    for (int k = 0; k < PT_SS_CHUNKS; k++) {
        double S = 0;
        int64_t a = (int64_t)k * c, b = a + c < m ? a + c : m;
        for (int64_t j = a; j < b; j++) S += v[j];
        T[k] = S;
    }
    for (int d = 1; d < PT_SS_CHUNKS; d <<= 1)
        for (int i = PT_SS_CHUNKS - 1; i >= d; i--) T[i] = T[i - d] + T[i];
}

/* The cumulative walk of sample_math.h over the first m of n terms (mode 0:
 * the first positive term where cum >= target; mode 1: where target < cum).
 * 1: hit at *at; 0: no hit in the whole sequence (m == n); -1: undecided
 * (the walk would need terms past m). */
static int ss_walk(const float *v, int64_t n, int64_t m, const double *T, double target, int mode, int64_t *at) {
    const int64_t c = pt_ss_chunk(n);
    for (int k = 0; k < PT_SS_CHUNKS; k++) {
        int64_t a = (int64_t)k * c, b = a + c < n ? a + c : n;
        if (a >= n) break;
        double cum = k ? T[k - 1] : 0.0;
        for (int64_t j = a; j < b; j++) {
            if (j >= m) return -1;
            cum += v[j];
            if (v[j] > 0 && (mode == 0 ? cum >= target : target < cum)) {
                *at = j;
                return 1;
            }
        }
    }
    return 0;
}

pt_status pt_sampler_sample(pt_sampler *s, const float *logits, const pt_sampling_params *sp,
                            const int32_t *history, size_t n_history, const uint8_t *allowed,
                            pt_token_info *out) {
    return pt_sampler_sample_u(s, logits, sp, history, n_history, allowed, -1.0, out);
}

pt_status pt_sampler_sample_u(pt_sampler *s, const float *logits, const pt_sampling_params *sp,
                              const int32_t *history, size_t n_history, const uint8_t *allowed, double u_drawn,
                              pt_token_info *out) {
    PT_TRY(pt_sampling_validate(sp));
    const int V = s->vocab;
    float *w = s->work;
    memcpy(w, logits, (size_t)V * sizeof *w);
    if (!s->seeded) pt_sampler_seed(s, sp->seed);

    /* 1. penalties over the window [n_history - n, n_history) */
    int rep = sp->repetition_penalty != 1.0f;
    int pres = sp->presence_penalty != 0.0f, freq = sp->frequency_penalty != 0.0f;
    if ((rep || pres || freq) && history && n_history > 0) {
        size_t n = sp->repeat_last_n > 0 && (size_t)sp->repeat_last_n < n_history ? (size_t)sp->repeat_last_n
                                                                                  : n_history;
        const int32_t *h = history + (n_history - n);
        for (size_t i = 0; i < n; i++)
            if (h[i] >= 0 && h[i] < V) s->count[h[i]]++;
        for (size_t i = 0; i < n; i++) {
            int32_t t = h[i];
            if (t < 0 || t >= V || s->count[t] == 0) continue;
            w[t] = pt_spenalty(w[t], sp->repetition_penalty, sp->presence_penalty, sp->frequency_penalty,
                               s->count[t]);
            s->count[t] = 0; /* each distinct token once; also resets the counts */
        }
    }
    /* 2. mask */
    if (allowed) {
        int any = 0;
        for (int i = 0; i < V; i++) {
            if (!allowed[i]) w[i] = -INFINITY;
            else any = 1;
        }
        if (!any) return pt_error(PT_ERR_INVALID_ARG, "sampling: the allowed-token mask allows nothing");
    }

    int32_t chosen = -1;
    if (sp->temperature == 0.0f || sp->top_k == 1) {
        /* 3. greedy: first maximum (NaN never wins) */
        float best = -INFINITY;
        for (int i = 0; i < V; i++)
            if (w[i] > best) {
                best = w[i];
                chosen = i;
            }
        if (chosen < 0) {
            /* every candidate is -inf: take the first allowed id */
            for (int i = 0; i < V && chosen < 0; i++)
                if (!allowed || allowed[i]) chosen = i;
        }
    } else {
        /* 4. temperature, candidates with finite logits; p[] holds each
         * candidate's probability relative to the max (0 elsewhere) */
        float inv_t = 1.0f / sp->temperature;
        float *p = s->prob, *seq = s->seq;
        int n = 0;
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) {
            p[i] = 0;
            if (!(w[i] > -INFINITY) || isnan(w[i])) continue;
            w[i] *= inv_t;
            if (w[i] > mx) mx = w[i];
            s->idx[n++] = i;
        }
        if (n == 0) return pt_error(PT_ERR_INVALID_ARG, "sampling: no token has a finite logit");
        for (int j = 0; j < n; j++) p[s->idx[j]] = pt_sexp(w[s->idx[j]] - mx);
        /* The sequence the sums run over: the candidates sorted by (scaled
         * logit descending, id ascending) once a filter needs the order,
         * else every id in id order (non-candidates contribute 0). */
        int sorted = 0;
        t_sort_vals = w;
        if (sp->top_k > 0 && sp->top_k < n) {
            qsort(s->idx, (size_t)n, sizeof *s->idx, cmp_desc);
            sorted = 1;
            n = sp->top_k;
        }
        double T[PT_SS_CHUNKS];
        double total;
        if (sorted) {
            for (int j = 0; j < n; j++) seq[j] = p[s->idx[j]];
            ss_scan(seq, n, n, T);
        } else {
            ss_scan(p, V, V, T);
        }
        total = T[PT_SS_CHUNKS - 1];
        if (sp->top_p < 1.0f) {
            const double target = sp->top_p * total;
            int64_t at = -1;
            int keep = n, r = 0;
            if (!sorted) {
                /* The nucleus only holds the largest probabilities: sort just the
                 * candidates above a threshold, lowering it until the walk
                 * decides within them (exact: every excluded candidate is
                 * smaller than every included one). */
                double thr = 1e-3;
                for (;;) {
                    int m = 0;
                    double mass = 0;
                    for (int j = 0; j < n; j++) {
                        int32_t i = s->idx[j];
                        if (p[i] >= thr || thr == 0) {
                            int32_t tmp = s->idx[m];
                            s->idx[m] = i;
                            s->idx[j] = tmp;
                            m++;
                            mass += p[i];
                        }
                    }
                    if (mass >= target || thr == 0) {
                        /* p rounds, so {p >= thr} need not be a prefix of the
                         * value order: take every candidate at or above the
                         * smallest value among them (a true prefix) */
                        float wmin = INFINITY;
                        for (int j = 0; j < m; j++)
                            if (w[s->idx[j]] < wmin) wmin = w[s->idx[j]];
                        m = 0;
                        for (int j = 0; j < n; j++) {
                            int32_t i = s->idx[j];
                            if (w[i] >= wmin) {
                                int32_t tmp = s->idx[m];
                                s->idx[m] = i;
                                s->idx[j] = tmp;
                                m++;
                            }
                        }
                        qsort(s->idx, (size_t)m, sizeof *s->idx, cmp_desc);
                        for (int j = 0; j < m; j++) seq[j] = p[s->idx[j]];
                        ss_scan(seq, n, m, T);
                        r = ss_walk(seq, n, m, T, target, 0, &at);
                        if (r >= 0) break;
                    }
                    thr = thr < 1e-30 ? 0 : thr * 1e-4;
                }
                sorted = 1;
            } else {
                ss_scan(seq, n, n, T);
                r = ss_walk(seq, n, n, T, target, 0, &at);
            }
            if (r == 1) keep = (int)at + 1;
            n = keep;
        }
        if (sp->min_p > 0) {
            /* max probability is exp(0) = 1 relative; keep p >= min_p * pmax
             * (a prefix of a sorted sequence; the max itself always passes) */
            if (sorted) {
                int m = 0;
                while (m < n && p[s->idx[m]] >= sp->min_p) m++;
                n = m;
            } else {
                for (int i = 0; i < V; i++)
                    if (p[i] < sp->min_p) p[i] = 0;
            }
        }
        /* 5. the draw: u in [0, sum) and the cumulative walk */
        const double u01 = u_drawn >= 0 ? u_drawn : pt_sampler_uniform(s);
        int64_t at = -1;
        if (sorted) {
            for (int j = 0; j < n; j++) seq[j] = p[s->idx[j]];
            ss_scan(seq, n, n, T);
            double u = u01 * T[PT_SS_CHUNKS - 1];
            chosen = ss_walk(seq, n, n, T, u, 1, &at) == 1 ? s->idx[at] : s->idx[n - 1];
        } else {
            ss_scan(p, V, V, T);
            double u = u01 * T[PT_SS_CHUNKS - 1];
            if (ss_walk(p, V, V, T, u, 1, &at) == 1) chosen = (int32_t)at;
            else
                for (int i = V - 1; i >= 0 && chosen < 0; i--)
                    if (p[i] > 0) chosen = i;
        }
    }
    memset(out, 0, sizeof *out);
    out->id = chosen;
    fill_logprobs(logits, V, sp->n_logprobs, sp->no_logprob, out);
    return PT_OK;
}
