/* petrel quantize — not built yet; answers with a clear error. */
#include "cli/cli.h"

#include <stdio.h>

int cmd_quantize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "petrel quantize: not implemented yet\n");
    return 1;
}
