/* petrel logits — not built yet; answers with a clear error. */
#include "cli/cli.h"

#include <stdio.h>

int cmd_logits(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "petrel logits: not implemented yet\n");
    return 1;
}
