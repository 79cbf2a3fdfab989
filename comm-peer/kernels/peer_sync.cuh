// peer_sync.cuh: the region layout, the kernel arguments, the memory model, bounded waits
// that report to host-mapped memory, the flag barrier, signals, the agreement on the call,
// and the prologue and epilogue of the peer-memory kernels. Prepended (after peer_io.cuh,
// before peer_lamport.cuh) to peer_collectives.cu by the crate.
//
// Every rank owns one region that every rank can address (how it was obtained: CUDA IPC of
// cuMemAlloc memory, a VMM heap, or host memory registered with every device;
// comm_peer::layout mirrors this, keep the two in step):
//
//   [0, 8 KiB)          PeerPad.flags: per-block barrier flags that PEERS store into (two sets)
//   [8 KiB, +128)       PeerPad.chan: signal slots of the user channels, [channel][sender]
//   [8 KiB + 128, +1 KiB) PeerPad.calls: every rank's call descriptor, [call parity][sender]
//   then, 128-byte aligned  PeerPad.digests: every rank's call digest, [call parity][sender]
//   off_data            2 x cap: staged inputs (two-shot pull: the peers' slices), by call parity
//   off_tmp             cap: two-shot pull's reduced slice
//   off_push            3 x world x lcap: one-shot Lamport mailboxes [buffer][sender]
//   off_recv            3 x world x slice_cap: two-shot push slice mailboxes [buffer][sender]
//   off_result          3 x lcap: two-shot push result mailboxes [buffer]
//
// PeerState, this rank's own bookkeeping (never touched by peers), lives in its device's
// memory beside the region (PeerArgs.state): every kernel reads and updates it, which would
// cost a PCIe round trip each time where the regions are host memory.
//
// Why it is built this way:
// - Graph replay: nothing that changes from call to call is a kernel argument. The call
//   counter (which selects data parity, Lamport buffer and barrier values) lives in
//   PeerState on the device, one copy per block index: block b reads copy b at start and,
//   at its end, advances copy b and the copies of the blocks this launch does not have
//   (b + grid, b + 2 grid, ...), so that every copy is equal again once the launch is done,
//   whatever the next launch's grid. No atomic, no fence, no wait for the other blocks: no
//   block of a launch reads a copy another of its blocks writes, and the next launch reads
//   them after this one has completed.
// - Barriers without peer atomics: block b of rank r stores the value 2*seq+phase+1 with
//   st.release into slot [phase][b][r] of every peer's pad, and thread p waits with
//   ld.acquire on its own slot [phase][b][p], then __syncthreads. Values only grow
//   (compared by signed difference, so wrapping is harmless), and the two phases use two
//   slot sets, so a fast peer's next barrier never overwrites a value still awaited. Every
//   block reads only data that the same-numbered block of each peer wrote before its
//   release (identical partitions on every rank), so the per-block flag covers it. Scope
//   .sys where peers are other devices or the regions are host memory mapped into the
//   device (GPUs without peer access), .gpu where every rank shares this device's memory.
// - Lamport: mailboxes hold the sentinel (peer_io.cuh); readers poll with volatile
//   16-byte loads until no element holds it. Three buffers rotate: peers may be writing
//   buffer seq%3 (this call) or (seq+1)%3 (their next call, once they have all of this
//   rank's data), never (seq+2)%3, which each call resets at its end (the sizes the call
//   that used it wrote are in PeerState.used).
// - Bounded spins: every wait reads %globaltimer and gives up after timeout_ns, records
//   the failure in host-mapped memory (status) and in PeerState.abort (so that the other
//   blocks and every later launch stop at once), and returns; the host reports
//   Error::Timeout, then Error::Aborted.
// - Calls agree on the device, with no host round trip: block 0 of every rank stores its
//   call (collective, dtype, op, count, root, algorithm, zero-copy offset) into its slot of
//   every peer's pad, tagged with the call number, and before it a 64-bit digest of the
//   call in one 16-byte line (one load tells whether the calls agree: a round of loads of
//   the whole call took microseconds through host memory; the whole call is read only
//   where the digests differ, to name both calls); before it reads a peer's data or
//   writes its output, every block compares each peer's call with its own (pull kernels
//   within their first barrier, push kernels while polling their mailboxes); where the
//   regions are host memory, block 0 alone, whose verdict the other blocks wait for in
//   device memory before they write output (peer_share_agreement). A difference
//   is recorded like a timeout (both calls in the status), so every rank stops, writes no
//   output, and reports Error::Mismatch naming both calls; the communicator is unusable
//   afterwards, as after an NCCL asynchronous error. A rank that rejects its arguments, or
//   whose call moves nothing, still launches (peer_agree_only), so that its peers learn at
//   once instead of waiting.

#define PEER_MAX_RANKS 8
#define PEER_MAX_BLOCKS 128
#define PEER_TRACE_CALLS 4096  // records of the trace ring (comm_peer::trace)
#define PEER_MAX_THREADS 512
// Signal channels: the user's 4, then the communicator's own (comm_peer::layout).
#define PEER_CHANNELS 7

// status[0] codes (comm_peer::status mirrors them).
#define PEER_OK 0
#define PEER_TIMEOUT_BARRIER 1
#define PEER_TIMEOUT_LAMPORT 2
#define PEER_TIMEOUT_SIGNAL 3
#define PEER_MISMATCH 4
#define PEER_TIMEOUT_CALL 5
// The status word after the record: the ticket of the last barrier the host waits for
// (peer_barrier_kernel with a non-zero ticket in PeerArgs.count) that saw every rank.
#define PEER_STATUS_BARRIER 18

