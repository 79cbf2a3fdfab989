// peer_io.cuh: element packing and user-memory access of the peer-memory kernels.
// The crate prepends it (then peer_sync.cuh and peer_lamport.cuh) to peer_collectives.cu,
// so NVRTC needs no include path for it.
//
// Data moves in 16-byte vectors (4 f32 or 8 f16/bf16); arithmetic is always f32, so
// reduced-precision sums accumulate in f32. f16/bf16 travel as their bits and are
// converted by comm_dtypes.cuh (NVRTC ships no cuda_fp16.h / cuda_bf16.h).
#include "comm_dtypes.cuh"

template <int DT> struct PeerDt;
template <> struct PeerDt<COMM_F32> {
    static constexpr int VEC = 4;
    static constexpr int SIZE = 4;
};
template <> struct PeerDt<COMM_F16> {
    static constexpr int VEC = 8;
    static constexpr int SIZE = 2;
};
template <> struct PeerDt<COMM_BF16> {
    static constexpr int VEC = 8;
    static constexpr int SIZE = 2;
};

template <int DT> __device__ __forceinline__ float peer_to_f(uint32_t bits) {
    if constexpr (DT == COMM_F32) return __uint_as_float(bits);
    else if constexpr (DT == COMM_F16) return comm_f16_to_float((uint16_t)bits);
    else return comm_bf16_to_float((uint16_t)bits);
}

template <int DT> __device__ __forceinline__ uint32_t peer_from_f(float f) {
    if constexpr (DT == COMM_F32) return __float_as_uint(f);
    else if constexpr (DT == COMM_F16) return comm_float_to_f16(f);
    else return comm_float_to_bf16(f);
}

__device__ __forceinline__ uint32_t peer_word(const uint4& w, int i) {
    return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}

template <int DT> __device__ __forceinline__ void peer_unpack(const uint4& w, float* f) {
    if constexpr (PeerDt<DT>::SIZE == 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) f[i] = peer_to_f<DT>(peer_word(w, i));
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t x = peer_word(w, i);
            f[2 * i] = peer_to_f<DT>(x & 0xffffu);
            f[2 * i + 1] = peer_to_f<DT>(x >> 16);
        }
    }
}

