/* The server's pipelined turn at the runtime level (pt_session_rows_ahead,
 * runtime/batch.h; docs/batching.md "Pipelined turns"): a turn that samples
 * and runs the next step ahead, then takes those rows with
 * pt_session_decode_rows, leaves every session exactly as the plain turn
 * (pt_session_sample per session, then pt_session_decode_rows) does: the
 * same tokens and log-probabilities from the same draws, the same logits bit
 * for bit after every turn. Shared by tests/test_batch_ahead.c (CPU: the
 * draws on the host before the step) and tests/cuda/test_cuda_batch_ahead.c
 * (the GPU sampler writing the ids into the step's table, the step from a
 * CUDA graph); header-only, each test binary includes it once.
 *
 * Two identical sets of sessions run the same five turns, one pipelined,
 * one plain. Sessions: s0 greedy, s1 temperature 0.8 / top-p 0.9 (seeded),
 * s2 prompt rows for two turns and then greedy decoding, s3 temperature 1
 * / top-k 20 (seeded) whose first token is sampled without a row (norow: a
 * request's last token). On the GPU s1's nucleus may exceed what the GPU
 * sampler holds over a large vocabulary (random weights): the row is handed
 * back, sampled on the host, and runs again in the plain step (the same
 * results; it holds nothing ahead). What each turn adds:
 *   turn 0: a call the runtime refuses (a session without logits) draws
 *           nothing first: the later tokens still match;
 *   turn 2: s1 is given another id than the one sampled: its row runs again;
 *   turn 3: another batched step runs between: nothing ahead is taken;
 *   turn 4: s0's token goes through pt_session_prompt: its row is dropped.
 * The rows a later step took are counted against what each turn allows. */
#ifndef PT_TESTS_BATCH_AHEAD_H
#define PT_TESTS_BATCH_AHEAD_H

#include "petrel.h"
#include "base/error.h"
#include "runtime/batch.h"
#include "runtime/session.h"
#include "test.h"

#include <stdint.h>
#include <string.h>

enum { BA_S = 4, BA_TURNS = 5, BA_PROMPT_ROWS = 3 };

typedef struct {
    pt_session *s[BA_S];
    pt_session *extra; /* the session of turn 3's step between */
} ba_set;

static int ba_open(pt_model *m, ba_set *set) {
    memset(set, 0, sizeof *set);
    pt_session_params p = pt_session_default_params();
    p.n_ctx = 256;
    static const int32_t pro[BA_S][9] = {
        {3, 17, 29, 41, 5}, {7, 11, 13, 19, 23, 31, 37, 43, 47}, {9, 8, 7}, {21, 22, 23, 24}};
    static const size_t len[BA_S] = {5, 9, 3, 4};
    for (int i = 0; i < BA_S; i++) {
        NEED(pt_session_create(m, &p, &set->s[i]) == PT_OK, "session: %s", pt_last_error());
        NEED(pt_session_prompt(set->s[i], pro[i], len[i]) == PT_OK, "prompt: %s", pt_last_error());
    }
    NEED(pt_session_create(m, &p, &set->extra) == PT_OK, "session: %s", pt_last_error());
    const int32_t x[2] = {50, 51};
    NEED(pt_session_prompt(set->extra, x, 2) == PT_OK, "prompt: %s", pt_last_error());
    return 1;
}

static void ba_close(ba_set *set) {
    for (int i = 0; i < BA_S; i++) pt_session_free(&set->s[i]);
    pt_session_free(&set->extra);
}

/* The prompt rows of s2 at turn t (turns 0 and 1). */
static const int32_t *ba_rows(int t) {
    static const int32_t r[2][BA_PROMPT_ROWS] = {{60, 61, 62}, {63, 64, 65}};
    return r[t];
}

/* One turn's step over the set: decode tokens tok[i] of the decoding
 * sessions (dec[i]; skip[i]: no row), then s2's prompt rows while it has
 * them. turn 4: s0's token through pt_session_prompt instead. */
static pt_status ba_step(ba_set *set, int t, const int32_t *tok, const uint8_t *skip) {
    pt_session *ss[BA_S];
    int32_t ids[BA_S + BA_PROMPT_ROWS];
    int cnt[BA_S], n = 0, R = 0;
    for (int i = 0; i < BA_S; i++) {
        const int prompt = i == 2 && t < 2;
        if (!prompt && skip[i]) continue;
        if (i == 0 && t == 4) {
            PT_TRY(pt_session_prompt(set->s[0], &tok[0], 1));
            continue;
        }
        ss[n] = set->s[i];
        if (prompt) {
            memcpy(ids + R, ba_rows(t), sizeof(int32_t) * BA_PROMPT_ROWS);
            cnt[n++] = BA_PROMPT_ROWS;
            R += BA_PROMPT_ROWS;
        } else {
            ids[R++] = tok[i];
            cnt[n++] = 1;
        }
    }
    return pt_session_decode_rows(ss, ids, cnt, n);
}

