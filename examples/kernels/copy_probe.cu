// copy_probe.cu: the one kernel of copy-probe's two-shot all-reduce, whose bytes move
// between the GPUs by copies: out = a + b over f32, 16 bytes per thread and step (the host
// passes 16-byte aligned pointers and a count that is a multiple of 4).

typedef unsigned long long u64;

extern "C" __global__ void copy_probe_add_f32(float4* out, const float4* a, const float4* b, u64 n4) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 x = a[i], y = b[i];
        out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}
