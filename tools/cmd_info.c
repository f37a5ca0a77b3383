/* cmd_info.c: `minference info`: versions, build features, devices, threads and patterns. */
#include "args.h"
#include "cli.h"
#include "minference.h"

#include <stdio.h>
#include <string.h>

static const char usage[] = "usage: minference info\n"
                            "\n"
                            "Prints the library and header versions, the build features, the\n"
                            "CUDA devices, the default number of CPU threads and the sparse\n"
                            "patterns (config name, other accepted names, fields).\n";

int mi_cmd_info(int argc, char **argv) {
    const char *pos[1];
    int np = 0;
    args_result r = args_parse("info", usage, NULL, 0, argc, argv, pos, 0, &np);
    if (r != ARGS_OK) return r == ARGS_HELP ? 0 : 2;

    mi_context *ctx = NULL;
    mi_context_params cp = mi_context_default_params();
    int threads = 0;
    if (mi_context_create(&cp, &ctx) == MI_STATUS_SUCCESS) {
        threads = mi_context_n_threads(ctx);
        mi_context_destroy(ctx);
    }
    const char *lib = mi_version();
    printf("minference %s\n", lib);
    printf("  header version   %s%s\n", MI_VERSION_STRING,
           strcmp(lib, MI_VERSION_STRING) ? "  (MISMATCH with the loaded library)" : "");
    printf("  build features   %s\n", mi_build_features());
    printf("  source commit    %s\n", mi_build_commit());
    printf("  CUDA devices     %d\n", mi_cuda_device_count());
    printf("  CPU threads      %d\n", threads);
    printf("  patterns        ");
    for (int32_t t = 0; t < mi_pattern_count(); t++) {
        const mi_pattern_type type = (mi_pattern_type)t;
        printf("%s %s", t ? "\n                  " : "", mi_pattern_name(type));
        for (int32_t a = 0; mi_pattern_alias(type, a); a++)
            printf("%s%s", a ? ", " : " (also ", mi_pattern_alias(type, a));
        if (mi_pattern_alias(type, 0)) printf(")");
        for (int32_t f = 0; mi_pattern_field(type, f); f++)
            printf("%s%s", f ? " " : ": ", mi_pattern_field(type, f));
    }
    printf("\n");
    return 0;
}
