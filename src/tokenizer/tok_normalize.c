/* Normalizers: NFC/NFD/NFKC/NFKD (utf8proc), Lowercase, StripAccents, Strip,
 * Prepend, Replace (literal or regex) and Sequence, applied to one span of
 * text (the parts between added tokens). The reference tracks offsets through
 * normalization; petrel needs only the resulting text. */
#include "tokenizer/tok_internal.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static pt_status unicode_norm(const char *s, size_t n, int flags, tok_buf *out) {
    if (!n) return PT_OK;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | flags));
    if (r < 0) {
        free(dst);
        return pt_error(PT_ERR_INVALID_ARG, "tokenizer: normalization failed: %s", utf8proc_errmsg(r));
    }
    pt_status st = tok_buf_put(out, dst, (size_t)r);
    free(dst);
    return st;
}

static pt_status lowercase(const char *s, size_t n, tok_buf *out) {
    PT_TRY(tok_buf_reserve(out, n + 8));
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) { /* ASCII fast path */
            PT_TRY(tok_buf_putc(out, (char)(c >= 'A' && c <= 'Z' ? c + 32 : c)));
            i++;
            continue;
        }
        int adv;
        uint32_t cp = tok_utf8_next((const unsigned char *)s + i, n - i, &adv);
        i += (size_t)adv;
        if (cp == 0x130) { /* İ lowercases to two code points: i + combining dot above */
            PT_TRY(tok_buf_put(out, "i\xCC\x87", 3));
            continue;
        }
        char e[4];
        int l = tok_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), e);
        PT_TRY(tok_buf_put(out, e, (size_t)l));
    }
    return PT_OK;
}

static pt_status strip_accents(const char *s, size_t n, tok_buf *out) {
    for (size_t i = 0; i < n;) {
        int adv;
        uint32_t cp = tok_utf8_next((const unsigned char *)s + i, n - i, &adv);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
        /* the reference drops every combining mark (Mn, Mc and Me) */
        if (k != UTF8PROC_CATEGORY_MN && k != UTF8PROC_CATEGORY_MC && k != UTF8PROC_CATEGORY_ME)
            PT_TRY(tok_buf_put(out, s + i, (size_t)adv));
        i += (size_t)adv;
    }
    return PT_OK;
}

static pt_status strip(const char *s, size_t n, bool left, bool right, tok_buf *out) {
    size_t a = 0, b = n;
    while (left && a < b) {
        int adv;
        uint32_t cp = tok_utf8_next((const unsigned char *)s + a, b - a, &adv);
        if (!tok_is_whitespace(cp)) break;
        a += (size_t)adv;
    }
    while (right && b > a) {
        size_t k = b - 1;
        while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        int adv;
        uint32_t cp = tok_utf8_next((const unsigned char *)s + k, b - k, &adv);
        if (!tok_is_whitespace(cp)) break;
        b = k;
    }
    return tok_buf_put(out, s + a, b - a);
}

static pt_status replace(const tok_norm *nm, const char *s, size_t n, tok_buf *out) {
    tok_match *m = NULL;
    size_t nm_ = 0, cap = 0;
    pcre2_match_data *md = nm->pat.re ? pcre2_match_data_create_from_pattern(nm->pat.re, NULL) : NULL;
    if (nm->pat.re && !md) return pt_error(PT_ERR_NOMEM, "tokenizer: out of memory");
    pt_status st = tok_pattern_find(&nm->pat, md, NULL, s, n, &m, &nm_, &cap);
    size_t prev = 0;
    for (size_t i = 0; !st && i < nm_; i++) {
        st = tok_buf_put(out, s + prev, m[i].start - prev);
        if (!st) st = tok_buf_put(out, nm->str, nm->str_len);
        prev = m[i].end;
    }
    if (!st) st = tok_buf_put(out, s + prev, n - prev);
    free(m);
    if (md) pcre2_match_data_free(md);
    return st;
}

pt_status tok_normalize(const pt_tokenizer *t, const tok_norm *nm, const char *s, size_t n,
                        tok_buf *out) {
    switch (nm->kind) {
    case NORM_NFC: return unicode_norm(s, n, UTF8PROC_COMPOSE, out);
    case NORM_NFD: return unicode_norm(s, n, UTF8PROC_DECOMPOSE, out);
    case NORM_NFKC: return unicode_norm(s, n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
    case NORM_NFKD: return unicode_norm(s, n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
    case NORM_LOWERCASE: return lowercase(s, n, out);
    case NORM_STRIP_ACCENTS: return strip_accents(s, n, out);
    case NORM_STRIP: return strip(s, n, nm->strip_left, nm->strip_right, out);
    case NORM_PREPEND:
        if (n) PT_TRY(tok_buf_put(out, nm->str, nm->str_len)); /* only non-empty text is prefixed */
        return tok_buf_put(out, s, n);
    case NORM_REPLACE: return replace(nm, s, n, out);
    case NORM_SEQUENCE: {
        if (nm->n_items == 0) return tok_buf_put(out, s, n);
        tok_buf a = {0}, b = {0};
        pt_status st = tok_buf_put(&a, s, n);
        for (size_t i = 0; !st && i < nm->n_items; i++) {
            b.n = 0;
            st = tok_normalize(t, &nm->items[i], a.p, a.n, &b);
            tok_buf x = a; a = b; b = x;
        }
        if (!st) st = tok_buf_put(out, a.p, a.n);
        tok_buf_free(&a);
        tok_buf_free(&b);
        return st;
    }
    }
    return pt_error(PT_ERR_INTERNAL, "tokenizer: unknown normalizer kind");
}