/* greedy_nolp: every session greedy without a log-probability (on CUDA the sampler's greedy ids are then
 * its last pass, gs_mb_greedy_id writing the results) */
static void ba_params(pt_sampling_params sp[BA_S], int greedy_nolp) {
    for (int i = 0; i < BA_S; i++) {
        sp[i] = pt_sampling_default_params(NULL);
        sp[i].temperature = 0;
        sp[i].no_logprob = greedy_nolp;
    }
    if (greedy_nolp) return;
    sp[1].temperature = 0.8f;
    sp[1].top_p = 0.9f;
    sp[1].seed = 11;
    sp[3].temperature = 1.0f;
    sp[3].top_k = 20;
    sp[3].seed = 5;
}

/* The five turns on model m (label names it in the messages), with the
 * sampling parameters above or (greedy_nolp) every session greedy without a
 * log-probability. Returns how many of the pipelined draws had their
 * session's logits on the device (the GPU sampler's form; 0 on the CPU). */
static int batch_ahead_check(pt_model *m, const char *label, int greedy_nolp) {
    ba_set P, Q; /* P pipelined, Q plain */
    int on_device = 0;
    if (!ba_open(m, &P) || !ba_open(m, &Q)) return 0;
    pt_sampling_params sp[BA_S];
    ba_params(sp, greedy_nolp);
    const pt_sampling_params *sps[BA_S];
    for (int i = 0; i < BA_S; i++) sps[i] = &sp[i];
    const int V = pt_model_vocab_size(m);
    uint64_t want_taken[BA_S] = {0};
    uint8_t skip[BA_S] = {0};
    int held_rows = 0;

    /* refused: a session without logits among the decode sessions */
    {
        pt_session *fresh = NULL;
        pt_session_params p = pt_session_default_params();
        p.n_ctx = 64;
        NEED(pt_session_create(m, &p, &fresh) == PT_OK, "%s: session: %s", label, pt_last_error());
        pt_session *dec[2] = {P.s[1], fresh};
        const pt_sampling_params *s2[2] = {&sp[1], &sp[1]};
        pt_token_info outs[2];
        pt_status sts[2];
        static char errs[2][512];
        uint8_t held[2];
        CHECK(pt_session_rows_ahead(dec, s2, NULL, 2, NULL, NULL, NULL, 0, outs, sts, errs, held) != PT_OK,
              "%s: a session without logits is refused", label);
        pt_clear_error();
        pt_session_free(&fresh);
    }

    for (int t = 0; t < BA_TURNS; t++) {
        /* the decoding sessions this turn: s2 from turn 2 on; s3 without a row at turn 0 */
        pt_session *dec[BA_S], *prs[1];
        const pt_sampling_params *dsp[BA_S];
        uint8_t norow[BA_S] = {0};
        int di[BA_S], nd = 0;
        for (int i = 0; i < BA_S; i++) {
            if (i == 2 && t < 2) continue;
            di[nd] = i;
            dec[nd] = P.s[i];
            dsp[nd] = sps[i];
            norow[nd++] = i == 3 && t == 0;
        }
        const int np = t < 2;
        prs[0] = P.s[2];
        const int pc = BA_PROMPT_ROWS;
        pt_token_info outs[BA_S], ref[BA_S];
        pt_status sts[BA_S];
        static char errs[BA_S][512];
        uint8_t held[BA_S + 1];
        for (int k = 0; k < nd; k++) on_device += dec[k]->gpu && dec[k]->logits_dev;
        pt_status st = pt_session_rows_ahead(dec, dsp, norow, nd, prs, ba_rows(t < 2 ? t : 0), &pc, np, outs, sts,
                                             errs, held);
        NEED(st == PT_OK, "%s: turn %d: pt_session_rows_ahead: %s", label, t, pt_last_error());
        int32_t tok[BA_S] = {0};
        for (int k = 0; k < nd; k++) {
            const int i = di[k];
            NEED(sts[k] == PT_OK, "%s: turn %d: session %d sampled: %s", label, t, i, errs[k]);
            NEED(pt_session_sample(Q.s[i], sps[i], NULL, &ref[k]) == PT_OK, "%s: sample: %s", label,
                    pt_last_error());
            CHECK(outs[k].id == ref[k].id && !memcmp(&outs[k].logprob, &ref[k].logprob, sizeof(float)),
                  "%s: turn %d, session %d: token %d (logprob %.9g) pipelined, %d (%.9g) plain", label, t, i,
                  outs[k].id, (double)outs[k].logprob, ref[k].id, (double)ref[k].logprob);
            if (greedy_nolp) CHECK(outs[k].logprob == 0.0f, "%s: turn %d, session %d: a log-probability (%.9g) "
                                   "nobody asked for", label, t, i, (double)outs[k].logprob);
            /* a row the GPU sampler hands back (e.g. a top-p nucleus over
             * more than PT_GSAMPLE_CAP candidates) holds nothing: the host
             * sampled it, its row ran on a stale id */
            CHECK(!(held[k] && norow[k]), "%s: turn %d, session %d: holds a row it was not to run", label, t, i);
            held_rows += held[k];
            tok[i] = ref[k].id;
        }
        if (np) CHECK(held[nd], "%s: turn %d: the prompt rows are held ahead", label, t);
        /* what the step after takes */
        for (int k = 0; k < nd; k++) {
            const int i = di[k];
            const int taken = held[k] && !(i == 1 && t == 2) && t != 3 && !(i == 0 && t == 4);
            want_taken[i] += (uint64_t)taken;
        }
        if (np && t != 3) want_taken[2] += BA_PROMPT_ROWS;
        if (t == 2) tok[1] = (tok[1] + 1) % V; /* another id than the one sampled */
        if (t == 3) {
            /* a batched step between: the rows ahead are not taken */
            const int32_t x = 52, xq = 52;
            NEED(pt_session_decode_batch(&P.extra, &x, 1) == PT_OK, "%s: step between: %s", label, pt_last_error());
            NEED(pt_session_decode_batch(&Q.extra, &xq, 1) == PT_OK, "%s: step between: %s", label,
                    pt_last_error());
        }
        for (int i = 0; i < BA_S; i++) skip[i] = i == 3 && t == 0; /* its token had no row */
        NEED(ba_step(&P, t, tok, skip) == PT_OK, "%s: turn %d: pipelined step: %s", label, t, pt_last_error());
        NEED(ba_step(&Q, t, tok, skip) == PT_OK, "%s: turn %d: plain step: %s", label, t, pt_last_error());
        for (int i = 0; i < BA_S; i++) {
            CHECK(pt_session_n_tokens(P.s[i]) == pt_session_n_tokens(Q.s[i]), "%s: turn %d, session %d: %zu tokens vs %zu",
                  label, t, i, pt_session_n_tokens(P.s[i]), pt_session_n_tokens(Q.s[i]));
            const float *a = pt_session_logits(P.s[i]), *b = pt_session_logits(Q.s[i]);
            NEED(a && b, "%s: turn %d, session %d: logits", label, t, i);
            int diff = -1;
            for (int v = 0; v < V && diff < 0; v++)
                if (memcmp(&a[v], &b[v], sizeof *a)) diff = v;
            CHECK(diff < 0, "%s: turn %d, session %d: logit %d is %.9g pipelined, %.9g plain", label, t, i, diff,
                  diff < 0 ? 0.0 : (double)a[diff], diff < 0 ? 0.0 : (double)b[diff]);
        }
    }
    for (int i = 0; i < BA_S; i++)
        CHECK(P.s[i]->rows_taken == want_taken[i], "%s: session %d: %llu rows taken from the steps ahead, want %llu",
              label, i, (unsigned long long)P.s[i]->rows_taken, (unsigned long long)want_taken[i]);
    CHECK(held_rows >= BA_TURNS, "%s: only %d decode rows held ahead in %d turns", label, held_rows, BA_TURNS);
    printf("INFO %s: %d turns pipelined, %d decode rows held; rows taken %llu/%llu/%llu/%llu\n", label, BA_TURNS,
           held_rows,
           (unsigned long long)P.s[0]->rows_taken, (unsigned long long)P.s[1]->rows_taken,
           (unsigned long long)P.s[2]->rows_taken, (unsigned long long)P.s[3]->rows_taken);
    ba_close(&P);
    ba_close(&Q);
    return on_device;
}

#endif
