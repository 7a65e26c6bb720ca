/* Pre-tokenizers: split a normalized span into pieces (the "words" the BPE
 * model sees) — Split (regex or literal, five behaviours, invert), ByteLevel
 * (prefix space, GPT-2 regex, byte -> code point mapping), Metaspace, Digits,
 * Whitespace, WhitespaceSplit, Punctuation, CharDelimiterSplit and Sequence.
 * The split behaviours reproduce the reference's span folding exactly
 * (including which pieces count as "first" for Metaspace's prepend_scheme).
 * Pieces are (offset, length) views into one work buffer; transforms append
 * new bytes to it. Not the BPE model. */
#include "tokenizer/tok_internal.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct tok_span {
    size_t a, b; /* relative to the piece */
    bool match;
} tok_span;

pt_status tok_pieces_push(tok_pieces *p, size_t off, size_t len, bool first) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        tok_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (tok_piece){off, len, first};
    return PT_OK;
}

static pt_status span_push(tok_work *w, size_t *n, size_t a, size_t b, bool match) {
    if (*n == w->sp_cap) {
        size_t cap = w->sp_cap ? w->sp_cap * 2 : 64;
        tok_span *v = realloc(w->sp, cap * sizeof *v);
        if (!v) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
        w->sp = v;
        w->sp_cap = cap;
    }
    w->sp[(*n)++] = (tok_span){a, b, match};
    return PT_OK;
}

/* Folds (span, is_match) events by behaviour and emits the kept pieces. */
static pt_status emit_spans(tok_work *w, const tok_piece *pc, size_t ns, tok_split_behavior beh,
                            tok_pieces *out) {
    tok_span *sp = w->sp;
    size_t k = 0; /* folded spans written back into sp[0..k); .match now means "remove" */
    bool prev_match = false;
    switch (beh) {
    case SPLIT_REMOVED: k = ns; break;
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < ns; i++) sp[i].match = false;
        k = ns;
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < ns; i++) {
            bool m = sp[i].match;
            if (k > 0 && m == prev_match) sp[k - 1].b = sp[i].b;
            else sp[k++] = (tok_span){sp[i].a, sp[i].b, false};
            prev_match = m;
        }
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < ns; i++) {
            bool m = sp[i].match;
            if (m && !prev_match && k > 0) sp[k - 1].b = sp[i].b;
            else sp[k++] = (tok_span){sp[i].a, sp[i].b, false};
            prev_match = m;
        }
        break;
    case SPLIT_MERGED_NEXT: {
        /* folded right to left, written from the end, then moved to the front */
        size_t j = ns;
        for (size_t i = ns; i-- > 0;) {
            bool m = sp[i].match;
            if (m && !prev_match && j < ns) sp[j].a = sp[i].a;
            else sp[--j] = (tok_span){sp[i].a, sp[i].b, false};
            prev_match = m;
        }
        k = ns - j;
        memmove(sp, sp + j, k * sizeof *sp);
        break;
    }
    }
    for (size_t i = 0; i < k; i++) {
        if (sp[i].match || sp[i].b <= sp[i].a) continue; /* removed or empty */
        PT_TRY(tok_pieces_push(out, pc->off + sp[i].a, sp[i].b - sp[i].a, pc->first && sp[i].a == 0));
    }
    return PT_OK;
}

/* Spans from pattern matches over a piece (invert flips the flags). */
static pt_status spans_from_matches(tok_work *w, const tok_match *m, size_t nm, size_t len, bool invert,
                                    size_t *ns) {
    size_t prev = 0, n = 0;
    for (size_t i = 0; i < nm; i++) {
        if (m[i].start > prev) PT_TRY(span_push(w, &n, prev, m[i].start, invert));
        PT_TRY(span_push(w, &n, m[i].start, m[i].end, !invert));
        prev = m[i].end;
    }
    if (prev < len || n == 0) PT_TRY(span_push(w, &n, prev, len, invert));
    *ns = n;
    return PT_OK;
}

