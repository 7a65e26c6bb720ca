/* Encode-throughput harness for petrel's tokenizer: loads a tokenizer.json,
 * reads a text file, encodes it whole REPS times on one thread and prints
 * MB/s (best and median) plus the token count. Built and run by
 * bench/tokenizer.sh beside the reference library. Not a test. */
#include "base/mmap.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tokenizer_bench TOKENIZER.json TEXT [REPS] [whole|lines]\n");
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    int lines = argc > 4 && !strcmp(argv[4], "lines"); /* encode each line (with its \n) separately */
    if (reps < 1 || reps > 100) reps = 5;
    pt_tokenizer *t;
    double t0 = now();
    if (pt_tokenizer_load(argv[1], &t)) {
        fprintf(stderr, "tokenizer_bench: %s\n", pt_last_error());
        return 1;
    }
    double load_s = now() - t0;
    char *text;
    size_t len;
    if (pt_read_file(argv[2], &text, &len)) {
        fprintf(stderr, "tokenizer_bench: %s\n", pt_last_error());
        return 1;
    }
    double secs[100];
    size_t n = 0;
    for (int r = 0; r < reps; r++) {
        double a = now();
        n = 0;
        for (size_t off = 0; off < len;) {
            size_t end = len;
            if (lines) {
                const char *nl = memchr(text + off, '\n', len - off);
                end = nl ? (size_t)(nl - text) + 1 : len;
            }
            int32_t *ids;
            size_t k;
            if (pt_tokenizer_encode(t, text + off, end - off, 0, &ids, &k)) {
                fprintf(stderr, "tokenizer_bench: %s\n", pt_last_error());
                return 1;
            }
            n += k;
            free(ids);
            off = end;
        }
        secs[r] = now() - a;
    }
    qsort(secs, (size_t)reps, sizeof *secs, cmp);
    printf("petrel     %-5s load %.3f s  tokens %zu  best %.2f MB/s  median %.2f MB/s\n", lines ? "lines" : "whole", load_s, n,
           len / secs[0] / 1e6, len / secs[reps / 2] / 1e6);
    free(text);
    pt_tokenizer_free(&t);
    return 0;
}
