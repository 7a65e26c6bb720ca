/* petrel tokenize — not built yet; answers with a clear error. */
#include "cli/cli.h"

#include <stdio.h>

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "petrel tokenize: not implemented yet\n");
    return 1;
}
