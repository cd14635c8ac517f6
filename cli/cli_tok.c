/* Placeholder until the tokenizer subcommands land. */
#include <stdio.h>
#include "cli.h"
int cli_tokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tokenize: not built yet\n"); return 2; }
int cli_detokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "detokenize: not built yet\n"); return 2; }
