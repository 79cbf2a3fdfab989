// ipc_allreduce.cu: the all-reduce kernels of comm-ipc (CUDA-IPC custom all-reduce).
//
// Every rank owns one registered region (cuMemAlloc, shared through CUDA IPC). Its layout,
// mirrored by comm_ipc::layout (keep the two in step):
//
//   [0, 8 KiB)        IpcSignal: barrier flags that PEERS store into (two sets)
//   [8 KiB, 16 KiB)   IpcState: this rank's own bookkeeping (call counter, Lamport sizes)
//   off_data          2 x cap: eager input copies for the pull algorithms (by call parity)
//   off_tmp           cap: two-shot pull's reduced slice
//   off_push          3 x n x cap: one-shot push mailboxes [buffer][sender]
//   off_recv          3 x n x slice_cap: two-shot push slice mailboxes [buffer][sender]
//   off_result        3 x cap: two-shot push result mailboxes [buffer]
//
// Why it is built this way:
// - Graph replay: nothing that changes from call to call is a kernel argument. The call
//   counter (which selects data parity, Lamport buffer and barrier values) lives in
//   IpcState on the device; every block reads it at start, and the last block to finish
//   (a local atomic, never a peer atomic) advances it.
// - Barriers without peer atomics: block b of rank r stores the value 2*seq+phase+1 with
//   st.release.sys into slot [phase][b][r] of every peer's IpcSignal, and thread p waits
//   with ld.acquire.sys on its own slot [phase][b][p], then __syncthreads. The values only
//   grow (compared by signed difference, so wrapping is harmless), and the two phases use
//   two slot sets, so a fast peer's next barrier never overwrites a value still awaited.
//   Every block reads only data that the same-numbered block of each peer wrote before
//   its release (identical partitions on every rank), so the per-block flag covers it.
// - Lamport push: receivers' mailboxes hold the sentinel (all bits set: a NaN in f32,
//   f16 and bf16 alike, so one memset(0xff) resets any dtype); writers never store it
//   (an input NaN with that exact payload is sent as the canonical quiet NaN: NaN stays
//   NaN, and unlike the -0.0 sentinel no ordinary value changes); readers poll with
//   volatile 16-byte loads until no element holds it, comparing bits. Three buffers
//   rotate: peers may be writing buffer seq%3 (this call) or (seq+1)%3 (their next call,
//   once they have all of this rank's data), never (seq+2)%3, which each call resets at
//   its end (sizes of the call that used it are in IpcState).
// - Determinism: every element is reduced in rank order 0..n-1 in f32 by exactly one code
//   path (one-shot: every rank; two-shot: the slice's owner, whose result everyone
//   copies), so all ranks hold bitwise-identical results.
// - Bounded spins: every wait reads %globaltimer and gives up after timeout_ns, records
//   the failure in host-mapped memory (status) and in IpcState.abort (so that the other
//   blocks stop waiting too), and returns; the host turns that into Error::Timeout.
#include "comm_dtypes.cuh"

#define IPC_MAX_RANKS 8
#define IPC_MAX_BLOCKS 128
#define IPC_MAX_THREADS 512
#define IPC_STATE_OFFSET 8192

// Status codes in status[0] (comm_ipc::status mirrors them).
#define IPC_OK 0
#define IPC_TIMEOUT_BARRIER 1
#define IPC_TIMEOUT_PUSH 2

// Lamport mailbox kinds (index of IpcState::used).
#define IPC_MB_ONESHOT 0
#define IPC_MB_RECV 1
#define IPC_MB_RESULT 2

struct IpcSignal {
    uint32_t flags[2][IPC_MAX_BLOCKS][IPC_MAX_RANKS];
};

struct IpcState {
    uint32_t seq;    // calls completed by this rank
    uint32_t done;   // blocks of the running call that have finished
    uint32_t abort;  // set by a block that timed out, so that the others stop waiting
    uint32_t pad;
    uint64_t used[3][3];  // [mailbox kind][buffer]: bytes per sender slot written by that call
};

struct IpcTable {
    char* ptr[IPC_MAX_RANKS];
};

