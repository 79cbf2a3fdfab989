// peer_lamport.cuh: Lamport mailboxes and reductions of the peer-memory kernels: pushing a
// vector into every peer's mailbox, polling mailboxes until no element holds the sentinel
// (one vector, or batches of them with every load in flight), and reducing the ranks'
// vectors in rank order in f32. Prepended (after peer_io.cuh and peer_sync.cuh, whose waits,
// give-up and call checks it uses) to peer_collectives.cu by the crate.
//
// Loads in flight together: every round of polls issues all its loads before it looks at
// any. A look right after its load waits for that load, so the next load would leave one
// round trip later: with the looks interleaved (as ptxas keeps them around volatile loads),
// one poll of 7 peers on one H200 took 1.54 us instead of one round trip.

// A load that travels with every round of a poll (peer_settle) until it is settled: none
// (PeerNoSide), or a peer's call digest (PeerDigestSide).
struct PeerNoSide {
    __device__ __forceinline__ void issue() {}
    __device__ __forceinline__ bool settled() { return true; }
    __device__ __forceinline__ uint32_t peer() const { return 0; }
};

// Peer p's call digest, its first load in `line` already; `seen` gets peer_judge_digest's
// verdict (0 while the digest has not come; start at 1 for a thread that has none to wait for).
// With `publish`, a digest that matches is at once block 0's verdict to the other blocks
// (unordered). Only between two ranks: block 0 then has one checker, whose match is the
// whole verdict; with more peers the checkers' results are combined first, so there the
// verdict waits for block 0's reduction. With `watch`, every round also looks at that
// verdict, into `verdict` (thread 0 of another block), so that it waits for nothing once its
// data are in.
struct PeerDigestSide {
    const PeerArgs* a;
    const PeerCtx* c;
    uint32_t p;
    uint4* line;
    int* seen;
    bool publish;
    bool watch;
    uint32_t* verdict;
    __device__ __forceinline__ void issue() {
        if (*seen == 0) *line = peer_ld_volatile(peer_digest_of(*a, *c, p));
        if (watch && !peer_is_agreed(*c, *verdict)) *verdict = peer_look_at_agreement(*c);
    }
    __device__ __forceinline__ bool settled() {
        if (*seen == 0) {
            *seen = peer_judge_digest(*a, *c, *line);
            if (*seen == 1 && publish) peer_publish_agreement(*c, c->seq + 1u, false);
        }
        return *seen != 0;
    }
    __device__ __forceinline__ uint32_t peer() const { return p; }
};

// Reloads the slots in `pending` (bit i: slot i, at slot(i)) until none holds the sentinel,
// bounded, and `side` with them until it is settled. `peer_of(i)` names the rank slot i
// waits for; with `look_at_calls`, a wait that lasts also looks at that rank's call, since a
// peer making another call may never send this data (say so, not a timeout). False when
// the block must stop.
template <int DT, typename Slot, typename PeerOf, typename Side = PeerNoSide>
__device__ __forceinline__ bool peer_settle(const PeerArgs& a, const PeerCtx& c, uint4* s, uint32_t pending,
                                            Slot slot, PeerOf peer_of, bool look_at_calls, uint32_t phase,
                                            Side side = {}) {
    if (!pending && side.settled()) return true;
    const uint64_t start = peer_now();
    uint32_t spins = 0;
    while (true) {
#pragma unroll
        for (int i = 0; i < PEER_MAX_RANKS; ++i)
            if (pending & (1u << i)) s[i] = peer_ld_volatile(slot(i));
        side.issue();
#pragma unroll
        for (int i = 0; i < PEER_MAX_RANKS; ++i)
            if ((pending & (1u << i)) && !peer_has_sentinel<DT>(s[i])) pending &= ~(1u << i);
        if (side.settled() && !pending) return true;
        const uint32_t late = pending ? peer_of(__ffs(pending) - 1) : side.peer();
        if (look_at_calls && (spins & 255) == 128 && peer_look_at_call(a, c, late, peer_call_of(a, c, late)) < 0)
            return false;
        if (peer_give_up(a, c, start, spins, PEER_TIMEOUT_LAMPORT, phase, late)) return false;
    }
}

