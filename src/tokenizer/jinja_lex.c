/* Lexer of the Jinja engine: template text -> tokens, with jinja2's
 * whitespace rules for apply_chat_template's environment (trim_blocks,
 * lstrip_blocks, `-`/`+` markers, comments, raw blocks) and Python string
 * literal escapes. Not the grammar (jinja_parse.c). */
#include "tokenizer/jinja_parse.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int push_tok(parser *p, tok t) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        tok *nt = realloc(p->toks, cap * sizeof(tok));
        if (!nt) return pj_perr(p, t.line, "out of memory");
        p->toks = nt;
        p->cap = cap;
    }
    p->toks[p->n++] = t;
    return 0;
}

/* ------------------------------------------------------------------ lexer */

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

/* Python's str.rstrip() length / "is all whitespace" over UTF-8 text. */
static size_t rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        /* step back one code point */
        size_t k = n - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80 && n - k < 4) k--;
        size_t adv;
        uint32_t cp = pj_utf8_decode(s + k, n - k, &adv);
        if (k + adv != n || !pj_is_space(cp)) break;
        n = k;
    }
    return n;
}
static int all_space(const char *s, size_t n) {
    if (n == 0) return 0;
    for (size_t i = 0; i < n;) {
        size_t adv;
        if (!pj_is_space(pj_utf8_decode(s + i, n - i, &adv))) return 0;
        i += adv;
    }
    return 1;
}
static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Applies the strip rules to the text before a tag (sign: '-', '+' or 0). */
static size_t strip_before(const char *text, size_t n, char sign, int lstrip_ok, int line_starting) {
    if (sign == '-') return rstrip_len(text, n);
    if (sign != '+' && lstrip_ok) {
        size_t l_pos = 0;
        for (size_t i = n; i > 0; i--)
            if (text[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if ((l_pos > 0 || line_starting) && all_space(text + l_pos, n - l_pos)) return l_pos;
    }
    return n;
}

/* Decodes a Python string literal body (unicode-escape) into the arena. */
static int unescape(parser *p, const char *s, size_t n, int line, const char **out, size_t *out_len) {
    char *o = pj_palloc(p, n + 1);
    if (!o) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            o[k++] = s[i];
            continue;
        }
        char e = s[++i];
        uint32_t cp;
        int digits = 0;
        switch (e) {
        case '\n': break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'v': o[k++] = '\v'; break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                cp = 0;
                int m = 0;
                while (m < 3 && i < n && s[i] >= '0' && s[i] <= '7') cp = cp * 8 + (uint32_t)(s[i++] - '0'), m++;
                i--;
                k += (size_t)pj_utf8_encode(cp, o + k);
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (digits) {
            cp = 0;
            for (int m = 0; m < digits; m++) {
                char h = (i + 1 + (size_t)m < n) ? s[i + 1 + (size_t)m] : 0;
                int v = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                if (v < 0) return pj_perr(p, line, "(unicode error) truncated \\%c escape", e);
                cp = cp * 16 + (uint32_t)v;
            }
            if (cp > 0x10ffff) return pj_perr(p, line, "(unicode error) illegal Unicode character");
            i += (size_t)digits;
            k += (size_t)pj_utf8_encode(cp, o + k);
        }
    }
    o[k] = 0;
    *out = o;
    *out_len = k;
    return 0;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char OPS1[] = "+-/*%~[](){}<>=.:|,;";

/* Lexes the inside of a {{ }} / {% %} tag starting at *pos; stops after the
 * end marker. Returns 0, or -1 on error. *line_starting set for the next text. */
static int lex_tag(parser *p, const char *src, size_t n, size_t *pos, int *line, int is_block,
                   int *line_starting) {
    size_t i = *pos;
    int balance = 0;
    for (;;) {
        while (i < n && is_ws(src[i])) {
            if (src[i] == '\n') (*line)++;
            i++;
        }
        if (i >= n) return pj_perr(p, *line, "unexpected end of template, expected end of %s tag",
                                is_block ? "block" : "print");
        /* end markers first (only with balanced brackets) */
        if (balance == 0) {
            char c0 = src[i];
            const char *end = is_block ? "%}" : "}}";
            size_t off = (c0 == '-' || (c0 == '+' && is_block)) ? 1 : 0;
            if (i + off + 2 <= n && !memcmp(src + i + off, end, 2)) {
                i += off + 2;
                *line_starting = 0;
                if (off && c0 == '-') {
                    while (i < n && is_ws(src[i])) {
                        if (src[i] == '\n') (*line)++;
                        i++;
                    }
                    *line_starting = i > 0 && src[i - 1] == '\n';
                } else if (is_block && !off && i < n && src[i] == '\n') {
                    i++; /* trim_blocks */
                    (*line)++;
                    *line_starting = 1;
                }
                *pos = i;
                return push_tok(p, (tok){.type = is_block ? T_BLOCK_END : T_VAR_END, .line = *line});
            }
        }
        char ch = src[i];
        tok t = {.line = *line, .s = src + i};
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
            size_t j = i;
            while (j < n && ((src[j] >= 'a' && src[j] <= 'z') || (src[j] >= 'A' && src[j] <= 'Z') ||
                             (src[j] >= '0' && src[j] <= '9') || src[j] == '_'))
                j++;
            t.type = T_NAME;
            t.len = j - i;
            i = j;
        } else if (ch >= '0' && ch <= '9') {
            size_t j = i;
            int is_float = 0;
            while (j < n && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_')) j++;
            if (j + 1 < n && src[j] == '.' && src[j + 1] >= '0' && src[j + 1] <= '9') {
                is_float = 1;
                j++;
                while (j < n && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_')) j++;
            }
            if (j < n && (src[j] == 'e' || src[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (src[k] == '+' || src[k] == '-')) k++;
                if (k < n && src[k] >= '0' && src[k] <= '9') {
                    is_float = 1;
                    j = k;
                    while (j < n && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_')) j++;
                }
            }
            char num[64];
            size_t m = 0;
            for (size_t k = i; k < j && m < sizeof num - 1; k++)
                if (src[k] != '_') num[m++] = src[k];
            num[m] = 0;
            if (is_float) {
                t.type = T_FLOAT;
                t.f = strtod(num, NULL);
            } else {
                t.type = T_INT;
                errno = 0;
                long long v = strtoll(num, NULL, 10);
                if (errno) return pj_perr(p, *line, "integer literal %s is out of range", num);
                t.i = v;
            }
            i = j;
        } else if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            int l0 = *line;
            while (j < n && src[j] != ch) {
                if (src[j] == '\\' && j + 1 < n) j++;
                if (src[j] == '\n') (*line)++;
                j++;
            }
            if (j >= n) return pj_perr(p, l0, "unexpected end of string");
            t.type = T_STRING;
            if (unescape(p, src + i + 1, j - i - 1, l0, &t.s, &t.len)) return -1;
            i = j + 1;
        } else {
            t.type = T_OP;
            t.len = 0;
            for (int k = 0; OPS2[k]; k++)
                if (i + 1 < n && src[i] == OPS2[k][0] && src[i + 1] == OPS2[k][1]) t.len = 2;
            if (!t.len && strchr(OPS1, ch) && ch) t.len = 1;
            if (!t.len) return pj_perr(p, *line, "unexpected char '%c' at %zu", ch, i);
            if (t.len == 1 && (ch == '(' || ch == '[' || ch == '{')) balance++;
            if (t.len == 1 && (ch == ')' || ch == ']' || ch == '}')) {
                if (balance == 0) return pj_perr(p, *line, "unexpected '%c'", ch);
                balance--;
            }
            i += t.len;
        }
        if (push_tok(p, t)) return -1;
    }
}

int pj_lex(parser *p, const char *src, size_t n) {
    size_t pos = 0;
    int line = 1, line_starting = 1;
    while (pos < n) {
        /* find the next tag start */
        size_t k = pos;
        char kind = 0;
        while (k + 1 < n) {
            if (src[k] == '{' && (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#')) {
                kind = src[k + 1];
                break;
            }
            k++;
        }
        if (!kind) {
            push_tok(p, (tok){.type = T_TEXT, .line = line, .s = src + pos, .len = n - pos});
            break;
        }
        char sign = (k + 2 < n && (src[k + 2] == '-' || src[k + 2] == '+')) ? src[k + 2] : 0;
        size_t after = k + 2 + (sign ? 1 : 0);
        /* {% raw %} ? */
        int is_raw = 0;
        size_t raw_end = 0;
        if (kind == '%') {
            size_t j = after;
            while (j < n && is_ws(src[j])) j++;
            if (j + 3 <= n && !memcmp(src + j, "raw", 3)) {
                j += 3;
                while (j < n && is_ws(src[j])) j++;
                if (j + 3 <= n && src[j] == '-' && !memcmp(src + j + 1, "%}", 2)) {
                    is_raw = 1;
                    j += 3;
                    while (j < n && is_ws(src[j])) j++;
                    raw_end = j;
                } else if (j + 2 <= n && !memcmp(src + j, "%}", 2)) {
                    is_raw = 1;
                    raw_end = j + 2;
                }
            }
        }
        size_t tlen = strip_before(src + pos, k - pos, sign, kind != '{', line_starting);
        if (tlen) push_tok(p, (tok){.type = T_TEXT, .line = line, .s = src + pos, .len = tlen});
        line += count_nl(src + pos, k - pos);
        if (p->failed) return -1;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t j = after; j + 1 < n; j++)
                if (src[j] == '#' && src[j + 1] == '}') {
                    e = src + j;
                    break;
                }
            if (!e) return pj_perr(p, line, "Missing end of comment tag");
            size_t j = (size_t)(e - src);
            line += count_nl(src + after, j - after);
            char esign = j > after ? src[j - 1] : 0;
            j += 2;
            if (esign == '-') {
                while (j < n && is_ws(src[j])) line += src[j++] == '\n';
            } else if (esign != '+' && j < n && src[j] == '\n') {
                j++;
                line++;
            }
            line_starting = j > 0 && src[j - 1] == '\n';
            pos = j;
            continue;
        }
        if (is_raw) {
            line += count_nl(src + k, raw_end - k);
            /* find {%[-+]? endraw [-+]?%} */
            size_t j = raw_end, body_end = 0, end_after = 0;
            char esign = 0;
            for (; j + 1 < n; j++) {
                if (src[j] != '{' || src[j + 1] != '%') continue;
                size_t m = j + 2;
                char s1 = (m < n && (src[m] == '-' || src[m] == '+')) ? src[m] : 0;
                if (s1) m++;
                while (m < n && is_ws(src[m])) m++;
                if (m + 6 > n || memcmp(src + m, "endraw", 6)) continue;
                m += 6;
                while (m < n && is_ws(src[m])) m++;
                char s2 = (m < n && (src[m] == '-' || src[m] == '+')) ? src[m] : 0;
                if (m + (s2 ? 1 : 0) + 2 > n || memcmp(src + m + (s2 ? 1 : 0), "%}", 2)) continue;
                m += (s2 ? 1 : 0) + 2;
                if (s2 == '-')
                    while (m < n && is_ws(src[m])) m++;
                else if (!s2 && m < n && src[m] == '\n') m++;
                body_end = j;
                end_after = m;
                esign = s1;
                break;
            }
            if (!end_after) return pj_perr(p, line, "Missing end of raw directive");
            int ls = raw_end > 0 && src[raw_end - 1] == '\n';
            size_t blen = strip_before(src + raw_end, body_end - raw_end, esign, 1, ls);
            if (blen) push_tok(p, (tok){.type = T_TEXT, .line = line, .s = src + raw_end, .len = blen});
            line += count_nl(src + raw_end, end_after - raw_end);
            line_starting = src[end_after - 1] == '\n';
            pos = end_after;
            continue;
        }
        push_tok(p, (tok){.type = kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, .line = line});
        pos = after;
        if (lex_tag(p, src, n, &pos, &line, kind == '%', &line_starting)) return -1;
    }
    return push_tok(p, (tok){.type = T_EOF, .line = line});
}

