/* petrel chat — not built yet; answers with a clear error. */
#include "cli/cli.h"

#include <stdio.h>

int cmd_chat(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "petrel chat: not implemented yet\n");
    return 1;
}
