/*
 * test_scbench_matrix.c: the method matrix of `minference scbench`: the --attn and --kv lists,
 * "all" against the library's own tables, duplicates, a spec's key=value list kept whole, and
 * the errors (empty list, too many entries).
 */
#include "../check.h"
#include "cmd_scbench.h"
#include "minference.h"
#include "minference_session.h"

#include <string.h>

#define MAX 32

static int find(char **v, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i], s)) return i;
    return -1;
}

static void test_attn(void) {
    char *v[MAX] = {0}, why[128];
    int n = sc_attn_list("dense,a_shape:64:512,dense,,vs", v, MAX, why, sizeof why);
    CHECK_EQ(n, 3); /* the second dense and the empty entry drop out, the order is kept */
    CHECK(n == 3 && !strcmp(v[0], "dense") && !strcmp(v[1], "a_shape:64:512") &&
          !strcmp(v[2], "vs"));
    sc_free_list(v, n > 0 ? n : 0);

    n = sc_attn_list("all", v, MAX, why, sizeof why);
    /* dense, minference (the config: what vs names too), then every other pattern once */
    CHECK_EQ(n, mi_pattern_count() - 2 + 2);
    CHECK_EQ(find(v, n, "dense"), 0);
    CHECK_EQ(find(v, n, "minference"), 1);
    for (int32_t p = 0; p < mi_pattern_count(); p++) {
        if (p == MI_PATTERN_DENSE || p == MI_PATTERN_VERTICAL_SLASH) continue;
        int hits = 0;
        for (int i = 0; i < n; i++) {
            mi_pattern_type t;
            if (mi_pattern_from_name(v[i], &t) == MI_STATUS_SUCCESS && t == (mi_pattern_type)p)
                hits++;
        }
        CHECK_EQ(hits, 1);
    }
    for (int i = 0; i < n; i++) { /* every entry is a name the harness accepts */
        mi_pattern_type t;
        CHECK(!strcmp(v[i], "minference") || mi_pattern_from_name(v[i], &t) == MI_STATUS_SUCCESS,
              "%s", v[i]);
    }
    CHECK(find(v, n, "a_shape") >= 0 && find(v, n, "tri_shape") >= 0 &&
          find(v, n, "block_sparse") >= 0 && find(v, n, "xattention") >= 0 &&
          find(v, n, "flexprefill") >= 0);
    sc_free_list(v, n > 0 ? n : 0);

    /* "all" with a budgeted entry: the budgeted one is added, the plain names not repeated */
    const int n_all = mi_pattern_count();
    n = sc_attn_list("a_shape:64:512,all,dense", v, MAX, why, sizeof why);
    CHECK_EQ(n, n_all + 1);
    CHECK(n > 0 && !strcmp(v[0], "a_shape:64:512"));
    sc_free_list(v, n > 0 ? n : 0);

    CHECK_EQ(sc_attn_list(",,", v, MAX, why, sizeof why), -1);
    CHECK(strstr(why, "empty") != NULL, "%s", why);
    CHECK_EQ(sc_attn_list(NULL, v, MAX, why, sizeof why), -1);
    CHECK_EQ(sc_attn_list("all", v, 3, why, sizeof why), -1);
    CHECK(strstr(why, "more than 3") != NULL, "%s", why);
    for (int i = 0; i < MAX; i++) CHECK(v[i] == NULL); /* a failure leaves nothing allocated */
}

static void test_kv(void) {
    char *v[MAX] = {0}, why[128];
    int n = sc_kv_list("dense,snapkv:max_capacity_prompt=512,window_size=16;quest", v, MAX, why,
                       sizeof why);
    CHECK_EQ(n, 3);
    CHECK(n == 3 && !strcmp(v[0], "dense") &&
          !strcmp(v[1], "snapkv:max_capacity_prompt=512,window_size=16") && !strcmp(v[2], "quest"));
    sc_free_list(v, n > 0 ? n : 0);

    n = sc_kv_list("all", v, MAX, why, sizeof why);
    CHECK_EQ(n, mi_session_kv_method_count());
    for (int32_t i = 0; i < mi_session_kv_method_count(); i++)
        CHECK_EQ(find(v, n, mi_session_kv_method_name(i)), i);
    CHECK(find(v, n, "streamingllm") >= 0 && find(v, n, "kivi") >= 0 &&
          find(v, n, "retr_attn") >= 0 && find(v, n, "pyramidkv") >= 0);
    sc_free_list(v, n > 0 ? n : 0);

    /* a spec with keys before "all": kept, and dense not named twice */
    n = sc_kv_list("kivi:bits=2;all,dense", v, MAX, why, sizeof why);
    CHECK_EQ(n, mi_session_kv_method_count() + 1);
    CHECK(n > 0 && !strcmp(v[0], "kivi:bits=2"));
    sc_free_list(v, n > 0 ? n : 0);

    CHECK_EQ(sc_kv_list(";;", v, MAX, why, sizeof why), -1);
    CHECK_EQ(sc_kv_list("all", v, 2, why, sizeof why), -1);
    for (int i = 0; i < MAX; i++) CHECK(v[i] == NULL);
}

int main(void) {
    test_attn();
    test_kv();
    return check_finish("eval.scbench_matrix");
}
