/* cli.h: the subcommands of the minference command-line tool. Each returns the process exit
 * status: 0 success, 1 failure, 2 usage error. */
#ifndef MI_TOOLS_CLI_H
#define MI_TOOLS_CLI_H

int mi_cmd_bench(int argc, char **argv);
int mi_cmd_info(int argc, char **argv);
int mi_cmd_blend(int argc, char **argv);
int mi_cmd_config(int argc, char **argv);
int mi_cmd_generate(int argc, char **argv);
int mi_cmd_search(int argc, char **argv);
int mi_cmd_eval(int argc, char **argv);
int mi_cmd_chat(int argc, char **argv);
int mi_cmd_scbench(int argc, char **argv);
int mi_cmd_leank_learn(int argc, char **argv);

/* The OpenMP wait policy and OpenBLAS kernels the model commands need (cmd_generate.c); may
 * re-execute the tool with them set. */
void mi_cli_prepare_runtime(void);

/* Makes OpenBLAS use the CPU's real kernels for the bench's sgemm reference (may re-execute
 * the tool with OPENBLAS_CORETYPE set; returns when nothing needs doing). */
void mi_bench_prepare_blas(char **argv);

#endif /* MI_TOOLS_CLI_H */
