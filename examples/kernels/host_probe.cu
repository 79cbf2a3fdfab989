// host_probe.cu: the kernels of host-probe, which measures what a GPU pays to reach pinned
// host memory mapped into it (the memory of comm-symm's host backing, for GPUs without peer
// access): one load's round trip, reading and writing a message with a given grid, and one
// flag's trip from one GPU to another through host memory.

typedef unsigned long long u64;

__device__ __forceinline__ u64 probe_now() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u64 probe_ld(const u64* p) {
    u64 v;
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// A 16-byte load of `flavor`: 0 volatile (relaxed, system scope as PTX maps it), 1
// ld.relaxed.sys, 2 a weak load that fetches again (.cv: cached system-memory lines are stale),
// 3 a weak load with the default cache operator, 4 ld.acquire.sys (of the first word only).
__device__ __forceinline__ uint4 probe_ld4_as(const uint4* p, int flavor) {
    uint4 v;
    if (flavor == 0)
        asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    else if (flavor == 1)
        asm volatile("ld.relaxed.sys.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    else if (flavor == 2)
        asm volatile("ld.global.cv.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    else if (flavor == 3)
        asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    else {
        asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v.x) : "l"(p) : "memory");
        v.y = v.z = v.w = 0;
    }
    return v;
}

__device__ __forceinline__ void probe_st(u64* p, u64 v) {
    asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

// A flag's store of `flavor`: 0 volatile, 1 volatile and a system fence after it, 2 a weak
// store written through L2 to system memory (.wt), 3 .wt and a fence.
__device__ __forceinline__ void probe_st_as(u64* p, u64 v, int flavor) {
    if (flavor & 2) asm volatile("st.global.wt.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
    else probe_st(p, v);
    if (flavor & 1) __threadfence_system();
}

// One thread follows `steps` links of the chain in `chain` (chain[i] is the index of the
// next word): each load waits for the one before. times[0] = ns for all of them; the last
// index goes to times[1] so that the loads cannot be dropped.
extern "C" __global__ void host_probe_chase(const u64* chain, u64 steps, u64* times) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    u64 i = 0;
    const u64 t0 = probe_now();
    for (u64 s = 0; s < steps; ++s) i = probe_ld(chain + i);
    times[0] = probe_now() - t0;
    times[1] = i;
}

// Block `block` of `blocks` reads (write == 0; loads of `flavor`, probe_ld4_as) or writes
// (write != 0) the 16-byte vectors tid, tid + stride, ... < nvec of `buf`, as a one-shot
// all-reduce reads its peers' data, and records its start and end (times[2 * blockIdx.x],
// times[2 * blockIdx.x + 1]) so that the host can take the grid's span without the launch;
// a read's xor goes to sink.
__device__ __forceinline__ void probe_move(uint4* buf, u64 nvec, int write, int flavor, unsigned block,
                                           unsigned blocks, u64* times, uint4* sink) {
    __syncthreads();
    const u64 t0 = probe_now();
    const u64 stride = (u64)blocks * blockDim.x;
    uint4 acc = make_uint4(0, 0, 0, 0);
    if (write) {
        const uint4 w = make_uint4(threadIdx.x, block, 1, 2);
        for (u64 v = (u64)block * blockDim.x + threadIdx.x; v < nvec; v += stride)
            asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};"
                         :: "l"(buf + v), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w) : "memory");
        __threadfence_system();
    } else {
        for (u64 v = (u64)block * blockDim.x + threadIdx.x; v < nvec; v += stride) {
            const uint4 x = probe_ld4_as(buf + v, flavor);
            acc.x ^= x.x; acc.y ^= x.y; acc.z ^= x.z; acc.w ^= x.w;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        times[2 * blockIdx.x] = t0;
        times[2 * blockIdx.x + 1] = probe_now();
    }
    if (acc.x == 0x9e3779b9u) sink[0] = acc;
}

// The whole grid moves `buf` (probe_move).
extern "C" __global__ void host_probe_move(uint4* buf, u64 nvec, int write, u64* times, uint4* sink, int flavor) {
    probe_move(buf, nvec, write, flavor, blockIdx.x, gridDim.x, times, sink);
}

