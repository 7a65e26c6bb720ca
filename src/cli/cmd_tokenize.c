/* petrel tokenize — text -> ids (or ids -> text with --decode) with a model
 * directory's tokenizer or a tokenizer.json file. Prints results on stdout;
 * errors on stderr. Not a model runner: it loads no weights. */
#include "cli/cli.h"

#include "base/error.h"
#include "base/mmap.h"
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char USAGE[] =
    "usage: petrel tokenize (-m DIR | --tokenizer FILE) (--text T | --text-file F) [--special]\n"
    "       petrel tokenize (-m DIR | --tokenizer FILE) --decode --ids \"1 2 3\" [--skip-special]\n"
    "\n"
    "Encodes text with a Hugging Face tokenizer.json and prints the ids, space-separated,\n"
    "on one line; or decodes ids back to text.\n"
    "\n"
    "  -m, --model DIR     model directory (its tokenizer.json, plus tokenizer_config.json\n"
    "                      and generation_config.json when present)\n"
    "  --tokenizer FILE    a tokenizer.json file\n"
    "  --text T            the text to encode (UTF-8)\n"
    "  --text-file F       encode the file's bytes exactly (no newline stripped)\n"
    "  --special           add what the post-processor adds (e.g. BOS), like\n"
    "                      encode(text, add_special_tokens=True); added tokens in the text\n"
    "                      are always recognised\n"
    "  --decode            decode --ids instead of encoding\n"
    "  --ids \"1 2 3\"       token ids separated by spaces or commas\n"
    "  --skip-special      with --decode: drop special tokens (skip_special_tokens=True)\n"
    "  -h, --help          this help\n"
    "\n"
    "Decoded text is printed byte for byte with no newline added.\n"
    "Exit status: 0 ok, 1 error (bad tokenizer file, invalid UTF-8, id out of range), 2 usage.\n";

static int parse_ids(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *out = malloc(cap * sizeof **out);
    if (!*out) return -1;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) return -1;
        if (*n == cap) {
            cap *= 2;
            int32_t *q = realloc(*out, cap * sizeof *q);
            if (!q) return -1;
            *out = q;
        }
        (*out)[(*n)++] = (int32_t)v;
        p = end;
        if (*p && *p != ' ' && *p != ',' && *p != '\t' && *p != '\n') return -1;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *C = "tokenize";
    const char *dir = NULL, *file = NULL, *text = NULL, *text_file = NULL, *ids_arg = NULL;
    int special = 0, decode = 0, skip = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!has_val) return cli_usage_error(C, "%s needs a directory", a);
            dir = argv[++i];
        } else if (!strcmp(a, "--tokenizer")) {
            if (!has_val) return cli_usage_error(C, "--tokenizer needs a file");
            file = argv[++i];
        } else if (!strcmp(a, "--text")) {
            if (!has_val) return cli_usage_error(C, "--text needs a value");
            text = argv[++i];
        } else if (!strcmp(a, "--text-file")) {
            if (!has_val) return cli_usage_error(C, "--text-file needs a file");
            text_file = argv[++i];
        } else if (!strcmp(a, "--ids")) {
            if (!has_val) return cli_usage_error(C, "--ids needs a list of ids");
            ids_arg = argv[++i];
        } else if (!strcmp(a, "--special")) special = 1;
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "--skip-special")) skip = 1;
        else return cli_usage_error(C, "unknown argument '%s' (see petrel tokenize --help)", a);
    }
    if (!dir == !file) return cli_usage_error(C, "give exactly one of -m DIR or --tokenizer FILE");
    if (decode) {
        if (!ids_arg) return cli_usage_error(C, "--decode needs --ids \"1 2 3\"");
        if (text || text_file) return cli_usage_error(C, "--decode takes --ids, not --text/--text-file");
        if (special) return cli_usage_error(C, "--special applies to encoding; use --skip-special with --decode");
    } else {
        if (!text == !text_file) return cli_usage_error(C, "give exactly one of --text or --text-file");
        if (ids_arg) return cli_usage_error(C, "--ids needs --decode");
        if (skip) return cli_usage_error(C, "--skip-special applies to --decode");
    }

    pt_tokenizer *tok = NULL;
    pt_status st = dir ? pt_tokenizer_load_dir(dir, &tok) : pt_tokenizer_load(file, &tok);
    if (st) return cli_fail(C);

    int rc = 0;
    if (decode) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (parse_ids(ids_arg, &ids, &n)) {
            free(ids);
            pt_tokenizer_free(&tok);
            return cli_usage_error(C, "--ids: expected non-negative integers separated by spaces, found \"%s\"", ids_arg);
        }
        char *out = NULL;
        size_t len = 0;
        if (pt_tokenizer_decode(tok, ids, n, skip, &out, &len)) rc = cli_fail(C);
        else fwrite(out, 1, len, stdout);
        free(out);
        free(ids);
    } else {
        char *buf = NULL;
        size_t len;
        if (text_file) {
            if (pt_read_file(text_file, &buf, &len)) {
                pt_tokenizer_free(&tok);
                return cli_fail(C);
            }
        } else len = strlen(text);
        int32_t *ids = NULL;
        size_t n = 0;
        if (pt_tokenizer_encode(tok, buf ? buf : text, len, special, &ids, &n)) {
            rc = cli_fail(C);
        } else {
            for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            putchar('\n');
        }
        free(ids);
        free(buf);
    }
    pt_tokenizer_free(&tok);
    if (fflush(stdout) != 0 && rc == 0) {
        fprintf(stderr, "petrel tokenize: error writing output\n");
        rc = 1;
    }
    return rc;
}
