/* cli.h - subcommands of kda-cli that live in their own files. Each takes the
 * arguments after the subcommand name and returns the process exit code. */
#ifndef KDA_CLI_H
#define KDA_CLI_H

int cli_tokenize(int argc, char **argv);    /* cli_tok.c */
int cli_detokenize(int argc, char **argv);  /* cli_tok.c */
int cli_bench(int argc, char **argv);       /* cli_bench.c */

#endif