typedef bool (*char_pred)(uint32_t cp, uint32_t arg);
/* Rust char::is_numeric: general categories Nd, Nl, No */
static bool pred_numeric(uint32_t c, uint32_t a) {
    (void)a;
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
static bool pred_punct(uint32_t c, uint32_t a) { (void)a; return tok_is_punct(c); }
static bool pred_space(uint32_t c, uint32_t a) { (void)a; return tok_is_whitespace(c); }
static bool pred_eq(uint32_t c, uint32_t a) { return c == a; }

/* Every character satisfying pred is its own match, as in the reference. */
static pt_status spans_from_pred(tok_work *w, const char *s, size_t len, char_pred pred, uint32_t arg,
                                 size_t *ns) {
    size_t last = 0, n = 0;
    for (size_t i = 0; i < len;) {
        int adv;
        uint32_t cp = tok_utf8_next((const unsigned char *)s + i, len - i, &adv);
        if (pred(cp, arg)) {
            if (last < i) PT_TRY(span_push(w, &n, last, i, false));
            PT_TRY(span_push(w, &n, i, i + (size_t)adv, true));
            last = i + (size_t)adv;
        }
        i += (size_t)adv;
    }
    if (last < len) PT_TRY(span_push(w, &n, last, len, false));
    *ns = n;
    return PT_OK;
}

static pt_status split_regex(tok_work *w, const pcre2_code *re, const tok_pattern *pat,
                             const tok_piece *pc, bool invert, tok_split_behavior beh, tok_pieces *out) {
    size_t nm = 0, ns = 0;
    tok_pattern tmp;
    if (re) {
        memset(&tmp, 0, sizeof tmp);
        tmp.re = (pcre2_code *)re;
        pat = &tmp;
    }
    PT_TRY(tok_pattern_find(pat, w->md, w->mc, w->buf.p + pc->off, pc->len, &w->m, &nm, &w->m_cap));
    PT_TRY(spans_from_matches(w, w->m, nm, pc->len, invert, &ns));
    return emit_spans(w, pc, ns, beh, out);
}

static pt_status split_pred(tok_work *w, const tok_piece *pc, char_pred pred, uint32_t arg,
                            tok_split_behavior beh, tok_pieces *out) {
    size_t ns = 0;
    PT_TRY(spans_from_pred(w, w->buf.p + pc->off, pc->len, pred, arg, &ns));
    return emit_spans(w, pc, ns, beh, out);
}

/* Appends a copy of the piece to the work buffer with `pre` prepended and
 * points the piece at the copy. */
static pt_status rewrite_piece(tok_work *w, tok_piece *pc, const char *pre, size_t pre_len) {
    size_t off = w->buf.n;
    PT_TRY(tok_buf_reserve(&w->buf, pre_len + pc->len + 1));
    memcpy(w->buf.p + off, pre, pre_len);
    memmove(w->buf.p + off + pre_len, w->buf.p + pc->off, pc->len);
    w->buf.n += pre_len + pc->len;
    pc->off = off;
    pc->len += pre_len;
    return PT_OK;
}

static pt_status metaspace(const tok_pre *p, tok_work *w, const tok_piece *in, tok_pieces *out) {
    /* replace ' ' by the replacement into the buffer */
    size_t rl = strlen(p->replacement);
    size_t off = w->buf.n, n = 0;
    size_t spaces = 0;
    for (size_t i = 0; i < in->len; i++) spaces += w->buf.p[in->off + i] == ' ';
    PT_TRY(tok_buf_reserve(&w->buf, rl + in->len + spaces * rl + 1));
    char *d = w->buf.p + off;
    const char *s = w->buf.p + in->off;
    /* the reference tests "starts with the replacement" after replacing spaces */
    bool after_starts = in->len && (s[0] == ' ' || (in->len >= rl && memcmp(s, p->replacement, rl) == 0));
    if ((p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && in->first)) && !after_starts) {
        memcpy(d, p->replacement, rl);
        n += rl;
    }
    for (size_t i = 0; i < in->len; i++) {
        if (s[i] == ' ') { memcpy(d + n, p->replacement, rl); n += rl; }
        else d[n++] = s[i];
    }
    w->buf.n += n;
    tok_piece pc = {off, n, in->first};
    if (!p->split) return n ? tok_pieces_push(out, off, n, in->first) : PT_OK;
    return split_pred(w, &pc, pred_eq, p->replacement_cp, SPLIT_MERGED_NEXT, out);
}

