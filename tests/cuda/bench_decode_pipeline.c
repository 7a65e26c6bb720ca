/* Where a decode step's time goes on the host and on the GPU, for the
 * pipelined decode's A/B (runtime/session.c pt_session_sample_ahead):
 *
 *   bench_decode_pipeline NAME QUANT [N] [DEPTH]   (synthetic model, e.g. llama-3.2-1b q4)
 *
 * prints, per token (medians over 3 runs of N tokens after a warm-up):
 *   replay      the captured step launched N times back to back with no host
 *               wait between (the same position each time): the GPU's time
 *               for the step alone, and the host's time per launch call;
 *   unpipelined the generation loop with PETREL_CUDA_PIPELINE=0: greedy GPU
 *               sample (the call waits for the step before it, samples,
 *               downloads the id), then the prompt of that id (two uploads,
 *               each waited for, and the graph launch): both calls timed;
 *   pipelined   the same loop with the pipeline: pt_session_sample_ahead
 *               (sample, next step enqueued, wait for the id only) and the
 *               prompt that takes the step (a device copy enqueued).
 * unpipelined − replay is the time the GPU waits on the host per token
 * (plus the sampler's kernels); pipelined − replay what is left of it.
 * Results as MEASURE lines. Not a test. */
#include "bench_util.h"

#include "model/model.h"
#include "runtime/session.h"

#include <string.h>

static int cmp_double(const void *a, const void *b) { return cmpd(a, b); }
static double median3(double *v) {
    qsort(v, 3, sizeof *v, cmp_double);
    return v[1];
}

/* One run of n tokens: per-token seconds of the sample calls, the prompt
 * calls and the whole loop. */
static void loop(pt_session *s, int n, int pipe, double *t_sample, double *t_prompt, double *t_all) {
    setenv("PETREL_CUDA_PIPELINE", pipe ? "1" : "0", 1);
    pt_sampling_params greedy = pt_sampling_default_params(NULL);
    greedy.temperature = 0;
    double ts = 0, tp = 0;
    const double t0 = now();
    for (int i = 0; i < n; i++) {
        pt_token_info ti;
        const double a = now();
        if (pt_session_sample_ahead(s, &greedy, &ti) != PT_OK) DIE("sample");
        const double b = now();
        if (pt_session_prompt(s, &ti.id, 1) != PT_OK) DIE("prompt");
        const double c = now();
        ts += b - a;
        tp += c - b;
    }
    *t_all = (now() - t0) / n;
    *t_sample = ts / n;
    *t_prompt = tp / n;
}

/* Back to the context of depth + 1 tokens, with its logits (a truncation
 * drops them: the last token runs again). */
static void reset(pt_session *s, size_t base, int32_t last) {
    if (pt_session_truncate(s, base - 1) != PT_OK || pt_session_prompt(s, &last, 1) != PT_OK) DIE("reset");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s NAME q4|q8|bf16 [N] [DEPTH]\n", argv[0]);
        return 2;
    }
    const int N = argc > 3 ? atoi(argv[3]) : 128;
    const int depth = argc > 4 ? atoi(argv[4]) : 0;
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CUDA;
    pt_model *m = NULL;
    if (pt_model_synthetic(argv[1], argv[2], &mp, &m) != PT_OK) DIE("synthetic %s %s", argv[1], argv[2]);
    pt_session *s = NULL;
    pt_session_params sp = pt_session_default_params();
    sp.n_ctx = depth + 4 * N + 64;
    if (pt_session_create(m, &sp, &s) != PT_OK) DIE("session");
    const int V = pt_model_vocab_size(m);
    int32_t *buf = malloc((size_t)(depth + 1) * 4);
    for (int i = 0; i <= depth; i++) buf[i] = (int32_t)(ru() % (uint32_t)V);
    if (pt_session_prompt(s, buf, (size_t)depth + 1) != PT_OK) DIE("prompt");
    const size_t base = pt_session_n_tokens(s);
    double us[3][3], pp[3][3], rp[3], rl[3];
    /* warm-up: captures both graphs */
    loop(s, 8, 0, &us[0][0], &us[0][1], &us[0][2]);
    loop(s, 8, 1, &us[0][0], &us[0][1], &us[0][2]);
    reset(s, base, buf[depth]);
    for (int r = 0; r < 3; r++) {
        /* the step replayed back to back at one position */
        int32_t id = 1;
        if (pt_session_prompt(s, &id, 1) != PT_OK) DIE("prompt");
        pt_cuda_graph *g = s->fwd.graph[0];
        if (!g) DIE("no captured step (compiled decode off?)");
        if (m->be->ops->sync(m->be) != PT_OK) DIE("sync");
        double t0 = now(), tl = 0;
        for (int i = 0; i < N; i++) {
            const double a = now();
            if (pt_cuda_graph_launch(m->be, g) != PT_OK) DIE("launch");
            tl += now() - a;
        }
        if (m->be->ops->sync(m->be) != PT_OK) DIE("sync");
        rp[r] = (now() - t0) / N;
        rl[r] = tl / N;
        reset(s, base, buf[depth]);
        /* the loop, off then on */
        loop(s, N, 0, &us[0][r], &us[1][r], &us[2][r]);
        reset(s, base, buf[depth]);
        loop(s, N, 1, &pp[0][r], &pp[1][r], &pp[2][r]);
        reset(s, base, buf[depth]);
    }
    const double rep = median3(rp) * 1e6, launch = median3(rl) * 1e6;
    double u[3], p[3];
    for (int k = 0; k < 3; k++) u[k] = median3(us[k]) * 1e6, p[k] = median3(pp[k]) * 1e6;
    printf("MEASURE %s %s depth %d, %d tokens, µs per token (medians of 3):\n", argv[1], argv[2], depth, N);
    printf("MEASURE   replay back to back: %.1f µs a step on the GPU; the launch call %.1f µs on the host\n", rep,
           launch);
    printf("MEASURE   unpipelined: %.1f a token (%.1f t/s) = sample call %.1f + prompt call %.1f; over the replay "
           "%.1f\n",
           u[2], 1e6 / u[2], u[0], u[1], u[2] - rep);
    printf("MEASURE   pipelined:   %.1f a token (%.1f t/s) = sample call %.1f + prompt call %.1f; over the replay "
           "%.1f\n",
           p[2], 1e6 / p[2], p[0], p[1], p[2] - rep);
    printf("MEASURE   steps ahead taken: %llu\n", (unsigned long long)s->ahead_taken);
    free(buf);
    pt_session_free(&s);
    pt_model_free(&m);
    return 0;
}
