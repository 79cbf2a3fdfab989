// symm_collectives.cu: the collectives of comm-symm's CUDA backing, over the symmetric heap
// of symm.cuh (prepended by the crate). One kernel per call; everything that changes from
// call to call (call number, staging half, Lamport inbox, signal counts) lives in the
// rank's SymmState on the device, so calls can be captured into CUDA graphs and replayed.
//
// Data areas of every segment (offsets in SymmArgs, comm_symm::cuda::layout):
//   off_data     2 x cap   staging halves, by call parity
//   off_tmp      cap       two-shot: this rank's reduced slice
//   off_lamport  3 x world x lcap   Lamport inboxes [inbox][sender]
//
// - oneshot (pull): stage the input, barrier, every rank reduces every rank's staged copy.
//   No end barrier: the other half was last read in the previous call, which every peer
//   finished before entering this call's barrier.
// - twoshot: stage, barrier, rank r reduces slice r into its tmp, barrier, every rank
//   copies every slice from its owner's tmp.
// - lamport: push the input into slot `me` of every peer's inbox seq%3 (sentinel: all bits
//   set, a NaN in every float dtype; inputs holding it are sent as the canonical quiet NaN),
//   poll the own inbox until no slot holds the sentinel, reduce. No barrier. Inbox
//   (seq+2)%3, the previous call's, is reset at the end: peers write it again only two
//   calls later.
// - Every partition is by 16-byte vector index, the same on every rank and in every step,
//   so the per-block barrier of block b covers everything block b reads next.
// - Reductions are in f32, in rank order, by one code path per element: bitwise identical
//   results on every rank.
// - fused all-reduce + residual add + RMSNorm (bf16): a = allreduce(x) rounded to bf16,
//   residual' = bf16(residual + a) (written back), out = bf16(residual' * rsqrt(mean(
//   residual'^2) + eps) * weight): exactly the unfused pipeline (all-reduce, then
//   fused_add_rms_norm), one row per block at a time, exchange by lamport or oneshot.

template <int DT> struct SymmDt;
template <> struct SymmDt<COMM_F32> { static constexpr int VEC = 4, SIZE = 4; };
template <> struct SymmDt<COMM_F16> { static constexpr int VEC = 8, SIZE = 2; };
template <> struct SymmDt<COMM_BF16> { static constexpr int VEC = 8, SIZE = 2; };

template <int DT> __device__ __forceinline__ float symm_to_f(uint32_t bits) {
    if constexpr (DT == COMM_F32) return __uint_as_float(bits);
    else if constexpr (DT == COMM_F16) return comm_f16_to_float((uint16_t)bits);
    else return comm_bf16_to_float((uint16_t)bits);
}

template <int DT> __device__ __forceinline__ uint32_t symm_from_f(float f) {
    if constexpr (DT == COMM_F32) return __float_as_uint(f);
    else if constexpr (DT == COMM_F16) return comm_float_to_f16(f);
    else return comm_float_to_bf16(f);
}

__device__ __forceinline__ uint32_t symm_word(const uint4& w, int i) {
    return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}

template <int DT> __device__ __forceinline__ void symm_unpack(const uint4& w, float* f) {
    if constexpr (SymmDt<DT>::SIZE == 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) f[i] = symm_to_f<DT>(symm_word(w, i));
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t x = symm_word(w, i);
            f[2 * i] = symm_to_f<DT>(x & 0xffffu);
            f[2 * i + 1] = symm_to_f<DT>(x >> 16);
        }
    }
}

