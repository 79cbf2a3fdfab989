// step_chain.cu: the small dependent kernel of verify-step, between two all-reduces.
//
// x[i] = y[i] / div + add, in f32, rounded once to T: it reads the all-reduce's output y
// and writes the next all-reduce's input x, so every call of the step depends on the one
// before it (as a decode step's layers do). verify-step passes div = world size, which
// keeps the values from growing with the number of calls.
#include "comm_dtypes.cuh"

// Launched with programmatic stream serialization on sm_90+ (where each rank has a GPU of
// its own), as a serving engine's kernels are: it may start while the all-reduce before it
// finishes, so it waits for that kernel before reading y, and lets the next all-reduce
// start at once (that kernel waits for this one in turn). Elsewhere both are no-ops.
template <typename T>
__device__ __forceinline__ void step_chain(T* x, const T* y, uint64_t n, float div, float add) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = (float)comm_elem<T>::to_double(y[i]);
        x[i] = comm_elem<T>::from_double((double)(v / div + add));
    }
}

#define COMM_STEP_CHAIN(T, NAME)                                                          \
    extern "C" __global__ void comm_step_chain_##NAME(                                    \
        uint64_t x, uint64_t y, uint64_t n, float div, float add) {                       \
        step_chain<T>((T*)x, (const T*)y, n, div, add);                                   \
    }
COMM_STEP_CHAIN(float, f32)
COMM_STEP_CHAIN(comm_f16, f16)
COMM_STEP_CHAIN(comm_bf16, bf16)
