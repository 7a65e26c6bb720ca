/* Batch-invariance harness (see batch_check.h). */
#include "batch_check.h"

#include "golden.h" /* golden_argmax */
#include "runtime/batch.h" /* pt_session_decode_rows */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int32_t batch_prompt_id(int i, int j, int V) { return (int32_t)((i * 131 + j * 37 + 5) % V); }

static float *ref_row(const batch_ref *r, int i, int step) {
    return r->logits + ((size_t)i * (size_t)(r->steps + 1) + (size_t)step) * (size_t)r->V;
}

static int prefill(pt_session *s, const batch_ref *r, int i) {
    int32_t p[BATCH_CHECK_MAX_PROMPT];
    int len = r->prompt_len(i);
    if (len < 1 || len > BATCH_CHECK_MAX_PROMPT) return 0;
    for (int j = 0; j < len; j++) p[j] = batch_prompt_id(i, j, r->V);
    if (r->tokenwise) {
        for (int j = 0; j < len; j++)
            if (pt_session_prompt(s, &p[j], 1) != PT_OK) return 0;
        return 1;
    }
    return pt_session_prompt(s, p, (size_t)len) == PT_OK;
}

void batch_ref_free(batch_ref *r) {
    free(r->logits);
    free(r->tok);
    r->logits = NULL;
    r->tok = NULL;
}

static int ref_make(pt_model *m, batch_ref *r, int n, int steps, int (*prompt_len)(int i), int tokenwise) {
    memset(r, 0, sizeof *r);
    r->tokenwise = tokenwise;
    r->V = pt_model_vocab_size(m);
    r->n = n;
    r->steps = steps;
    r->prompt_len = prompt_len;
    r->logits = malloc((size_t)n * (size_t)(steps + 1) * (size_t)r->V * sizeof(float));
    r->tok = malloc((size_t)n * (size_t)steps * sizeof(int32_t));
    if (!r->logits || !r->tok) return 0;
    for (int i = 0; i < n; i++) {
        pt_session *s = NULL;
        if (pt_session_create(m, NULL, &s) != PT_OK) return 0;
        int ok = prefill(s, r, i);
        if (ok) memcpy(ref_row(r, i, 0), pt_session_logits(s), (size_t)r->V * 4);
        for (int t = 0; ok && t < steps; t++) {
            int32_t id = golden_argmax(pt_session_logits(s), r->V);
            r->tok[(size_t)i * (size_t)steps + (size_t)t] = id;
            ok = pt_session_prompt(s, &id, 1) == PT_OK;
            if (ok) memcpy(ref_row(r, i, t + 1), pt_session_logits(s), (size_t)r->V * 4);
        }
        pt_session_free(&s);
        if (!ok) return 0;
    }
    return 1;
}

int batch_ref_make(pt_model *m, batch_ref *r, int n, int steps, int (*prompt_len)(int i)) {
    return ref_make(m, r, n, steps, prompt_len, 0);
}

int batch_ref_make_tokenwise(pt_model *m, batch_ref *r, int n, int steps, int (*prompt_len)(int i)) {
    return ref_make(m, r, n, steps, prompt_len, 1);
}

/* ss[0..n): sessions on m. Returns 1, or 0 (having printed why) at the first
 * that cannot be created. */
static int sessions_create(pt_model *m, pt_session **ss, int n) {
    for (int i = 0; i < n; i++)
        if (pt_session_create(m, NULL, &ss[i]) != PT_OK) {
            printf("    session: %s\n", pt_last_error());
            return 0;
        }
    return 1;
}

/* The end of a batched run of sessions ss[0..n) (ss may be NULL): unless the
 * run failed, counts the sessions whose length is not their prompt plus
 * last[i] tokens; then frees every session. Returns that count. */
static int sessions_finish(pt_session **ss, const batch_ref *r, int n, const int *last, int failed) {
    int bad = 0;
    for (int i = 0; !failed && i < n; i++)
        if (pt_session_n_tokens(ss[i]) != (size_t)(r->prompt_len(i) + last[i])) bad++;
    for (int i = 0; ss && i < n && i < r->n; i++)
        if (ss[i]) pt_session_free(&ss[i]);
    return bad;
}

/* Frees a run's buffers (any may be NULL). */
static void free_run(pt_session **ss, pt_session **b, int32_t *ids, int *done, int *who, int *fed, int *cnt) {
    free(ss), free(b), free(ids), free(done), free(who), free(fed), free(cnt);
}

