/* The `petrel` command: one function per subcommand (cmd_<name>.c), each
 * taking argv after the subcommand name (argv[0] is the subcommand). Each
 * returns the process exit code. Results go to stdout; errors to stderr. */
#ifndef PT_CLI_H
#define PT_CLI_H

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Prints "petrel <cmd>: <msg>" to stderr; returns exit code 2 (usage error). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "petrel <cmd>: error: <pt_last_error()>" to stderr; returns 1. */
int cli_fail(const char *cmd);

#endif
