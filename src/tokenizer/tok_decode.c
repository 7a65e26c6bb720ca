/* Decoding: ids -> pieces -> decoder chain (ByteLevel, Metaspace, Replace,
 * ByteFallback, Fuse, Strip, Sequence) -> text, with the reference's
 * per-token semantics (each decoder maps a list of token strings to a new
 * list; the result is their concatenation). Also the streaming detokenizer,
 * which re-decodes a small window of ids (the last emitted token plus the
 * pending ones) and releases only text that cannot change any more. Not
 * encoding. */
#include "tokenizer/tok_internal.h"

#include "base/error.h"
#include "base/json.h"

#include <stdlib.h>
#include <string.h>

/* A list of token strings: [n] (offset, length) into buf. */
typedef struct tlist {
    tok_buf buf;
    size_t *off, *len;
    size_t n, cap;
} tlist;

static pt_status tl_push(tlist *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        size_t *o = realloc(l->off, cap * sizeof *o);
        if (o) l->off = o;
        size_t *q = realloc(l->len, cap * sizeof *q);
        if (q) l->len = q;
        if (!o || !q) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        l->cap = cap;
    }
    size_t off = l->buf.n;
    PT_TRY(tok_buf_put(&l->buf, s, n));
    l->off[l->n] = off;
    l->len[l->n] = n;
    l->n++;
    return PT_OK;
}
/* Starts a new empty token whose bytes are appended with tok_buf_put(&l->buf). */
static pt_status tl_open(tlist *l) { return tl_push(l, "", 0); }
static void tl_close(tlist *l) { l->len[l->n - 1] = l->buf.n - l->off[l->n - 1]; }
static void tl_free(tlist *l) {
    tok_buf_free(&l->buf);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}
#define TOK(l, i) ((l)->buf.p + (l)->off[i])

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 32) >= 'a' && (c | 32) <= 'f') return (c | 32) - 'a' + 10;
    return -1;
}

static pt_status flush_bytes(tlist *out, const unsigned char *bytes, size_t nb) {
    if (!nb) return PT_OK;
    if (pt_utf8_invalid_offset((const char *)bytes, nb) < 0) return tl_push(out, (const char *)bytes, nb);
    for (size_t i = 0; i < nb; i++) PT_TRY(tl_push(out, "\xEF\xBF\xBD", 3)); /* one U+FFFD per byte */
    return PT_OK;
}