// Words of a call descriptor (comm_peer::kernels::CALL_WORDS).
#define PEER_CALL_WORDS 7

// Lamport mailbox kinds (first index of PeerState.used).
#define PEER_MB_ONESHOT 0
#define PEER_MB_RECV 1
#define PEER_MB_RESULT 2

// One rank's call as a peer sees it: every word carries the call's tag (call number + 1) in
// its upper half, so that a reader knows from the words alone that all of them are this
// call's: no release/acquire pair, and the whole call comes in one round of loads.
struct PeerCall {
    uint64_t w[PEER_CALL_WORDS];
    uint64_t unused;
};

struct PeerPad {
    uint32_t flags[2][PEER_MAX_BLOCKS][PEER_MAX_RANKS];
    uint32_t chan[PEER_CHANNELS][PEER_MAX_RANKS];
    PeerCall calls[2][PEER_MAX_RANKS];
    // {digest low, tag, digest high, tag}: every sender's of one parity in one 128-byte
    // line, which a warp's checkers load in one request.
    alignas(128) uint4 digests[2][PEER_MAX_RANKS];
};

struct PeerState {
    uint32_t seq[PEER_MAX_BLOCKS];  // collective calls completed, one copy per block index
    uint32_t abort;  // a spin gave up: every later launch returns at once
    uint32_t agreed;  // host regions: call number + 1 once block 0 found every peer's call the same
    uint64_t used[3][3];  // [mailbox kind][buffer]: bytes per sender slot written by that call
    uint32_t sent[PEER_CHANNELS][PEER_MAX_RANKS];  // signals sent, per channel and peer
    uint32_t seen[PEER_CHANNELS][PEER_MAX_RANKS];  // signals consumed, per channel and peer
    uint64_t row_sums[PEER_MAX_BLOCKS];  // fused op: each block's part of its row's sum of squares, tagged
    uint32_t chunk_seen[PEER_MAX_BLOCKS];  // streamed push: 2 x call + 1 once chunk k's flags came
    uint32_t chunk_sent[PEER_MAX_BLOCKS];  // streamed push in place: 2 x call + 1 once chunk k is sent
};

struct PeerTable {
    char* ptr[PEER_MAX_RANKS];
};

// Kernel arguments, by value; comm_peer::kernels::PeerArgs is the same #[repr(C)].
struct PeerArgs {
    const char* input;        // this rank's input (user memory)
    char* output;             // this rank's output (may equal input)
    char* residual;           // fused op: residual, read and updated in place
    const char* weight;       // fused op: RMSNorm weight [hidden]
    const PeerTable* regions; // every rank's region, as mapped in this process
    const PeerTable* inputs;  // zero-copy: every rank's registered input buffer; else null
    uint32_t* status;         // host-mapped: [code, rank, phase, peer, mine[7], theirs[7], barrier]
    PeerState* state;         // this rank's bookkeeping, in its device's memory
    uint64_t* trace;          // diagnostic ring of PEER_TRACE_CALLS records of 8 words, or null
    uint64_t in_off;          // zero-copy: byte offset of the input in its registered buffer
    uint64_t count;           // elements (all-reduce, fused: rows * hidden); bytes for gather/bcast
    uint64_t part;            // two-shot pull: bytes of the message each part moves (a multiple of 16)
    uint64_t cap;             // bytes of one staging half (a multiple of 16)
    uint64_t lcap;            // bytes of one Lamport sender slot (a multiple of 16)
    uint64_t slice_cap;       // bytes of one two-shot push slice slot (a multiple of 16)
    uint64_t off_data, off_tmp, off_push, off_recv, off_result;
    const char* staged;       // one-shot by copies: every rank's part, in this device's memory
    uint64_t staged_pitch;    // bytes from one rank's part to the next there
    uint64_t timeout_ns;
    uint64_t hidden;          // fused op: row length
    float eps;                // fused op
    uint32_t rank;
    uint32_t world;
    uint32_t aligned;         // user buffers 16-byte aligned
    uint32_t gpu_scope;       // every rank on this device, regions in its memory: .gpu suffices
    uint32_t root;            // broadcast root
    uint32_t peer;            // signal primitives: the peer
    uint32_t channel;         // signal primitives: the channel
    uint32_t host;            // the regions are host memory mapped into the devices
    uint32_t writers;         // one-shot push over host memory by data and flags: writer blocks (0: Lamport)
    uint32_t call[PEER_CALL_WORDS + 1];  // this call, as every rank must see it (last word unused)
    uint64_t call_digest;     // its 64-bit digest (comm_peer::calls::digest), what peers compare first
    uint32_t taper_vecs;      // streamed one-shot push: vectors of its small first and last chunks (tapered kernels)
    uint32_t taper_big;       // streamed one-shot push with small chunks: its chunks of `part` bytes, between
                              // the small first one and the small last ones (tapered kernels)
    uint32_t late_chunk;      // tapered streamed push between two ranks on one link: 1 + the peer's chunk whose
                              // flag the call's later writer waits for before it writes (0: none)
    uint32_t spare;           // unused: keeps the struct free of padding
};

// ---------------------------------------------------------------------------------------
// Memory model (PTX, sm_70+).

