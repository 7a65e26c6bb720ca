/* Constrained JSON generation: a JSON Schema compiled into a byte-level
 * matcher, and the per-step token mask it induces over a vocabulary.
 *
 * The "grammar" is the compiled schema itself: a tree of nodes (type set,
 * properties, required, additionalProperties, items, minItems/maxItems,
 * enum/const, anyOf/oneOf, local $ref/$defs) interpreted by a pushdown
 * matcher. The matcher state is a small set of stacks (several only while an
 * anyOf is ambiguous); feeding a byte advances or rejects it. The token mask
 * for a step feeds every token's bytes to a copy of the state, walking the
 * vocabulary in sorted order so that a shared prefix is fed once and a dead
 * prefix prunes every token under it.
 *
 * Supported: type (one or a list), properties, required,
 * additionalProperties (bool or schema; default allowed), items,
 * minItems/maxItems, enum, const, anyOf, oneOf (as anyOf), allOf with one
 * member, $ref to "#", "#/$defs/..", "#/definitions/.." or any local JSON
 * pointer. Annotations (title, description, default, examples, format,
 * $schema, $id, $comment) are ignored. Any other keyword is an error naming
 * it: petrel does not pretend to enforce a constraint it ignores.
 *
 * Output form: no whitespace before the value or inside enum/const values,
 * at most PT_JSM_MAX_WS in a row between tokens, so a model cannot pad forever;
 * numbers are capped at 24 characters; at most 64 properties per object and
 * 64 values per enum.
 */
#ifndef PT_SERVER_JSON_SCHEMA_H
#define PT_SERVER_JSON_SCHEMA_H

#include "petrel.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#define PT_JSM_DEPTH 32   /* nesting depth of the generated value */
#define PT_JSM_THREADS 8  /* simultaneous anyOf alternatives */
/* Whitespace bytes allowed in a row between JSON tokens (none before the
 * value). One: a model that likes padding otherwise spends its whole token
 * budget on blanks, and compact JSON is as valid as pretty JSON. */
#define PT_JSM_MAX_WS 1

typedef struct pt_jschema pt_jschema;

/* Compiles `schema` (a JSON Schema object or boolean). schema NULL means
 * "any JSON object" (response_format json_object). On error the message
 * names the schema location ("#/properties/a: ...") and the keyword. */
pt_status pt_jschema_compile(const cJSON *schema, pt_jschema **out);
void pt_jschema_free(pt_jschema **s);

typedef struct pt_jsm_frame {
    const void *node; /* the schema node this value must satisfy */
    uint64_t a;       /* object: seen properties; key/literal: alive candidates */
    uint32_t n;       /* array: items; key/literal/number: bytes so far; object: current key */
    uint8_t kind, sub, ws, flag;
} pt_jsm_frame;

typedef struct pt_jsm_thread {
    int depth; /* 0 with done = a complete value */
    int done;
    pt_jsm_frame f[PT_JSM_DEPTH];
} pt_jsm_thread;

/* Matcher state. Copy with pt_jsm_copy (copies only the live part). */
typedef struct pt_jsm {
    int n; /* live threads; 0 = rejected */
    pt_jsm_thread t[PT_JSM_THREADS];
} pt_jsm;

void pt_jsm_init(pt_jsm *m, const pt_jschema *s);
void pt_jsm_copy(pt_jsm *dst, const pt_jsm *src);
/* Feeds bytes; returns 1 while some thread survives, 0 once rejected. */
int pt_jsm_feed(pt_jsm *m, const char *bytes, size_t n);
/* 1 if the bytes fed so far form a complete value (generation may end). */
int pt_jsm_accepts(const pt_jsm *m);

/* The vocabulary as the mask sees it: each token's bytes, sorted. */
typedef struct pt_vocab_index {
    int n_vocab;
    char **text;      /* [n_vocab] raw bytes; "" for control tokens */
    uint32_t *len;    /* [n_vocab] */
    int32_t *order;   /* [n_vocab] ids sorted by text bytes */
    uint32_t *lcp;    /* [n_vocab] common prefix of order[i] with order[i-1] */
    uint8_t *is_eos;  /* [n_vocab] */
    uint8_t *plain;   /* [n_vocab] 1: complete UTF-8 with no '"', '\\' or control byte */
    uint32_t max_len;
} pt_vocab_index;

/* Builds the index from per-token texts (takes ownership of text[]). */
pt_status pt_vocab_index_build(pt_vocab_index *vi, int n_vocab, char **text, const uint8_t *is_eos);
void pt_vocab_index_free(pt_vocab_index *vi);

/* allowed[id] = 1 where the token's bytes keep the value valid; end-of-text
 * tokens only where the value is complete. Returns the number allowed. */
size_t pt_jsm_mask(const pt_jsm *m, const pt_vocab_index *vi, uint8_t *allowed);

#endif