static pt_status apply_dec(const pt_tokenizer *t, const tok_dec *d, tlist *in, tlist *out) {
    switch (d->kind) {
    case DEC_SEQUENCE: {
        tlist a = {0}, b = {0};
        pt_status st = PT_OK;
        for (size_t i = 0; !st && i < in->n; i++) st = tl_push(&a, TOK(in, i), in->len[i]);
        for (size_t k = 0; !st && k < d->n_items; k++) {
            tl_free(&b);
            st = apply_dec(t, &d->items[k], &a, &b);
            tlist x = a; a = b; b = x;
        }
        for (size_t i = 0; !st && i < a.n; i++) st = tl_push(out, TOK(&a, i), a.len[i]);
        tl_free(&a);
        tl_free(&b);
        return st;
    }
    case DEC_BYTELEVEL: {
        /* every token back to bytes (a token with a char outside the map
         * keeps its own UTF-8 bytes), then one lossy UTF-8 string */
        tok_buf raw = {0};
        pt_status st = PT_OK;
        for (size_t i = 0; !st && i < in->n; i++) {
            const unsigned char *s = (const unsigned char *)TOK(in, i);
            size_t n = in->len[i], mark = raw.n;
            bool ok = true;
            for (size_t k = 0; k < n && !st;) {
                int adv;
                uint32_t cp = tok_utf8_next(s + k, n - k, &adv);
                if (cp >= 324 || t->cp_to_byte[cp] < 0) { ok = false; break; }
                st = tok_buf_putc(&raw, (char)t->cp_to_byte[cp]);
                k += (size_t)adv;
            }
            if (!st && !ok) {
                raw.n = mark;
                st = tok_buf_put(&raw, s, n);
            }
        }
        if (!st) st = tl_open(out);
        if (!st) st = tok_buf_put_lossy(&out->buf, (const unsigned char *)raw.p, raw.n);
        if (!st) tl_close(out);
        tok_buf_free(&raw);
        return st;
    }
    case DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            const unsigned char *s = (const unsigned char *)TOK(in, i);
            size_t n = in->len[i];
            PT_TRY(tl_open(out));
            for (size_t k = 0; k < n;) {
                int adv;
                uint32_t cp = tok_utf8_next(s + k, n - k, &adv);
                if (cp == d->replacement_cp) {
                    if (!(i == 0 && d->prepend != PREPEND_NEVER)) PT_TRY(tok_buf_putc(&out->buf, ' '));
                } else PT_TRY(tok_buf_put(&out->buf, s + k, (size_t)adv));
                k += (size_t)adv;
            }
            tl_close(out);
        }
        return PT_OK;
    case DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            tok_match *m = NULL;
            size_t nm = 0, cap = 0;
            pcre2_match_data *md = d->pat.re ? pcre2_match_data_create(1, NULL) : NULL;
            pt_status st = PT_OK;
            /* tokens are valid UTF-8 (checked at load); a regex never sees anything else */
            if (!d->pat.re || pt_utf8_invalid_offset(TOK(in, i), in->len[i]) < 0)
                st = tok_pattern_find(&d->pat, md, NULL, TOK(in, i), in->len[i], &m, &nm, &cap);
            if (md) pcre2_match_data_free(md);
            size_t prev = 0;
            if (!st) st = tl_open(out);
            for (size_t k = 0; !st && k < nm; k++) {
                st = tok_buf_put(&out->buf, TOK(in, i) + prev, m[k].start - prev);
                if (!st) st = tok_buf_put(&out->buf, d->content, d->content_len);
                prev = m[k].end;
            }
            if (!st) st = tok_buf_put(&out->buf, TOK(in, i) + prev, in->len[i] - prev);
            if (!st) tl_close(out);
            free(m);
            PT_TRY(st);
        }
        return PT_OK;
    case DEC_BYTEFALLBACK: {
        unsigned char *bytes = malloc(in->n + 1);
        size_t nb = 0;
        pt_status st = bytes ? PT_OK : pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        for (size_t i = 0; !st && i < in->n; i++) {
            const char *s = TOK(in, i);
            int hi, lo;
            if (in->len[i] == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && (hi = hexval(s[3])) >= 0 &&
                (lo = hexval(s[4])) >= 0) {
                bytes[nb++] = (unsigned char)(hi * 16 + lo);
                continue;
            }
            st = flush_bytes(out, bytes, nb);
            nb = 0;
            if (!st) st = tl_push(out, s, in->len[i]);
        }
        if (!st) st = flush_bytes(out, bytes, nb);
        free(bytes);
        return st;
    }
    case DEC_FUSE:
        PT_TRY(tl_open(out));
        for (size_t i = 0; i < in->n; i++) PT_TRY(tok_buf_put(&out->buf, TOK(in, i), in->len[i]));
        tl_close(out);
        return PT_OK;
    case DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const unsigned char *s = (const unsigned char *)TOK(in, i);
            size_t n = in->len[i], a = 0, b = n;
            for (int k = 0; k < d->strip_start && a < n; k++) {
                int adv;
                if (tok_utf8_next(s + a, n - a, &adv) != d->strip_cp) break;
                a += (size_t)adv;
            }
            for (int k = 0; k < d->strip_stop && b > a; k++) {
                size_t j = b - 1;
                while (j > a && (s[j] & 0xC0) == 0x80) j--;
                int adv;
                if (tok_utf8_next(s + j, b - j, &adv) != d->strip_cp) break;
                b = j;
            }
            PT_TRY(tl_push(out, (const char *)s + a, b - a));
        }
        return PT_OK;
    }
    return pt_error(PT_ERR_INTERNAL, "tokenizer: unknown decoder kind");
}

pt_status tok_decode_tokens(const pt_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                            tok_buf *out) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            return pt_error(PT_ERR_RANGE, "tokenizer: id %d at position %zu is outside the vocabulary [0, %d)",
                            ids[i], i, t->vocab_size);
    tlist in = {0}, res = {0};
    pt_status st = PT_OK;
    for (size_t i = 0; !st && i < n; i++) {
        int32_t id = ids[i];
        if (!t->pieces[id]) continue; /* an id with no token decodes to nothing */
        if (skip_special && (t->flags[id] & 2)) continue;
        st = tl_push(&in, t->pieces[id], t->piece_len[id]);
    }
    if (!st && !t->has_dec) {
        for (size_t i = 0; !st && i < in.n; i++) {
            if (i) st = tok_buf_putc(out, ' ');
            if (!st) st = tok_buf_put(out, TOK(&in, i), in.len[i]);
        }
    } else if (!st) {
        st = apply_dec(t, &t->dec, &in, &res);
        for (size_t i = 0; !st && i < res.n; i++) st = tok_buf_put(out, TOK(&res, i), res.len[i]);
    }
    if (!st) st = tok_buf_put(out, "", 0);
    tl_free(&in);
    tl_free(&res);
    return st;
}