__device__ __forceinline__ void peer_st_release(uint32_t* p, uint32_t v, bool gpu) {
    if (gpu) asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
    else asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t peer_ld_acquire(const uint32_t* p, bool gpu) {
    uint32_t v;
    if (gpu) asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    else asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint4 peer_ld_volatile(const uint4* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ void peer_st_volatile(uint4* p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

// Peer data after a barrier: cached in L2 only, so no stale L1 line can be returned.
__device__ __forceinline__ uint4 peer_ld_cg(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint64_t peer_now() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ---------------------------------------------------------------------------------------
// Per-block context: the tables copied to shared memory, the call number, the give-up flag.

struct PeerCtx {
    char* const* region;       // shared: region[p]
    const char* const* input;  // shared: zero-copy input of rank p (offset applied), or null
    const uint64_t* used;      // shared: PeerState.used as the kernel started, [kind * 3 + buffer]
    PeerState* state;
    volatile int* dead;        // shared: set once this block gave up
    uint64_t* times;           // shared, traced kernels: entry, prologue done, first wait done,
                               // first peer seen, own data sent
    uint32_t seq;
};

// Traced kernels: the end of the first wait for peers (their data, or the first barrier,
// and the comparison of the calls).
__device__ __forceinline__ void peer_trace_waited(const PeerArgs& a, const PeerCtx& c) {
    if (a.trace != nullptr && threadIdx.x == 0 && c.times[2] == 0) c.times[2] = peer_now();
}

// Traced kernels, by the thread that waited: the first peer's data or barrier flag seen,
// before the calls are compared.
__device__ __forceinline__ void peer_trace_seen(const PeerArgs& a, const PeerCtx& c) {
    if (a.trace != nullptr && c.times[3] == 0) c.times[3] = peer_now();
}

// Traced kernels, thread 0: this rank's data written (its stores issued), before any wait.
__device__ __forceinline__ void peer_trace_sent(const PeerArgs& a, const PeerCtx& c) {
    if (a.trace != nullptr && threadIdx.x == 0 && c.times[4] == 0) c.times[4] = peer_now();
}

__device__ __forceinline__ PeerPad* peer_pad(const PeerCtx& c, uint32_t p) {
    return reinterpret_cast<PeerPad*>(c.region[p]);
}

// Records a failure (the first one wins) and tells every later launch to give up.
__device__ void peer_fail(const PeerArgs& a, const PeerCtx& c, uint32_t code, uint32_t phase, uint32_t peer) {
    *c.dead = 1;
    *(volatile uint32_t*)&c.state->abort = 1;
    volatile uint32_t* s = a.status;
    if (s[0] == PEER_OK) {
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
__device__ __forceinline__ bool peer_give_up(const PeerArgs& a, const PeerCtx& c, uint64_t start, uint32_t& spins,
                                             uint32_t code, uint32_t phase, uint32_t peer) {
    if (*c.dead) return true;
    if ((++spins & 255) == 0) {
        if (*(volatile uint32_t*)&c.state->abort) {
            *c.dead = 1;
            return true;
        }
        if (peer_now() - start > a.timeout_ns) {
            peer_fail(a, c, code, phase, peer);
            return true;
        }
    }
    return false;
}

// Spins until *slot reaches `want` (signed difference), bounded. False on give-up.
__device__ __forceinline__ bool peer_wait_value(const PeerArgs& a, const PeerCtx& c, const uint32_t* slot,
                                                uint32_t want, uint32_t code, uint32_t phase, uint32_t peer) {
    const bool gpu = a.gpu_scope != 0;
    if ((int32_t)(peer_ld_acquire(slot, gpu) - want) >= 0) return true;
    const uint64_t start = peer_now();
    uint32_t spins = 0;
    while ((int32_t)(peer_ld_acquire(slot, gpu) - want) < 0) {
        if (peer_give_up(a, c, start, spins, code, phase, peer)) return false;
    }
    return true;
}

// The flag barrier of this block with the same-numbered block of every rank (see top).
// Returns false when the block must give up.
__device__ bool peer_barrier(const PeerArgs& a, const PeerCtx& c, uint32_t phase) {
    __syncthreads();
    const uint32_t value = 2u * c.seq + phase + 1u;
    const uint32_t p = threadIdx.x;
    if (p < a.world && !*c.dead) {
        peer_st_release(&peer_pad(c, p)->flags[phase][blockIdx.x][a.rank], value, a.gpu_scope != 0);
        peer_wait_value(a, c, &peer_pad(c, a.rank)->flags[phase][blockIdx.x][p], value, PEER_TIMEOUT_BARRIER,
                        phase, p);
    }
    __syncthreads();
    return !*c.dead;
}

// put_signal: the next count of (channel, peer) into my slot of the peer's pad. One thread.
__device__ void peer_put_signal(const PeerArgs& a, const PeerCtx& c, uint32_t peer, uint32_t channel) {
    uint32_t* sent = &c.state->sent[channel][peer];
    const uint32_t v = *sent + 1u;
    *sent = v;
    peer_st_release(&peer_pad(c, peer)->chan[channel][a.rank], v, a.gpu_scope != 0);
}

// wait_signal: the next count of (channel, peer) in the peer's slot of my pad. One thread.
__device__ bool peer_wait_signal(const PeerArgs& a, const PeerCtx& c, uint32_t peer, uint32_t channel) {
    uint32_t* seen = &c.state->seen[channel][peer];
    const uint32_t v = *seen + 1u;
    *seen = v;
    return peer_wait_value(a, c, &peer_pad(c, a.rank)->chan[channel][peer], v, PEER_TIMEOUT_SIGNAL, channel, peer);
}

// ---------------------------------------------------------------------------------------
// Agreement on the call (see top).

// This rank's call digest, computed by the host with each launch (the words mixed in
// turn, each step invertible, so that calls differing in one word always differ).
__device__ __forceinline__ uint64_t peer_call_digest(const PeerArgs& a) { return a.call_digest; }

// Stores this rank's call digest, then its call, into its slots of every peer's pad: block
// 0, thread p for peer p.
// First thing in a kernel, so that it travels while the rank stages or pushes its data.
__device__ __forceinline__ void peer_publish_call(const PeerArgs& a, const PeerCtx& c) {
    const uint32_t p = threadIdx.x;
    if (blockIdx.x != 0 || p >= a.world || p == a.rank) return;
    const uint64_t digest = peer_call_digest(a);
    peer_st_volatile(&peer_pad(c, p)->digests[c.seq & 1u][a.rank],
                     make_uint4((uint32_t)digest, c.seq + 1u, (uint32_t)(digest >> 32), c.seq + 1u));
    PeerCall* slot = &peer_pad(c, p)->calls[c.seq & 1u][a.rank];
    const uint64_t tag = (uint64_t)(c.seq + 1u) << 32;
#pragma unroll
    for (int i = 0; i < PEER_CALL_WORDS + 1; i += 2) {
        const uint64_t lo = tag | a.call[i];
        const uint64_t hi = i + 1 < PEER_CALL_WORDS ? tag | a.call[i + 1] : 0;
        asm volatile("st.volatile.global.v2.u64 [%0], {%1,%2};" ::"l"(&slot->w[i]), "l"(lo), "l"(hi) : "memory");
    }
}

// Records that peer `peer` makes another call than this rank (the first failure wins).
__device__ void peer_fail_mismatch(const PeerArgs& a, const PeerCtx& c, uint32_t peer, const uint32_t* theirs) {
    *c.dead = 1;
    *(volatile uint32_t*)&c.state->abort = 1;
    volatile uint32_t* s = a.status;
    if (s[0] == PEER_OK) {
        s[1] = a.rank;
        s[2] = 0;
        s[3] = peer;
        for (int i = 0; i < PEER_CALL_WORDS; ++i) {
            s[4 + i] = a.call[i];
            s[4 + PEER_CALL_WORDS + i] = theirs[i];
        }
        __threadfence_system();
        s[0] = PEER_MISMATCH;
    }
    __threadfence_system();
}

// Every word of a call slot, 16 bytes per load, each load issued before any result is used.
// Few and wide: where the slot is host memory, seven 8-byte loads took ~5.5 us after the
// peer's flag and four 16-byte ones ~2.8 us (one H200, two ranks, host backing), although a
// thread's volatile loads of host memory travel together (host-probe's bursts: 8 in 1.7 us).
__device__ __forceinline__ void peer_load_call(const PeerCall* slot, uint64_t* w) {
    uint64_t all[PEER_CALL_WORDS + 1];
#pragma unroll
    for (int i = 0; i < PEER_CALL_WORDS + 1; i += 2)
        asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];"
                     : "=l"(all[i]), "=l"(all[i + 1])
                     : "l"(&slot->w[i])
                     : "memory");
#pragma unroll
    for (int i = 0; i < PEER_CALL_WORDS; ++i) w[i] = all[i];
}

// peer_look_at_call's verdict on words already loaded.
__device__ int peer_judge_call(const PeerArgs& a, const PeerCtx& c, uint32_t p, const uint64_t* w) {
    const uint32_t tag = c.seq + 1u;
    uint32_t theirs[PEER_CALL_WORDS];
    bool arrived = true, same = true;
#pragma unroll
    for (int i = 0; i < PEER_CALL_WORDS; ++i) {
        arrived &= (uint32_t)(w[i] >> 32) == tag;
        theirs[i] = (uint32_t)w[i];
        same &= theirs[i] == a.call[i];
    }
    if (!arrived) return 0;
    if (same) return 1;
    peer_fail_mismatch(a, c, p, theirs);
    return -1;
}

// Looks at peer p's call slot once. 0: not all of this call's words are there yet; 1: they
// are, and the calls are the same; -1: they differ (recorded).
__device__ int peer_look_at_call(const PeerArgs& a, const PeerCtx& c, uint32_t p, const PeerCall* slot) {
    uint64_t w[PEER_CALL_WORDS];
    peer_load_call(slot, w);
    return peer_judge_call(a, c, p, w);
}

__device__ __forceinline__ const PeerCall* peer_call_of(const PeerArgs& a, const PeerCtx& c, uint32_t p) {
    return &peer_pad(c, a.rank)->calls[c.seq & 1u][p];
}

// Waits (bounded) until peer p's whole call is there and compares it with this rank's;
// false when they differ (recorded) or the wait gave up.
__device__ bool peer_await_call_words(const PeerArgs& a, const PeerCtx& c, uint32_t p) {
    const PeerCall* slot = peer_call_of(a, c, p);
    int seen = peer_look_at_call(a, c, p, slot);
    if (seen != 0) return seen > 0;
    const uint64_t start = peer_now();
    uint32_t spins = 0;
    while ((seen = peer_look_at_call(a, c, p, slot)) == 0) {
        if (peer_give_up(a, c, start, spins, PEER_TIMEOUT_CALL, 0, p)) return false;
    }
    return seen > 0;
}

__device__ __forceinline__ const uint4* peer_digest_of(const PeerArgs& a, const PeerCtx& c, uint32_t p) {
    return &peer_pad(c, a.rank)->digests[c.seq & 1u][p];
}

// The verdict on a peer's digest line, loaded already. 0: not this call's yet; 1: the same
// digest as this rank's; 2: another digest (the whole calls must be compared).
__device__ __forceinline__ int peer_judge_digest(const PeerArgs& a, const PeerCtx& c, const uint4& line) {
    const uint32_t tag = c.seq + 1u;
    if (line.y != tag || line.w != tag) return 0;
    const uint64_t mine = peer_call_digest(a);
    return line.x == (uint32_t)mine && line.z == (uint32_t)(mine >> 32) ? 1 : 2;
}

// Waits (bounded) until peer p's call digest is there and compares it with this rank's;
// where they differ, the whole calls (stored after the digest), once: inlined at every
// look, that comparison held registers there (and spilled). `first`: the digest line,
// loaded already. False when the calls differ (recorded) or a wait gave up.
__device__ bool peer_await_call_from(const PeerArgs& a, const PeerCtx& c, uint32_t p, uint4 first) {
    const uint4* line = peer_digest_of(a, c, p);
    int seen = peer_judge_digest(a, c, first);
    if (seen == 0) {
        const uint64_t start = peer_now();
        uint32_t spins = 0;
        while ((seen = peer_judge_digest(a, c, peer_ld_volatile(line))) == 0) {
            if (peer_give_up(a, c, start, spins, PEER_TIMEOUT_CALL, 0, p)) return false;
        }
    }
    return seen == 1 || peer_await_call_words(a, c, p);
}

__device__ __forceinline__ bool peer_await_call(const PeerArgs& a, const PeerCtx& c, uint32_t p) {
    return peer_await_call_from(a, c, p, peer_ld_volatile(peer_digest_of(a, c, p)));
}

// Spins until `word` of this rank's PeerState (device memory, written by another block of
// this launch) reaches `want`, bounded; stops at once when a block gave up or found the
// calls different (PeerState.abort). One thread.
__device__ __forceinline__ void peer_wait_on_device(const PeerArgs& a, const PeerCtx& c, const uint32_t* word,
                                                    uint32_t want, uint32_t code, uint32_t peer) {
    const uint64_t start = peer_now();
    uint32_t spins = 0;
    while (true) {
        uint32_t v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
        if ((int32_t)(v - want) >= 0) return;
        if (*(volatile uint32_t*)&c.state->abort) {
            *c.dead = 1;
            return;
        }
        if (peer_give_up(a, c, start, spins, code, 0, peer)) return;
    }
}

// Where the regions are host memory, only block 0 compares the calls, and the launch's
// other blocks wait for its verdict in this rank's device memory (PeerState.agreed) before
// they write output. Every block reading the same call slot costs far more there than the
// bytes suggest: loads of one host-memory line from many SMs complete one after another
// (one H200, two ranks, 42 KB one-shot push: 2 blocks 14 us, 11 blocks 50 us, almost all
// of it in the blocks' comparisons of the calls).
__device__ __forceinline__ bool peer_compares_calls(const PeerArgs& a) {
    return a.host == 0 || blockIdx.x == 0;
}

// Block 0's verdict that the calls agree (PeerState.agreed: `want`, this call's number + 1),
// for the launch's other blocks. `ordered`: a release, so that what block 0 saw before it
// (a barrier's flags, and so the data they guard) is seen by the blocks that wait for it;
// without it a plain store, where every block's data shows by itself whether it has come
// (Lamport). One thread.
__device__ __forceinline__ void peer_publish_agreement(const PeerCtx& c, uint32_t want, bool ordered) {
    if (ordered)
        asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&c.state->agreed), "r"(want) : "memory");
    else
        asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(&c.state->agreed), "r"(want) : "memory");
}

// This call's verdict as block 0 published it, looked at without waiting.
__device__ __forceinline__ uint32_t peer_look_at_agreement(const PeerCtx& c) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(&c.state->agreed) : "memory");
    return v;
}