// Fills w[p] with vector v of every sender p's slot (slot p at box(p): this rank's mailbox
// for push, the peer's own slot where ranks share a device), waiting until none holds the
// sentinel; w[skip] = own. On give-up *c.dead is set.
template <int DT, typename Box, typename Side = PeerNoSide>
__device__ __forceinline__ void peer_poll(const PeerArgs& a, const PeerCtx& c, Box box, uint32_t skip, uint4 own,
                                          uint64_t v, uint4* w, uint32_t phase, Side side = {}) {
    const auto slot = [&](int p) { return reinterpret_cast<const uint4*>(box((uint32_t)p)) + v; };
    uint32_t pending = 0;
    if (a.world <= 2) {
        // One peer: nothing to overlap, and the look beside its load costs the fewest
        // instructions (the loop below issues every slot's code, predicated off).
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            if (p == (int)skip) {
                w[p] = own;
            } else if (p < (int)a.world) {
                w[p] = peer_ld_volatile(slot(p));
                if (peer_has_sentinel<DT>(w[p])) pending |= 1u << p;
            }
        }
    } else {
#pragma unroll
        for (int p = 0; p < PEER_MAX_RANKS; ++p)
            if (p != (int)skip && p < (int)a.world) w[p] = peer_ld_volatile(slot(p));
#pragma unroll
        for (int p = 0; p < PEER_MAX_RANKS; ++p) {
            if (p == (int)skip) {
                w[p] = own;  // this rank's own contribution (a compile-time index keeps w in registers)
            } else if (p < (int)a.world && peer_has_sentinel<DT>(w[p])) {
                pending |= 1u << p;
            }
        }
    }
    peer_settle<DT>(a, c, w, pending, slot, [](int p) { return (uint32_t)p; }, true, phase, side);
}

// The first wait of a push kernel, with the comparison of the calls folded in: every
// thread with a vector (`have`) waits for vector v of every peer's slot as peer_poll does
// (the wait notices a peer making another call, whose data may never come, by the whole
// call), and thread p, the checker of peer p, polls peer p's call digest in the same
// rounds (a peer stores it first thing), so that the comparison adds no round trip of its
// own; a checker without a vector waits for the digest alone. Every thread of the block
// calls it (it ends with __syncthreads); false when the block must stop. Where the regions
// are host memory only block 0 compares the calls: the caller then calls
// peer_share_agreement before it writes output, once it has reduced w (so that the ranks'
// vectors are not live across that wait).
// EARLY (a kernel whose verdict needs no ordering, Lamport; two ranks over host memory):
// block 0's checker publishes the verdict as soon as the peer's digest matches (stored
// first thing, it comes well before the data), and thread 0 of every other block looks at
// the verdict with its polls; *agreed_early tells it whether it has seen it, so that
// peer_share_agreement need not wait a round trip through L2 for it.
template <int DT, bool EARLY = false, typename Box>
__device__ bool peer_poll_agreeing(const PeerArgs& a, const PeerCtx& c, Box box, bool have, uint4 own, uint64_t v,
                                   uint4* w, bool* agreed_early = nullptr) {
    // The checkers are warp 1 where there is one, so that their loads do not queue ahead of
    // warp 0's first polls. Waiting for the digest before polling held their whole warp a
    // round trip, and every block waits for block 0's verdict: over host memory, one H200,
    // two ranks, 1 KiB took 4.8 us that way and 3.7 this way, 42 KB 8.1 and 7.6. The first
    // digest load is the whole warp's (lanes past the peers load some peer's line and drop
    // it): issued by the checkers alone, in a branch, it still cost 1 KiB half of that.
    const uint32_t p = blockDim.x >= 64 ? threadIdx.x - 32u : threadIdx.x;
    const bool checker = peer_compares_calls(a) && p < a.world && p != a.rank && !*c.dead;
    const bool checker_warp = peer_compares_calls(a) && (blockDim.x < 64 || threadIdx.x / 32u == 1u);
    const bool early = EARLY && a.host != 0 && gridDim.x > 1 && a.world == 2;
    const bool watcher = early && blockIdx.x != 0 && threadIdx.x == 0;
    uint4 digest{};
    int seen = checker ? 0 : 1;
    uint32_t verdict = 0;
    if (checker_warp) digest = peer_ld_volatile(peer_digest_of(a, c, p % a.world));
    if (watcher) verdict = peer_look_at_agreement(c);
    if (have) {
        peer_poll<DT>(a, c, box, a.rank, own, v, w, 0,
                      PeerDigestSide{&a, &c, p, &digest, &seen, early && checker, watcher, &verdict});
        if (threadIdx.x == 0) peer_trace_seen(a, c);
    }
    if (checker && !*c.dead && seen != 1) {
        const bool same = peer_await_call_from(a, c, p, digest);
        if constexpr (EARLY) {
            if (same && early) peer_publish_agreement(c, c.seq + 1u, false);
        }
    }
    if constexpr (EARLY) {
        if (watcher) *agreed_early = peer_is_agreed(c, verdict);
    }
    __syncthreads();
    peer_trace_waited(a, c);
    return !*c.dead;
}