template <int DT> __device__ __forceinline__ uint4 symm_pack(const float* f) {
    uint32_t w[4];
    if constexpr (SymmDt<DT>::SIZE == 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = symm_from_f<DT>(f[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = symm_from_f<DT>(f[2 * i]) | (symm_from_f<DT>(f[2 * i + 1]) << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int DT> __device__ __forceinline__ bool symm_has_sentinel(const uint4& w) {
    if constexpr (SymmDt<DT>::SIZE == 4) {
        return w.x == 0xffffffffu || w.y == 0xffffffffu || w.z == 0xffffffffu || w.w == 0xffffffffu;
    } else {
        bool any = false;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t x = symm_word(w, i);
            any |= (x & 0xffffu) == 0xffffu || (x >> 16) == 0xffffu;
        }
        return any;
    }
}

template <int DT> __device__ __forceinline__ uint32_t symm_clean(uint32_t x) {
    if constexpr (SymmDt<DT>::SIZE == 4) {
        return x == 0xffffffffu ? 0x7fc00000u : x;
    } else {
        const uint32_t qnan = DT == COMM_F16 ? 0x7e00u : 0x7fc0u;
        uint32_t lo = x & 0xffffu, hi = x >> 16;
        if (lo == 0xffffu) lo = qnan;
        if (hi == 0xffffu) hi = qnan;
        return lo | (hi << 16);
    }
}

template <int DT> __device__ __forceinline__ uint4 symm_sanitize(uint4 w) {
    return make_uint4(symm_clean<DT>(w.x), symm_clean<DT>(w.y), symm_clean<DT>(w.z), symm_clean<DT>(w.w));
}

template <int OP> __device__ __forceinline__ float symm_combine(float a, float b) {
    if constexpr (OP == COMM_MAX) return fmaxf(a, b);
    else if constexpr (OP == COMM_MIN) return fminf(a, b);
    else return a + b;
}

// Element-typed user memory: vector v (VEC elements) of `count`; a whole aligned vector in
// one 16-byte access, else element by element (lanes past `count` read 0, never written).
template <int DT>
__device__ __forceinline__ uint4 symm_load_user(const char* base, uint64_t v, uint64_t count, bool aligned) {
    constexpr int VEC = SymmDt<DT>::VEC;
    if (aligned && (v + 1) * VEC <= count) return *reinterpret_cast<const uint4*>(base + v * 16);
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        const uint64_t idx = v * VEC + e;
        if (idx < count) {
            if constexpr (SymmDt<DT>::SIZE == 4) {
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
__device__ __forceinline__ void symm_store_user(char* base, uint64_t v, uint64_t count, bool aligned, uint4 val) {
    constexpr int VEC = SymmDt<DT>::VEC;
    if (aligned && (v + 1) * VEC <= count) {
        *reinterpret_cast<uint4*>(base + v * 16) = val;
        return;
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        const uint64_t idx = v * VEC + e;
        if (idx < count) {
            if constexpr (SymmDt<DT>::SIZE == 4) {
                reinterpret_cast<uint32_t*>(base)[idx] = symm_word(val, e);
            } else {
                reinterpret_cast<uint16_t*>(base)[idx] = (uint16_t)(symm_word(val, e / 2) >> (16 * (e % 2)));
            }
        }
    }
}

// Untyped user memory (gather, broadcast): vector v of `bytes`, byte by byte at the tail or
// where `base` is not 16-byte aligned.
__device__ __forceinline__ uint4 symm_load_bytes(const char* base, uint64_t v, uint64_t bytes, bool aligned) {
    if (aligned && (v + 1) * 16 <= bytes) return *reinterpret_cast<const uint4*>(base + v * 16);
    uint32_t w[4] = {0, 0, 0, 0};
    for (int b = 0; b < 16; ++b) {
        const uint64_t idx = v * 16 + b;
        if (idx < bytes) w[b / 4] |= (uint32_t)(uint8_t)base[idx] << (8 * (b % 4));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void symm_store_bytes(char* base, uint64_t v, uint64_t bytes, bool aligned, uint4 val) {
    if (aligned && (v + 1) * 16 <= bytes) {
        *reinterpret_cast<uint4*>(base + v * 16) = val;
        return;
    }
    for (int b = 0; b < 16; ++b) {
        const uint64_t idx = v * 16 + b;
        if (idx < bytes) base[idx] = (char)(uint8_t)(symm_word(val, b / 4) >> (8 * (b % 4)));
    }
}

__device__ __forceinline__ uint64_t symm_tid() { return (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ uint64_t symm_stride() { return (uint64_t)gridDim.x * blockDim.x; }

// dst(i) = src(i) for i < n, grid-stride, four loads in flight (same i per thread as a
// plain grid-stride loop, so the per-block barrier pairing holds).
template <typename Load, typename Store> __device__ __forceinline__ void symm_copy(uint64_t n, Load load, Store store) {
    const uint64_t stride = symm_stride();
    uint64_t i = symm_tid();
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 w0 = load(i), w1 = load(i + stride), w2 = load(i + 2 * stride), w3 = load(i + 3 * stride);
        store(i, w0);
        store(i + stride, w1);
        store(i + 2 * stride, w2);
        store(i + 3 * stride, w3);
    }
    for (; i < n; i += stride) store(i, load(i));
}

template <int DT, int OP> __device__ __forceinline__ void symm_accumulate(float* acc, const uint4& w, bool first) {
    constexpr int VEC = SymmDt<DT>::VEC;
    float x[VEC];
    symm_unpack<DT>(w, x);
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = first ? x[e] : symm_combine<OP>(acc[e], x[e]);
}

template <int DT, int OP> __device__ __forceinline__ uint4 symm_finish_acc(const SymmArgs& a, float* acc) {
    if constexpr (OP == COMM_AVG) {
        const float n = (float)a.world;
#pragma unroll
        for (int e = 0; e < SymmDt<DT>::VEC; ++e) acc[e] = acc[e] / n;
    }
    return symm_pack<DT>(acc);
}

// Reduces vector v of every rank's staged copy at `off` (rank order).
template <int DT, int OP>
__device__ __forceinline__ uint4 symm_reduce_staged(const SymmArgs& a, const SymmCtx& c, uint64_t off, uint64_t v) {
    float acc[SymmDt<DT>::VEC];
#pragma unroll
    for (int p = 0; p < SYMM_MAX_RANKS; ++p)
        if (p < (int)a.world) symm_accumulate<DT, OP>(acc, symm_ld_cg(reinterpret_cast<const uint4*>(c.seg[p] + off) + v), p == 0);
    return symm_finish_acc<DT, OP>(a, acc);
}

// Lamport: fills w[p] with vector v of sender p's slot (src + p * stride) once it holds no
// sentinel; w[skip] = own. False when the block gave up.
template <int DT>
__device__ bool symm_poll(const SymmArgs& a, const SymmCtx& c, const char* src, uint64_t stride, uint32_t skip,
                          uint4 own, uint64_t v, uint4* w) {
    uint32_t pending = 0;
#pragma unroll
    for (int p = 0; p < SYMM_MAX_RANKS; ++p) {
        if (p == (int)skip) {
            w[p] = own;
        } else if (p < (int)a.world) {
            w[p] = symm_ld_volatile(reinterpret_cast<const uint4*>(src + p * stride) + v);
            if (symm_has_sentinel<DT>(w[p])) pending |= 1u << p;
        }
    }
    if (!pending) return true;
    const uint64_t start = symm_now();
    uint32_t spins = 0;
    while (pending) {
#pragma unroll
        for (int p = 0; p < SYMM_MAX_RANKS; ++p) {
            if (pending & (1u << p)) {
                w[p] = symm_ld_volatile(reinterpret_cast<const uint4*>(src + p * stride) + v);
                if (!symm_has_sentinel<DT>(w[p])) pending &= ~(1u << p);
            }
        }
        if (pending && symm_give_up(a, c, start, spins, SYMM_TIMEOUT_LAMPORT, 0, __ffs(pending) - 1)) return false;
    }
    return true;
}

template <int DT, int OP> __device__ __forceinline__ uint4 symm_reduce_regs(const SymmArgs& a, const uint4* w) {
    float acc[SymmDt<DT>::VEC];
#pragma unroll
    for (int p = 0; p < SYMM_MAX_RANKS; ++p)
        if (p < (int)a.world) symm_accumulate<DT, OP>(acc, w[p], p == 0);
    return symm_finish_acc<DT, OP>(a, acc);
}

// Lamport push: vector v of this rank's input into slot `me` of every peer's inbox.
template <int DT> __device__ __forceinline__ void symm_push(const SymmArgs& a, const SymmCtx& c, uint64_t slot0, uint64_t v, uint4 w) {
    for (uint32_t k = 1; k < a.world; ++k) {
        const uint32_t p = (a.rank + k) % a.world;
        symm_st_volatile(reinterpret_cast<uint4*>(c.seg[p] + slot0 + a.rank * a.lcap) + v, w);
    }
}

// ---------------------------------------------------------------------------------------
// All-reduce.

template <int DT, int OP> __device__ void symm_oneshot(const SymmArgs& a, const SymmCtx& c, uint64_t nvec) {
    const uint64_t half = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const bool aligned = a.aligned != 0;
    uint4* mine = reinterpret_cast<uint4*>(c.seg[a.rank] + half);
    symm_copy(
        nvec, [&](uint64_t v) { return symm_load_user<DT>(a.input, v, a.count, aligned); },
        [&](uint64_t v, uint4 w) { mine[v] = w; });
    if (!symm_block_barrier(a, c, 0)) return;
    for (uint64_t v = symm_tid(); v < nvec; v += symm_stride())
        symm_store_user<DT>(a.output, v, a.count, aligned, symm_reduce_staged<DT, OP>(a, c, half, v));
}

template <int DT, int OP> __device__ void symm_twoshot(const SymmArgs& a, const SymmCtx& c, uint64_t nvec) {
    const uint64_t half = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const bool aligned = a.aligned != 0;
    const uint64_t S = (nvec + a.world - 1) / a.world;
    const uint32_t me = a.rank;
    uint4* mine = reinterpret_cast<uint4*>(c.seg[me] + half);
    for (uint32_t s = 0; s < a.world; ++s) {
        const uint64_t first = s * S;
        const uint64_t n = first >= nvec ? 0 : (nvec - first < S ? nvec - first : S);
        symm_copy(
            n, [&](uint64_t i) { return symm_load_user<DT>(a.input, first + i, a.count, aligned); },
            [&](uint64_t i, uint4 w) { mine[first + i] = w; });
    }
    if (!symm_block_barrier(a, c, 0)) return;
    uint4* tmp = reinterpret_cast<uint4*>(c.seg[me] + a.off_tmp);
    for (uint64_t i = symm_tid(); i < S && me * S + i < nvec; i += symm_stride())
        tmp[i] = symm_reduce_staged<DT, OP>(a, c, half, me * S + i);
    if (!symm_block_barrier(a, c, 1)) return;
    for (uint32_t k = 0; k < a.world; ++k) {
        const uint32_t s = (me + k) % a.world;  // not everyone reads rank 0 first
        const uint4* src = reinterpret_cast<const uint4*>(c.seg[s] + a.off_tmp);
        const uint64_t first = s * S;
        const uint64_t n = first >= nvec ? 0 : (nvec - first < S ? nvec - first : S);
        symm_copy(
            n, [&](uint64_t i) { return symm_ld_cg(src + i); },
            [&](uint64_t i, uint4 w) { symm_store_user<DT>(a.output, first + i, a.count, aligned, w); });
    }
}

template <int DT, int OP> __device__ void symm_lamport(const SymmArgs& a, const SymmCtx& c, uint64_t nvec) {
    const bool aligned = a.aligned != 0;
    const uint64_t slot0 = a.off_lamport + (uint64_t)(c.seq % 3u) * a.world * a.lcap;
    for (uint64_t v = symm_tid(); v < nvec; v += symm_stride())
        symm_push<DT>(a, c, slot0, v, symm_sanitize<DT>(symm_load_user<DT>(a.input, v, a.count, aligned)));
    const char* inbox = c.seg[a.rank] + slot0;
    for (uint64_t v = symm_tid(); v < nvec; v += symm_stride()) {
        uint4 w[SYMM_MAX_RANKS];
        const uint4 own = symm_sanitize<DT>(symm_load_user<DT>(a.input, v, a.count, aligned));
        if (!symm_poll<DT>(a, c, inbox, a.lcap, a.rank, own, v, w)) break;
        symm_store_user<DT>(a.output, v, a.count, aligned, symm_reduce_regs<DT, OP>(a, w));
    }
}

// ---------------------------------------------------------------------------------------
// Prologue / epilogue shared by every collective kernel.

#define SYMM_ALGO_ONESHOT 0
#define SYMM_ALGO_TWOSHOT 1
#define SYMM_ALGO_LAMPORT 2

// Resets inbox (seq+2)%3 (the previous call's) as far as that call wrote, records what
// this call writes (`lamport_vecs` vectors per sender slot), then advances the call counter
// once every block is done (a local atomic, never a peer one).
__device__ void symm_epilogue(const SymmArgs& a, const SymmCtx& c, uint64_t lamport_vecs) {
    __syncthreads();
    if (*c.dead) return;
    const uint32_t old = (c.seq + 2u) % 3u;
    const uint64_t used = c.state->used[old] / 16;
    const uint4 ones = make_uint4(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
    for (uint32_t p = 0; p < a.world; ++p) {
        uint4* slot = reinterpret_cast<uint4*>(c.seg[a.rank] + a.off_lamport + ((uint64_t)old * a.world + p) * a.lcap);
        for (uint64_t v = symm_tid(); v < used; v += symm_stride()) slot[v] = ones;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (blockIdx.x == 0) c.state->used[c.seq % 3u] = lamport_vecs * 16;
        __threadfence();
        if (atomicAdd(&c.state->done, 1u) == gridDim.x - 1) {
            c.state->done = 0;
            *(volatile uint32_t*)&c.state->seq = c.seq + 1u;
            __threadfence();
        }
    }
}

template <int ALGO, int DT, int OP> __device__ void symm_all_reduce(const SymmArgs& a) {
    SYMM_PROLOGUE(a, c)
    const uint64_t nvec = (a.count + SymmDt<DT>::VEC - 1) / SymmDt<DT>::VEC;
    if constexpr (ALGO == SYMM_ALGO_ONESHOT) symm_oneshot<DT, OP>(a, c, nvec);
    else if constexpr (ALGO == SYMM_ALGO_TWOSHOT) symm_twoshot<DT, OP>(a, c, nvec);
    else symm_lamport<DT, OP>(a, c, nvec);
    symm_epilogue(a, c, ALGO == SYMM_ALGO_LAMPORT ? nvec : 0);
}

// reduce_scatter: input holds world x count elements; rank r gets slice r reduced. Staged
// slice by slice (each slice from a 16-byte boundary), so vector i of every slice is
// written and read by the same block.
template <int DT, int OP> __device__ void symm_reduce_scatter(const SymmArgs& a) {
    SYMM_PROLOGUE(a, c)
    constexpr int VEC = SymmDt<DT>::VEC;
    const uint64_t svec = (a.count + VEC - 1) / VEC;
    const uint64_t half = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const uint64_t sbytes = a.count * SymmDt<DT>::SIZE;
    const bool slices_aligned = a.aligned != 0 && sbytes % 16 == 0;
    uint4* mine = reinterpret_cast<uint4*>(c.seg[a.rank] + half);
    for (uint32_t s = 0; s < a.world; ++s) {
        const char* src = a.input + s * sbytes;
        symm_copy(
            svec, [&](uint64_t i) { return symm_load_user<DT>(src, i, a.count, slices_aligned); },
            [&](uint64_t i, uint4 w) { mine[s * svec + i] = w; });
    }
    if (symm_block_barrier(a, c, 0)) {
        for (uint64_t i = symm_tid(); i < svec; i += symm_stride())
            symm_store_user<DT>(a.output, i, a.count, a.aligned != 0,
                                symm_reduce_staged<DT, OP>(a, c, half, a.rank * svec + i));
    }
    symm_epilogue(a, c, 0);
}

// all_gather (bytes): stage, barrier, copy every rank's staged input to its place.
extern "C" __global__ void __launch_bounds__(SYMM_MAX_THREADS) symm_all_gather(SymmArgs a) {
    SYMM_PROLOGUE(a, c)
    const uint64_t bytes = a.count, nvec = (bytes + 15) / 16;
    const uint64_t half = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    uint4* mine = reinterpret_cast<uint4*>(c.seg[a.rank] + half);
    symm_copy(
        nvec, [&](uint64_t v) { return symm_load_bytes(a.input, v, bytes, a.aligned != 0); },
        [&](uint64_t v, uint4 w) { mine[v] = w; });
    if (symm_block_barrier(a, c, 0)) {
        for (uint32_t k = 0; k < a.world; ++k) {
            const uint32_t p = (a.rank + k) % a.world;
            const uint4* src = reinterpret_cast<const uint4*>(c.seg[p] + half);
            char* dst = a.output + p * bytes;
            const bool aligned = a.aligned != 0 && (p * bytes) % 16 == 0;
            symm_copy(
                nvec, [&](uint64_t v) { return symm_ld_cg(src + v); },
                [&](uint64_t v, uint4 w) { symm_store_bytes(dst, v, bytes, aligned, w); });
        }
    }
    symm_epilogue(a, c, 0);
}

// broadcast (bytes, in place): the root stages, barrier, everyone else copies.
extern "C" __global__ void __launch_bounds__(SYMM_MAX_THREADS) symm_broadcast(SymmArgs a) {
    SYMM_PROLOGUE(a, c)
    const uint64_t bytes = a.count, nvec = (bytes + 15) / 16;
    const uint64_t half = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const bool aligned = a.aligned != 0;
    if (a.rank == a.root) {
        uint4* mine = reinterpret_cast<uint4*>(c.seg[a.rank] + half);
        symm_copy(
            nvec, [&](uint64_t v) { return symm_load_bytes(a.output, v, bytes, aligned); },
            [&](uint64_t v, uint4 w) { mine[v] = w; });
    }
    if (symm_block_barrier(a, c, 0) && a.rank != a.root) {
        const uint4* src = reinterpret_cast<const uint4*>(c.seg[a.root] + half);
        symm_copy(
            nvec, [&](uint64_t v) { return symm_ld_cg(src + v); },
            [&](uint64_t v, uint4 w) { symm_store_bytes(a.output, v, bytes, aligned, w); });
    }
    symm_epilogue(a, c, 0);
}

// ---------------------------------------------------------------------------------------
// Fused all-reduce + residual add + RMSNorm, bf16 rows of `hidden` (a multiple of 8;
// 16-byte aligned buffers). Rows b, b + grid, ... belong to block b on every rank.

__device__ float symm_block_sum(float v) {
    __shared__ float part[SYMM_MAX_THREADS / 32];
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

// One row after the exchange: `reduced(j)` gives vector j of allreduce(x) (bf16 bits).
template <typename Reduced>
__device__ __forceinline__ void symm_norm_row(const SymmArgs& a, uint64_t row, uint64_t rvec, Reduced reduced) {
    uint4* res = reinterpret_cast<uint4*>(a.residual) + row * rvec;
    uint4* out = reinterpret_cast<uint4*>(a.output) + row * rvec;
    const uint4* wt = reinterpret_cast<const uint4*>(a.weight);
    float sumsq = 0.0f;
    for (uint64_t j = threadIdx.x; j < rvec; j += blockDim.x) {
        float s[8], r[8];
        symm_unpack<COMM_BF16>(reduced(j), s);  // the all-reduce's bf16 result
        symm_unpack<COMM_BF16>(res[j], r);
#pragma unroll
        for (int e = 0; e < 8; ++e) r[e] = r[e] + s[e];
        const uint4 h = symm_pack<COMM_BF16>(r);
        res[j] = h;
        symm_unpack<COMM_BF16>(h, r);  // the rounded residual is what gets normalised
#pragma unroll
        for (int e = 0; e < 8; ++e) sumsq += r[e] * r[e];
    }
    const float scale = rsqrtf(symm_block_sum(sumsq) / (float)a.hidden + a.eps);
    for (uint64_t j = threadIdx.x; j < rvec; j += blockDim.x) {
        float r[8], w[8];
        symm_unpack<COMM_BF16>(res[j], r);  // this thread's own store above
        symm_unpack<COMM_BF16>(wt[j], w);
#pragma unroll
        for (int e = 0; e < 8; ++e) r[e] = r[e] * scale * w[e];
        out[j] = symm_pack<COMM_BF16>(r);
    }
}

template <int ALGO> __device__ void symm_fused_rmsnorm(const SymmArgs& a) {
    SYMM_PROLOGUE(a, c)
    const uint64_t rvec = a.hidden / 8, rows = a.count / a.hidden, nvec = rows * rvec;
    const uint4* in = reinterpret_cast<const uint4*>(a.input);
    if constexpr (ALGO == SYMM_ALGO_LAMPORT) {
        const uint64_t slot0 = a.off_lamport + (uint64_t)(c.seq % 3u) * a.world * a.lcap;
        for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x)
            for (uint64_t j = threadIdx.x; j < rvec; j += blockDim.x)
                symm_push<COMM_BF16>(a, c, slot0, row * rvec + j, symm_sanitize<COMM_BF16>(in[row * rvec + j]));
        const char* inbox = c.seg[a.rank] + slot0;
        for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
            symm_norm_row(a, row, rvec, [&](uint64_t j) {
                uint4 w[SYMM_MAX_RANKS];
                const uint64_t v = row * rvec + j;
                symm_poll<COMM_BF16>(a, c, inbox, a.lcap, a.rank, symm_sanitize<COMM_BF16>(in[v]), v, w);
                return symm_reduce_regs<COMM_BF16, COMM_SUM>(a, w);
            });
            if (*c.dead) break;  // uniform: read after the block sum's barriers
        }
    } else {
        const uint64_t half = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
        uint4* mine = reinterpret_cast<uint4*>(c.seg[a.rank] + half);
        for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x)
            for (uint64_t j = threadIdx.x; j < rvec; j += blockDim.x) mine[row * rvec + j] = in[row * rvec + j];
        if (symm_block_barrier(a, c, 0)) {
            for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x)
                symm_norm_row(a, row, rvec, [&](uint64_t j) {
                    return symm_reduce_staged<COMM_BF16, COMM_SUM>(a, c, half, row * rvec + j);
                });
        }
    }
    symm_epilogue(a, c, ALGO == SYMM_ALGO_LAMPORT ? nvec : 0);
}

extern "C" __global__ void __launch_bounds__(SYMM_MAX_THREADS) symm_fused_rmsnorm_lamport(SymmArgs a) {
    symm_fused_rmsnorm<SYMM_ALGO_LAMPORT>(a);
}
extern "C" __global__ void __launch_bounds__(SYMM_MAX_THREADS) symm_fused_rmsnorm_oneshot(SymmArgs a) {
    symm_fused_rmsnorm<SYMM_ALGO_ONESHOT>(a);
}

// ---------------------------------------------------------------------------------------
// The heap's primitives as one-block launches (thread p handles peer p): they use only the
// user channels and the signal counts, never the collectives' call counter.

extern "C" __global__ void symm_put_signal_kernel(SymmArgs a) {
    SYMM_PROLOGUE(a, c)
    if (threadIdx.x == 0) symm_put_signal(a, c, a.peer, a.channel);
}

extern "C" __global__ void symm_wait_signal_kernel(SymmArgs a) {
    SYMM_PROLOGUE(a, c)
    if (threadIdx.x == 0) symm_wait_signal(a, c, a.peer, a.channel);
}

extern "C" __global__ void symm_barrier_kernel(SymmArgs a) {
    SYMM_PROLOGUE(a, c)
    const uint32_t p = threadIdx.x;
    if (p < a.world && p != a.rank) {
        symm_put_signal(a, c, p, a.channel);
        symm_wait_signal(a, c, p, a.channel);
    }
}

// ---------------------------------------------------------------------------------------
// Names: symm_<oneshot|twoshot|lamport>_<f32|f16|bf16>_<sum|avg|max|min>,
// symm_reduce_scatter_<dtype>_<op>.

#define SYMM_AR(ALGO, ANAME, DT, DNAME, OP, ONAME)                                                             \
    extern "C" __global__ void __launch_bounds__(SYMM_MAX_THREADS) symm_##ANAME##_##DNAME##_##ONAME(SymmArgs a) { \
        symm_all_reduce<ALGO, DT, OP>(a);                                                                      \
    }
#define SYMM_RS(DT, DNAME, OP, ONAME)                                                                          \
    extern "C" __global__ void __launch_bounds__(SYMM_MAX_THREADS) symm_reduce_scatter_##DNAME##_##ONAME(SymmArgs a) { \
        symm_reduce_scatter<DT, OP>(a);                                                                        \
    }
#define SYMM_OPS(DT, DNAME, OP, ONAME)                  \
    SYMM_AR(SYMM_ALGO_ONESHOT, oneshot, DT, DNAME, OP, ONAME) \
    SYMM_AR(SYMM_ALGO_TWOSHOT, twoshot, DT, DNAME, OP, ONAME) \
    SYMM_AR(SYMM_ALGO_LAMPORT, lamport, DT, DNAME, OP, ONAME) \
    SYMM_RS(DT, DNAME, OP, ONAME)
#define SYMM_DTYPE(DT, DNAME)                 \
    SYMM_OPS(DT, DNAME, COMM_SUM, sum)        \
    SYMM_OPS(DT, DNAME, COMM_AVG, avg)        \
    SYMM_OPS(DT, DNAME, COMM_MAX, max)        \
    SYMM_OPS(DT, DNAME, COMM_MIN, min)

SYMM_DTYPE(COMM_F32, f32)
SYMM_DTYPE(COMM_F16, f16)
SYMM_DTYPE(COMM_BF16, bf16)
