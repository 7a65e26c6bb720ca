/* Internals of petrel's Jinja engine, shared by its files: values, the
 * syntax tree, the lexer/parser and the interpreter. Not a public header:
 * callers use jinja.h (the engine) or chat_template.h (chat templates).
 *
 * Memory: a template's syntax tree lives in the template's arena; every value
 * made while rendering lives in the render's arena and is released at once
 * when the render ends. Values are immutable once built (the sandbox refuses
 * every mutating method), except namespace() objects, so values share
 * storage freely and need no reference counts. */
#ifndef PT_TOKENIZER_JINJA_INTERNAL_H
#define PT_TOKENIZER_JINJA_INTERNAL_H

#include "base/arena.h"
#include "tokenizer/jinja.h"

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- values */

typedef enum pj_type {
    PJ_UNDEF, /* jinja2's default Undefined */
    PJ_NONE,
    PJ_BOOL,
    PJ_INT,
    PJ_FLOAT,
    PJ_STR,
    PJ_LIST, /* list, tuple (PJ_F_TUPLE) or a lazy filter's generator (PJ_F_GEN) */
    PJ_DICT,
    PJ_NS,   /* namespace(): a mutable dict of attributes */
    PJ_FUNC, /* macro, global function, bound method, caller */
    PJ_LOOP, /* the `loop` variable of a for loop */
} pj_type;

#define PJ_F_TUPLE 1u /* a list printed and compared as a Python tuple */
#define PJ_F_GEN 2u   /* a generator (map/select/... results): iterable, not JSON-serializable */
#define PJ_F_SAFE 4u  /* a Markup string (|safe): `+` escapes its other operand */
#define PJ_F_RANGE 8u /* a range() object: prints as range(a, b[, c]) */

typedef struct pj_list pj_list;
typedef struct pj_dict pj_dict;
typedef struct pj_func pj_func;
typedef struct pj_loop pj_loop;
typedef struct pj_undef pj_undef;

typedef struct pj_value {
    uint8_t type;  /* pj_type */
    uint8_t flags; /* PJ_F_* */
    size_t len;    /* PJ_STR: byte length (UTF-8) */
    union {
        int64_t i; /* PJ_INT, PJ_BOOL (0/1) */
        double f;
        const char *s; /* not NUL-terminated in general */
        pj_list *l;
        pj_dict *d; /* PJ_DICT and PJ_NS */
        pj_func *fn;
        pj_loop *loop;
        pj_undef *u;
    };
} pj_value;

struct pj_list {
    size_t n, cap;
    pj_value *items; /* [n] */
    int64_t range[3];   /* PJ_F_RANGE: start, stop, step (for printing) */
};

struct pj_dict { /* insertion-ordered, like Python's dict */
    size_t n, cap;
    pj_value *keys; /* [n] */
    pj_value *vals; /* [n] */
};

struct pj_undef {
    const char *msg; /* UndefinedError message ("'x' is undefined") */
    int security;    /* 1: an attribute the sandbox refuses (SecurityError) */
};

typedef struct pj_ctx pj_ctx;
typedef struct pj_node pj_node;
typedef struct pj_scope pj_scope;

/* Call arguments: positional values then keyword (name, value) pairs. */
typedef struct pj_args {
    int n_pos, n_kw;
    pj_value *pos;
    const char **kw_names;
    pj_value *kw;
} pj_args;

typedef int (*pj_builtin_fn)(pj_ctx *c, const pj_value *self, const char *name, pj_args *a,
                             pj_value *out);

typedef enum { PJ_FN_MACRO, PJ_FN_BUILTIN, PJ_FN_METHOD, PJ_FN_CALLER } pj_fn_kind;

struct pj_func {
    int kind;              /* pj_fn_kind */
    const char *name;      /* macro / function / method name */
    const pj_node *macro;  /* PJ_FN_MACRO, PJ_FN_CALLER: the definition */
    pj_scope *closure;     /* the scope the macro was defined in */
    pj_builtin_fn builtin; /* PJ_FN_BUILTIN, PJ_FN_METHOD */
    pj_value self;         /* PJ_FN_METHOD: the receiver */
    const pj_func *caller; /* PJ_FN_MACRO called from {% call %}: its caller() */
};

struct pj_loop {
    const pj_list *items; /* the (filtered) sequence */
    size_t index0;
    int depth;
    pj_value last_changed; /* loop.changed() memory */
    int has_changed;
    const pj_node *node; /* the for statement (for recursive loop(...) calls) */
    pj_scope *scope;     /* the scope the loop runs in */
};

/* ----------------------------------------------------------- syntax tree */