// Over host memory a load leaves the GPU only after every write queued on its link before
// it, so a push kernel's first poll waits behind its pushes in any case; and where the
// peer's pushes reached the link after it (its kernel started a little later, or it shares
// this GPU's link), it brings back the sentinel and a second round trip follows. Held back
// for part of the time the pushes take to cross (bytes / PEER_HOLD_BYTES_PER_CYCLE cycles),
// the first poll waits no longer and finds the peer's data more often. Measured (one H100,
// two ranks sharing it, graphs): 96-116 KiB 7-11% faster, 64 KiB level, 42 KB 0.1 us slower;
// so only from PEER_HOLD_FROM bytes, and never in a grid of one block.
#define PEER_HOLD_BYTES_PER_CYCLE 40
#define PEER_HOLD_FROM (64u << 10)
__device__ __forceinline__ void peer_hold_first_poll(const PeerArgs& a, uint64_t bytes) {
    if (a.host == 0 || gridDim.x == 1 || bytes < PEER_HOLD_FROM) return;
    const long long until = clock64() + (long long)(bytes / PEER_HOLD_BYTES_PER_CYCLE);
    while (clock64() < until) {
    }
}

// Vector v of this rank's data into slot `me` (at slot0 + me * slot_bytes) of every peer's
// mailbox, starting with the next rank, so that the ranks do not all write rank 0 first.
__device__ __forceinline__ void peer_push(const PeerArgs& a, const PeerCtx& c, uint64_t slot0, uint64_t slot_bytes,
                                          uint64_t v, uint4 w) {
    for (uint32_t k = 1; k < a.world; ++k) {
        const uint32_t p = (a.rank + k) % a.world;
        peer_st_volatile(reinterpret_cast<uint4*>(c.region[p] + slot0 + a.rank * slot_bytes) + v, w);
    }
}

// One step of the rank-order fold in f32: rank 0's vector starts it, each later rank's is
// combined in, and the mean divides once the last rank is in. Code that meets the ranks'
// vectors one at a time folds them in rank order and gets peer_reduce's bits.
template <int DT, int OP>
__device__ __forceinline__ void peer_fold(const PeerArgs& a, float* acc, const uint4& w, uint32_t p) {
    constexpr int VEC = PeerDt<DT>::VEC;
    float x[VEC];
    peer_unpack<DT>(w, x);
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = p == 0 ? x[e] : peer_combine<OP>(acc[e], x[e]);
    if constexpr (OP == COMM_AVG) {
        if (p + 1 == a.world) {
            const float n = (float)a.world;
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] = acc[e] / n;
        }
    }
}

// Reduces w[0..world) in rank order, in f32.
template <int DT, int OP> __device__ __forceinline__ uint4 peer_reduce(const PeerArgs& a, const uint4* w) {
    float acc[PeerDt<DT>::VEC];
#pragma unroll
    for (int p = 0; p < PEER_MAX_RANKS; ++p)
        if (p < (int)a.world) peer_fold<DT, OP>(a, acc, w[p], p);
    return peer_pack<DT>(acc);
}

