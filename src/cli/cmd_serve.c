/* petrel serve — not built yet; answers with a clear error. */
#include "cli/cli.h"

#include <stdio.h>

int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "petrel serve: not implemented yet\n");
    return 1;
}
