/* libFuzzer target for the model-directory JSON parsers. The first input
 * byte picks the parser (config.json, generation_config.json,
 * tokenizer_config.json, kv_config.json); the rest is the file's text. Every
 * input must end in a parsed struct or a clean error. A parsed config.json
 * also has its RoPE tables built for every layer type, as loading does. */
#include "model/config.h"
#include "model/rope.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1 << 20)) return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    switch (data[0] % 4) {
    case 0: {
        pt_config c;
        if (pt_config_parse(text, len, "config.json", &c) != PT_OK) return 0;
        for (int k = 0; k < 2; k++) {
            int hd = (int)(k == 0 && c.global_head_dim ? c.global_head_dim : c.head_dim);
            pt_rope_table t;
            (void)pt_rope_table_build(&c.rope[k], hd, c.max_position_embeddings, "config.json", &t);
            pt_rope_table_free(&t); /* frees what a success allocated; a failure left it empty */
        }
        int bits, gs;
        pt_quant_lookup(&c.quant, "model.layers.0.mlp.down_proj", &bits, &gs);
        pt_config_free(&c);
        break;
    }
    case 1: {
        pt_generation_config g;
        (void)pt_generation_config_parse(text, len, "generation_config.json", &g);
        break;
    }
    case 2: {
        pt_tokenizer_config t;
        if (pt_tokenizer_config_parse(text, len, "tokenizer_config.json", &t) == PT_OK) pt_tokenizer_config_free(&t);
        break;
    }
    default: {
        pt_kv_config k;
        if (pt_kv_config_parse(text, len, "kv_config.json", &k) == PT_OK) pt_kv_config_free(&k);
        break;
    }
    }
    return 0;
}
