// timing.cu: the benchmark's hold kernel (cupyops/bench/timing.py), not an operator.
//
// CUDA events bracket whatever the GPU does between them, including waiting for the host
// to enqueue the next launch. A call whose host side (argument checks, plans, several
// launches) takes longer than the flush before it leaves the GPU idle inside the timed
// region, and the event pair then measures Python, not the kernels. The benchmark
// therefore enqueues this kernel first, then a batch of (flush, event, call, event), and
// only then releases it: the batch runs back to back from the GPU's queue.
#include "common.cuh"

// Spin until the host raises *flag (pinned host memory, read across PCIe) to release_at,
// this hold's number, or timeout_ns pass; *timed_out = 1 tells the host that its batch may
// have waited on it after all. The flag only grows: the next hold's engage never hides a
// release this kernel has not polled yet (it polls every 2 us).
__global__ void hold_until_released(const volatile int* flag, int release_at, long long timeout_ns,
                                    int* timed_out) {
    long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (*flag < release_at) {
        __nanosleep(2000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > timeout_ns) {
            *timed_out = 1;
            return;
        }
    }
}
