/* `petrel` entry point: dispatches to the subcommands (see cli.h). */
#include "cli/cli.h"

#include "petrel.h"
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command commands[] = {
    {"generate", cmd_generate, "generate text from a prompt (streams to stdout)"},
    {"chat", cmd_chat, "interactive chat with the model's chat template"},
    {"serve", cmd_serve, "OpenAI/Anthropic-compatible HTTP server"},
    {"logits", cmd_logits, "write float32 logits for every prompt position"},
    {"perplexity", cmd_perplexity, "perplexity over a text file"},
    {"tokenize", cmd_tokenize, "text -> token ids, or ids -> text with --decode"},
    {"template", cmd_template, "render a chat template with JSON variables"},
    {"inspect", cmd_inspect, "validate a model directory and describe it"},
    {"quantize", cmd_quantize, "write an MLX-format quantized checkpoint"},
    {"bench", cmd_bench, "prompt-processing and generation speed"},
};

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "petrel %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'petrel %s --help')\n", cmd);
    va_end(ap);
    return 2;
}

int cli_fail(const char *cmd) {
    fprintf(stderr, "petrel %s: error: %s\n", cmd, pt_last_error());
    return 1;
}

static void usage(FILE *f) {
    fprintf(f, "petrel %s — local LLM inference\n\nusage: petrel <command> [options]\n\ncommands:\n",
            pt_version());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'petrel <command> --help' describes each command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("petrel %s\n", pt_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "petrel: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
