/*
 * bench_clock.h: the CPU benchmarks' clock (bench_cpu, bench_cpu_patterns). Process CPU time by
 * default: on a shared machine the wall clock mostly measures the other tenants (time slices),
 * while CPU seconds measure the code. MI_BENCH_WALL=1 switches to wall time. With several
 * threads, CPU time includes the OpenMP / OpenBLAS spin-waits. Header-only.
 */
#ifndef MI_BENCH_CLOCK_H
#define MI_BENCH_CLOCK_H

#include <stdlib.h>
#include <time.h>

/* Whether the benchmarks time the wall clock (MI_BENCH_WALL=1) */
static inline int bench_wall(void) {
    static int wall = -1;
    if (wall < 0) wall = getenv("MI_BENCH_WALL") && atoi(getenv("MI_BENCH_WALL")) != 0;
    return wall;
}

static inline const char *bench_clock_name(void) { return bench_wall() ? "wall" : "process CPU"; }

/* Seconds on the chosen clock */
static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(bench_wall() ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort comparison of doubles, for medians */
static inline int bench_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif /* MI_BENCH_CLOCK_H */
