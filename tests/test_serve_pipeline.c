/* The scheduler's pipelined turns (src/server/sched.c turn_ahead,
 * docs/batching.md "Pipelined turns") on the CPU: with PETREL_SERVE_PIPELINE=1
 * every request gets the reply it gets with 0, bit for bit (token ids,
 * log-probabilities, text, finish reason), while requests join, end by
 * length (one after a single token: sampled without a row), by a stop
 * string (its row ahead unused), run constrained to a JSON schema (turns
 * with a mask run unpipelined) and one is cancelled mid-generation. The
 * bundled demo model, prompt rows on as on CUDA; the CPU engine itself
 * leaves turns unpipelined by default (checked). Not here: the runtime's
 * rows ahead (tests/test_batch_ahead.c), the GPU (make check-cuda). */
#include "base/mmap.h"
#include "petrel.h"
#include "server/engine.h"
#include "server/sched.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NREQ = 6, MAXG = 16 };

typedef struct {
    int n;
    int32_t id[MAXG];
    float lp[MAXG];
    char text[1024];
    pt_srv_finish finish;
    char error[512];
} reply;

typedef struct {
    size_t len;
    int max_tokens;
    float temperature;
    const char *stop; /* "@": may take a stop string cut from its plain reply (the longest such reply's) */
    int schema;
} req;

static const req REQS[NREQ] = {
    {12, 14, 0.0f, "@", 0}, {20, 12, 0.9f, NULL, 0}, {300, 10, 0.0f, "@", 0},
    {8, 1, 0.0f, NULL, 0},  {15, 14, 0.0f, "@", 0},  {10, 3, 0.0f, NULL, 1},
};

static pt_srv_job *submit(pt_srv_engine *e, pt_srv_sched *s, const int32_t *prompt, const req *r, const char *stop) {
    pt_srv_job *j = pt_srv_job_new();
    if (!j) return NULL;
    j->prompt = malloc(r->len * sizeof *prompt);
    memcpy(j->prompt, prompt, r->len * sizeof *prompt);
    j->n_prompt = r->len;
    j->sp = e->default_sampling(e->model);
    j->sp.temperature = r->temperature;
    j->sp.top_p = r->temperature > 0 ? 0.95f : 1.0f;
    j->sp.seed = 3;
    j->max_tokens = r->max_tokens;
    j->want_logprobs = 1;
    if (stop) {
        j->stop = malloc(sizeof *j->stop);
        j->stop[0] = strdup(stop);
        j->n_stop = 1;
    }
    if (r->schema) {
        cJSON *sc = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}");
        pt_status st = pt_jschema_compile(sc, &j->schema);
        cJSON_Delete(sc);
        if (st != PT_OK) {
            pt_srv_job_release(j);
            return NULL;
        }
    }
    if (pt_srv_sched_submit(s, j) != 0) {
        pt_srv_job_release(j);
        return NULL;
    }
    return j;
}

static void collect(pt_srv_job *j, reply *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_lock(&j->mu);
    while (j->finish == PT_SRV_RUNNING) pthread_cond_wait(&j->cv, &j->mu);
    r->finish = j->finish;
    snprintf(r->error, sizeof r->error, "%s", j->error);
    snprintf(r->text, sizeof r->text, "%.*s", (int)j->text.len, j->text.data ? j->text.data : "");
    for (size_t i = 0; i < j->n_toks && i < MAXG; i++) {
        r->id[r->n] = j->toks[i].id;
        r->lp[r->n++] = j->toks[i].logprob;
    }
    pthread_mutex_unlock(&j->mu);
    pt_srv_job_release(j);
}

/* All requests submitted together (plus one to cancel mid-generation) on a
 * fresh scheduler with PETREL_SERVE_PIPELINE=pipe; stops[i]: request i's
 * stop string or NULL. Returns the pipelined turns the scheduler ran. */
static uint64_t run(pt_srv_engine *e, const char *pipe, int32_t P[NREQ][300], char stops[NREQ][64], reply *out,
                    int *cancelled_ok) {
    setenv("PETREL_SERVE_PIPELINE", pipe, 1);
    pt_srv_sched *s = NULL;
    pt_status st = pt_srv_sched_create(e, 8, 64, (size_t)1 << 30, 512, &s);
    unsetenv("PETREL_SERVE_PIPELINE");
    CHECK(st == PT_OK, "scheduler (pipeline %s): %s", pipe, pt_last_error());
    if (st != PT_OK) return 0;
    pt_srv_job *jobs[NREQ];
    for (int i = 0; i < NREQ; i++) jobs[i] = submit(e, s, P[i], &REQS[i], stops[i][0] ? stops[i] : NULL);
    const req long_one = {16, 200, 0.0f, NULL, 0};
    pt_srv_job *victim = submit(e, s, P[1] + 3, &long_one, NULL);
    /* cancelled once it has generated some tokens, while the others run */
    for (int w = 0; victim && w < 20000; w++) {
        pthread_mutex_lock(&victim->mu);
        const size_t g = victim->n_generated;
        const int done = victim->finish != PT_SRV_RUNNING;
        pthread_mutex_unlock(&victim->mu);
        if (g >= 3 || done) break;
        usleep(500);
    }
    if (victim) pt_srv_job_cancel(victim);
    for (int i = 0; i < NREQ; i++) {
        if (jobs[i]) collect(jobs[i], &out[i]);
        else CHECK(0, "submitting request %d", i);
    }
    if (victim) {
        reply v;
        collect(victim, &v);
        *cancelled_ok = v.finish == PT_SRV_CANCELLED && v.n >= 3 && v.n < 200;
    }
    pt_srv_sched_stats stats;
    pt_srv_sched_get_stats(s, &stats);
    pt_srv_sched_free(&s);
    return stats.piped_turns;
}

