/* tools/lib/tools.h: code shared by the command-line tools. */
#ifndef EDGELM_TOOLS_H
#define EDGELM_TOOLS_H

#include <stdio.h>

/* `edgelm-gguf mkmodel ...`: write a synthetic model of a named real shape.
 * argv[0] is "mkmodel". Returns the process exit code. */
int tools_mkmodel_main(int argc, char **argv);
void tools_mkmodel_usage(FILE *o);

#endif
