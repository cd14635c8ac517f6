/* Placeholder until the benchmark subcommand lands. */
#include <stdio.h>
#include "cli.h"
int cli_bench(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "bench: not built yet\n"); return 2; }
