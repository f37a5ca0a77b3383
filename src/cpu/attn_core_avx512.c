/*
 * attn_core_avx512.c: the attention engine compiled a second time with AVX-512 enabled, for
 * builds whose baseline target lacks it (the default x86-64-v3). attn_core.c calls it when the
 * CPU reports AVX-512F/DQ/BW/VL. About 2x the AVX2 engine's throughput on the same core: twice
 * the vector width and 32 registers for a 8 x 32 register block.
 */
#include "cpu_common.h"

#if MI_CPU_AVX512_ENGINE
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
#define ENGINE(name) name##_avx512
#include "attn_engine.h"
#else
/* ISO C forbids an empty translation unit */
typedef int mi_cpu_avx512_engine_unused;
#endif
