/* Reader of petrel's golden files: the reference outputs recorded by
 * tools/oracle/make_fixtures.py next to each tiny checkpoint in
 * tests/fixtures/<fixture>/golden.bin (format: tests/fixtures/README.md).
 *
 * What it is: test support, linked into every test binary; plain C11 with no
 * dependency on the engine, so a parity test can compare petrel's outputs
 * with the reference's.  What it is not: a general container format, or
 * anything the library itself reads.
 *
 * Ownership: golden_open() reads the whole file into memory; every pointer
 * returned by the accessors points into the golden object and stays valid
 * until golden_close().  bf16 arrays are widened to float once at open time,
 * so every floating array can be read as const float *.
 *
 * Names inside a fixture's golden.bin (p = prompt index, s = scenario):
 *   meta.n_prompts i32[1], meta.hidden_prompt i32[1], meta.greedy_len i32[1]
 *   prompt.p.ids                   i32 [n]          token ids, used verbatim
 *   prompt.p.logits.f32            f32 [n, V]       every position, fp32 reference
 *   prompt.p.logits.bf16           bf16 [n, V]      every position, bf16 reference
 *   prompt.p.margin.{f32,bf16}     f32 [n]          top-1 minus top-2 logit per position
 *   prompt.p.greedy.{f32,bf16}     i32 [G]          greedy continuation (G = 32)
 *   prompt.p.greedy_margin.{f32,bf16} f32 [G]       top-1 minus top-2 at each greedy step
 *   prompt.p.hidden.f32            f32 [L+2, n, H]  (hidden prompt only) [0] input of
 *                                  layer 0, [i] output of layer i-1, [L+1] final norm output
 *   meta.n_qkv, qkv.s.*            quantized-KV references (llama fixture; README)
 */
#ifndef PT_TESTS_GOLDEN_H
#define PT_TESTS_GOLDEN_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    GOLDEN_F32 = 0,
    GOLDEN_I32 = 1,
    GOLDEN_BF16 = 2,
    GOLDEN_U32 = 3,
    GOLDEN_U8 = 4,
} golden_dtype;

/* Which reference run: the fp32 model or the model loaded in bf16. */
typedef enum { GOLDEN_REF_F32 = 0, GOLDEN_REF_BF16 = 1 } golden_ref;

typedef struct {
    const char *name;
    golden_dtype dtype; /* as stored in the file */
    int ndim;           /* 1..4 */
    int64_t dims[4];
    int64_t count;      /* product of dims */
    const void *data;   /* the stored little-endian elements (16-byte aligned) */
    const float *f32;   /* F32 and BF16 arrays as float; NULL for integer arrays */
} golden_array;

typedef struct golden golden;

/* Opens a golden file; NULL on error with a message (naming the file) in err. */
golden *golden_open(const char *path, char *err, size_t errlen);
/* Opens tests/fixtures/<fixture>/golden.bin (tests run from the repo root). */
golden *golden_open_fixture(const char *fixture, char *err, size_t errlen);
void golden_close(golden *g);

int golden_count(const golden *g);
const golden_array *golden_at(const golden *g, int i);
/* The array called name, or NULL. */
const golden_array *golden_find(const golden *g, const char *name);
/* The array called name if it has the given dtype class and ndim, else NULL.
 * want_float accepts F32 or BF16; otherwise dtype must match exactly. */
const golden_array *golden_get(const golden *g, const char *name, int want_float, golden_dtype dtype, int ndim);
/* The single value of a one-element i32 array, or fallback if absent. */
int golden_int(const golden *g, const char *name, int fallback);

/* Per-prompt accessors; NULL (and zeroed sizes) when absent. */
int golden_n_prompts(const golden *g);
const int32_t *golden_prompt_ids(const golden *g, int p, int *n);
const float *golden_logits(const golden *g, int p, golden_ref ref, int *n_pos, int *vocab);
const float *golden_margins(const golden *g, int p, golden_ref ref, int *n_pos);
const int32_t *golden_greedy(const golden *g, int p, golden_ref ref, int *n);
const float *golden_greedy_margins(const golden *g, int p, golden_ref ref, int *n);
/* Which prompt has hidden states (-1 if none). */
int golden_hidden_prompt(const golden *g);
/* Hidden state rows of entry `layer` (0 = input of layer 0, i = output of
 * layer i-1, n_entries-1 = final norm output): [n_pos, hidden]. */
const float *golden_hidden(const golden *g, int p, int layer, int *n_pos, int *hidden, int *n_entries);

/* Quantized-KV reference scenario s (see README "Quantized-KV references"). */
typedef struct {
    int kv_bits;            /* 8 or 4 = every layer; 0 = per-layer from kv_config.json */
    int group_size, prefill_chunk, quantized_kv_start;
    const int32_t *layer_bits; /* [n_layers]: bits per layer, 0 = full precision */
    int n_layers;
    const float *prompt_logits; /* [n_prompt, vocab] */
    int n_prompt, vocab;
    const int32_t *greedy;      /* [n_greedy] */
    int n_greedy;
    const float *step_logits;   /* [n_greedy - 1, vocab]: row j chose greedy[j + 1] */
} golden_qkv;
int golden_n_qkv(const golden *g);
/* 0 on success, -1 if scenario s is absent or malformed. */
int golden_qkv_get(const golden *g, int s, golden_qkv *out);

/* Index of the largest value (the first one on ties). */
int golden_argmax(const float *x, int n);

#endif
