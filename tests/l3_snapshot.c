/* The L3 gate's frozen snapshot (see l3_snapshot.h). */
#include "l3_snapshot.h"

#include "base/mmap.h"
#include "parity_util.h"
#include "petrel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void snap_path(const char *fixture, char *buf, size_t n) {
    snprintf(buf, n, "tests/fixtures/l3_snapshot/%s.bin", fixture);
}

void l3_snap_free(l3_snap *s) {
    free(s->ids);
    free(s->greedy);
    free(s->logits);
    memset(s, 0, sizeof *s);
}

int l3_snap_write(const char *fixture, const l3_snap *s) {
    char path[256];
    snap_path(fixture, path, sizeof path);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int32_t hdr[3] = {s->n_prompt, s->n_steps, s->vocab};
    int ok = fwrite("PTL3SNP1", 1, 8, f) == 8 && fwrite(hdr, 4, 3, f) == 3 &&
             fwrite(s->ids, 4, (size_t)s->n_prompt, f) == (size_t)s->n_prompt &&
             fwrite(s->greedy, 4, (size_t)s->n_steps, f) == (size_t)s->n_steps &&
             fwrite(s->logits, 4, (size_t)s->n_steps * s->vocab, f) == (size_t)s->n_steps * s->vocab;
    return fclose(f) == 0 && ok;
}

int l3_snap_read(const char *fixture, l3_snap *s) {
    char path[256];
    snap_path(fixture, path, sizeof path);
    memset(s, 0, sizeof *s);
    char *data = NULL;
    size_t len = 0;
    if (pt_read_file(path, &data, &len) != PT_OK) {
        printf("    %s: %s\n", path, pt_last_error());
        return 0;
    }
    const unsigned char *p = (const unsigned char *)data;
    int32_t hdr[3];
    int ok = len >= 20 && !memcmp(p, "PTL3SNP1", 8);
    if (ok) {
        memcpy(hdr, p + 8, 12);
        ok = hdr[0] > 0 && hdr[0] < 4096 && hdr[1] > 0 && hdr[1] <= 1024 && hdr[2] > 0 && hdr[2] < (1 << 20) &&
             len == 20 + 4 * ((size_t)hdr[0] + hdr[1] + (size_t)hdr[1] * hdr[2]);
    }
    if (ok) {
        s->n_prompt = hdr[0];
        s->n_steps = hdr[1];
        s->vocab = hdr[2];
        s->ids = malloc(4 * (size_t)s->n_prompt);
        s->greedy = malloc(4 * (size_t)s->n_steps);
        s->logits = malloc(4 * (size_t)s->n_steps * s->vocab);
        ok = s->ids && s->greedy && s->logits;
        if (ok) {
            memcpy(s->ids, p + 20, 4 * (size_t)s->n_prompt);
            memcpy(s->greedy, p + 20 + 4 * (size_t)s->n_prompt, 4 * (size_t)s->n_steps);
            memcpy(s->logits, p + 20 + 4 * ((size_t)s->n_prompt + s->n_steps), 4 * (size_t)s->n_steps * s->vocab);
        }
    }
    if (!ok) printf("    %s: not a valid snapshot (header or size)\n", path);
    free(data);
    if (!ok) l3_snap_free(s);
    return ok;
}

void l3_delta(const l3_snap *s, const float *ref, const int32_t *ref_top, const float *rows, const int32_t *top,
              double *mean_kl, double *max_kl, double *agree) {
    int V = s->vocab, same = 0;
    *mean_kl = 0;
    if (max_kl) *max_kl = 0;
    for (int j = 0; j < s->n_steps; j++) {
        double k = parity_kl_row(ref + (size_t)j * V, rows + (size_t)j * V, V);
        *mean_kl += k / s->n_steps;
        if (max_kl && k > *max_kl) *max_kl = k;
        same += top[j] == ref_top[j];
    }
    *agree = (double)same / s->n_steps;
}

