// launch_probe.cu: the empty kernels of launch-cost, which measures what enqueuing work costs
// on a machine. They take a parameter block as large as the peer kernels' and do nothing
// with it, so that what is timed is the launch alone; and host-probe's handshake, an empty
// call that waits for its peer once.
struct LaunchProbeArgs {
    unsigned long long words[32];
};

// Launched plainly: starts once the previous work of its stream has finished.
extern "C" __global__ void launch_probe_plain(LaunchProbeArgs a) {
    if (a.words[0] == 1 && threadIdx.x == 0) asm volatile("" ::: "memory");
}

// Launched with programmatic stream serialization: may start while the previous kernel of
// its stream finishes, waits for it, and lets the next one start (as the peer kernels do).
extern "C" __global__ void launch_probe_overlap(LaunchProbeArgs a) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
    if (a.words[0] == 1 && threadIdx.x == 0) asm volatile("" ::: "memory");
}

// A call that hears from its peer once through host memory: the least an all-reduce of two
// ranks over host memory does each call (in graph replay, one kernel a call on each rank's
// stream). Thread 0 counts its calls in device memory (words[0]), stores the count into its
// own flag (words[1], host memory), with a system fence after it where words[3] != 0, and
// polls the peer's flag (words[2]) until it holds the count; after words[4] ns it gives up
// and sets the counter's second word, so that a dead peer ends the probe with an error
// (and the calls after it at once).
__device__ __forceinline__ unsigned long long launch_probe_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void launch_probe_handshake(LaunchProbeArgs a) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
    if (threadIdx.x != 0) return;
    unsigned long long* calls = reinterpret_cast<unsigned long long*>(a.words[0]);
    volatile unsigned long long* mine = reinterpret_cast<volatile unsigned long long*>(a.words[1]);
    volatile unsigned long long* peer = reinterpret_cast<volatile unsigned long long*>(a.words[2]);
    if (calls[1] != 0) return;  // an earlier call gave up: no peer to wait for
    const unsigned long long n = calls[0] + 1;
    calls[0] = n;
    *mine = n;
    if (a.words[3] != 0) __threadfence_system();
    if (*peer >= n) return;
    const unsigned long long start = launch_probe_now();
    while (*peer < n) {
        if (launch_probe_now() - start > a.words[4]) {
            calls[1] = 1;
            return;
        }
    }
}
