/* Parity against the transformers goldens for every fixture of the
 * Llama-style families (tests/fixtures/<name>/golden.bin, written by
 * tools/oracle/): llama, qwen2, qwen3, qwen3_moe, minicpm, gemma2,
 * gemma3_text and the MLX quantized variants.
 *
 * Gates (DESIGN.md "Numerics and parity tiers", L1):
 *   fp32: max|Δlogit| <= 1e-4 × max|logit| over every position of every prompt;
 *         greedy continuation identical (up to a golden near-tie, margin < 1e-3);
 *   bf16: argmax identical wherever the golden top-1/top-2 margin > 0.05
 *         (dense families: every such position; MoE: >= 95% of them, each
 *         disagreement printed with its margin); greedy identical up to the
 *         first golden step with margin <= 0.05;
 *   threads: 1-thread and 2-thread logits bit-identical (f32 and bf16).
 * Each prints what it measured (MEASURE lines): max|Δ|, max|logit|, mean KL.
 * When a gate fails, the per-layer hidden states (prompt.N.hidden.f32) are
 * compared to locate the first diverging layer. */
#include "test.h"
#include "parity_util.h"

#include "base/mmap.h"
#include "model/model.h"
#include "petrel.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>

/* ---- golden.bin reader (format: tools/oracle/goldfile.py) ---- */
typedef struct {
    char name[256];
    int dtype; /* 0 f32, 1 i32, 2 bf16, 3 u32, 4 u8 */
    int ndim;
    uint32_t dims[4];
    const unsigned char *data;
    uint64_t size;
} garr;

typedef struct {
    pt_mmap mm;
    int n;
    garr *a;
} golden;

static int golden_open(golden *g, const char *path) {
    memset(g, 0, sizeof *g);
    if (pt_mmap_open(&g->mm, path) != PT_OK) return 0;
    const unsigned char *p = g->mm.data, *end = p + g->mm.size;
    if (g->mm.size < 16 || memcmp(p, "PTGOLD1\0", 8)) return 0;
    uint32_t n;
    memcpy(&n, p + 8, 4);
    if (n > 100000) return 0;
    g->a = calloc(n ? n : 1, sizeof *g->a);
    g->n = (int)n;
    p += 16;
    for (uint32_t i = 0; i < n; i++) {
        garr *a = &g->a[i];
        uint16_t L;
        if (p + 2 > end) return 0;
        memcpy(&L, p, 2);
        p += 2;
        if (L == 0 || p + L + 2 > end) return 0;
        memcpy(a->name, p, L);
        p += L;
        a->dtype = p[0];
        a->ndim = p[1];
        p += 2;
        if (a->ndim < 1 || a->ndim > 4 || p + 4 * a->ndim + 16 > end) return 0;
        memcpy(a->dims, p, 4 * (size_t)a->ndim);
        p += 4 * a->ndim;
        uint64_t off;
        memcpy(&off, p, 8);
        memcpy(&a->size, p + 8, 8);
        p += 16;
        if (off > g->mm.size || a->size > g->mm.size - off) return 0;
        a->data = g->mm.data + off;
    }
    return 1;
}

static void golden_close(golden *g) {
    pt_mmap_close(&g->mm);
    free(g->a);
}

static const garr *gget(const golden *g, const char *fmt, int p) {
    char name[256];
    snprintf(name, sizeof name, fmt, p);
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->a[i].name, name)) return &g->a[i];
    return NULL;
}

static int64_t gnum(const garr *a) {
    int64_t n = 1;
    for (int i = 0; i < a->ndim; i++) n *= a->dims[i];
    return n;
}

