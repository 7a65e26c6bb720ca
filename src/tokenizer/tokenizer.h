/* petrel's tokenizer: Hugging Face tokenizer.json (BPE models, byte-level and
 * SentencePiece-style with byte fallback) loaded into C, encoding to exactly
 * the ids the reference library produces, decoding back to text, and a
 * streaming detokenizer for generation.
 *
 * This is the internal API (the engine builds pt_tokenize / pt_detokenize /
 * pt_token_text / pt_detokenizer_* of include/petrel.h on top of it). It is
 * not the chat-template renderer (jinja*.c / chat_template*.c).
 *
 * Thread safety: a loaded pt_tokenizer is read-only; any number of threads
 * may encode/decode with it at once. A pt_tok_stream belongs to one thread.
 * Every function returning pt_status leaves a message for pt_last_error(). */
#ifndef PT_TOKENIZER_H
#define PT_TOKENIZER_H

#include "petrel.h"

#include <stddef.h>
#include <stdint.h>

typedef struct pt_tokenizer pt_tokenizer;

/* Loads a tokenizer.json file. PT_ERR_IO if unreadable; PT_ERR_FORMAT for an
 * invalid file (the message names the field: missing model, unknown component
 * type, bad regex, merges naming unknown tokens...); PT_ERR_UNSUPPORTED for a
 * valid component petrel does not implement (e.g. a WordPiece model). */
pt_status pt_tokenizer_load(const char *path, pt_tokenizer **out);

/* Same, from tokenizer.json text in memory (`what` names it in messages).
 * The text need not be NUL-terminated. */
pt_status pt_tokenizer_load_json(const char *json, size_t len, const char *what, pt_tokenizer **out);

/* Loads DIR/tokenizer.json plus, when present, DIR/tokenizer_config.json
 * (bos_token, eos_token, pad_token, unk_token, add_bos_token, add_eos_token)
 * and DIR/generation_config.json (eos_token_id: int or list, bos/pad ids).
 * PT_ERR_NOT_FOUND if DIR has no tokenizer.json. */
pt_status pt_tokenizer_load_dir(const char *dir, pt_tokenizer **out);

/* Frees and sets *t to NULL. NULL-safe. */
void pt_tokenizer_free(pt_tokenizer **t);

/* Text -> ids. `text` is `len` bytes of UTF-8 (PT_ERR_INVALID_ARG naming the
 * byte offset otherwise; NUL bytes are ordinary characters). add_special: run
 * the post-processor's additions (e.g. BOS from TemplateProcessing), like
 * `encode(text, add_special_tokens=True)`. Added tokens (special or not) are
 * always recognised in the text. *ids is malloc'd (free()); it is non-NULL
 * even when *n_ids is 0. */
pt_status pt_tokenizer_encode(const pt_tokenizer *t, const char *text, size_t len, int add_special,
                              int32_t **ids, size_t *n_ids);

/* ids -> text, like `decode(ids, skip_special_tokens=skip_special)`. Invalid
 * UTF-8 produced by byte tokens becomes U+FFFD as the reference does.
 * *text is malloc'd and NUL-terminated; *len (may be NULL) excludes the NUL.
 * PT_ERR_RANGE for an id outside [0, vocab_size). */
pt_status pt_tokenizer_decode(const pt_tokenizer *t, const int32_t *ids, size_t n_ids,
                              int skip_special, char **text, size_t *len);

/* The text of one token decoded in isolation (decode([id], false)). */
pt_status pt_tokenizer_token_text(const pt_tokenizer *t, int32_t id, char **text, size_t *len);

/* One past the largest id of the model vocabulary and the added tokens. */
int32_t pt_tokenizer_vocab_size(const pt_tokenizer *t);

/* The raw piece string of an id as it is stored in tokenizer.json (e.g. "Ġthe",
 * "▁the", "<0x0A>", "<|eot_id|>"; a normalized added token gives its normalized
 * content, as the reference does); NULL for an id with no token (gaps). The
 * pointer lives as long as the tokenizer. *len (may be NULL) gets its length. */
const char *pt_tokenizer_id_to_piece(const pt_tokenizer *t, int32_t id, size_t *len);

/* The id of a piece string (added-token contents first, then the model vocabulary),
 * or -1 if none. */
int32_t pt_tokenizer_piece_to_id(const pt_tokenizer *t, const char *piece, size_t len);

/* 1 if id is an added token marked special (dropped by skip_special). */
int pt_tokenizer_is_special(const pt_tokenizer *t, int32_t id);

/* Special token ids resolved from tokenizer_config.json (strings looked up in
 * the vocabulary) and generation_config.json; -1 when unknown. */
int32_t pt_tokenizer_bos_id(const pt_tokenizer *t);
int32_t pt_tokenizer_eos_id(const pt_tokenizer *t); /* the first of the eos set */
int32_t pt_tokenizer_pad_id(const pt_tokenizer *t);
int32_t pt_tokenizer_unk_id(const pt_tokenizer *t);
/* The bos/eos token strings (for chat templates); NULL when unknown. */
const char *pt_tokenizer_bos_token(const pt_tokenizer *t);
const char *pt_tokenizer_eos_token(const pt_tokenizer *t);
/* tokenizer_config.json add_bos_token / add_eos_token: 1, 0, or -1 if absent. */
int pt_tokenizer_add_bos(const pt_tokenizer *t);
int pt_tokenizer_add_eos(const pt_tokenizer *t);
/* The eos set: generation_config.json eos_token_id (int or list) when present,
 * else tokenizer_config.json eos_token. *ids points into the tokenizer. */
size_t pt_tokenizer_eos_ids(const pt_tokenizer *t, const int32_t **ids);
int pt_tokenizer_is_eos(const pt_tokenizer *t, int32_t id);

/* Streaming detokenizer: push ids one at a time; each push returns only text
 * that is complete UTF-8 and final (a byte-fallback or byte-level sequence
 * split across steps is held back until it completes). The concatenation of
 * every push and the flush equals pt_tokenizer_decode of all ids for the
 * pipelines petrel supports. */
typedef struct pt_tok_stream pt_tok_stream;
pt_status pt_tok_stream_create(const pt_tokenizer *t, int skip_special, pt_tok_stream **out);
/* *text points into the stream (valid until the next call); *len may be 0.
 * PT_ERR_RANGE for an id outside the vocabulary (the stream is unchanged). */
pt_status pt_tok_stream_push(pt_tok_stream *s, int32_t id, const char **text, size_t *len);
/* Returns what is held back (incomplete UTF-8 becomes U+FFFD) and resets. */
pt_status pt_tok_stream_flush(pt_tok_stream *s, const char **text, size_t *len);
void pt_tok_stream_free(pt_tok_stream **s);

#endif