pt_status pt_tokenizer_decode(const pt_tokenizer *t, const int32_t *ids, size_t n_ids, int skip_special,
                              char **text, size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    tok_buf b = {0};
    pt_status st = tok_decode_tokens(t, ids, n_ids, skip_special, &b);
    if (st) {
        tok_buf_free(&b);
        return st;
    }
    *text = b.p;
    if (len) *len = b.n;
    return PT_OK;
}

pt_status pt_tokenizer_token_text(const pt_tokenizer *t, int32_t id, char **text, size_t *len) {
    return pt_tokenizer_decode(t, &id, 1, 0, text, len);
}

/* ---- streaming ------------------------------------------------------------------------ */
struct pt_tok_stream {
    const pt_tokenizer *t;
    int skip_special;
    tok_ids window;       /* [0, prefix_index): already emitted; the rest pending */
    size_t prefix_index;
    tok_buf prefix;       /* decode(window[0 .. prefix_index)) as emitted */
    tok_buf cur, out;
};

pt_status pt_tok_stream_create(const pt_tokenizer *t, int skip_special, pt_tok_stream **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
    (*out)->t = t;
    (*out)->skip_special = skip_special;
    return PT_OK;
}

static bool ends_with_fffd(const tok_buf *b) {
    return b->n >= 3 && !memcmp(b->p + b->n - 3, "\xEF\xBF\xBD", 3);
}

/* The reference's DecodeStream algorithm: the window holds the ids of the
 * last emission (their text is `prefix`) plus pending ids; text is released
 * once the decoded window grew and does not end in U+FFFD (an incomplete
 * byte sequence decodes to U+FFFD until it completes). Keeping the whole last
 * emission as left context keeps byte groups and first-token rules intact. */
pt_status pt_tok_stream_push(pt_tok_stream *s, int32_t id, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (id < 0 || id >= s->t->vocab_size)
        return pt_error(PT_ERR_RANGE, "tokenizer: id %d is outside the vocabulary [0, %d)", id, s->t->vocab_size);
    /* A skipped special token is dropped before the decoder runs, so it
     * changes nothing; not keeping it stops a run of them from growing the
     * window (and the cost of every push). */
    if (s->skip_special && (s->t->flags[id] & 2)) return PT_OK;
    if (s->prefix.n == 0 && s->window.n > 0) {
        s->cur.n = 0;
        PT_TRY(tok_decode_tokens(s->t, s->window.v, s->window.n, s->skip_special, &s->cur));
        if (!ends_with_fffd(&s->cur)) {
            s->prefix.n = 0;
            PT_TRY(tok_buf_put(&s->prefix, s->cur.p, s->cur.n));
            s->prefix_index = s->window.n;
        }
    }
    PT_TRY(tok_ids_push(&s->window, id));
    s->cur.n = 0;
    PT_TRY(tok_decode_tokens(s->t, s->window.v, s->window.n, s->skip_special, &s->cur));
    if (s->cur.n <= s->prefix.n || ends_with_fffd(&s->cur)) return PT_OK;
    s->out.n = 0;
    PT_TRY(tok_buf_put(&s->out, s->cur.p + s->prefix.n, s->cur.n - s->prefix.n));
    size_t new_index = s->window.n - s->prefix_index;
    memmove(s->window.v, s->window.v + s->prefix_index, new_index * sizeof *s->window.v);
    s->window.n = new_index;
    s->prefix.n = 0;
    PT_TRY(tok_decode_tokens(s->t, s->window.v, s->window.n, s->skip_special, &s->prefix));
    s->prefix_index = new_index;
    *text = s->out.p;
    *len = s->out.n;
    return PT_OK;
}

pt_status pt_tok_stream_flush(pt_tok_stream *s, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    s->cur.n = 0;
    PT_TRY(tok_decode_tokens(s->t, s->window.v, s->window.n, s->skip_special, &s->cur));
    s->out.n = 0;
    if (s->cur.n > s->prefix.n) PT_TRY(tok_buf_put(&s->out, s->cur.p + s->prefix.n, s->cur.n - s->prefix.n));
    PT_TRY(tok_buf_put(&s->out, "", 0));
    s->window.n = 0;
    s->prefix.n = 0;
    s->prefix_index = 0;
    *text = s->out.p;
    *len = s->out.n;
    return PT_OK;
}

void pt_tok_stream_free(pt_tok_stream **sp) {
    if (!sp || !*sp) return;
    pt_tok_stream *s = *sp;
    free(s->window.v);
    tok_buf_free(&s->prefix);
    tok_buf_free(&s->cur);
    tok_buf_free(&s->out);
    free(s);
    *sp = NULL;
}
