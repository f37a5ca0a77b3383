/*
 * minference.c: the command-line tool. `minference [SUBCOMMAND] [OPTIONS]`; without a
 * subcommand it runs `bench`.
 */
#include "cli.h"
#include "minference.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: minference [SUBCOMMAND] [OPTIONS]\n"
    "\n"
    "Dynamic sparse attention for long-context LLM prefill (MInference).\n"
    "\n"
    "subcommands:\n"
    "  bench      dense against every sparse pattern on synthetic data, on the CPU or a GPU\n"
    "             (the default)\n"
    "  info       library version, build features, CUDA devices, threads\n"
    "  config     validate or summarise a per-head pattern config (JSON)\n"
    "  generate   run a model: prefill a prompt with sparse attention, decode greedily\n"
    "  blend      CacheBlend: reuse the caches of text chunks in front of a prompt\n"
    "  chat       a conversation with a model, its KV cache kept across turns\n"
    "  search     offline per-head pattern search on a sample prompt; writes a config\n"
    "  eval       accuracy tasks (needle, passkey, ...) with each attention method\n"
    "  scbench    SCBench: shared-context tasks, multi-turn and multi-request, per method\n"
    "  leank-learn  a LeanK key-channel mask from calibration text on a model\n"
    "\n"
    "options:\n"
    "  -h, --help     this message (SUBCOMMAND --help: that subcommand's options)\n"
    "  -V, --version  the version of the tool and of the loaded library\n";

int main(int argc, char **argv) {
    if (argc < 2) {
        mi_bench_prepare_blas(argv);
        return mi_cmd_bench(0, argv + 1);
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(cmd, "-V") == 0 || strcmp(cmd, "--version") == 0) {
        printf("minference %s (library %s)\n", MI_VERSION_STRING, mi_version());
        return 0;
    }
    if (strcmp(cmd, "bench") == 0 || cmd[0] == '-') mi_bench_prepare_blas(argv);
    if (strcmp(cmd, "bench") == 0) return mi_cmd_bench(argc - 2, argv + 2);
    if (strcmp(cmd, "info") == 0) return mi_cmd_info(argc - 2, argv + 2);
    if (strcmp(cmd, "config") == 0) return mi_cmd_config(argc - 2, argv + 2);
    if (strcmp(cmd, "generate") == 0) return mi_cmd_generate(argc - 2, argv + 2);
    if (strcmp(cmd, "blend") == 0) return mi_cmd_blend(argc - 2, argv + 2);
    if (strcmp(cmd, "chat") == 0) return mi_cmd_chat(argc - 2, argv + 2);
    if (strcmp(cmd, "search") == 0) return mi_cmd_search(argc - 2, argv + 2);
    if (strcmp(cmd, "eval") == 0) return mi_cmd_eval(argc - 2, argv + 2);
    if (strcmp(cmd, "scbench") == 0) return mi_cmd_scbench(argc - 2, argv + 2);
    if (strcmp(cmd, "leank-learn") == 0) return mi_cmd_leank_learn(argc - 2, argv + 2);
    /* Options without a subcommand belong to the default one. */
    if (cmd[0] == '-') return mi_cmd_bench(argc - 1, argv + 1);
    fprintf(stderr, "minference: unknown subcommand '%s'\n\n%s", cmd, usage);
    return 2;
}