__device__ __forceinline__ bool peer_is_agreed(const PeerCtx& c, uint32_t verdict) {
    return (int32_t)(verdict - (c.seq + 1u)) >= 0;
}

// The end of a first wait (every thread; after its __syncthreads): block 0 tells the other
// blocks that the calls agree (`ordered` as peer_publish_agreement); they wait for that,
// unless thread 0 has seen it already (`seen`). False when the block must stop.
__device__ bool peer_share_agreement(const PeerArgs& a, const PeerCtx& c, bool ordered = true, bool seen = false) {
    if (a.host == 0 || gridDim.x == 1) return !*c.dead;
    const uint32_t want = c.seq + 1u;
    if (blockIdx.x == 0) {
        if (threadIdx.x == 0 && !*c.dead) peer_publish_agreement(c, want, ordered);
        return !*c.dead;
    }
    if (threadIdx.x == 0 && !*c.dead && !seen)
        peer_wait_on_device(a, c, &c.state->agreed, want, PEER_TIMEOUT_CALL, (a.rank + 1u) % a.world);
    __syncthreads();
    return !*c.dead;
}

// Every block of a kernel that neither waits on a barrier nor polls data (peer_agree_only):
// thread p compares peer p's call with this rank's (push kernels fold this into their first
// wait, pull kernels into their first barrier). False when the block must stop (a mismatch,
// a wait that gave up). Peers can be at most one call ahead (every call waits for every
// rank), so the slot of this call's parity holds this call's words or those of two calls
// before.
__device__ bool peer_check_calls(const PeerArgs& a, const PeerCtx& c) {
    const uint32_t p = threadIdx.x;
    if (peer_compares_calls(a) && p < a.world && p != a.rank && !*c.dead) peer_await_call(a, c, p);
    __syncthreads();
    return !*c.dead;
}

