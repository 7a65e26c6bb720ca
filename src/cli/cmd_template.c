/* petrel template — not built yet; answers with a clear error. */
#include "cli/cli.h"

#include <stdio.h>

int cmd_template(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "petrel template: not implemented yet\n");
    return 1;
}
