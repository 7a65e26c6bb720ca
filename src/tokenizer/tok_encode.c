/* Encoding: text -> ids, in the reference's order: split the raw text on
 * non-normalized added tokens, normalize each remaining span, split it on
 * normalized added tokens, pre-tokenize, run BPE on each piece, then add what
 * the post-processor adds. Also the loader entry points, lifetime and simple
 * accessors of pt_tokenizer. Not decoding (tok_decode.c). */
#include "tokenizer/tok_internal.h"

#include "base/error.h"
#include "base/json.h"
#include "base/mmap.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

pt_status pt_tokenizer_load_json(const char *json, size_t len, const char *what, pt_tokenizer **out) {
    *out = NULL;
    cJSON *root = NULL;
    /* Duplicate keys are checked where they matter (model.vocab) in linear
     * time; the generic checker is quadratic on a 262k-entry object. */
    PT_TRY(pt_json_parse(json, len, what, 0, &root));
    pt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
    }
    pt_arena_init(&t->arena, 1 << 16);
    t->bos_id = t->eos_id = t->pad_id = t->unk_id_cfg = -1;
    t->add_bos = t->add_eos = -1;
    pt_status st = tok_load_root(t, root, what);
    cJSON_Delete(root);
    if (st) {
        pt_tokenizer_free(&t);
        return st;
    }
    t->unk_id_cfg = t->bpe.unk_id;
    *out = t;
    return PT_OK;
}

pt_status pt_tokenizer_load(const char *path, pt_tokenizer **out) {
    *out = NULL;
    char *buf;
    size_t len;
    PT_TRY(pt_read_file(path, &buf, &len));
    pt_status st = pt_tokenizer_load_json(buf, len, path, out);
    free(buf);
    return st;
}

void pt_tokenizer_free(pt_tokenizer **tp) {
    if (!tp || !*tp) return;
    pt_tokenizer *t = *tp;
    tok_free_components(t);
    free(t->bos_token);
    free(t->eos_token);
    free(t->eos_ids);
    pt_arena_free(&t->arena);
    free(t);
    *tp = NULL;
}

/* ---- added-token matching ------------------------------------------------------ */
typedef struct seg {
    size_t a, b;
    int32_t tok; /* index into t->added, or -1 for text */
} seg;
typedef struct segs {
    seg *v;
    size_t n, cap;
} segs;
static pt_status seg_push(segs *s, size_t a, size_t b, int32_t tok) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        seg *v = realloc(s->v, cap * sizeof *v);
        if (!v) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (seg){a, b, tok};
    return PT_OK;
}

static uint32_t last_cp(const char *s, size_t n) {
    size_t k = n - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    int adv;
    return tok_utf8_next((const unsigned char *)s + k, n - k, &adv);
}

/* Splits s[0..n) on added tokens of trie `tr`: leftmost-longest matches, then
 * the single_word / lstrip / rstrip rules of the reference. */
static pt_status split_added(const pt_tokenizer *t, const tok_trie *tr, const char *s, size_t n, segs *out) {
    size_t start_off = 0, pos = 0;
    if (tr->n) {
        while (pos < n) {
            if (!tr->first_byte[(unsigned char)s[pos]]) { pos++; continue; }
            int32_t cur = 0, best = -1;
            size_t best_end = 0;
            for (size_t i = pos; i < n; i++) {
                int32_t ch = tr->nodes[cur].first_child;
                while (ch >= 0 && tr->nodes[ch].byte != (unsigned char)s[i]) ch = tr->nodes[ch].next_sibling;
                if (ch < 0) break;
                cur = ch;
                if (tr->nodes[cur].token >= 0) { best = tr->nodes[cur].token; best_end = i + 1; }
            }
            if (best < 0) { pos++; continue; }
            const tok_added *a = &t->added[best];
            size_t start = pos, stop = best_end;
            pos = best_end; /* matches never overlap */
            if (a->single_word) {
                int adv;
                /* the reference tests its regex word class (\w) on the neighbours */
                bool start_space = start == 0 || !tok_is_word(last_cp(s, start));
                bool stop_space = stop == n || !tok_is_word(tok_utf8_next((const unsigned char *)s + stop, n - stop, &adv));
                if (!start_space || !stop_space) continue;
            }
            if (a->lstrip) {
                size_t k = start;
                while (k > 0) {
                    size_t j = k - 1;
                    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
                    int adv;
                    if (!tok_is_whitespace(tok_utf8_next((const unsigned char *)s + j, k - j, &adv))) break;
                    k = j;
                }
                start = k > start_off ? k : start_off; /* an earlier match may own those spaces */
            }
            if (a->rstrip) {
                while (stop < n) {
                    int adv;
                    if (!tok_is_whitespace(tok_utf8_next((const unsigned char *)s + stop, n - stop, &adv))) break;
                    stop += (size_t)adv;
                }
            }
            if (start_off < start) PT_TRY(seg_push(out, start_off, start, -1));
            PT_TRY(seg_push(out, start, stop, best));
            start_off = stop;
            if (pos < stop) pos = stop;
        }
    }
    if (start_off < n) PT_TRY(seg_push(out, start_off, n, -1));
    return PT_OK;
}