static void test_serve_pipeline_demo(void) {
    const char *dir = "models/kjv-llama-4bit";
    if (!pt_is_dir(dir)) TEST_SKIP("demo model absent");
    pt_model_params mp = pt_model_default_params();
    mp.device = PT_DEVICE_CPU;
    mp.n_threads = 2;
    pt_model *m = NULL;
    REQUIRE(pt_model_load(dir, &mp, &m) == PT_OK, "load: %s", pt_last_error());
    pt_srv_engine e;
    REQUIRE(pt_srv_engine_from_model(&e, m, dir) == PT_OK, "engine: %s", pt_last_error());
    CHECK(e.session_rows_ahead && !e.pipeline, "the CPU engine can pipeline turns and does not by default");
    e.prompt_rows_max = 64;

    /* a malformed switch is refused by name */
    setenv("PETREL_SERVE_PIPELINE", "yes", 1);
    pt_srv_sched *bad = NULL;
    CHECK(pt_srv_sched_create(&e, 2, 4, (size_t)1 << 28, 256, &bad) != PT_OK &&
              strstr(pt_last_error(), "PETREL_SERVE_PIPELINE"),
          "PETREL_SERVE_PIPELINE=yes is refused: %s", pt_last_error());
    unsetenv("PETREL_SERVE_PIPELINE");
    pt_srv_sched_free(&bad);

    /* prompts cut from verse (the demo model's text): replies that run on */
    static const char *const verse =
        "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
        "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
        "said, Let there be light: and there was light. And God saw the light, that it was good: and God divided "
        "the light from the darkness. And God called the light Day, and the darkness he called Night. And the "
        "evening and the morning were the first day. And God said, Let there be a firmament in the midst of the "
        "waters, and let it divide the waters from the waters. And God made the firmament, and divided the waters "
        "which were under the firmament from the waters which were above the firmament: and it was so. And God "
        "called the firmament Heaven. And the evening and the morning were the second day. And God said, Let the "
        "waters under the heaven be gathered together unto one place, and let the dry land appear: and it was so. "
        "And God called the dry land Earth; and the gathering together of the waters called he Seas: and God saw "
        "that it was good. And God said, Let the earth bring forth grass, the herb yielding seed, and the fruit "
        "tree yielding fruit after his kind, whose seed is in itself, upon the earth: and it was so.";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    REQUIRE(e.tokenize(e.model, verse, strlen(verse), 1, &ids, &n_ids) == PT_OK, "tokenize: %s", pt_last_error());
    static int32_t P[NREQ][300];
    for (int i = 0; i < NREQ; i++)
        for (size_t k = 0; k < 300; k++) P[i][k] = ids[(k + (size_t)i * 7) % n_ids];
    free(ids);
    char stops[NREQ][64] = {{0}};
    reply plain[NREQ], piped[NREQ];
    int c0 = 0, c1 = 0;
    /* the plain replies first, without stop strings: a stop is cut from the longest reply of the greedy
     * requests marked "@" (which one ends early, at its end-of-text token, depends on the CPU's kernels) */
    CHECK(run(&e, "0", P, stops, plain, &c0) == 0, "PETREL_SERVE_PIPELINE=0 runs no pipelined turn");
    int ks = -1;
    for (int i = 0; i < NREQ; i++)
        if (REQS[i].stop && (ks < 0 || strlen(plain[i].text) > strlen(plain[ks].text))) ks = i;
    const char *tk = plain[ks].text;
    const size_t nk = strlen(tk);
    CHECK(nk >= 8, "request %d's text is long enough to cut a stop string from (%zu bytes)", ks, nk);
    if (nk >= 8) snprintf(stops[ks], sizeof stops[ks], "%.3s", tk + nk / 2);
    const uint64_t turns0 = run(&e, "0", P, stops, plain, &c0);
    const uint64_t turns1 = run(&e, "1", P, stops, piped, &c1);
    CHECK(turns0 == 0 && turns1 > 0, "pipelined turns: %llu with =0, %llu with =1", (unsigned long long)turns0,
          (unsigned long long)turns1);
    CHECK(c0 && c1, "the request cancelled mid-generation ends cancelled (plain %d, pipelined %d)", c0, c1);
    CHECK(plain[ks].finish == PT_SRV_STOP_STRING, "request %d ends at its stop string \"%s\" (finish %d)", ks,
          stops[ks], (int)plain[ks].finish);
    CHECK(plain[3].n == 1 && plain[3].finish == PT_SRV_LENGTH, "request 3 ends after one token (%d)", plain[3].n);
    for (int i = 0; i < NREQ; i++) {
        const reply *a = &plain[i], *b = &piped[i];
        CHECK(a->finish != PT_SRV_ERROR, "request %d: %s", i, a->error);
        int same = a->finish == b->finish && a->n == b->n && !strcmp(a->text, b->text);
        for (int k = 0; same && k < a->n; k++) same = a->id[k] == b->id[k] && !memcmp(&a->lp[k], &b->lp[k], 4);
        CHECK(same, "request %d: pipelined reply (%d tokens, finish %d, \"%s\") differs from the plain one (%d, %d, \"%s\")",
              i, b->n, (int)b->finish, b->text, a->n, (int)a->finish, a->text);
    }
    printf("INFO %llu pipelined turns; replies (tokens, finish):", (unsigned long long)turns1);
    for (int i = 0; i < NREQ; i++) printf(" %d %d,", plain[i].n, (int)plain[i].finish);
    printf("\n");
    pt_srv_engine_release(&e);
    pt_model_free(&m);
}

int main(void) {
    TEST_RUN(test_serve_pipeline_demo);
    return test_summary();
}
