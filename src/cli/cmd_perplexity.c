/* petrel perplexity — not built yet; answers with a clear error. */
#include "cli/cli.h"

#include <stdio.h>

int cmd_perplexity(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "petrel perplexity: not implemented yet\n");
    return 1;
}
