// launch_probe.cu: the empty kernels of launch-cost, which measures what enqueuing work costs
// on a machine. They take a parameter block as large as the peer kernels' and do nothing
// with it, so that what is timed is the launch alone.
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
