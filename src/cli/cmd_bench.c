/* petrel bench — not built yet; answers with a clear error. */
#include "cli/cli.h"

#include <stdio.h>

int cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "petrel bench: not implemented yet\n");
    return 1;
}