// Two moves at once, as the two ranks of an all-reduce on one GPU share its link: the first
// `first_blocks` blocks of the grid move `buf_a` (write_a), the others `buf_b` (write_b),
// each part as host_probe_move would with its blocks alone.
extern "C" __global__ void host_probe_move_pair(uint4* buf_a, uint4* buf_b, u64 nvec, int write_a, int write_b,
                                                u64* times, uint4* sink, int flavor, unsigned first_blocks) {
    const unsigned second = blockIdx.x >= first_blocks;
    probe_move(second ? buf_b : buf_a, nvec, second ? write_b : write_a, flavor, blockIdx.x - second * first_blocks,
               second ? gridDim.x - first_blocks : first_blocks, times, sink);
}

// A flag bounced between two kernels (two GPUs, or two streams of one) through host memory,
// `rounds` times: the side with first != 0 writes round r into `out` and waits to see r in
// `in`; the other waits for r in `in` and writes it back into `out`. With `fence`, each
// write is followed by a system-scope fence; without, the write is left to travel on its
// own, as the all-reduce kernels' pushes are. Round r uses the flags of page r % pages
// (pages `page_words` words apart): one page, or a new page each round as rotating
// mailboxes touch. times[0] = ns for all rounds on each side; a wait that lasts past
// `limit_ns` stops with times[1] = the round it gave up in (0: none).
extern "C" __global__ void host_probe_pingpong(u64* out, const u64* in, u64 rounds, int first, u64 limit_ns,
                                               int fence, u64 pages, u64 page_words, u64* times) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    times[1] = 0;
    const u64 t0 = probe_now();
    for (u64 r = 1; r <= rounds; ++r) {
        const u64 at = (r % pages) * page_words;
        if (first) probe_st_as(out + at, r, fence);
        while (probe_ld(in + at) != r) {
            if (probe_now() - t0 > limit_ns) {
                times[1] = r;
                times[0] = probe_now() - t0;
                return;
            }
        }
        if (!first) probe_st_as(out + at, r, fence);
    }
    times[0] = probe_now() - t0;
}

// One block stores `nvec` 16-byte vectors into `wbuf` (host or device memory), with a
// system fence after them if `fence`; then thread 0 loads the host word at `probe`.
// times[0] = the load's ns, times[1] = ns from the first store to the load, times[2] = the
// word loaded: the store of it waits for the load, and the clock is read after that store.
// If reads wait for a GPU's earlier writes to host memory (PCIe orders a read behind the
// posted writes before it), the load grows with the bytes written.
extern "C" __global__ void host_probe_load_after_writes(uint4* wbuf, u64 nvec, int fence, const u64* probe,
                                                        u64* times) {
    __syncthreads();
    const u64 t0 = probe_now();
    for (u64 v = threadIdx.x; v < nvec; v += blockDim.x)
        asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};"
                     :: "l"(wbuf + v), "r"(threadIdx.x), "r"(3u), "r"(1u), "r"(2u) : "memory");
    if (fence) __threadfence_system();
    __syncthreads();
    if (threadIdx.x != 0) return;
    const u64 t1 = probe_now();
    const u64 x = probe_ld(probe);
    probe_st(times + 2, x);
    const u64 t2 = probe_now();
    times[0] = t2 - t1;
    times[1] = t1 - t0;
}

// One thread issues K independent 16-byte loads of `flavor` (probe_ld4_as) from `buf`,
// `pitch` vectors apart (a line and a page of their own each), all before it uses any:
// times[0] = ns from the first issue until every value is in. If the loads complete one
// after another, it grows by a round trip per load; in flight together, by little.
template <int K>
__device__ __forceinline__ void probe_burst(const uint4* buf, u64 pitch, int flavor, u64* times, uint4* sink) {
    uint4 x[K];
    const u64 t0 = probe_now();
#pragma unroll
    for (int i = 0; i < K; ++i) x[i] = probe_ld4_as(buf + i * pitch, flavor);
    uint4 acc = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < K; ++i) {
        acc.x ^= x[i].x; acc.y ^= x[i].y; acc.z ^= x[i].z; acc.w ^= x[i].w;
    }
    // The store of the result waits for every load; the clock is read after it.
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};"
                 :: "l"(sink), "r"(acc.x), "r"(acc.y), "r"(acc.z), "r"(acc.w) : "memory");
    times[0] = probe_now() - t0;
}