// Kernel arguments, passed by value; comm_ipc::launch::KernelArgs is the same #[repr(C)].
struct IpcArgs {
    const char* input;        // this rank's input (user memory)
    char* output;             // this rank's output (may equal input)
    const IpcTable* regions;  // every rank's region, as mapped in this process
    const IpcTable* inputs;   // zero-copy: every rank's registered input buffer; else null
    uint32_t* status;         // host-mapped: [code, rank, phase, peer]
    uint64_t in_off;          // zero-copy: byte offset of the input in its registered buffer
    uint64_t count;           // elements
    uint64_t cap;             // bytes of one message slot (a multiple of 16)
    uint64_t slice_cap;       // bytes of one two-shot push slice slot (a multiple of 16)
    uint64_t off_data, off_tmp, off_push, off_recv, off_result;
    uint64_t timeout_ns;
    uint32_t rank;
    uint32_t world;
    uint32_t aligned;    // input and output are 16-byte aligned
    uint32_t gpu_scope;  // every rank is on this device: barriers need only .gpu scope
};

// ---------------------------------------------------------------------------------------
// Memory-model helpers (PTX: sm_70+).

// System scope where peers are other GPUs; GPU scope (cheaper fences) where every rank
// runs on this device (virtual ranks, or processes sharing one GPU).
__device__ __forceinline__ void ipc_st_release(uint32_t* p, uint32_t v, bool gpu) {
    if (gpu) asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
    else asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ipc_ld_acquire(const uint32_t* p, bool gpu) {
    uint32_t v;
    if (gpu) asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    else asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint4 ipc_ld_volatile(const uint4* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ void ipc_st_volatile(uint4* p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

// Peer data after a barrier: cached in L2 only, so no stale L1 line can be returned.
__device__ __forceinline__ uint4 ipc_ld_cg(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint64_t ipc_now() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ---------------------------------------------------------------------------------------
// Element packing: 16 bytes hold 4 f32 or 8 f16/bf16; arithmetic is always f32.

template <int DT> struct IpcDt;
template <> struct IpcDt<COMM_F32> {
    static constexpr int VEC = 4;
    static constexpr int SIZE = 4;
};
template <> struct IpcDt<COMM_F16> {
    static constexpr int VEC = 8;
    static constexpr int SIZE = 2;
};
template <> struct IpcDt<COMM_BF16> {
    static constexpr int VEC = 8;
    static constexpr int SIZE = 2;
};

template <int DT> __device__ __forceinline__ float ipc_to_f(uint32_t bits) {
    if constexpr (DT == COMM_F32) return __uint_as_float(bits);
    else if constexpr (DT == COMM_F16) return comm_f16_to_float((uint16_t)bits);
    else return comm_bf16_to_float((uint16_t)bits);
}

template <int DT> __device__ __forceinline__ uint32_t ipc_from_f(float f) {
    if constexpr (DT == COMM_F32) return __float_as_uint(f);
    else if constexpr (DT == COMM_F16) return comm_float_to_f16(f);
    else return comm_float_to_bf16(f);
}

__device__ __forceinline__ uint32_t ipc_word(const uint4& w, int i) {
    return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}

template <int DT> __device__ __forceinline__ void ipc_unpack(const uint4& w, float* f) {
    if constexpr (IpcDt<DT>::SIZE == 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) f[i] = ipc_to_f<DT>(ipc_word(w, i));
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t x = ipc_word(w, i);
            f[2 * i] = ipc_to_f<DT>(x & 0xffffu);
            f[2 * i + 1] = ipc_to_f<DT>(x >> 16);
        }
    }
}

template <int DT> __device__ __forceinline__ uint4 ipc_pack(const float* f) {
    uint32_t w[4];
    if constexpr (IpcDt<DT>::SIZE == 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = ipc_from_f<DT>(f[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = ipc_from_f<DT>(f[2 * i]) | (ipc_from_f<DT>(f[2 * i + 1]) << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The sentinel is all bits set, element by element.
template <int DT> __device__ __forceinline__ bool ipc_has_sentinel(const uint4& w) {
    if constexpr (IpcDt<DT>::SIZE == 4) {
        return w.x == 0xffffffffu || w.y == 0xffffffffu || w.z == 0xffffffffu || w.w == 0xffffffffu;
    } else {
        bool any = false;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t x = ipc_word(w, i);
            any |= (x & 0xffffu) == 0xffffu || (x >> 16) == 0xffffu;
        }
        return any;
    }
}

template <int DT> __device__ __forceinline__ uint32_t ipc_clean(uint32_t x) {
    if constexpr (IpcDt<DT>::SIZE == 4) {
        return x == 0xffffffffu ? 0x7fc00000u : x;
    } else {
        const uint32_t qnan = DT == COMM_F16 ? 0x7e00u : 0x7fc0u;
        uint32_t lo = x & 0xffffu, hi = x >> 16;
        if (lo == 0xffffu) lo = qnan;
        if (hi == 0xffffu) hi = qnan;
        return lo | (hi << 16);
    }
}

// Replaces every sentinel element by the canonical quiet NaN.
template <int DT> __device__ __forceinline__ uint4 ipc_sanitize(uint4 w) {
    return make_uint4(ipc_clean<DT>(w.x), ipc_clean<DT>(w.y), ipc_clean<DT>(w.z), ipc_clean<DT>(w.w));
}

template <int OP> __device__ __forceinline__ float ipc_combine(float a, float b) {
    if constexpr (OP == COMM_MAX) return fmaxf(a, b);
    else if constexpr (OP == COMM_MIN) return fminf(a, b);
    else return a + b;
}

// User memory: vector access where aligned and whole, element by element otherwise.
// Lanes past `count` read as 0 (never the sentinel) and are never written.
template <int DT>
__device__ __forceinline__ uint4 ipc_load_user(const char* base, uint64_t v, uint64_t count, bool aligned) {
    constexpr int VEC = IpcDt<DT>::VEC;
    if (aligned && (v + 1) * VEC <= count) return *reinterpret_cast<const uint4*>(base + v * 16);
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        uint64_t idx = v * VEC + e;
        if (idx < count) {
            if constexpr (IpcDt<DT>::SIZE == 4) {
                w[e] = reinterpret_cast<const uint32_t*>(base)[idx];
            } else {
                uint32_t h = reinterpret_cast<const uint16_t*>(base)[idx];
                w[e / 2] |= h << (16 * (e % 2));
            }
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int DT>
__device__ __forceinline__ void ipc_store_user(char* base, uint64_t v, uint64_t count, bool aligned, uint4 val) {
    constexpr int VEC = IpcDt<DT>::VEC;
    if (aligned && (v + 1) * VEC <= count) {
        *reinterpret_cast<uint4*>(base + v * 16) = val;
        return;
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        uint64_t idx = v * VEC + e;
        if (idx < count) {
            if constexpr (IpcDt<DT>::SIZE == 4) {
                reinterpret_cast<uint32_t*>(base)[idx] = ipc_word(val, e);
            } else {
                reinterpret_cast<uint16_t*>(base)[idx] = (uint16_t)(ipc_word(val, e / 2) >> (16 * (e % 2)));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Per-block context: the tables copied to shared memory, the call number, the abort flag.

struct IpcCtx {
    char* const* region;  // shared: region[p]
    const char* const* input;  // shared: zero-copy input of rank p (offset applied), or null
    IpcState* state;
    volatile int* dead;  // shared: set once this block gave up
    uint32_t seq;
};

__device__ void ipc_fail(const IpcArgs& a, const IpcCtx& c, uint32_t code, uint32_t phase, uint32_t peer) {
    *c.dead = 1;
    volatile uint32_t* abort = &c.state->abort;
    *abort = 1;
    volatile uint32_t* s = a.status;
    if (s[0] == IPC_OK) {
        s[1] = a.rank;
        s[2] = phase;
        s[3] = peer;
        __threadfence_system();
        s[0] = code;
    }
    __threadfence_system();
}

// True when this thread should stop waiting: this block or another gave up, or too long.
__device__ __forceinline__ bool ipc_give_up(const IpcArgs& a, const IpcCtx& c, uint64_t start, uint32_t& spins,
                                            uint32_t code, uint32_t phase, uint32_t peer) {
    if (*c.dead) return true;
    if ((++spins & 255) == 0) {
        if (*(volatile uint32_t*)&c.state->abort) {
            *c.dead = 1;
            return true;
        }
        if (ipc_now() - start > a.timeout_ns) {
            ipc_fail(a, c, code, phase, peer);
            return true;
        }
    }
    return false;
}

// The flag barrier of this block with the same-numbered block of every rank (see top).
// Returns false when the block must give up.
__device__ bool ipc_barrier(const IpcArgs& a, const IpcCtx& c, uint32_t phase) {
    __syncthreads();
    const uint32_t value = 2u * c.seq + phase + 1u;
    const uint32_t p = threadIdx.x;
    if (p < a.world && !*c.dead) {
        IpcSignal* peer = reinterpret_cast<IpcSignal*>(c.region[p]);
        ipc_st_release(&peer->flags[phase][blockIdx.x][a.rank], value, a.gpu_scope != 0);
        IpcSignal* mine = reinterpret_cast<IpcSignal*>(c.region[a.rank]);
        const uint32_t* slot = &mine->flags[phase][blockIdx.x][p];
        uint64_t start = ipc_now();
        uint32_t spins = 0;
        while ((int32_t)(ipc_ld_acquire(slot, a.gpu_scope != 0) - value) < 0) {
            if (ipc_give_up(a, c, start, spins, IPC_TIMEOUT_BARRIER, phase, p)) break;
        }
    }
    __syncthreads();
    return !*c.dead;
}

// Fills w[p] with vector v of every sender p's slot (slot p at src + p * stride), waiting
// until none holds the sentinel; w[skip] = own.
template <int DT>
__device__ __forceinline__ void ipc_poll(const IpcArgs& a, const IpcCtx& c, const char* src, uint64_t stride,
                                         uint32_t skip, uint4 own, uint64_t v, uint4* w, uint32_t phase) {
    uint32_t pending = 0;
#pragma unroll
    for (int p = 0; p < IPC_MAX_RANKS; ++p) {
        if (p == (int)skip) {
            w[p] = own;  // this rank's own contribution (a compile-time index keeps w in registers)
        } else if (p < (int)a.world) {
            w[p] = ipc_ld_volatile(reinterpret_cast<const uint4*>(src + p * stride) + v);
            if (ipc_has_sentinel<DT>(w[p])) pending |= 1u << p;
        }
    }
    if (!pending) return;
    uint64_t start = ipc_now();
    uint32_t spins = 0;
    while (pending) {
#pragma unroll
        for (int p = 0; p < IPC_MAX_RANKS; ++p) {
            if (pending & (1u << p)) {
                w[p] = ipc_ld_volatile(reinterpret_cast<const uint4*>(src + p * stride) + v);
                if (!ipc_has_sentinel<DT>(w[p])) pending &= ~(1u << p);
            }
        }
        if (pending && ipc_give_up(a, c, start, spins, IPC_TIMEOUT_PUSH, phase, __ffs(pending) - 1)) return;
    }
}

// Waits until the vector at `src` holds no sentinel (a result pushed by rank `peer`).
template <int DT>
__device__ __forceinline__ uint4 ipc_poll1(const IpcArgs& a, const IpcCtx& c, const uint4* src, uint32_t peer) {
    uint4 w = ipc_ld_volatile(src);
    if (!ipc_has_sentinel<DT>(w)) return w;
    uint64_t start = ipc_now();
    uint32_t spins = 0;
    do {
        if (ipc_give_up(a, c, start, spins, IPC_TIMEOUT_PUSH, 1, peer)) break;
        w = ipc_ld_volatile(src);
    } while (ipc_has_sentinel<DT>(w));
    return w;
}

// Reduces w[0..world) in rank order.
template <int DT, int OP> __device__ __forceinline__ uint4 ipc_reduce(const IpcArgs& a, const uint4* w) {
    constexpr int VEC = IpcDt<DT>::VEC;
    float acc[VEC], x[VEC];
    ipc_unpack<DT>(w[0], acc);
#pragma unroll
    for (int p = 1; p < IPC_MAX_RANKS; ++p) {
        if (p < (int)a.world) {
            ipc_unpack<DT>(w[p], x);
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] = ipc_combine<OP>(acc[e], x[e]);
        }
    }
    if constexpr (OP == COMM_AVG) {
        const float n = (float)a.world;
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = acc[e] / n;
    }
    return ipc_pack<DT>(acc);
}

__device__ __forceinline__ uint64_t ipc_tid() { return (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ uint64_t ipc_stride() { return (uint64_t)gridDim.x * blockDim.x; }

// dst(i) = src(i) for i in [0, n), grid-stride, four loads in flight per thread (a copy is
// otherwise one dependent load-store pair at a time, too few bytes in flight for HBM).
// Thread t handles exactly the i = t (mod threads in grid) of a plain grid-stride loop, so
// the per-block barrier pairing is unchanged.
template <typename Load, typename Store>
__device__ __forceinline__ void ipc_copy(uint64_t n, Load load, Store store) {
    const uint64_t stride = ipc_stride();
    uint64_t i = ipc_tid();
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 w0 = load(i), w1 = load(i + stride), w2 = load(i + 2 * stride), w3 = load(i + 3 * stride);
        store(i, w0);
        store(i + stride, w1);
        store(i + 2 * stride, w2);
        store(i + 3 * stride, w3);
    }
    for (; i < n; i += stride) store(i, load(i));
}

// ---------------------------------------------------------------------------------------
// The four algorithms. `nvec` = 16-byte vectors of the message.

// oneshot-pull: (eager) copy the input into this rank's data buffer of this call's parity;
// barrier; every rank reads every rank's vector and reduces. Eager needs no end barrier:
// the other parity was last read in the previous call, which every peer finished before
// it entered this call's barrier. Zero-copy reads the peers' own buffers, so it ends with
// a barrier before they may be written again.
template <int DT, int OP> __device__ void ipc_oneshot_pull(const IpcArgs& a, const IpcCtx& c, uint64_t nvec) {
    const bool zc = c.input[0] != nullptr;
    const uint64_t dbuf = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const bool aligned = a.aligned != 0;
    if (!zc) {
        uint4* mine = reinterpret_cast<uint4*>(c.region[a.rank] + dbuf);
        ipc_copy(
            nvec, [&](uint64_t v) { return ipc_load_user<DT>(a.input, v, a.count, aligned); },
            [&](uint64_t v, uint4 w) { mine[v] = w; });
    }
    if (!ipc_barrier(a, c, 0)) return;
    for (uint64_t v = ipc_tid(); v < nvec; v += ipc_stride()) {
        uint4 w[IPC_MAX_RANKS];
#pragma unroll
        for (int p = 0; p < IPC_MAX_RANKS; ++p) {
            if (p < (int)a.world) {
                w[p] = zc ? ipc_load_user<DT>(c.input[p], v, a.count, aligned)
                          : ipc_ld_cg(reinterpret_cast<const uint4*>(c.region[p] + dbuf) + v);
            }
        }
        ipc_store_user<DT>(a.output, v, a.count, aligned, ipc_reduce<DT, OP>(a, w));
    }
    if (zc) ipc_barrier(a, c, 1);
}

// twoshot-pull: (eager) copy; barrier; reduce-scatter (rank r reduces slice r from every
// rank, into its tmp); barrier; all-gather (every rank copies slice s from rank s's tmp).
// Every block handles the same offsets inside every slice in all three steps, so each
// per-block barrier covers what the block reads next. Inputs are read before the second
// barrier only, so zero-copy needs no third barrier (and in place is safe).
template <int DT, int OP> __device__ void ipc_twoshot_pull(const IpcArgs& a, const IpcCtx& c, uint64_t nvec) {
    const bool zc = c.input[0] != nullptr;
    const uint64_t dbuf = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const bool aligned = a.aligned != 0;
    const uint64_t S = (nvec + a.world - 1) / a.world;
    const uint32_t me = a.rank;
    if (!zc) {
        uint4* mine = reinterpret_cast<uint4*>(c.region[me] + dbuf);
        for (uint32_t s = 0; s < a.world; ++s) {
            const uint64_t first = s * S;
            const uint64_t n = first >= nvec ? 0 : (nvec - first < S ? nvec - first : S);
            ipc_copy(
                n, [&](uint64_t i) { return ipc_load_user<DT>(a.input, first + i, a.count, aligned); },
                [&](uint64_t i, uint4 w) { mine[first + i] = w; });
        }
    }
    if (!ipc_barrier(a, c, 0)) return;
    uint4* tmp = reinterpret_cast<uint4*>(c.region[me] + a.off_tmp);
    for (uint64_t i = ipc_tid(); i < S && me * S + i < nvec; i += ipc_stride()) {
        const uint64_t v = me * S + i;
        uint4 w[IPC_MAX_RANKS];
#pragma unroll
        for (int p = 0; p < IPC_MAX_RANKS; ++p) {
            if (p < (int)a.world) {
                w[p] = zc ? ipc_load_user<DT>(c.input[p], v, a.count, aligned)
                          : ipc_ld_cg(reinterpret_cast<const uint4*>(c.region[p] + dbuf) + v);
            }
        }
        tmp[i] = ipc_reduce<DT, OP>(a, w);
    }
    if (!ipc_barrier(a, c, 1)) return;
    for (uint32_t k = 0; k < a.world; ++k) {
        // Start with the next rank's slice, so that the ranks do not all read rank 0 first.
        const uint32_t s = (me + k) % a.world;
        const uint4* src = reinterpret_cast<const uint4*>(c.region[s] + a.off_tmp);
        const uint64_t first = s * S;
        const uint64_t n = first >= nvec ? 0 : (nvec - first < S ? nvec - first : S);
        ipc_copy(
            n, [&](uint64_t i) { return ipc_ld_cg(src + i); },
            [&](uint64_t i, uint4 w) { ipc_store_user<DT>(a.output, first + i, a.count, aligned, w); });
    }
}

// oneshot-push (Lamport): write the input into this rank's slot of every peer's mailbox;
// then wait for every peer's slot of this rank's mailbox and reduce. No barrier.
template <int DT, int OP> __device__ void ipc_oneshot_push(const IpcArgs& a, const IpcCtx& c, uint64_t nvec) {
    const bool aligned = a.aligned != 0;
    const uint32_t me = a.rank, buf = c.seq % 3u;
    const uint64_t slot0 = a.off_push + (uint64_t)buf * a.world * a.cap;
    for (uint64_t v = ipc_tid(); v < nvec; v += ipc_stride()) {
        const uint4 w = ipc_sanitize<DT>(ipc_load_user<DT>(a.input, v, a.count, aligned));
        for (uint32_t k = 1; k < a.world; ++k) {
            const uint32_t p = (me + k) % a.world;
            ipc_st_volatile(reinterpret_cast<uint4*>(c.region[p] + slot0 + me * a.cap) + v, w);
        }
    }
    const char* inbox = c.region[me] + slot0;
    for (uint64_t v = ipc_tid(); v < nvec; v += ipc_stride()) {
        uint4 w[IPC_MAX_RANKS];
        const uint4 own = ipc_sanitize<DT>(ipc_load_user<DT>(a.input, v, a.count, aligned));
        ipc_poll<DT>(a, c, inbox, a.cap, me, own, v, w, 0);
        if (*c.dead) return;
        ipc_store_user<DT>(a.output, v, a.count, aligned, ipc_reduce<DT, OP>(a, w));
    }
}

// twoshot-push (Lamport): push slice s of the input into rank s's slice mailbox; reduce
// this rank's slice from every rank's contribution (rank order); push the result into
// every peer's result mailbox; wait for the other slices' results.
template <int DT, int OP> __device__ void ipc_twoshot_push(const IpcArgs& a, const IpcCtx& c, uint64_t nvec) {
    const bool aligned = a.aligned != 0;
    const uint32_t me = a.rank, buf = c.seq % 3u;
    const uint64_t S = (nvec + a.world - 1) / a.world;
    const uint64_t recv0 = a.off_recv + (uint64_t)buf * a.world * a.slice_cap;
    const uint64_t result0 = a.off_result + (uint64_t)buf * a.cap;
    for (uint32_t k = 1; k < a.world; ++k) {
        const uint32_t s = (me + k) % a.world;
        uint4* dst = reinterpret_cast<uint4*>(c.region[s] + recv0 + me * a.slice_cap);
        for (uint64_t i = ipc_tid(); i < S && s * S + i < nvec; i += ipc_stride())
            ipc_st_volatile(dst + i, ipc_sanitize<DT>(ipc_load_user<DT>(a.input, s * S + i, a.count, aligned)));
    }
    const char* inbox = c.region[me] + recv0;
    for (uint64_t i = ipc_tid(); i < S && me * S + i < nvec; i += ipc_stride()) {
        const uint64_t v = me * S + i;
        uint4 w[IPC_MAX_RANKS];
        const uint4 own = ipc_sanitize<DT>(ipc_load_user<DT>(a.input, v, a.count, aligned));
        ipc_poll<DT>(a, c, inbox, a.slice_cap, me, own, i, w, 0);
        if (*c.dead) return;
        const uint4 r = ipc_sanitize<DT>(ipc_reduce<DT, OP>(a, w));
        for (uint32_t k = 1; k < a.world; ++k) {
            const uint32_t p = (me + k) % a.world;
            ipc_st_volatile(reinterpret_cast<uint4*>(c.region[p] + result0) + v, r);
        }
        ipc_store_user<DT>(a.output, v, a.count, aligned, r);
    }
    const char* results = c.region[me] + result0;
    for (uint32_t k = 1; k < a.world; ++k) {
        const uint32_t s = (me + k) % a.world;
        for (uint64_t i = ipc_tid(); i < S && s * S + i < nvec; i += ipc_stride()) {
            const uint4 w = ipc_poll1<DT>(a, c, reinterpret_cast<const uint4*>(results) + s * S + i, s);
            if (*c.dead) return;
            ipc_store_user<DT>(a.output, s * S + i, a.count, aligned, w);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Entry: prologue (tables, call number), the algorithm, epilogue (Lamport resets, the
// call counter).

#define IPC_ONESHOT_PULL 0
#define IPC_TWOSHOT_PULL 1
#define IPC_ONESHOT_PUSH 2
#define IPC_TWOSHOT_PUSH 3

// Resets (to the sentinel) the mailboxes of buffer (seq+2)%3, as far as the call that used
// them wrote, and records what this call writes into buffer seq%3.
__device__ void ipc_lamport_housekeeping(const IpcArgs& a, const IpcCtx& c, int algo, uint64_t nvec) {
    const uint32_t old = (c.seq + 2u) % 3u, cur = c.seq % 3u;
    char* base = c.region[a.rank];
    const uint4 ones = make_uint4(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
    const uint64_t used_one = c.state->used[IPC_MB_ONESHOT][old] / 16;
    const uint64_t used_recv = c.state->used[IPC_MB_RECV][old] / 16;
    const uint64_t used_res = c.state->used[IPC_MB_RESULT][old] / 16;
    for (uint32_t p = 0; p < a.world; ++p) {
        uint4* one = reinterpret_cast<uint4*>(base + a.off_push + ((uint64_t)old * a.world + p) * a.cap);
        for (uint64_t v = ipc_tid(); v < used_one; v += ipc_stride()) one[v] = ones;
        uint4* recv = reinterpret_cast<uint4*>(base + a.off_recv + ((uint64_t)old * a.world + p) * a.slice_cap);
        for (uint64_t v = ipc_tid(); v < used_recv; v += ipc_stride()) recv[v] = ones;
    }
    uint4* res = reinterpret_cast<uint4*>(base + a.off_result + (uint64_t)old * a.cap);
    for (uint64_t v = ipc_tid(); v < used_res; v += ipc_stride()) res[v] = ones;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const uint64_t S = (nvec + a.world - 1) / a.world;
        c.state->used[IPC_MB_ONESHOT][cur] = algo == IPC_ONESHOT_PUSH ? nvec * 16 : 0;
        c.state->used[IPC_MB_RECV][cur] = algo == IPC_TWOSHOT_PUSH ? S * 16 : 0;
        c.state->used[IPC_MB_RESULT][cur] = algo == IPC_TWOSHOT_PUSH ? nvec * 16 : 0;
    }
}

template <int ALGO, int DT, int OP> __device__ void ipc_allreduce(const IpcArgs& a) {
    __shared__ char* s_region[IPC_MAX_RANKS];
    __shared__ const char* s_input[IPC_MAX_RANKS];
    __shared__ uint32_t s_seq;
    __shared__ int s_dead;
    IpcState* state = reinterpret_cast<IpcState*>(
        const_cast<char*>(a.regions->ptr[a.rank]) + IPC_STATE_OFFSET);
    if (threadIdx.x < IPC_MAX_RANKS) {
        const int p = threadIdx.x;
        s_region[p] = p < (int)a.world ? a.regions->ptr[p] : nullptr;
        s_input[p] = (a.inputs != nullptr && p < (int)a.world) ? a.inputs->ptr[p] + a.in_off : nullptr;
    }
    if (threadIdx.x == 0) {
        s_seq = *(volatile uint32_t*)&state->seq;
        s_dead = *(volatile uint32_t*)&state->abort ? 1 : 0;
    }
    __syncthreads();
    IpcCtx c{s_region, s_input, state, &s_dead, s_seq};
    if (*c.dead) return;
    const uint64_t nvec = (a.count + IpcDt<DT>::VEC - 1) / IpcDt<DT>::VEC;
    if constexpr (ALGO == IPC_ONESHOT_PULL) ipc_oneshot_pull<DT, OP>(a, c, nvec);
    else if constexpr (ALGO == IPC_TWOSHOT_PULL) ipc_twoshot_pull<DT, OP>(a, c, nvec);
    else if constexpr (ALGO == IPC_ONESHOT_PUSH) ipc_oneshot_push<DT, OP>(a, c, nvec);
    else ipc_twoshot_push<DT, OP>(a, c, nvec);
    if (*c.dead) return;
    ipc_lamport_housekeeping(a, c, ALGO, nvec);
    // The resets need no fence: peers write into that buffer only two calls later, after
    // kernel boundaries and after seeing data this rank sends in the next call.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const uint32_t finished = atomicAdd(&state->done, 1u);
        if (finished == gridDim.x - 1) {
            state->done = 0;
            *(volatile uint32_t*)&state->seq = c.seq + 1u;
            __threadfence();
        }
    }
}

#define IPC_KERNEL(ALGO, ANAME, DT, DNAME, OP, ONAME)                                                 \
    extern "C" __global__ void __launch_bounds__(IPC_MAX_THREADS) ipc_##ANAME##_##DNAME##_##ONAME(IpcArgs a) { \
        ipc_allreduce<ALGO, DT, OP>(a);                                                              \
    }
#define IPC_OPS(ALGO, ANAME, DT, DNAME)                   \
    IPC_KERNEL(ALGO, ANAME, DT, DNAME, COMM_SUM, sum)     \
    IPC_KERNEL(ALGO, ANAME, DT, DNAME, COMM_AVG, avg)     \
    IPC_KERNEL(ALGO, ANAME, DT, DNAME, COMM_MAX, max)     \
    IPC_KERNEL(ALGO, ANAME, DT, DNAME, COMM_MIN, min)
#define IPC_DTYPES(ALGO, ANAME)                    \
    IPC_OPS(ALGO, ANAME, COMM_F32, f32)            \
    IPC_OPS(ALGO, ANAME, COMM_F16, f16)            \
    IPC_OPS(ALGO, ANAME, COMM_BF16, bf16)

IPC_DTYPES(IPC_ONESHOT_PULL, oneshot_pull)
IPC_DTYPES(IPC_TWOSHOT_PULL, twoshot_pull)
IPC_DTYPES(IPC_ONESHOT_PUSH, oneshot_push)
IPC_DTYPES(IPC_TWOSHOT_PUSH, twoshot_push)
