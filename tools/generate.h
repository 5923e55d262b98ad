/* generate.h - the generation commands of the kiln tool (tools/generate.c). */
#ifndef KILN_TOOLS_GENERATE_H
#define KILN_TOOLS_GENERATE_H

int cmd_generate(int argc, char **argv);
int cmd_bench_llm(int argc, char **argv);

#endif