// The first barrier of a pull kernel with the comparison of the calls folded in, so that
// the agreement costs no flight of its own: thread p releases its flag to peer p and waits
// for peer p's, looking at peer p's call slot now and then while it waits (a peer in a
// kernel of another kind never comes to this barrier, but its call does); once the flag has
// come, the call is compared (stored at the peer's kernel start, it has almost always
// arrived by then). Same flags and values as peer_barrier(a, c, 0).
__device__ bool peer_agreeing_barrier(const PeerArgs& a, const PeerCtx& c) {
    __syncthreads();
    peer_trace_sent(a, c);
    const uint32_t value = 2u * c.seq + 1u;
    const uint32_t p = threadIdx.x;
    const bool gpu = a.gpu_scope != 0;
    // With a second warp, its thread 32 + q waits for peer q's call while thread q waits for
    // the flag, so the comparison adds no round trip after the flag (through host memory a
    // round of loads takes a microsecond); a lone warp looks at the call now and then.
    const bool compares = peer_compares_calls(a);
    const bool split = compares && blockDim.x >= 64;
    const uint32_t q = threadIdx.x - 32u;
    if (split && q < a.world && q != a.rank && !*c.dead) peer_await_call(a, c, q);
    if (p < a.world && !*c.dead) {
        peer_st_release(&peer_pad(c, p)->flags[0][blockIdx.x][a.rank], value, gpu);
        if (p != a.rank) {
            const uint32_t* flag = &peer_pad(c, a.rank)->flags[0][blockIdx.x][p];
            const PeerCall* slot = peer_call_of(a, c, p);
            int seen = split || !compares ? 1 : 0;
            if ((int32_t)(peer_ld_acquire(flag, gpu) - value) < 0) {
                const uint64_t start = peer_now();
                uint32_t spins = 0;
                while ((int32_t)(peer_ld_acquire(flag, gpu) - value) < 0) {
                    if ((spins & 255) == 255 && seen == 0 && (seen = peer_look_at_call(a, c, p, slot)) < 0) break;
                    if (peer_give_up(a, c, start, spins, PEER_TIMEOUT_BARRIER, 0, p)) break;
                }
            }
            peer_trace_seen(a, c);
            if (!*c.dead && seen == 0) peer_await_call(a, c, p);
        }
    }
    __syncthreads();
    peer_trace_waited(a, c);
    return peer_share_agreement(a, c);
}

