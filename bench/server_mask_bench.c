/* Constrained-decoding mask cost (src/server/json_schema.c) on a synthetic
 * vocabulary of 151,000 tokens (Qwen-sized): random word pieces with and
 * without a leading space, some JSON punctuation and digits. Prints the time
 * of one pt_jsm_mask call at several points of a document. Built and run by
 * bench/server_bench.sh against build/libpetrel.a. */
#include "server/json_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(void) {
    const int n = 151000;
    char **text = malloc((size_t)n * sizeof *text);
    uint8_t *eos = calloc((size_t)n, 1);
    const char *punct = "\"{}[]:, 0123456789_-.";
    unsigned s = 1;
    for (int i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        int len = 1 + (int)((s >> 16) % 9), k = 0;
        text[i] = malloc((size_t)len + 2);
        if ((s >> 8) & 1) text[i][k++] = ' ';
        for (int j = 0; j < len; j++) {
            s = s * 1103515245u + 12345u;
            text[i][k++] = (s >> 16) % 100 < 80 ? (char)('a' + (s >> 20) % 26)
                                                 : punct[(s >> 18) % strlen(punct)];
        }
        text[i][k] = 0;
    }
    eos[0] = 1;
    pt_vocab_index vi;
    if (pt_vocab_index_build(&vi, n, text, eos) != PT_OK) return 1;
    cJSON *j = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":"
                           "{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
                           "\"string\"}}},\"required\":[\"name\",\"age\"]}");
    pt_jschema *sc;
    if (pt_jschema_compile(j, &sc) != PT_OK) return 1;
    uint8_t *allowed = malloc((size_t)n);
    const char *at[] = {"", "{", "{\"na", "{\"name\":\"Jo", "{\"name\":\"Jo\",\"age\":4"};
    for (int p = 0; p < 5; p++) {
        pt_jsm m;
        pt_jsm_init(&m, sc);
        pt_jsm_feed(&m, at[p], strlen(at[p]));
        struct timespec a, b;
        size_t na = 0;
        const int reps = 20;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int r = 0; r < reps; r++) na = pt_jsm_mask(&m, &vi, allowed);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ms = ((double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6) / reps;
        printf("mask after '%s': %zu of %d tokens allowed, %.2f ms\n", at[p], na, n, ms);
    }
    return 0;
}