template <int DT> __device__ __forceinline__ uint4 peer_pack(const float* f) {
    uint32_t w[4];
    if constexpr (PeerDt<DT>::SIZE == 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = peer_from_f<DT>(f[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = peer_from_f<DT>(f[2 * i]) | (peer_from_f<DT>(f[2 * i + 1]) << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The Lamport sentinel is all bits set, element by element: a NaN in f32, f16 and bf16
// alike, so one memset(0xff) resets a mailbox of any dtype. Compared as bits, never floats.
template <int DT> __device__ __forceinline__ bool peer_has_sentinel(const uint4& w) {
    if constexpr (PeerDt<DT>::SIZE == 4) {
        return w.x == 0xffffffffu || w.y == 0xffffffffu || w.z == 0xffffffffu || w.w == 0xffffffffu;
    } else {
        bool any = false;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t x = peer_word(w, i);
            any |= (x & 0xffffu) == 0xffffu || (x >> 16) == 0xffffu;
        }
        return any;
    }
}

template <int DT> __device__ __forceinline__ uint32_t peer_clean(uint32_t x) {
    if constexpr (PeerDt<DT>::SIZE == 4) {
        return x == 0xffffffffu ? 0x7fc00000u : x;
    } else {
        const uint32_t qnan = DT == COMM_F16 ? 0x7e00u : 0x7fc0u;
        uint32_t lo = x & 0xffffu, hi = x >> 16;
        if (lo == 0xffffu) lo = qnan;
        if (hi == 0xffffu) hi = qnan;
        return lo | (hi << 16);
    }
}

// Writers never store the sentinel: an input NaN with that exact payload is sent as the
// canonical quiet NaN (NaN stays NaN, and unlike a -0.0 sentinel no ordinary value changes).
template <int DT> __device__ __forceinline__ uint4 peer_sanitize(uint4 w) {
    return make_uint4(peer_clean<DT>(w.x), peer_clean<DT>(w.y), peer_clean<DT>(w.z), peer_clean<DT>(w.w));
}

template <int OP> __device__ __forceinline__ float peer_combine(float a, float b) {
    if constexpr (OP == COMM_MAX) return fmaxf(a, b);
    else if constexpr (OP == COMM_MIN) return fminf(a, b);
    else return a + b;
}

// User memory: vector access where aligned and whole, element by element otherwise.
// Lanes past `count` read as 0 (never the sentinel) and are never written.
template <int DT>
__device__ __forceinline__ uint4 peer_load_user(const char* base, uint64_t v, uint64_t count, bool aligned) {
    constexpr int VEC = PeerDt<DT>::VEC;
    if (aligned && (v + 1) * VEC <= count) return *reinterpret_cast<const uint4*>(base + v * 16);
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        const uint64_t idx = v * VEC + e;
        if (idx < count) {
            if constexpr (PeerDt<DT>::SIZE == 4) {
                w[e] = reinterpret_cast<const uint32_t*>(base)[idx];
            } else {
                const uint32_t h = reinterpret_cast<const uint16_t*>(base)[idx];
                w[e / 2] |= h << (16 * (e % 2));
            }
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int DT>
__device__ __forceinline__ void peer_store_user(char* base, uint64_t v, uint64_t count, bool aligned, uint4 val) {
    constexpr int VEC = PeerDt<DT>::VEC;
    if (aligned && (v + 1) * VEC <= count) {
        *reinterpret_cast<uint4*>(base + v * 16) = val;
        return;
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        const uint64_t idx = v * VEC + e;
        if (idx < count) {
            if constexpr (PeerDt<DT>::SIZE == 4) {
                reinterpret_cast<uint32_t*>(base)[idx] = peer_word(val, e);
            } else {
                reinterpret_cast<uint16_t*>(base)[idx] = (uint16_t)(peer_word(val, e / 2) >> (16 * (e % 2)));
            }
        }
    }
}

// Untyped user memory (gather, broadcast): vector v of `bytes`, byte by byte at the tail or
// where `base` is not 16-byte aligned.
__device__ __forceinline__ uint4 peer_load_bytes(const char* base, uint64_t v, uint64_t bytes, bool aligned) {
    if (aligned && (v + 1) * 16 <= bytes) return *reinterpret_cast<const uint4*>(base + v * 16);
    uint32_t w[4] = {0, 0, 0, 0};
    for (int b = 0; b < 16; ++b) {
        const uint64_t idx = v * 16 + b;
        if (idx < bytes) w[b / 4] |= (uint32_t)(uint8_t)base[idx] << (8 * (b % 4));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void peer_store_bytes(char* base, uint64_t v, uint64_t bytes, bool aligned, uint4 val) {
    if (aligned && (v + 1) * 16 <= bytes) {
        *reinterpret_cast<uint4*>(base + v * 16) = val;
        return;
    }
    for (int b = 0; b < 16; ++b) {
        const uint64_t idx = v * 16 + b;
        if (idx < bytes) base[idx] = (char)(uint8_t)(peer_word(val, b / 4) >> (8 * (b % 4)));
    }
}

__device__ __forceinline__ uint64_t peer_tid() { return (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ uint64_t peer_stride() { return (uint64_t)gridDim.x * blockDim.x; }

// dst(i) = src(i) for this thread's i in [start, n), in steps of `stride` from `start`,
// four loads in flight per thread (a copy is otherwise one dependent load-store pair at a
// time, too few bytes in flight for HBM).
template <typename Load, typename Store>
__device__ __forceinline__ void peer_copy_strided(uint64_t start, uint64_t n, uint64_t stride, Load load, Store store) {
    uint64_t i = start;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 w0 = load(i), w1 = load(i + stride), w2 = load(i + 2 * stride), w3 = load(i + 3 * stride);
        store(i, w0);
        store(i + stride, w1);
        store(i + 2 * stride, w2);
        store(i + 3 * stride, w3);
    }
    for (; i < n; i += stride) store(i, load(i));
}

// The same grid-stride from `start` (peer_tid(), or a later index of the thread's): thread
// t handles exactly the i = t (mod threads in grid) of a plain grid-stride loop, so the
// per-block barrier pairing is unchanged.
template <typename Load, typename Store>
__device__ __forceinline__ void peer_copy_from(uint64_t start, uint64_t n, Load load, Store store) {
    peer_copy_strided(start, n, peer_stride(), load, store);
}

template <typename Load, typename Store>
__device__ __forceinline__ void peer_copy(uint64_t n, Load load, Store store) {
    peer_copy_from(peer_tid(), n, load, store);
}
