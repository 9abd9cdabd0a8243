/* Pin the calling thread's OpenMP team to a core set.

   libgomp keeps a pool of team threads per calling thread and reuses them for every parallel
   region; a new team thread inherits the affinity its master had when it was created, and
   keeps it. So when a worker narrows its own affinity (CpuDevice at a new level), the team
   threads it already has may still run on the other side's cores. This runs one parallel
   region of `threads` threads (the team torch's next region will use) in which every member
   sets its own affinity. Returns how many members failed to. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>

int pdtop_pin_team(const int32_t* cores, int32_t n, int32_t threads) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int32_t i = 0; i < n; ++i) CPU_SET(cores[i], &set);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(+ : failed)
    failed += sched_setaffinity(0, sizeof set, &set) != 0;
    return failed;
}
