/* Shared by the Jinja lexer (jinja_lex.c) and parser (jinja_parse.c): the
 * token stream and the parser state. Internal; not for other files. */
#ifndef PT_TOKENIZER_JINJA_PARSE_H
#define PT_TOKENIZER_JINJA_PARSE_H

#include "tokenizer/jinja_internal.h"

enum {
    T_EOF,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP, /* punctuation; op holds its text (1-2 chars) */
};

typedef struct tok {
    int type;
    int line;
    const char *s; /* TEXT/NAME/STRING(unescaped)/OP text */
    size_t len;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    pt_jinja_template *t;
    tok *toks;
    size_t n, cap, pos;
    char err[512];
    int err_line;
    int failed;
    int depth; /* nesting, bounded so hostile input cannot exhaust the stack */
    /* the open blocks, for "innermost block" messages */
    const char *open[64];
    int n_open;
} parser;

/* Nesting bound, so hostile input cannot exhaust the stack. */
#define MAX_DEPTH 200

/* Records the first error (printf-style) with its line; returns -1. */
int pj_perr(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Allocates from the template's arena (zeroed); NULL + error when out of memory. */
void *pj_palloc(parser *p, size_t n);
/* Lexes the (newline-normalized) template into p->toks, ending with T_EOF:
 * text, tag delimiters and expression tokens, with the whitespace rules
 * applied to the text. Strings are unescaped into the arena. */
int pj_lex(parser *p, const char *src, size_t n);

#endif