// peer_agreeing_barrier over host memory with one poller: every block releases its flag to
// every peer as there, but only block 0 waits, for every block's flag of every peer, a
// thread each, while its last warp compares the calls; the other blocks wait for its word
// in device memory (peer_share_agreement). So however many blocks read the message, one
// block's loads poll host memory, where every load costs a trip across the link. Blocks of
// one warp, a grid of one block, or regions in device memory take peer_agreeing_barrier.
__device__ bool peer_gathered_barrier(const PeerArgs& a, const PeerCtx& c) {
    if (a.host == 0 || blockDim.x < 64 || gridDim.x == 1) return peer_agreeing_barrier(a, c);
    __syncthreads();
    peer_trace_sent(a, c);
    const uint32_t value = 2u * c.seq + 1u, t = threadIdx.x, waiters = blockDim.x - 32u;
    const bool gpu = a.gpu_scope != 0;
    if (t < a.world && !*c.dead) peer_st_release(&peer_pad(c, t)->flags[0][blockIdx.x][a.rank], value, gpu);
    if (blockIdx.x == 0) {
        if (t >= waiters) {
            const uint32_t q = t - waiters;
            if (q < a.world && q != a.rank && !*c.dead) peer_await_call(a, c, q);
        } else {
            for (uint32_t i = t; i < a.world * gridDim.x; i += waiters) {
                const uint32_t p = i % a.world, b = i / a.world;
                if (p != a.rank && !*c.dead)
                    peer_wait_value(a, c, &peer_pad(c, a.rank)->flags[0][b][p], value, PEER_TIMEOUT_BARRIER, 0, p);
            }
        }
        peer_trace_seen(a, c);
    }
    __syncthreads();
    peer_trace_waited(a, c);
    return peer_share_agreement(a, c);
}

// ---------------------------------------------------------------------------------------
// Programmatic dependent launch (sm_90+): kernels are launched so that they may start while
// the previous kernel of their stream finishes; each waits for it (griddepcontrol.wait:
// every prerequisite grid complete, its memory visible) before reading anything a kernel
// may have written, and lets the next one start as soon as its own prologue is done.

__device__ __forceinline__ void peer_wait_previous() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void peer_let_next_start() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------
// Prologue and epilogue of every kernel.

// Touches each 64-byte line of the parameters before the wait for the previous kernel: a fresh
// launch's parameters miss the constant cache, and the misses then land while that kernel
// finishes instead of after it (measured: BENCHMARKS.md, "Parameters warmed"). The store
// that never happens keeps the compiler from dropping the loads.
__device__ __forceinline__ void peer_warm_args(const PeerArgs& a) {
    const uint64_t x = (uint64_t)a.input ^ (uint64_t)a.inputs ^ (uint64_t)a.trace ^ a.cap ^ a.off_tmp ^
                       (uint64_t)a.staged ^ a.rank ^ a.host ^ a.call[6] ^ a.call_digest ^ a.taper_big;
    __shared__ uint64_t s_warm;
    if (x == 0x9e3779b97f4a7c15ull) *(volatile uint64_t*)&s_warm = x;  // never: keeps the loads
}