extern "C" __global__ void host_probe_burst(const uint4* buf, u64 k, u64 pitch, int flavor, u64* times, uint4* sink) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    switch (k) {
    case 1: probe_burst<1>(buf, pitch, flavor, times, sink); break;
    case 2: probe_burst<2>(buf, pitch, flavor, times, sink); break;
    case 4: probe_burst<4>(buf, pitch, flavor, times, sink); break;
    default: probe_burst<8>(buf, pitch, flavor, times, sink); break;
    }
}

// Waits until `in` (copy i at in + i * 16 where `spread`, else one word) holds r, with K
// polls in flight at once: issued `gap` clock cycles apart and each issued again as soon as
// it returns, so that a flag is seen about a K-th of a round trip after it lands instead of
// up to a whole one. False when `limit_ns` from t0 passed first.
template <int K>
__device__ __forceinline__ bool probe_wait_staggered(const u64* in, u64 r, int spread, u64 gap, u64 t0,
                                                     u64 limit_ns) {
    u64 x[K];
#pragma unroll
    for (int i = 0; i < K; ++i) {
        x[i] = probe_ld(in + (spread ? i * 16 : 0));
        const u64 c0 = clock64();
        if (i + 1 < K)
            while (clock64() - c0 < gap) {
            }
    }
    while (true) {
#pragma unroll
        for (int i = 0; i < K; ++i) {
            if (x[i] == r) return true;
            x[i] = probe_ld(in + (spread ? i * 16 : 0));
        }
        if (probe_now() - t0 > limit_ns) return false;
    }
}

// host_probe_pingpong, one page, stores of `store` (probe_st_as; a fence once after every
// copy), with K = k polls in flight (probe_wait_staggered) and, with `spread`, K copies of
// the flag, a line each, all written by the sender.
__device__ __forceinline__ void probe_put_copies(u64* out, u64 r, int copies, int store) {
    for (int i = 0; i < copies; ++i) probe_st_as(out + i * 16, r, store & 2);
    if (store & 1) __threadfence_system();
}

template <int K>
__device__ void probe_pingpong_staggered(u64* out, const u64* in, u64 rounds, int first, u64 limit_ns, int spread,
                                         u64 gap, int store, u64* times) {
    times[1] = 0;
    const int copies = spread ? K : 1;
    const u64 t0 = probe_now();
    for (u64 r = 1; r <= rounds; ++r) {
        if (first) probe_put_copies(out, r, copies, store);
        if (!probe_wait_staggered<K>(in, r, spread, gap, t0, limit_ns)) {
            times[1] = r;
            times[0] = probe_now() - t0;
            return;
        }
        if (!first) probe_put_copies(out, r, copies, store);
    }
    times[0] = probe_now() - t0;
}

extern "C" __global__ void host_probe_pingpong_staggered(u64* out, const u64* in, u64 rounds, int first,
                                                         u64 limit_ns, u64 k, int spread, u64 gap, int store,
                                                         u64* times) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    switch (k) {
    case 1: probe_pingpong_staggered<1>(out, in, rounds, first, limit_ns, spread, gap, store, times); break;
    case 2: probe_pingpong_staggered<2>(out, in, rounds, first, limit_ns, spread, gap, store, times); break;
    case 3: probe_pingpong_staggered<3>(out, in, rounds, first, limit_ns, spread, gap, store, times); break;
    case 4: probe_pingpong_staggered<4>(out, in, rounds, first, limit_ns, spread, gap, store, times); break;
    default: probe_pingpong_staggered<8>(out, in, rounds, first, limit_ns, spread, gap, store, times); break;
    }
}