typedef enum pj_node_kind {
    /* expressions */
    PJ_N_CONST,   /* value */
    PJ_N_NAME,    /* name */
    PJ_N_LIST,    /* kids */
    PJ_N_TUPLE,   /* kids */
    PJ_N_DICT,    /* kids: key, value, key, value... */
    PJ_N_GETATTR, /* a.name */
    PJ_N_GETITEM, /* a, b */
    PJ_N_SLICE,   /* a[b:c:d] (missing parts NULL) */
    PJ_N_CALL,    /* a(args): kids = args, kw names in names */
    PJ_N_FILTER,  /* a|name(args) (a NULL in a filter block) */
    PJ_N_TEST,    /* a is name(args); neg for `is not` */
    PJ_N_UNARY,   /* op a */
    PJ_N_BINARY,  /* a op b */
    PJ_N_AND,
    PJ_N_OR,
    PJ_N_NOT,
    PJ_N_COND, /* b if a else c: a=cond, b=then, c=else (NULL: undefined) */
    PJ_N_CONCAT,
    PJ_N_COMPARE, /* a op b */
    /* statements */
    PJ_N_BODY,   /* kids: statements */
    PJ_N_TEXT,   /* literal output: name/len */
    PJ_N_OUTPUT, /* {{ a }} */
    PJ_N_IF,     /* a=cond, b=then body, c=else body (or nested IF for elif) */
    PJ_N_FOR,    /* target=t, a=iter, b=body, c=else body, d=filter cond, recursive */
    PJ_N_SET,    /* t=target, a=value (or b=body for a block set, with filter chain in d) */
    PJ_N_MACRO,  /* name, params in names/kids(defaults), b=body; op: PJ_CATCH_* */
    PJ_N_CALLBLOCK, /* a=call expr, b=body, params in names/kids */
    PJ_N_FILTERBLOCK, /* d=filter chain (innermost a NULL), b=body */
    PJ_N_BREAK,
    PJ_N_CONTINUE,
    PJ_N_WITH, /* targets in names, values in kids, b=body */
} pj_node_kind;

struct pj_node {
    int kind;
    int line;
    int op;  /* operator token for UNARY/BINARY/COMPARE */
    int neg; /* TEST: `is not`; FOR: recursive */
    const char *name;
    size_t len;         /* TEXT length; CONST string length */
    pj_value value;     /* CONST */
    pj_node *a, *b, *c, *d, *t;
    pj_node **kids;
    int n_kids;
    const char **names; /* keyword names (CALL/FILTER/TEST: one per kid, NULL for positional) */
    int n_names;
};

/* A macro (or call block) whose body uses varargs / kwargs accepts extra
 * positional / keyword arguments; jinja2 refuses them otherwise. */
#define PJ_CATCH_VARARGS 1
#define PJ_CATCH_KWARGS 2

/* Operators (also token kinds). */
enum {
    PJ_OP_ADD = 1, PJ_OP_SUB, PJ_OP_MUL, PJ_OP_DIV, PJ_OP_FLOORDIV, PJ_OP_MOD, PJ_OP_POW,
    PJ_OP_EQ, PJ_OP_NE, PJ_OP_LT, PJ_OP_LE, PJ_OP_GT, PJ_OP_GE, PJ_OP_IN, PJ_OP_NOTIN,
};

struct pt_jinja_template {
    pt_arena arena;
    pj_node *root; /* PJ_N_BODY */
    char *name;
};

/* Parses `src` into t->root (allocating from t->arena). On error returns
 * PT_ERR_FORMAT with "name:line: TemplateSyntaxError: ..." set. */
pt_status pj_parse(pt_jinja_template *t, const char *src, size_t len);

/* ---------------------------------------------------------- interpreter */

struct pj_ctx {
    pt_arena *arena;
    const char *tname; /* template name for messages */
    int line;          /* line of the node being evaluated */
    int failed;
    char err[1024];
    struct pj_buf *out; /* where output goes (a macro call or block set swaps in its own) */
    pj_scope *globals;
    struct tm now; /* strftime_now */
    long steps;    /* evaluation steps, bounded against runaway templates */
    long max_steps;
    size_t max_bytes; /* arena bytes one render may use */
    int depth;     /* macro call depth */
    int edepth;    /* evaluator recursion depth (expressions + statements), bounds the C stack */
    int rdepth;    /* repr()/str() nesting depth */
};

