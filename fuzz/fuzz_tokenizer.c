/* libFuzzer target over the tokenizer.json loader: any bytes are parsed as a
 * tokenizer.json; when one loads, it encodes a fixed hostile text and the
 * input's own valid-UTF-8 prefix, decodes the ids (whole and streamed) and
 * looks pieces up. Must never crash, leak or read out of bounds. */
#include "base/json.h"
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void exercise(const pt_tokenizer *t, const char *text, size_t len) {
    int32_t *ids = NULL;
    size_t n = 0;
    for (int sp = 0; sp < 2; sp++) {
        if (pt_tokenizer_encode(t, text, len, sp, &ids, &n) != PT_OK) continue;
        char *out = NULL;
        size_t ol;
        if (pt_tokenizer_decode(t, ids, n, sp, &out, &ol) == PT_OK) free(out);
        pt_tok_stream *s = NULL;
        if (pt_tok_stream_create(t, sp, &s) == PT_OK) {
            const char *p;
            size_t pl;
            for (size_t i = 0; i < n; i++) pt_tok_stream_push(s, ids[i], &p, &pl);
            pt_tok_stream_flush(s, &p, &pl);
            pt_tok_stream_free(&s);
        }
        for (size_t i = 0; i < n && i < 8; i++) {
            size_t l;
            const char *piece = pt_tokenizer_id_to_piece(t, ids[i], &l);
            if (piece) (void)pt_tokenizer_piece_to_id(t, piece, l);
            (void)pt_tokenizer_is_special(t, ids[i]);
        }
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_tokenizer *t = NULL;
    if (pt_tokenizer_load_json((const char *)data, size, "fuzz.json", &t) != PT_OK) return 0;
    static const char hostile[] = "Hello  world\r\n\t 123456 it's <|eot_id|> \xe2\x96\x81 \xf0\x9f\x98\x80 "
                                  "e\xcc\x81 \xe0\xa7\xa7 \xef\xbc\xa1 <s></s>";
    exercise(t, hostile, sizeof hostile - 1);
    long bad = pt_utf8_invalid_offset((const char *)data, size);
    size_t ok = bad < 0 ? size : (size_t)bad;
    if (ok > 4096) ok = 4096;
    exercise(t, (const char *)data, ok);
    pt_tokenizer_free(&t);
    return 0;
}
