// comm_reduce.cuh: reductions across a thread block, shared by the kernels of several crates
// (comm-peer's fused all-reduce + RMSNorm, the examples' add + RMSNorm), so that the norms
// they compute sum alike.
#pragma once

// The sum of `v` over the block, returned on every thread. Every thread of the block must
// call it (it holds barriers), blockDim.x must be a multiple of 32 (whole warps shuffle) and
// at most MAX_THREADS. The last barrier lets a caller call again (the next row) without a
// thread overwriting `part` while another still reads `part[0]`.
template <int MAX_THREADS> __device__ float comm_block_sum(float v) {
    __shared__ float part[MAX_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? part[lane] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    const float total = part[0];
    __syncthreads();
    return total;
}
