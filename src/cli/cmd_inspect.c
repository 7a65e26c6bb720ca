/* petrel inspect — not built yet; answers with a clear error. */
#include "cli/cli.h"

#include <stdio.h>

int cmd_inspect(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "petrel inspect: not implemented yet\n");
    return 1;
}