// Waits for entries j = first, first + peer_stride(), ... < end of every peer's slot (slot p
// at box(p), as peer_poll) and hands each entry's reduction, in rank order,
// to done(j, reduced); this rank's contribution to entry j is vector user(j) of its input.
// Entries go in batches of PEER_MAX_RANKS / world (4 with two ranks) whose loads from every
// peer are in flight together, so that a thread waits one memory round trip per batch, not
// one per entry: through host memory a round trip takes microseconds, and over NVLink more
// loads in flight carry more bandwidth. Slot i of a batch holds entry i / world of rank
// i % world, so that slot order is rank order (peer_fold). False when the block must stop.
template <int DT, int OP, typename Box, typename User, typename Done>
__device__ bool peer_reduce_batches(const PeerArgs& a, const PeerCtx& c, Box box, uint64_t first, uint64_t end,
                                    User user, Done done) {
    const bool aligned = a.aligned != 0;
    const uint32_t world = a.world, per = PEER_MAX_RANKS / world;
    const uint64_t stride = peer_stride();
    // Slot i's entry and rank, computed where used (the divisions by a constant i are
    // hoisted out of the loop): an array of them, which peer_settle's look at the late slot
    // indexes at run time, would live in local memory (a 32-byte stack frame per thread).
    const auto entry_of = [&](uint32_t i) { return i / world; };
    const auto rank_of = [&](uint32_t i) { return i % world; };
    for (uint64_t base = first; base < end; base += per * stride) {
        const auto slot = [&](int i) {
            return reinterpret_cast<const uint4*>(box(rank_of(i))) + base + entry_of(i) * stride;
        };
        uint4 s[PEER_MAX_RANKS];
        uint32_t used = 0, pending = 0;
#pragma unroll
        for (int i = 0; i < PEER_MAX_RANKS; ++i) {
            const uint64_t j = base + entry_of(i) * stride;
            if (entry_of(i) >= per || j >= end) continue;
            used |= 1u << i;
            s[i] = rank_of(i) == a.rank ? peer_load_user<DT>(a.input, user(j), a.count, aligned)
                                        : peer_ld_volatile(slot(i));
        }
#pragma unroll
        for (int i = 0; i < PEER_MAX_RANKS; ++i) {
            if (!(used & (1u << i))) continue;
            if (rank_of(i) == a.rank) s[i] = peer_sanitize<DT>(s[i]);
            else if (peer_has_sentinel<DT>(s[i])) pending |= 1u << i;
        }
        if (!peer_settle<DT>(a, c, s, pending, slot, [&](int i) { return rank_of(i); }, true, 0)) return false;
        // Another thread of the block may have given up (a timeout): then nothing is written.
        if (*c.dead) return false;
        float acc[PeerDt<DT>::VEC];
#pragma unroll
        for (int i = 0; i < PEER_MAX_RANKS; ++i) {
            if (!(used & (1u << i))) continue;
            peer_fold<DT, OP>(a, acc, s[i], rank_of(i));
            if (rank_of(i) + 1 == world) done(base + entry_of(i) * stride, peer_pack<DT>(acc));
        }
    }
    return true;
}

// Waits for the entries j = peer_tid(), + peer_stride(), ... < end of `results` (vectors a
// peer pushed) in batches of PEER_MAX_RANKS, loads in flight together, and hands each to
// done(j, vector). False when the block must stop.
template <int DT, typename Done>
__device__ bool peer_take_batches(const PeerArgs& a, const PeerCtx& c, const uint4* results, uint64_t end,
                                  uint32_t peer, Done done) {
    const uint64_t stride = peer_stride();
    for (uint64_t base = peer_tid(); base < end; base += PEER_MAX_RANKS * stride) {
        const auto slot = [&](int i) { return results + base + i * stride; };
        uint4 w[PEER_MAX_RANKS];
        uint32_t used = 0, pending = 0;
#pragma unroll
        for (int i = 0; i < PEER_MAX_RANKS; ++i) {
            if (base + i * stride >= end) continue;
            used |= 1u << i;
            w[i] = peer_ld_volatile(slot(i));
        }
#pragma unroll
        for (int i = 0; i < PEER_MAX_RANKS; ++i)
            if ((used & (1u << i)) && peer_has_sentinel<DT>(w[i])) pending |= 1u << i;
        if (!peer_settle<DT>(a, c, w, pending, slot, [&](int) { return peer; }, false, 1)) return false;
        if (*c.dead) return false;
#pragma unroll
        for (int i = 0; i < PEER_MAX_RANKS; ++i)
            if (used & (1u << i)) done(base + i * stride, w[i]);
    }
    return true;
}

// Vector v of every rank's staged copy at `off` (L2 loads after a barrier), reduced.
template <int DT, int OP>
__device__ __forceinline__ uint4 peer_reduce_staged(const PeerArgs& a, const PeerCtx& c, uint64_t off, uint64_t v) {
    uint4 w[PEER_MAX_RANKS];
#pragma unroll
    for (int p = 0; p < PEER_MAX_RANKS; ++p)
        if (p < (int)a.world) w[p] = peer_ld_cg(reinterpret_cast<const uint4*>(c.region[p] + off) + v);
    return peer_reduce<DT, OP>(a, w);
}
