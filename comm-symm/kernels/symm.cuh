// symm.cuh: the device side of the comm-symm symmetric heap: layout, memory-model helpers,
// bounded spins, signals and barriers. Prepended to symm_collectives.cu by the crate
// (comm_symm::cuda::kernels), so NVRTC needs no include path for it.
//
// Every rank's segment (the same offsets everywhere; comm_symm::cuda::layout mirrors this):
//
//   [0, 4 KiB)        SymmPad.coll: per-block barrier flags of the collectives (two sets)
//   [4 KiB, +128)     SymmPad.chan: signal slots of the user channels, [channel][sender]
//   [8 KiB, 16 KiB)   SymmState: this rank's own counters (never written by peers)
//   16 KiB ...        data areas (staging halves, two-shot results, Lamport inboxes)
//
// Signals without peer atomics: a sender *stores* a growing value into its own slot of the
// receiver's pad (st.release), the receiver spins with ld.acquire until the slot reaches
// the value it expects. Values only grow (compared by signed difference: wrapping is
// harmless), so a fast sender that signals again only moves the slot further. Scope .sys
// where peers are other devices, .gpu where every rank shares this device. Every spin
// reads %globaltimer and gives up after timeout_ns: it records the failure in host-mapped
// memory (status) and in SymmState.abort (so that later launches return at once), and the
// host reports Error::Timeout.
#include "comm_dtypes.cuh"

#define SYMM_MAX_RANKS 8
#define SYMM_MAX_BLOCKS 64
#define SYMM_MAX_THREADS 512
#define SYMM_CHANNELS 4
#define SYMM_STATE_OFFSET 8192

// status[0] codes (comm_symm::cuda::status mirrors them).
#define SYMM_OK 0
#define SYMM_TIMEOUT_BARRIER 1
#define SYMM_TIMEOUT_LAMPORT 2
#define SYMM_TIMEOUT_SIGNAL 3

struct SymmPad {
    uint32_t coll[2][SYMM_MAX_BLOCKS][SYMM_MAX_RANKS];
    uint32_t chan[SYMM_CHANNELS][SYMM_MAX_RANKS];
};

struct SymmState {
    uint32_t seq;    // collective calls completed by this rank
    uint32_t done;   // blocks of the running call that have finished
    uint32_t abort;  // a spin gave up: every later launch returns at once
    uint32_t pad;
    uint64_t used[3];  // Lamport: bytes per sender slot written by the call that used inbox b
    uint32_t sent[SYMM_CHANNELS][SYMM_MAX_RANKS];  // user signals sent, per channel and peer
    uint32_t seen[SYMM_CHANNELS][SYMM_MAX_RANKS];  // user signals consumed, per channel and peer
};

// Kernel arguments, by value; comm_symm::cuda::kernels::SymmArgs is the same #[repr(C)].
struct SymmArgs {
    const char* input;
    char* output;
    char* residual;        // fused op: residual, read and updated in place
    const char* weight;    // fused op: RMSNorm weight [hidden]
    char* const* peers;    // every rank's segment as mapped here [SYMM_MAX_RANKS]
    uint32_t* status;      // host-mapped [code, rank, phase, peer]
    uint64_t count;        // elements (all-reduce, fused: rows * hidden); bytes for gather/bcast
    uint64_t cap;          // bytes of one staging half
    uint64_t lcap;         // bytes of one Lamport sender slot
    uint64_t off_data;     // two staging halves (by call parity)
    uint64_t off_tmp;      // two-shot reduced slice
    uint64_t off_lamport;  // 3 inboxes x world sender slots x lcap
    uint64_t timeout_ns;
    uint64_t hidden;       // fused op: row length
    float eps;             // fused op
    uint32_t rank;
    uint32_t world;
    uint32_t aligned;      // user buffers 16-byte aligned
    uint32_t gpu_scope;    // every rank on this device
    uint32_t root;         // broadcast root
    uint32_t peer;         // signal primitives: the peer
    uint32_t channel;      // signal primitives: the channel
};