/* pre-tokenize + BPE one normalized span */
static pt_status encode_span(const pt_tokenizer *t, tok_work *w, const char *s, size_t n, bool first,
                             tok_ids *ids) {
    if (!n) return PT_OK;
    w->buf.n = 0;
    PT_TRY(tok_buf_put(&w->buf, s, n));
    w->a.n = w->b.n = 0;
    PT_TRY(tok_pieces_push(&w->a, 0, n, first));
    tok_pieces *pieces = &w->a;
    if (t->has_pre) {
        PT_TRY(tok_pretokenize(t, &t->pre, w, &w->a, &w->b));
        pieces = &w->b;
    }
    for (size_t i = 0; i < pieces->n; i++)
        PT_TRY(tok_bpe_encode(&t->bpe, w->buf.p + pieces->v[i].off, pieces->v[i].len, ids));
    return PT_OK;
}

static pt_status encode_all(const pt_tokenizer *t, tok_work *w, const char *text, size_t len,
                            int add_special, tok_ids *ids) {
    if (add_special)
        for (size_t i = 0; i < t->post.n_before; i++) PT_TRY(tok_ids_push(ids, t->post.before[i]));
    segs raw = {0}, nseg = {0};
    tok_buf nb = {0};
    pt_status st = split_added(t, &t->trie_raw, text, len, &raw);
    for (size_t i = 0; !st && i < raw.n; i++) {
        seg g = raw.v[i];
        if (g.tok >= 0) { st = tok_ids_push(ids, t->added[g.tok].id); continue; }
        const char *s = text + g.a;
        size_t n = g.b - g.a;
        if (t->has_norm) {
            nb.n = 0;
            st = tok_normalize(t, &t->norm, s, n, &nb);
            if (st) break;
            s = nb.p;
            n = nb.n;
        }
        nseg.n = 0;
        if (t->trie_norm.n) st = split_added(t, &t->trie_norm, s, n, &nseg);
        else st = seg_push(&nseg, 0, n, -1);
        for (size_t k = 0; !st && k < nseg.n; k++) {
            seg h = nseg.v[k];
            if (h.tok >= 0) st = tok_ids_push(ids, t->added[h.tok].id);
            else st = encode_span(t, w, s + h.a, h.b - h.a, g.a == 0 && h.a == 0, ids);
        }
    }
    free(raw.v);
    free(nseg.v);
    tok_buf_free(&nb);
    if (!st && add_special)
        for (size_t i = 0; i < t->post.n_after; i++) PT_TRY(tok_ids_push(ids, t->post.after[i]));
    return st;
}

pt_status pt_tokenizer_encode(const pt_tokenizer *t, const char *text, size_t len, int add_special,
                              int32_t **ids_out, size_t *n_out) {
    *ids_out = NULL;
    *n_out = 0;
    if (!t) return pt_error(PT_ERR_INVALID_ARG, "tokenizer: no tokenizer");
    if (!text && len) return pt_error(PT_ERR_INVALID_ARG, "tokenizer: NULL text");
    long bad = len ? pt_utf8_invalid_offset(text, len) : -1;
    if (bad >= 0) return pt_error(PT_ERR_INVALID_ARG, "tokenizer: input text is not valid UTF-8 (byte offset %ld)", bad);
    tok_work w = {0};
    tok_ids ids = {0};
    pt_status st = PT_OK;
    w.md = pcre2_match_data_create(1, NULL);
    if (!w.md) st = pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
    if (!st) st = tok_ids_push(&ids, 0); /* ensure a non-NULL array even when empty */
    ids.n = 0;
    if (!st) st = encode_all(t, &w, text ? text : "", len, add_special, &ids);
    for (size_t i = 0; !st && i < ids.n; i++)
        if (ids.v[i] < 0 || ids.v[i] >= t->vocab_size)
            st = pt_error(PT_ERR_INTERNAL, "tokenizer: produced id %d outside the vocabulary", ids.v[i]);
    if (w.md) pcre2_match_data_free(w.md);
    tok_buf_free(&w.buf);
    free(w.a.v);
    free(w.b.v);
    free(w.m);
    free(w.sp);
    if (st) {
        free(ids.v);
        return st;
    }
    *ids_out = ids.v;
    *n_out = ids.n;
    return PT_OK;
}

/* ---- accessors -------------------------------------------------------------------- */
int32_t pt_tokenizer_vocab_size(const pt_tokenizer *t) { return t->vocab_size; }

const char *pt_tokenizer_id_to_piece(const pt_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->vocab_size || !t->pieces[id]) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->piece_len[id];
    return t->pieces[id];
}

int32_t pt_tokenizer_piece_to_id(const pt_tokenizer *t, const char *piece, size_t len) {
    int32_t id = tok_strmap_get(&t->added_map, piece, len);
    return id >= 0 ? id : tok_strmap_get(&t->bpe.vocab, piece, len);
}

int pt_tokenizer_is_special(const pt_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->vocab_size && (t->flags[id] & 2);
}
