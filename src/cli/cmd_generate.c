/* petrel generate — not built yet; answers with a clear error. */
#include "cli/cli.h"

#include <stdio.h>

int cmd_generate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "petrel generate: not implemented yet\n");
    return 1;
}