// The prologue in two halves, so that a kernel can issue loads of its own between them
// (PEER_PROLOGUE is both). The first loads the tables into shared memory (written at join,
// so before the wait for the previous kernel), then waits for that kernel; the second loads
// the call number, the abort flag and the Lamport bookkeeping the epilogue needs (one
// thread, loads issued together: one memory round trip, not one per use) and returns at once
// when a previous launch gave up (the communicator is then unusable).
#define PEER_PROLOGUE_WAIT(a)                                                                         \
    peer_warm_args(a);                                                                               \
    __shared__ char* s_region[PEER_MAX_RANKS];                                                       \
    __shared__ const char* s_input[PEER_MAX_RANKS];                                                  \
    __shared__ uint64_t s_used[9];                                                                   \
    __shared__ uint32_t s_seq;                                                                       \
    __shared__ int s_dead;                                                                           \
    __shared__ uint64_t s_times[5];                                                                  \
    const uint64_t entry_ = a.trace != nullptr ? peer_now() : 0;                                     \
    PeerState* s_state = a.state;                                                                    \
    if (threadIdx.x < PEER_MAX_RANKS) {                                                              \
        const int p_ = threadIdx.x;                                                                  \
        s_region[p_] = p_ < (int)a.world ? a.regions->ptr[p_] : nullptr;                             \
        s_input[p_] = (a.inputs != nullptr && p_ < (int)a.world) ? a.inputs->ptr[p_] + a.in_off : nullptr; \
    }                                                                                                \
    peer_wait_previous();                                                                            \
    peer_let_next_start();

#define PEER_PROLOGUE_STATE(a, c)                                                                     \
    if (threadIdx.x == 0) {                                                                          \
        const uint32_t seq_ = *(volatile uint32_t*)&s_state->seq[blockIdx.x];                        \
        const uint32_t abort_ = *(volatile uint32_t*)&s_state->abort;                                \
        uint64_t used_[9];                                                                           \
        _Pragma("unroll") for (int k_ = 0; k_ < 9; ++k_)                                             \
            used_[k_] = *(volatile uint64_t*)&s_state->used[k_ / 3][k_ % 3];                         \
        s_seq = seq_;                                                                                \
        s_dead = abort_ ? 1 : 0;                                                                     \
        _Pragma("unroll") for (int k_ = 0; k_ < 9; ++k_) s_used[k_] = used_[k_];                     \
        s_times[0] = entry_;                                                                         \
        s_times[2] = s_times[3] = s_times[4] = 0;                                                    \
    }                                                                                                \
    __syncthreads();                                                                                 \
    if (a.trace != nullptr && threadIdx.x == 0) s_times[1] = peer_now();                             \
    PeerCtx c{s_region, s_input, s_used, s_state, &s_dead, s_times, s_seq};                         \
    if (*c.dead) return;

#define PEER_PROLOGUE(a, c) \
    PEER_PROLOGUE_WAIT(a)     \
    PEER_PROLOGUE_STATE(a, c)

// What peer_reset_old_mailboxes resets: the slots peers wrote into (push), or this rank's
// own slot, which peers read (one-shot local).
#define PEER_RESET_PEERS 1u
#define PEER_RESET_OWN 2u
#define PEER_RESET_ALL 3u
// PeerState.used[PEER_MB_ONESHOT][buffer]: the call wrote its own slot (one-shot local),
// not the peers'.
#define PEER_USED_OWN (1ull << 63)

