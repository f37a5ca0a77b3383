/*
 * session_test_util.h: what the session tests share (header-only, after model_test_util.h): a
 * session with a KV-method spec, and the call script they compare sessions by.
 */
#ifndef MI_SESSION_TEST_UTIL_H
#define MI_SESSION_TEST_UTIL_H

#include "minference_session.h"
#include "model_test_util.h"

static inline mi_session *open_kv(mi_model *m, const char *kv) {
    mi_session_params p = mi_session_default_params();
    p.kv = kv;
    mi_session *s = NULL;
    mi_status st = mi_session_create(m, &p, &s);
    CHECK(st == MI_STATUS_SUCCESS, "session kv=%s: %s", kv, mi_model_last_error(m));
    return s;
}

/* Prefill tok[0..n0), a follow-up turn of n1 tokens, then `steps` single decode steps; the logits
 * of every call go to out [(2 + steps) * V]. */
static inline mi_status script(mi_session *s, const int32_t *tok, int n0, int n1, int steps,
                               float *out, int V) {
    mi_status st = mi_session_prefill(s, tok, (size_t)n0, out);
    if (st == MI_STATUS_SUCCESS) st = mi_session_prefill(s, tok + n0, (size_t)n1, out + V);
    for (int i = 0; i < steps && st == MI_STATUS_SUCCESS; i++)
        st = mi_session_decode(s, tok + n0 + n1 + i, 1, out + (size_t)(2 + i) * V);
    return st;
}

#endif /* MI_SESSION_TEST_UTIL_H */