__device__ __forceinline__ void symm_st_release(uint32_t* p, uint32_t v, bool gpu) {
    if (gpu) asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
    else asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t symm_ld_acquire(const uint32_t* p, bool gpu) {
    uint32_t v;
    if (gpu) asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    else asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint4 symm_ld_volatile(const uint4* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ void symm_st_volatile(uint4* p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
}

// Peer data after a barrier: L2 only, so that no stale L1 line is returned.
__device__ __forceinline__ uint4 symm_ld_cg(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ uint64_t symm_now() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Per-block context: peer table in shared memory, the call number, the give-up flag.
struct SymmCtx {
    char* const* seg;   // shared: seg[p]
    SymmState* state;   // this rank's state
    volatile int* dead; // shared: this block gave up
    uint32_t seq;
};

__device__ __forceinline__ SymmPad* symm_pad(const SymmCtx& c, uint32_t p) {
    return reinterpret_cast<SymmPad*>(c.seg[p]);
}

// Records a failure (first one wins) and tells every later launch to give up.
__device__ void symm_fail(const SymmArgs& a, const SymmCtx& c, uint32_t code, uint32_t phase, uint32_t peer) {
    *c.dead = 1;
    *(volatile uint32_t*)&c.state->abort = 1;
    volatile uint32_t* s = a.status;
    if (s[0] == SYMM_OK) {
        s[1] = a.rank;
        s[2] = phase;
        s[3] = peer;
        __threadfence_system();
        s[0] = code;
    }
    __threadfence_system();
}

// True when this thread must stop waiting: this block or another launch gave up, or the
// bound passed. The clock is read every 256 spins (it is not free).
__device__ __forceinline__ bool symm_give_up(const SymmArgs& a, const SymmCtx& c, uint64_t start, uint32_t& spins,
                                             uint32_t code, uint32_t phase, uint32_t peer) {
    if (*c.dead) return true;
    if ((++spins & 255) == 0) {
        if (*(volatile uint32_t*)&c.state->abort) {
            *c.dead = 1;
            return true;
        }
        if (symm_now() - start > a.timeout_ns) {
            symm_fail(a, c, code, phase, peer);
            return true;
        }
    }
    return false;
}

// Spins until *slot reaches `want` (signed difference), bounded. False on give-up.
__device__ bool symm_wait_value(const SymmArgs& a, const SymmCtx& c, const uint32_t* slot, uint32_t want,
                                uint32_t code, uint32_t phase, uint32_t peer) {
    const bool gpu = a.gpu_scope != 0;
    if ((int32_t)(symm_ld_acquire(slot, gpu) - want) >= 0) return true;
    const uint64_t start = symm_now();
    uint32_t spins = 0;
    while ((int32_t)(symm_ld_acquire(slot, gpu) - want) < 0) {
        if (symm_give_up(a, c, start, spins, code, phase, peer)) return false;
    }
    return true;
}

// The collectives' barrier: block b of every rank meets block b of every other rank.
// Value 2*seq+phase+1 into slot [phase][b][me] of every peer; thread p waits for peer p.
// Two phase sets, so that a fast peer's next barrier never overwrites a value still awaited.
__device__ bool symm_block_barrier(const SymmArgs& a, const SymmCtx& c, uint32_t phase) {
    __syncthreads();
    const uint32_t value = 2u * c.seq + phase + 1u;
    const uint32_t p = threadIdx.x;
    if (p < a.world && !*c.dead) {
        symm_st_release(&symm_pad(c, p)->coll[phase][blockIdx.x][a.rank], value, a.gpu_scope != 0);
        symm_wait_value(a, c, &symm_pad(c, a.rank)->coll[phase][blockIdx.x][p], value, SYMM_TIMEOUT_BARRIER,
                        phase, p);
    }
    __syncthreads();
    return !*c.dead;
}

// put_signal: the next count of (channel, peer) into my slot of the peer's pad. One thread.
__device__ void symm_put_signal(const SymmArgs& a, const SymmCtx& c, uint32_t peer, uint32_t channel) {
    uint32_t* sent = &c.state->sent[channel][peer];
    const uint32_t v = *sent + 1u;
    *sent = v;
    symm_st_release(&symm_pad(c, peer)->chan[channel][a.rank], v, a.gpu_scope != 0);
}

// wait_signal: the next count of (channel, peer) in the peer's slot of my pad. One thread.
__device__ bool symm_wait_signal(const SymmArgs& a, const SymmCtx& c, uint32_t peer, uint32_t channel) {
    uint32_t* seen = &c.state->seen[channel][peer];
    const uint32_t v = *seen + 1u;
    *seen = v;
    return symm_wait_value(a, c, &symm_pad(c, a.rank)->chan[channel][peer], v, SYMM_TIMEOUT_SIGNAL, channel, peer);
}

// Loads the peer table into shared memory and the call number; false when a previous
// launch gave up (the heap is then unusable).
#define SYMM_PROLOGUE(a, c)                                                                          \
    __shared__ char* s_seg[SYMM_MAX_RANKS];                                                          \
    __shared__ uint32_t s_seq;                                                                       \
    __shared__ int s_dead;                                                                           \
    SymmState* s_state = reinterpret_cast<SymmState*>(a.peers[a.rank] + SYMM_STATE_OFFSET);          \
    if (threadIdx.x < SYMM_MAX_RANKS) s_seg[threadIdx.x] = threadIdx.x < a.world ? a.peers[threadIdx.x] : nullptr; \
    if (threadIdx.x == 0) {                                                                          \
        s_seq = *(volatile uint32_t*)&s_state->seq;                                                  \
        s_dead = *(volatile uint32_t*)&s_state->abort ? 1 : 0;                                       \
    }                                                                                                \
    __syncthreads();                                                                                 \
    SymmCtx c{s_seg, s_state, &s_dead, s_seq};                                                       \
    if (*c.dead) return;