/* element i as float (f32 or bf16) */
static float gf(const garr *a, int64_t i) {
    if (a->dtype == 2) {
        uint16_t h;
        memcpy(&h, a->data + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    float f;
    memcpy(&f, a->data + 4 * i, 4);
    return f;
}

static int32_t gi(const garr *a, int64_t i) {
    int32_t v;
    memcpy(&v, a->data + 4 * i, 4);
    return v;
}

/* ---- helpers ---- */

static pt_model *load(const char *dir, pt_compute_dtype dt, int threads) {
    pt_model_params mp = pt_model_default_params();
    mp.dtype = dt;
    mp.n_threads = threads;
    mp.device = PT_DEVICE_CPU;
    pt_model *m = NULL;
    if (pt_model_load(dir, &mp, &m) != PT_OK) printf("    load %s: %s\n", dir, pt_last_error());
    return m;
}

/* KL(golden || ours) of one row, in nats */
static double kl_row(const garr *g, int64_t off, const float *ours, int V) {
    double mg = -INFINITY, mo = -INFINITY;
    for (int v = 0; v < V; v++) {
        mg = fmax(mg, gf(g, off + v));
        mo = fmax(mo, ours[v]);
    }
    double zg = 0, zo = 0;
    for (int v = 0; v < V; v++) {
        zg += exp(gf(g, off + v) - mg);
        zo += exp(ours[v] - mo);
    }
    double kl = 0;
    for (int v = 0; v < V; v++) {
        double lp = gf(g, off + v) - mg - log(zg), lq = ours[v] - mo - log(zo);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

/* Smallest routing gap per position over the MoE layers: softmax (f32) of
 * the router logits, probability of the k-th expert minus the (k+1)-th. */
#define MAXPOS 512
static float g_route_gap[MAXPOS];
static void on_route(void *user, int layer, const float *lg, int T, int pos0, int E, int k) {
    (void)user;
    (void)layer;
    for (int t = 0; t < T; t++) {
        const float *r = lg + (size_t)t * E;
        float mx = r[0];
        for (int e = 1; e < E; e++) mx = fmaxf(mx, r[e]);
        float p[256], z = 0;
        for (int e = 0; e < E && e < 256; e++) z += p[e] = expf(r[e] - mx);
        /* k-th and (k+1)-th largest by selection */
        float a = 0, b = 0;
        for (int j = 0; j <= k && j < E; j++) {
            int bi = -1;
            for (int e = 0; e < E && e < 256; e++)
                if (p[e] >= 0 && (bi < 0 || p[e] > p[bi])) bi = e;
            if (j == k - 1) a = p[bi] / z;
            if (j == k) b = p[bi] / z;
            p[bi] = -1;
        }
        int pos = pos0 + t;
        if (pos < MAXPOS && a - b < g_route_gap[pos]) g_route_gap[pos] = a - b;
    }
}
static void route_reset(void) {
    for (int i = 0; i < MAXPOS; i++) g_route_gap[i] = INFINITY;
}

/* per-layer hidden states against prompt.P.hidden.f32 [L+2, n, H] */
typedef struct {
    const garr *h;
    int n_tok, H, L;
    double worst[130];
} hid_ctx;

static void on_hidden(void *user, int layer, const float *x, int T, int pos0, int64_t H) {
    hid_ctx *c = user;
    int slot = layer + 1; /* -1 = embeddings, n_layers = final norm */
    if (slot < 0 || slot >= c->L + 2 || slot >= 130) return;
    for (int t = 0; t < T; t++)
        for (int64_t k = 0; k < H; k++) {
            double d = fabs(x[t * H + k] - gf(c->h, ((int64_t)slot * c->n_tok + pos0 + t) * H + k));
            if (d > c->worst[slot]) c->worst[slot] = d;
        }
}

static int argmax(const float *x, int V) {
    int b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void locate_divergence(const char *dir, const golden *g, int p) {
    const garr *h = gget(g, "prompt.%d.hidden.f32", p), *ids = gget(g, "prompt.%d.ids", p);
    if (!h || !ids) {
        printf("INFO %s: no hidden-state golden for prompt %d\n", dir, p);
        return;
    }
    pt_model *m = load(dir, PT_COMPUTE_F32, 1);
    if (!m) return;
    hid_ctx c = {.h = h, .n_tok = (int)h->dims[1], .H = (int)h->dims[2], .L = (int)h->dims[0] - 2};
    m->hidden_cb = on_hidden;
    m->hidden_user = &c;
    int n = (int)gnum(ids);
    int32_t *id = malloc(sizeof *id * (size_t)n);
    for (int i = 0; i < n; i++) id[i] = gi(ids, i);
    float *lg = malloc(sizeof(float) * (size_t)n * (size_t)pt_model_vocab_size(m));
    parity_eval(m, id, n, lg);
    for (int l = 0; l < c.L + 2; l++)
        printf("INFO %s hidden[%s%d]: max|Δ| %.3g\n", dir, l == 0 ? "embed " : l == c.L + 1 ? "norm " : "layer ",
               l == 0 || l == c.L + 1 ? 0 : l - 1, c.worst[l]);
    free(id);
    free(lg);
    pt_model_free(&m);
}

/* ---- the parity check of one fixture ---- */

static void check_fixture(const char *dir, const char *name, int moe) {
    char path[1200];
    snprintf(path, sizeof path, "%s/golden.bin", dir);
    golden g;
    if (!golden_open(&g, path)) {
        CHECK(0, "%s: cannot read %s", name, path);
        golden_close(&g);
        return;
    }
    const garr *np = gget(&g, "meta.n_prompts", 0);
    int n_prompts = np ? gi(np, 0) : 0;
    CHECK(n_prompts > 0, "%s: no prompts in the golden", name);
    pt_model *m32 = load(dir, PT_COMPUTE_F32, 1), *m16 = load(dir, PT_COMPUTE_BF16, 1);
    if (m16) m16->route_cb = on_route;
    pt_model *m32b = load(dir, PT_COMPUTE_F32, 2), *m16b = load(dir, PT_COMPUTE_BF16, 2);
    if (!m32 || !m16 || !m32b || !m16b) {
        CHECK(0, "%s: load failed", name);
        goto out;
    }
    int V = pt_model_vocab_size(m32);
    int fp32_fail_prompt = -1;
    long gated = 0, agree = 0;
    for (int p = 0; p < n_prompts; p++) {
        const garr *ids = gget(&g, "prompt.%d.ids", p), *l32 = gget(&g, "prompt.%d.logits.f32", p),
                   *l16 = gget(&g, "prompt.%d.logits.bf16", p), *m16g = gget(&g, "prompt.%d.margin.bf16", p);
        if (!ids || !l32 || !l16 || !m16g) {
            CHECK(0, "%s prompt %d: golden arrays missing", name, p);
            continue;
        }
        int n = (int)gnum(ids);
        CHECK(gnum(l32) == (int64_t)n * V, "%s prompt %d: golden vocab %lld vs model %d", name, p,
              (long long)(gnum(l32) / n), V);
        if (gnum(l32) != (int64_t)n * V) continue;
        int32_t *id = malloc(sizeof *id * (size_t)n);
        for (int i = 0; i < n; i++) id[i] = gi(ids, i);
        float *a = malloc(sizeof(float) * (size_t)n * V), *b = malloc(sizeof(float) * (size_t)n * V);
        /* fp32 */
        if (parity_eval(m32, id, n, a)) {
            double md = 0, mx = 0, kl = 0;
            for (int64_t i = 0; i < (int64_t)n * V; i++) {
                md = fmax(md, fabs(a[i] - gf(l32, i)));
                mx = fmax(mx, fabs(gf(l32, i)));
            }
            for (int t = 0; t < n; t++) kl += kl_row(l32, (int64_t)t * V, a + (int64_t)t * V, V) / n;
            printf("MEASURE parity %s prompt %d (%d tokens) fp32: max|dlogit| %.3g, max|logit| %.3g, ratio %.3g "
                   "(gate 1e-4), mean KL %.3g\n",
                   name, p, n, md, mx, md / mx, kl);
            CHECK(md <= 1e-4 * mx, "%s prompt %d fp32: max|dlogit| %.3g > 1e-4 x %.3g", name, p, md, mx);
            if (md > 1e-4 * mx && fp32_fail_prompt < 0) fp32_fail_prompt = p;
            /* threads */
            if (parity_eval(m32b, id, n, b))
                CHECK(!memcmp(a, b, sizeof(float) * (size_t)n * V), "%s prompt %d fp32: 1 vs 2 threads differ", name,
                      p);
        }
        /* bf16 */
        route_reset();
        if (parity_eval(m16, id, n, a)) {
            double md = 0, mx = 0, kl = 0;
            for (int64_t i = 0; i < (int64_t)n * V; i++) {
                md = fmax(md, fabs(a[i] - gf(l16, i)));
                mx = fmax(mx, fabs(gf(l16, i)));
            }
            int pg = 0, pa = 0;
            for (int t = 0; t < n; t++) {
                kl += kl_row(l16, (int64_t)t * V, a + (int64_t)t * V, V) / n;
                float margin = gf(m16g, t);
                if (margin <= 0.05f) continue;
                int gold = 0;
                for (int v = 1; v < V; v++)
                    if (gf(l16, (int64_t)t * V + v) > gf(l16, (int64_t)t * V + gold)) gold = v;
                int ours = argmax(a + (int64_t)t * V, V);
                pg++;
                if (ours == gold) pa++;
                else
                    printf("INFO %s prompt %d bf16 position %d: argmax %d vs golden %d (golden margin %.4f, smallest "
                           "routing gap %.4g)\n",
                           name, p, t, ours, gold, margin, t < MAXPOS ? g_route_gap[t] : -1.0f);
            }
            gated += pg;
            agree += pa;
            printf("MEASURE parity %s prompt %d bf16: argmax agreement %d/%d where margin > 0.05, max|dlogit| "
                   "%.3g of %.3g, mean KL %.3g\n",
                   name, p, pa, pg, md, mx, kl);
            if (!moe) CHECK(pa == pg, "%s prompt %d bf16: argmax differs at %d of %d gated positions", name, p, pg - pa, pg);
            if (parity_eval(m16b, id, n, b))
                CHECK(!memcmp(a, b, sizeof(float) * (size_t)n * V), "%s prompt %d bf16: 1 vs 2 threads differ", name,
                      p);
        }
        /* greedy continuations */
        const char *kinds[2] = {"f32", "bf16"};
        for (int k = 0; k < 2; k++) {
            char fmt1[64], fmt2[64];
            snprintf(fmt1, sizeof fmt1, "prompt.%%d.greedy.%s", kinds[k]);
            snprintf(fmt2, sizeof fmt2, "prompt.%%d.greedy_margin.%s", kinds[k]);
            const garr *gg = gget(&g, fmt1, p), *gm = gget(&g, fmt2, p);
            if (!gg || !gm) continue;
            int steps = (int)gnum(gg);
            int32_t *out = malloc(sizeof *out * (size_t)steps);
            float *om = malloc(sizeof *om * 2 * (size_t)steps);
            route_reset();
            if (parity_greedy(k ? m16 : m32, id, n, steps, out, om)) {
                float tie = k ? 0.05f : 1e-3f;
                int same = 0, decided = steps;
                for (int i = 0; i < steps; i++)
                    if (gf(gm, i) <= tie) {
                        decided = i + 1; /* the token at a near-tie itself may go either way */
                        break;
                    }
                while (same < steps && out[same] == gi(gg, same)) same++;
                printf("MEASURE parity %s prompt %d greedy %s: %d/%d tokens identical (%d decided before a near-tie)\n",
                       name, p, kinds[k], same, steps, decided);
                int ok = same >= decided - (decided < steps ? 1 : 0);
                if (same < steps) {
                    /* the logits of step `same` come from position n + same - 1 */
                    int pos = n + same - 1;
                    float ours = om[2 * same], ulp = parity_ulp_bf16(om[2 * same + 1]);
                    printf("INFO %s prompt %d greedy %s: step %d ours %d vs golden %d; golden margin %.4f, our margin "
                           "%.4f (bf16 ulp %.4f)%s",
                           name, p, kinds[k], same, out[same], gi(gg, same), gf(gm, same), ours, ulp,
                           moe ? "" : "\n");
                    if (moe) printf(", smallest routing gap %.4g\n", pos < MAXPOS ? g_route_gap[pos] : -1.0f);
                    /* MoE: a divergence where our own top-2 are within 2 bf16 ulps is a
                     * routing/rounding near-tie (the reference's expert GEMMs change with
                     * the sequence length); counted and printed, not a failure */
                    if (!ok && moe && k == 1 && ours <= 2 * ulp) {
                        printf("MEASURE parity %s prompt %d greedy bf16: near-tie divergence at step %d allowed for "
                               "MoE\n",
                               name, p, same);
                        ok = 1;
                    }
                }
                CHECK(ok, "%s prompt %d greedy %s: diverges at step %d", name, p, kinds[k], same);
            }
            free(out);
            free(om);
        }
        free(id);
        free(a);
        free(b);
    }
    if (moe && gated > 0) {
        printf("MEASURE parity %s bf16 argmax agreement %ld/%ld = %.1f%% (MoE gate 95%%)\n", name, agree, gated,
               100.0 * agree / gated);
        CHECK(agree * 100 >= gated * 95, "%s bf16 MoE agreement %ld/%ld below 95%%", name, agree, gated);
    }
    if (fp32_fail_prompt >= 0) locate_divergence(dir, &g, fp32_fail_prompt);
out:
    pt_model_free(&m32);
    pt_model_free(&m16);
    pt_model_free(&m32b);
    pt_model_free(&m16b);
    golden_close(&g);
}

static const char *const families[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "minicpm", "gemma2", "gemma3_text", NULL};

static void test_parity_fixtures(void) {
    DIR *d = opendir("tests/fixtures");
    if (!d) TEST_SKIP("tests/fixtures absent");
    int n = 0;
    struct dirent *e;
    char names[64][128];
    int nn = 0;
    while ((e = readdir(d)) && nn < 64) {
        for (int i = 0; families[i]; i++) {
            size_t l = strlen(families[i]);
            if (!strncmp(e->d_name, families[i], l) && (e->d_name[l] == 0 || !strncmp(e->d_name + l, "_mlx", 4))) {
                snprintf(names[nn++], 128, "%.100s", e->d_name);
                break;
            }
        }
    }
    closedir(d);
    for (int i = 0; i < nn; i++) {
        char dir[600], gold[700];
        snprintf(dir, sizeof dir, "tests/fixtures/%.120s", names[i]);
        snprintf(gold, sizeof gold, "%s/golden.bin", dir);
        if (!pt_is_file(gold)) continue;
        check_fixture(dir, names[i], strstr(names[i], "moe") != NULL);
        n++;
    }
    if (n == 0) TEST_SKIP("no llama/qwen/minicpm fixture with a golden.bin under tests/fixtures");
    printf("INFO parity: %d fixtures checked\n", n);
}

int main(void) {
    TEST_RUN(test_parity_fixtures);
    return test_summary();
}
