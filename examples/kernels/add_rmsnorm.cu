// add_rmsnorm.cu: residual add + RMSNorm after an all-reduce, for verify-step --fused on
// backends without a fused all-reduce (NCCL, or auto's choice).
//
// Per row of `hidden` bf16 elements, the contract of comm-peer's fused kernel, so that the
// two pipelines compute the same thing: residual' = bf16(residual + reduced) in f32
// (written back), out = bf16(residual' * rsqrt(mean(residual'^2) + eps) * weight), the
// mean over the rounded residual, accumulated in f32. `reduced` is the all-reduce's bf16
// output. The row's sum of squares is the fused kernel's block sum (comm_reduce.cuh). Rows
// b, b + grid, ... belong to block b; blockDim.x must be a multiple of 32 (the block sum
// shuffles whole warps) and at most ADD_RMSNORM_MAX_THREADS.
#include "comm_dtypes.cuh"
#include "comm_reduce.cuh"

#define ADD_RMSNORM_MAX_THREADS 1024

extern "C" __global__ void __launch_bounds__(ADD_RMSNORM_MAX_THREADS) comm_add_rmsnorm_bf16(
    uint64_t reduced, uint64_t residual, uint64_t out, uint64_t weight, uint64_t rows,
    uint64_t hidden, float eps) {
    const uint16_t* a = (const uint16_t*)reduced;
    uint16_t* res = (uint16_t*)residual;
    uint16_t* o = (uint16_t*)out;
    const uint16_t* w = (const uint16_t*)weight;
    // The row loop depends on the block only: every thread reaches the block sum's barriers.
    for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const uint64_t base = row * hidden;
        float sumsq = 0.0f;
        for (uint64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
            const uint16_t h = comm_float_to_bf16(comm_bf16_to_float(res[base + j]) +
                                                  comm_bf16_to_float(a[base + j]));
            res[base + j] = h;
            const float r = comm_bf16_to_float(h);  // the rounded residual is normalised
            sumsq += r * r;
        }
        const float scale = rsqrtf(comm_block_sum<ADD_RMSNORM_MAX_THREADS>(sumsq) / (float)hidden + eps);
        // Each thread reads back only the residual elements it wrote itself above.
        for (uint64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
            const float r = comm_bf16_to_float(res[base + j]);
            o[base + j] = comm_float_to_bf16(r * scale * comm_bf16_to_float(w[j]));
        }
    }
}