// Resets (to the sentinel) this rank's mailboxes of buffer (seq+2)%3, the previous call's,
// as far as that call wrote them (`which` of them).
// - What peers wrote needs no fence: this rank has had every peer's data of that call, and
//   peers write into that buffer again only two calls later, after kernel boundaries and
//   after seeing data this rank sends in the next call. So a kernel may do it at any point:
//   push kernels do it while their data travels, the others in the epilogue.
// - This rank's own slot (one-shot local), which peers read, only once every peer has been
//   seen in this call (its first wait or barrier is over): then each has finished the
//   previous call and read the slot. Its next writes come after kernel boundaries, and
//   peers read the buffer again only after seeing this rank's data of the next call, so
//   they find the sentinel or the new data, never the old (one device's memory, where
//   this kernel runs: one point of coherence).
__device__ __forceinline__ void peer_reset_old_mailboxes(const PeerArgs& a, const PeerCtx& c, uint32_t which) {
    const uint32_t old = (c.seq + 2u) % 3u;
    char* base = c.region[a.rank];
    const uint4 ones = make_uint4(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
    const uint64_t one_used = c.used[PEER_MB_ONESHOT * 3 + old];
    const bool own = (one_used & PEER_USED_OWN) != 0;
    if ((which & PEER_RESET_OWN) && own) {
        uint4* one = reinterpret_cast<uint4*>(base + a.off_push + ((uint64_t)old * a.world + a.rank) * a.lcap);
        for (uint64_t v = peer_tid(); v < (one_used & ~PEER_USED_OWN) / 16; v += peer_stride()) one[v] = ones;
    }
    if (!(which & PEER_RESET_PEERS)) return;
    const uint64_t used_one = own ? 0 : one_used / 16;
    const uint64_t used_recv = c.used[PEER_MB_RECV * 3 + old] / 16;
    const uint64_t used_res = c.used[PEER_MB_RESULT * 3 + old] / 16;
    // Skipped when empty: each turn reloads parameters even when it stores nothing (on one
    // H200, sending to the first poll took 0.93 us at 8 ranks against 0.38 at 2).
    for (uint32_t p = 0; (used_one | used_recv) != 0 && p < a.world; ++p) {
        // A push never sends into its own slot (its contribution comes from its input), so
        // that slot still holds the sentinel: resetting it would only cost writes, which
        // cross PCIe where the regions are host memory.
        if (p == a.rank) continue;
        uint4* one = reinterpret_cast<uint4*>(base + a.off_push + ((uint64_t)old * a.world + p) * a.lcap);
        for (uint64_t v = peer_tid(); v < used_one; v += peer_stride()) one[v] = ones;
        uint4* recv = reinterpret_cast<uint4*>(base + a.off_recv + ((uint64_t)old * a.world + p) * a.slice_cap);
        for (uint64_t v = peer_tid(); v < used_recv; v += peer_stride()) recv[v] = ones;
    }
    uint4* res = reinterpret_cast<uint4*>(base + a.off_result + (uint64_t)old * a.lcap);
    for (uint64_t v = peer_tid(); v < used_res; v += peer_stride()) res[v] = ones;
}

// Over host memory, a one-shot push all-reduce whose threads wait for one vector of each
// peer resets what each peer wrote into its mailboxes in the previous call, where that is at
// least this many bytes, once its first wait is over rather than while its data travels:
// PCIe reads do not pass writes, so a large reset issued before the polls holds them back
// by its drain (and, where ranks share a GPU, the peers' data on the link). A small one
// drains under the wait; issued late it holds up the end. One H200, two ranks on host
// memory, graphs: issued in the epilogue it lost 0.45-0.7 us up to 20 KiB; issued after the
// wait it won 0.3 us at 32 KiB, 0.55 at 42 KB and 1.0 at 64-80 KiB, and tied at 24 KiB. One
// H100, the same (2026-12-07): after the wait it won 0.36 us at 20 KiB and lost 0.23-0.26 at
// 8-16 KiB. (The fused op, whose threads wait row by row, resets early at every size: not
// measured.)
#define PEER_LATE_RESET_BYTES (20u << 10)

// Whether this call's one-shot push resets its peers' slots of the previous call late (see
// PEER_LATE_RESET_BYTES), as far as the previous call goes: after its first wait, not
// before it. Reads only the call state of the prologue, so every thread gets one answer.
__device__ __forceinline__ bool peer_resets_late(const PeerArgs& a, const PeerCtx& c) {
    const uint64_t used = c.used[PEER_MB_ONESHOT * 3 + (c.seq + 2u) % 3u];
    return a.host != 0 && !(used & PEER_USED_OWN) && used >= PEER_LATE_RESET_BYTES;
}

// Resets the previous call's mailboxes (`reset`: which of them; push kernels reset what
// peers wrote early), records what this call wrote into buffer seq%3 (bytes per sender slot
// of each kind; the one-shot kind with PEER_USED_OWN where it wrote its own slot), then
// advances this block's copies of the call counter (see the top) by `calls`: a launch that
// ran as several calls (two-shot pull's parts) wrote no mailbox in any of them, and has
// reset the previous call's mailboxes itself. Nothing here waits for memory: the next
// launch reads all of it after this one has completed. Every caller has seen every peer in
// this call (its barrier, its wait or its comparison of the calls), or has given up.
__device__ __forceinline__ void peer_epilogue(const PeerArgs& a, const PeerCtx& c, uint64_t oneshot_bytes, uint64_t recv_vecs,
                              uint64_t result_vecs, uint32_t reset = PEER_RESET_ALL, uint32_t calls = 1u) {
    __syncthreads();
    if (*c.dead) return;
    peer_reset_old_mailboxes(a, c, reset);
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        for (uint32_t k = calls > 3u ? calls - 3u : 0u; k < calls; ++k) {
            const uint32_t buf = (c.seq + k) % 3u;
            const bool last = k + 1u == calls;
            c.state->used[PEER_MB_ONESHOT][buf] = last ? oneshot_bytes : 0;
            c.state->used[PEER_MB_RECV][buf] = last ? recv_vecs * 16 : 0;
            c.state->used[PEER_MB_RESULT][buf] = last ? result_vecs * 16 : 0;
        }
    }
    // One store per thread: a small grid leaves up to PEER_MAX_BLOCKS copies to each block,
    // and one thread storing them one after another cost ~10 ns each (1.4 us for one block).
    for (uint32_t b = blockIdx.x + threadIdx.x * gridDim.x; b < PEER_MAX_BLOCKS; b += gridDim.x * blockDim.x)
        c.state->seq[b] = c.seq + calls;
    // Traced: block 0's record of this call (call number + 1, so that 0 marks an empty one).
    if (a.trace != nullptr && threadIdx.x == 0 && blockIdx.x == 0) {
        uint64_t* r = a.trace + (uint64_t)(c.seq % PEER_TRACE_CALLS) * 8;
        r[0] = (uint64_t)c.seq + 1u;
        r[1] = c.times[0];
        r[2] = c.times[1];
        r[3] = c.times[2];
        r[4] = peer_now();
        r[5] = (uint64_t)gridDim.x << 32 | blockDim.x;
        r[6] = c.times[4];
        r[7] = c.times[3];
    }
}