/* Sets the error ("Type: message", printf-style) unless one is set; returns -1. */
int pj_fail(pj_ctx *c, const char *type, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void *pj_alloc(pj_ctx *c, size_t n); /* arena allocation; NULL + error when over the limit */
/* Counts `work` steps against the render's bound (linear scans, sorts, ...);
 * -1 with an error once over it. */
int pj_charge(pj_ctx *c, size_t work);
/* int(f) truncating toward zero; OverflowError for inf/nan or beyond int64. */
int pj_float_to_int(pj_ctx *c, double f, int64_t *out);

/* constructors */
pj_value pj_undef_v(pj_ctx *c, const char *msg, int security);
pj_value pj_none(void);
pj_value pj_bool(int b);
pj_value pj_int(int64_t i);
pj_value pj_float(double f);
pj_value pj_str(const char *s, size_t len); /* shares s */
pj_value pj_cstr(const char *s);
pj_value pj_str_copy(pj_ctx *c, const char *s, size_t len);
pj_value pj_list_new(pj_ctx *c, size_t cap, unsigned flags);
int pj_list_push(pj_ctx *c, pj_value *list, pj_value v);
pj_value pj_dict_new(pj_ctx *c, size_t cap);
int pj_dict_set(pj_ctx *c, pj_dict *d, pj_value k, pj_value v);
/* NULL if absent. */
pj_value *pj_dict_get(const pj_dict *d, pj_value k);
pj_value *pj_dict_get_str(const pj_dict *d, const char *k);

/* A growable byte string in the arena (or malloc'd for the render output). */
typedef struct pj_buf {
    pj_ctx *c;
    char *p;
    size_t n, cap;
} pj_buf;
int pj_buf_put(pj_buf *b, const char *s, size_t n);
int pj_buf_puts(pj_buf *b, const char *s);
int pj_buf_printf(pj_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
pj_value pj_buf_value(pj_buf *b);

/* Python conversions */
int pj_str_of(pj_ctx *c, pj_value v, pj_buf *b);  /* str(v) appended */
int pj_repr_of(pj_ctx *c, pj_value v, pj_buf *b); /* repr(v) appended */
int pj_to_str(pj_ctx *c, pj_value v, pj_value *out); /* str(v) as a value */
void pj_format_float(double f, char *buf, size_t n); /* Python float repr */
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys). indent<0: none. */
int pj_tojson(pj_ctx *c, pj_value v, int indent, const char *item_sep, const char *key_sep,
              int sort_keys, pj_buf *b);
int pj_truthy(pj_value v);
int pj_equal(pj_value a, pj_value b);
/* Python ordering: sets *cmp (<0, 0, >0); TypeError for incomparable types. */
int pj_compare(pj_ctx *c, pj_value a, pj_value b, int op, int *cmp);
const char *pj_type_name(pj_value v); /* Python type name: 'str', 'int', 'NoneType'... */
/* Materializes an iterable into a list (dict -> keys, str -> chars). */
int pj_iterate(pj_ctx *c, pj_value v, pj_value *out_list);
int pj_length(pj_ctx *c, pj_value v, int64_t *n);
/* Fails with the value's UndefinedError (or SecurityError) if v is undefined. */
int pj_check_defined(pj_ctx *c, pj_value v);

/* UTF-8 helpers */
size_t pj_utf8_count(const char *s, size_t n);
/* Byte offset of code point index i (clamped to n). */
size_t pj_utf8_offset(const char *s, size_t n, int64_t i);
/* Decodes one code point at s (n bytes left); *adv = bytes used (>=1). Invalid bytes decode as themselves. */
uint32_t pj_utf8_decode(const char *s, size_t n, size_t *adv);
int pj_utf8_encode(uint32_t cp, char *out);
int pj_is_space(uint32_t cp); /* Python str.isspace() for one code point */

/* builtins (jinja_filters.c, jinja_methods.c) */
int pj_apply_filter(pj_ctx *c, const char *name, pj_value v, pj_args *a, pj_value *out);
int pj_apply_test(pj_ctx *c, const char *name, pj_value v, pj_args *a, int *out);
int pj_has_filter(const char *name);
int pj_has_test(const char *name);
/* getattr(obj, name) with the sandbox's rules (methods become bound functions). */
int pj_getattr(pj_ctx *c, pj_value obj, const char *name, pj_value *out);
int pj_getitem(pj_ctx *c, pj_value obj, pj_value key, pj_value *out);
int pj_call(pj_ctx *c, pj_value fn, pj_args *a, pj_value *out); /* jinja_eval.c */
int pj_install_globals(pj_ctx *c, pj_scope *g);
int pj_scope_set(pj_ctx *c, pj_scope *s, const char *name, pj_value v);
/* JSON text -> value (exact: ints stay ints, floats floats); -1 + ValueError. */
int pj_value_from_json(pj_ctx *c, const char *text, size_t len, pj_value *out);
/* cJSON -> value (integral numbers below 2^53 become ints). */
int pj_value_from_cjson(pj_ctx *c, const cJSON *j, pj_value *out);
/* str % args */
int pj_percent_format(pj_ctx *c, pj_value fmt, pj_value args, pj_value *out);
/* str.format(*args, **kwargs) */
int pj_str_format(pj_ctx *c, pj_value fmt, pj_args *a, pj_value *out);
/* Looks up an argument by position or keyword; returns 1 if given. */
int pj_arg(pj_args *a, int pos, const char *kw, pj_value *out);
/* Fails unless every argument is one of the named ones (in order). */
int pj_args_check(pj_ctx *c, const char *fname, pj_args *a, int max_pos, const char *const *kws);

#endif