static pt_status bytelevel_map(const pt_tokenizer *t, tok_work *w, tok_piece *pc) {
    size_t off = w->buf.n;
    PT_TRY(tok_buf_reserve(&w->buf, pc->len * 2 + 1)); /* each byte maps to a 1- or 2-byte char */
    char *d = w->buf.p + off;
    const unsigned char *s = (const unsigned char *)w->buf.p + pc->off;
    size_t n = 0;
    for (size_t i = 0; i < pc->len; i++) {
        uint32_t cp = t->byte_to_cp[s[i]];
        if (cp < 0x80) d[n++] = (char)cp;
        else {
            d[n++] = (char)(0xC0 | (cp >> 6));
            d[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    w->buf.n += n;
    pc->off = off;
    pc->len = n;
    return PT_OK;
}

pt_status tok_pretokenize(const pt_tokenizer *t, const tok_pre *p, tok_work *w, tok_pieces *in,
                          tok_pieces *out) {
    if (p->kind == PRE_SEQUENCE) {
        /* ping-pong through local lists */
        tok_pieces a = {0}, b = {0};
        pt_status st = PT_OK;
        for (size_t i = 0; !st && i < in->n; i++) st = tok_pieces_push(&a, in->v[i].off, in->v[i].len, in->v[i].first);
        for (size_t k = 0; !st && k < p->n_items; k++) {
            b.n = 0;
            st = tok_pretokenize(t, &p->items[k], w, &a, &b);
            tok_pieces x = a; a = b; b = x;
        }
        for (size_t i = 0; !st && i < a.n; i++) st = tok_pieces_push(out, a.v[i].off, a.v[i].len, a.v[i].first);
        free(a.v);
        free(b.v);
        return st;
    }
    for (size_t i = 0; i < in->n; i++) {
        tok_piece pc = in->v[i];
        switch (p->kind) {
        case PRE_SPLIT: PT_TRY(split_regex(w, NULL, &p->pat, &pc, p->invert, p->behavior, out)); break;
        case PRE_WHITESPACE: PT_TRY(split_regex(w, NULL, &p->pat, &pc, true, SPLIT_REMOVED, out)); break;
        case PRE_WHITESPACE_SPLIT: PT_TRY(split_pred(w, &pc, pred_space, 0, SPLIT_REMOVED, out)); break;
        case PRE_CHAR_DELIMITER: PT_TRY(split_pred(w, &pc, pred_eq, p->delimiter, SPLIT_REMOVED, out)); break;
        case PRE_PUNCTUATION: PT_TRY(split_pred(w, &pc, pred_punct, 0, p->behavior, out)); break;
        case PRE_DIGITS:
            PT_TRY(split_pred(w, &pc, pred_numeric, 0,
                              p->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, out));
            break;
        case PRE_METASPACE: PT_TRY(metaspace(p, w, &pc, out)); break;
        case PRE_BYTELEVEL: {
            if (p->add_prefix_space && (pc.len == 0 || w->buf.p[pc.off] != ' '))
                PT_TRY(rewrite_piece(w, &pc, " ", 1));
            size_t start = out->n;
            if (p->use_regex) PT_TRY(split_regex(w, t->gpt2_re, NULL, &pc, false, SPLIT_ISOLATED, out));
            else if (pc.len) PT_TRY(tok_pieces_push(out, pc.off, pc.len, pc.first));
            for (size_t k = start; k < out->n; k++) PT_TRY(bytelevel_map(t, w, &out->v[k]));
            break;
        }
        case PRE_SEQUENCE: break; /* handled above */
        }
    }
    return PT_OK;
}
