/* cli.h - subcommands of kda-cli that live in their own files. Each takes the
 * arguments after the subcommand name and returns the process exit code. */
#ifndef KDA_CLI_H
#define KDA_CLI_H

#include <stdio.h>

int cli_tokenize(int argc, char **argv);    /* cli_tok.c */
int cli_detokenize(int argc, char **argv);  /* cli_tok.c */
int cli_bench(int argc, char **argv);       /* cli_bench.c */
/* Usage text of a subcommand (kda-cli SUB --help prints it to stdout). */
void cli_tok_usage(FILE *f, const char *cmd);   /* "tokenize" or "detokenize" */
void cli_bench_usage(FILE *f);

#endif