int batch_run(pt_model *m, const batch_ref *r, int n, const int *join, const int *last, int *max_b) {
    int N = r->n, bad = 0, failed = 0;
    pt_session **ss = calloc((size_t)N, sizeof *ss), **b = calloc((size_t)N, sizeof *b);
    int32_t *ids = calloc((size_t)N, sizeof *ids);
    int *done = calloc((size_t)N, sizeof *done), *who = calloc((size_t)N, sizeof *who);
    *max_b = 0;
    if (n > N || !ss || !b || !ids || !done || !who) failed = 1;
    if (!failed && !sessions_create(m, ss, n)) failed = 1;
    for (int step = 0; !failed && step < r->steps + N; step++) {
        int B = 0;
        for (int i = 0; !failed && i < n; i++) {
            if (step == join[i]) {
                if (!prefill(ss[i], r, i)) {
                    printf("    prompt of session %d: %s\n", i, pt_last_error());
                    failed = 1;
                    break;
                }
                if (memcmp(pt_session_logits(ss[i]), ref_row(r, i, 0), (size_t)r->V * 4)) bad++;
            }
            if (step >= join[i] && done[i] < last[i]) {
                int32_t id = golden_argmax(pt_session_logits(ss[i]), r->V);
                if (id != r->tok[(size_t)i * (size_t)r->steps + (size_t)done[i]]) bad++;
                b[B] = ss[i];
                ids[B] = id;
                who[B++] = i;
            }
        }
        if (failed || !B) continue;
        if (B > *max_b) *max_b = B;
        if (pt_session_decode_batch(b, ids, B) != PT_OK) {
            printf("    decode_batch: %s\n", pt_last_error());
            failed = 1;
            break;
        }
        for (int k = 0; k < B; k++) {
            int i = who[k];
            done[i]++;
            if (memcmp(pt_session_logits(ss[i]), ref_row(r, i, done[i]), (size_t)r->V * 4)) {
                if (bad < 3) printf("    session %d step %d (batch of %d): logits differ\n", i, done[i], B);
                bad++;
            }
        }
    }
    bad += sessions_finish(ss, r, n, last, failed);
    free_run(ss, b, ids, done, who, NULL, NULL);
    return failed ? 1000 : bad;
}

int batch_run_rows(pt_model *m, const batch_ref *r, int n, const int *join, const int *last, const int *piece,
                   int *max_rows) {
    int N = r->n, bad = 0, failed = 0;
    pt_session **ss = calloc((size_t)N, sizeof *ss), **b = calloc((size_t)N, sizeof *b);
    int32_t *ids = calloc((size_t)N * BATCH_CHECK_MAX_PROMPT, sizeof *ids);
    int *done = calloc((size_t)N, sizeof *done), *who = calloc((size_t)N, sizeof *who);
    int *fed = calloc((size_t)N, sizeof *fed), *cnt = calloc((size_t)N, sizeof *cnt);
    *max_rows = 0;
    if (!r->tokenwise || n > N || !ss || !b || !ids || !done || !who || !fed || !cnt) failed = 1;
    if (!failed && !sessions_create(m, ss, n)) failed = 1;
    for (int step = 0; !failed && step < r->steps + 4 * N + BATCH_CHECK_MAX_PROMPT; step++) {
        int B = 0, R = 0;
        for (int i = 0; i < n; i++) {
            if (step < join[i]) continue;
            const int len = r->prompt_len(i);
            if (fed[i] < len) { /* a prompt piece */
                int k = len - fed[i] < piece[i] ? len - fed[i] : piece[i];
                for (int j = 0; j < k; j++) ids[R + j] = batch_prompt_id(i, fed[i] + j, r->V);
                fed[i] += k;
                cnt[B] = k;
            } else if (done[i] < last[i]) { /* a decode row */
                int32_t id = golden_argmax(pt_session_logits(ss[i]), r->V);
                if (id != r->tok[(size_t)i * (size_t)r->steps + (size_t)done[i]]) bad++;
                ids[R] = id;
                cnt[B] = 1;
                done[i]++;
            } else {
                continue;
            }
            R += cnt[B];
            b[B] = ss[i];
            who[B++] = i;
        }
        if (!B) continue;
        if (R > *max_rows) *max_rows = R;
        if (pt_session_decode_rows(b, ids, cnt, B) != PT_OK) {
            printf("    decode_rows: %s\n", pt_last_error());
            failed = 1;
            break;
        }
        for (int k = 0; k < B; k++) {
            int i = who[k];
            /* logits exist after a session's last prompt row and every decode row */
            int at = fed[i] < r->prompt_len(i) ? -1 : done[i];
            if (at < 0) continue;
            if (memcmp(pt_session_logits(ss[i]), ref_row(r, i, at), (size_t)r->V * 4)) {
                if (bad < 3) printf("    session %d step %d (%d rows of %d sessions): logits differ\n", i, at, R, B);
                bad++;
            }
        }
    }
    bad += sessions_finish(ss, r, n, last, failed);
    free_run(ss, b, ids, done, who, fed, cnt);
    return failed ? 1000 : bad;
}
