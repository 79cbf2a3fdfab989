// peer_collectives.cu: every collective over peer memory, written once for every source of
// that memory (comm-ipc's registered regions, comm-symm's symmetric heap). peer_io.cuh,
// peer_sync.cuh and peer_lamport.cuh are prepended by the crate (comm_peer::kernels).
//
// - Every partition is by 16-byte vector index, the same on every rank and in every step,
//   so the per-block barrier of block b covers everything block b reads next.
// - Determinism: every element is reduced in rank order 0..n-1 in f32 by exactly one code
//   path (one-shot: every rank; two-shot: the slice's owner, whose result everyone
//   copies), so all ranks hold bitwise-identical results.
// - One kernel per call; everything that changes from call to call lives in PeerState on
//   the device, so calls can be captured into CUDA graphs and replayed.

// ---------------------------------------------------------------------------------------
// All-reduce. `nvec` = 16-byte vectors of the message.

// oneshot-pull: (eager) copy the input into this rank's data buffer of this call's parity;
// barrier; every rank reads every rank's vector and reduces. Eager needs no end barrier:
// the other parity was last read in the previous call, which every peer finished before
// it entered this call's barrier. Zero-copy reads the peers' own buffers, so it ends with
// a barrier before they may be written again. `first`: eager, this thread's first input
// vector, loaded already.
template <int DT, int OP>
__device__ void peer_oneshot_pull(const PeerArgs& a, const PeerCtx& c, uint64_t nvec, uint4 first) {
    const bool zc = c.input[0] != nullptr;
    const uint64_t dbuf = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const bool aligned = a.aligned != 0;
    if (!zc) {
        uint4* mine = reinterpret_cast<uint4*>(c.region[a.rank] + dbuf);
        // `first` is loaded where the launch has no zero-copy table (the same test as the
        // loader's); a table without this rank's buffer would still be read correctly.
        if (peer_tid() < nvec)
            mine[peer_tid()] = a.inputs == nullptr ? first : peer_load_user<DT>(a.input, peer_tid(), a.count, aligned);
        peer_copy_from(
            peer_tid() + peer_stride(), nvec,
            [&](uint64_t v) { return peer_load_user<DT>(a.input, v, a.count, aligned); },
            [&](uint64_t v, uint4 w) { mine[v] = w; });
    }
    if (!peer_agreeing_barrier(a, c)) return;
    for (uint64_t v = peer_tid(); v < nvec; v += peer_stride()) {
        uint4 w[PEER_MAX_RANKS];
#pragma unroll
        for (int p = 0; p < PEER_MAX_RANKS; ++p) {
            if (p < (int)a.world) {
                w[p] = zc ? peer_load_user<DT>(c.input[p], v, a.count, aligned)
                          : peer_ld_cg(reinterpret_cast<const uint4*>(c.region[p] + dbuf) + v);
            }
        }
        peer_store_user<DT>(a.output, v, a.count, aligned, peer_reduce<DT, OP>(a, w));
    }
    if (zc) peer_barrier(a, c, 1);
}

// twoshot-pull, one part of the message (`count` elements from `input`/`output`, zero-copy
// inputs from byte `zc_off` of the peers' buffers), as call c.seq. Staged: rank r writes
// slice s of its input into rank s's data buffer of this call's parity (sender slot
// peer_slot(r, s), world - 1 slots of S vectors, which the host's part size keeps within a
// staging half) and keeps its own slice where it lies; barrier; rank r reduces slice r from
// its input and the slots (rank order), into its output and its tmp; barrier; every rank
// copies slice s from rank s's tmp. So no rank copies its own input first, the
// reduce-scatter's slices cross the links as stores, and only the all-gather reads a peer.
// Peers' stores land before the call is agreed, but only in the staging half of this call's
// parity, which no rank reads before the agreeing barrier. Zero-copy: rank r reads slice r
// from every rank's registered input where it lies. Inputs are read before the second
// barrier only, so zero-copy needs no third barrier (and in place is safe: rank r writes
// output slice r after reading input slice r, the other slices after the second barrier).
// `first`: the call's first part, whose first barrier compares the calls. `pitch_vecs`: the
// vectors whose slices set S (0: this part's own), those of a whole part wherever a launch
// holds several, so that a shorter last part lays its slots over the same vectors, and so
// the same blocks, as the part two before it in the same staging half. False when the
// block must stop.
__device__ __forceinline__ uint32_t peer_slot(uint32_t sender, uint32_t owner) {
    return sender < owner ? sender : sender - 1u;
}

template <int DT, int OP>
__device__ bool peer_twoshot_part(const PeerArgs& a, const PeerCtx& c, const char* input, char* output, uint64_t count,
                                  uint64_t zc_off, uint64_t pitch_vecs, bool first) {
    const bool zc = c.input[0] != nullptr;
    const uint64_t nvec = (count + PeerDt<DT>::VEC - 1) / PeerDt<DT>::VEC;
    const uint64_t dbuf = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const bool aligned = a.aligned != 0;
    const uint64_t S = ((pitch_vecs != 0 ? pitch_vecs : nvec) + a.world - 1) / a.world;
    const uint32_t me = a.rank;
    const auto slice_len = [&](uint32_t s) -> uint64_t {
        const uint64_t from = s * S;
        return from >= nvec ? 0 : (nvec - from < S ? nvec - from : S);
    };
    if (!zc) {
        for (uint32_t k = 1; k < a.world; ++k) {
            // Every rank starts with the next rank's slice, so that no rank gets every
            // peer's stores at once.
            const uint32_t s = (me + k) % a.world;
            uint4* dst = reinterpret_cast<uint4*>(c.region[s] + dbuf) + peer_slot(me, s) * S;
            peer_copy(
                slice_len(s), [&](uint64_t i) { return peer_load_user<DT>(input, s * S + i, count, aligned); },
                [&](uint64_t i, uint4 w) { dst[i] = w; });
        }
    }
    if (!(first ? peer_agreeing_barrier(a, c) : peer_barrier(a, c, 0))) return false;
    uint4* tmp = reinterpret_cast<uint4*>(c.region[me] + a.off_tmp);
    const uint4* staged = reinterpret_cast<const uint4*>(c.region[me] + dbuf);
    for (uint64_t i = peer_tid(); i < slice_len(me); i += peer_stride()) {
        const uint64_t v = me * S + i;
        uint4 w[PEER_MAX_RANKS];
#pragma unroll
        for (int p = 0; p < PEER_MAX_RANKS; ++p) {
            if (p < (int)a.world) {
                w[p] = zc                ? peer_load_user<DT>(c.input[p] + zc_off, v, count, aligned)
                       : p == (int)me ? peer_load_user<DT>(input, v, count, aligned)
                                         : peer_ld_cg(staged + peer_slot(p, me) * S + i);
            }
        }
        const uint4 r = peer_reduce<DT, OP>(a, w);
        tmp[i] = r;
        peer_store_user<DT>(output, v, count, aligned, r);
    }
    if (!peer_barrier(a, c, 1)) return false;
    for (uint32_t k = 1; k < a.world; ++k) {
        // Start with the next rank's slice, so that the ranks do not all read rank 0 first.
        const uint32_t s = (me + k) % a.world;
        const uint4* src = reinterpret_cast<const uint4*>(c.region[s] + a.off_tmp);
        peer_copy(
            slice_len(s), [&](uint64_t i) { return peer_ld_cg(src + i); },
            [&](uint64_t i, uint4 w) { peer_store_user<DT>(output, s * S + i, count, aligned, w); });
    }
    return true;
}

// Parts of a two-shot pull call: a.part bytes each (a multiple of 16; 0: one part), the
// last one shorter. A call of one part divides nothing: a 64-bit division is a subroutine
// of ~100 instructions, ~0.25 us of a one-part call (one H200, 2 ranks).
__device__ __forceinline__ uint32_t peer_twoshot_parts(const PeerArgs& a, uint64_t bytes) {
    return bytes <= a.part || a.part == 0 ? 1u : (uint32_t)((bytes + a.part - 1) / a.part);
}

// twoshot-pull: the whole call in one launch, part after part, each as the call number it
// would have as a launch of its own (c.seq + j: its data parity and barrier values), so that
// no part waits for a kernel boundary. A part reuses a staging half two parts later, once
// every peer has passed the barrier that ends this rank's reads of it; those barriers join
// block b with block b only, so every part lays its slots with the pitch of a whole part
// and each staging vector is written and read by the same block in every part. The previous
// call's mailboxes are reset once every peer is seen (the first barrier), since a peer's next
// call may push into the same buffer as that call did when the parts are 3k + 2. Returns the
// number of parts, the calls that the epilogue counts, also when a part fails.
template <int DT, int OP> __device__ uint32_t peer_twoshot_pull(const PeerArgs& a, const PeerCtx& c) {
    const uint64_t size = PeerDt<DT>::SIZE, bytes = a.count * size;
    const uint32_t parts = peer_twoshot_parts(a, bytes);
    const uint64_t step = a.part == 0 ? bytes : a.part;
    for (uint32_t j = 0; j < parts; ++j) {
        const uint64_t at = (uint64_t)j * step;
        const uint64_t n = (bytes - at < step ? bytes - at : step) / size;
        PeerCtx part = c;
        part.seq = c.seq + j;
        const uint64_t pitch_vecs = parts > 1 ? step / 16 : 0;
        if (!peer_twoshot_part<DT, OP>(a, part, a.input + at, a.output + at, n, at, pitch_vecs, j == 0)) break;
        if (j == 0) peer_reset_old_mailboxes(a, c, PEER_RESET_ALL);
    }
    return parts;
}

// The wait and reduction of the one-shot Lamport kernels once this rank's data is out:
// every peer's slot at box(p), the calls compared with the wait for each thread's first
// vector (peer_poll_agreeing; own0, its own contribution, loaded already), then the rest
// in batches. With `late`, the previous call's slots are reset after the first wait. The
// verdict (peer_share_agreement) needs no ordering here, every vector shows by itself
// whether it has come: a release would hold block 0 until its writes before it (its
// pushes, and with `late` that reset) reached host memory. Between two ranks the verdict
// comes with the peer's digest, ahead of the data (peer_poll_agreeing's agreed_early).
template <int DT, int OP, typename Box>
__device__ void peer_reduce_arrivals(const PeerArgs& a, const PeerCtx& c, Box box, uint64_t nvec, bool have,
                                     uint4 own0, bool late) {
    const bool aligned = a.aligned != 0;
    const uint64_t v0 = peer_tid();
    uint4 w0[PEER_MAX_RANKS];
    bool agreed_early = false;
    if (!peer_poll_agreeing<DT, true>(a, c, box, have, own0, v0, w0, &agreed_early)) return;
    if (late) peer_reset_old_mailboxes(a, c, PEER_RESET_PEERS);
    const uint4 r0 = have ? peer_reduce<DT, OP>(a, w0) : uint4{};
    if (!peer_share_agreement(a, c, false, agreed_early)) return;
    if (have) peer_store_user<DT>(a.output, v0, a.count, aligned, r0);
    peer_reduce_batches<DT, OP>(
        a, c, box, v0 + peer_stride(), nvec, [](uint64_t v) { return v; },
        [&](uint64_t v, uint4 r) { peer_store_user<DT>(a.output, v, a.count, aligned, r); });
}

// One-shot Lamport exchange, no barrier. The calls are compared with the wait for each
// thread's first vector (peer_poll_agreeing), which is `first`, loaded already.
// - oneshot-push (LOCAL false): write the input into this rank's slot of every peer's
//   mailbox; then wait for every peer's slot of this rank's mailbox and reduce.
// - oneshot-local (LOCAL true, every rank's region in this one device's memory): write the
//   input once, into this rank's own slot of its own mailbox buffer; wait for every peer's
//   own slot, in the peer's region, and reduce. A seventh of push's stores at 8 ranks: where
//   all regions are one device's memory, reading a peer's slot costs what reading one's own
//   does. Peers read this rank's slot, so it is reset (two calls later) only once this rank
//   has seen every peer in its next call (PEER_USED_OWN, peer_reset_old_mailboxes).
template <int DT, int OP, bool LOCAL>
__device__ void peer_oneshot_lamport(const PeerArgs& a, const PeerCtx& c, uint64_t nvec, uint4 first) {
    const bool aligned = a.aligned != 0;
    const uint64_t slot0 = a.off_push + (uint64_t)(c.seq % 3u) * a.world * a.lcap;
    uint4* mine = reinterpret_cast<uint4*>(c.region[a.rank] + slot0 + a.rank * a.lcap);
    const auto send = [&](uint64_t v, uint4 w) {
        if constexpr (LOCAL) peer_st_volatile(mine + v, w);
        else peer_push(a, c, slot0, a.lcap, v, w);
    };
    const uint64_t v0 = peer_tid();
    const bool have = v0 < nvec;
    const uint4 own0 = have ? peer_sanitize<DT>(first) : uint4{};
    if (have) send(v0, own0);
    for (uint64_t v = v0 + peer_stride(); v < nvec; v += peer_stride())
        send(v, peer_sanitize<DT>(peer_load_user<DT>(a.input, v, a.count, aligned)));
    peer_trace_sent(a, c);
    // A large reset goes after the first wait (peer_resets_late), but only where that wait
    // is every thread's last (a vector each): later polls would queue behind it.
    const bool late = nvec <= peer_stride() && peer_resets_late(a, c);
    if (!late) peer_reset_old_mailboxes(a, c, PEER_RESET_PEERS);
    if constexpr (!LOCAL) peer_hold_first_poll(a, nvec * 16);
    if constexpr (LOCAL) {
        // Every peer's slot, from a table in shared memory: computed where the waits use
        // it, the addresses would hold registers through them (and spill).
        __shared__ const char* s_slot[PEER_MAX_RANKS];
        if (threadIdx.x < a.world) s_slot[threadIdx.x] = c.region[threadIdx.x] + slot0 + threadIdx.x * a.lcap;
        __syncthreads();
        peer_reduce_arrivals<DT, OP>(a, c, [](uint32_t p) { return s_slot[p]; }, nvec, have, own0, late);
    } else {
        const char* inbox = c.region[a.rank] + slot0;
        peer_reduce_arrivals<DT, OP>(a, c, [inbox, &a](uint32_t p) { return inbox + p * a.lcap; }, nvec, have,
                                     own0, late);
    }
}

// Vectors start, start + stride, ... below `to` of the output: this rank's input reduced
// with the peers' slots of `inbox` (slot peer_slot(p, rank) of nvec vectors from peer p), in
// rank order. Entries in batches of PEER_MAX_RANKS / world, every load of a batch in flight
// together (through host memory a load takes a microsecond; one after another they would
// add up); entry i of a batch is vector i / world of rank i % world, so that order is rank
// order.
template <int DT, int OP>
__device__ void peer_reduce_slots(const PeerArgs& a, const uint4* inbox, uint64_t nvec, uint64_t start, uint64_t to,
                                  uint64_t stride) {
    const bool aligned = a.aligned != 0;
    const uint32_t world = a.world, per = PEER_MAX_RANKS / world;
    for (uint64_t base = start; base < to; base += per * stride) {
        uint4 s[PEER_MAX_RANKS];
#pragma unroll
        for (int i = 0; i < PEER_MAX_RANKS; ++i) {
            const uint32_t e = i / world, p = i % world;
            const uint64_t v = base + e * stride;
            if (e >= per || v >= to) continue;
            s[i] = p == a.rank ? peer_load_user<DT>(a.input, v, a.count, aligned)
                               : peer_ld_volatile(inbox + peer_slot(p, a.rank) * nvec + v);
        }
        float acc[PeerDt<DT>::VEC];
#pragma unroll
        for (int i = 0; i < PEER_MAX_RANKS; ++i) {
            const uint32_t e = i / world, p = i % world;
            const uint64_t v = base + e * stride;
            if (e >= per || v >= to) continue;
            peer_fold<DT, OP>(a, acc, s[i], p);
            if (p + 1 == world) peer_store_user<DT>(a.output, v, a.count, aligned, peer_pack<DT>(acc));
        }
    }
}

// oneshot-push over host memory, for messages of a few chunks at most (a.writers != 0):
// rank r stores its input into sender slot peer_slot(r, p) of every peer p's data half of
// this call's parity, then the gathered barrier (each block's release orders its stores
// before its flag; block 0 alone waits for every block's flag of every peer and tells the
// others in device memory), then every rank reduces the peers' slots in its own half with
// its own input, in rank order, a vector per thread. Where the regions are host memory
// this moves every byte across the link once each way: Lamport mailboxes must be reset to
// the sentinel (a second write of every byte), and one-shot pull reads this rank's own data
// back from host memory. No closing
// barrier: a peer writes this half again two calls later, after the barrier of the next
// call, which this rank reaches only once it has read this call's slots. `first`: this
// thread's first input vector, loaded already. The host keeps (world - 1) slots of the
// message within a staging half.
template <int DT, int OP>
__device__ void peer_oneshot_flagged(const PeerArgs& a, const PeerCtx& c, uint64_t nvec, uint4 first) {
    const bool aligned = a.aligned != 0;
    const uint64_t dbuf = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const auto send = [&](uint64_t v, uint4 w) {
        for (uint32_t k = 1; k < a.world; ++k) {
            const uint32_t p = (a.rank + k) % a.world;
            reinterpret_cast<uint4*>(c.region[p] + dbuf)[peer_slot(a.rank, p) * nvec + v] = w;
        }
    };
    const uint64_t v0 = peer_tid(), stride = peer_stride();
    if (v0 < nvec) send(v0, first);
    peer_copy_from(
        v0 + stride, nvec, [&](uint64_t v) { return peer_load_user<DT>(a.input, v, a.count, aligned); }, send);
    if (!peer_gathered_barrier(a, c)) return;
    peer_reduce_slots<DT, OP>(a, reinterpret_cast<const uint4*>(c.region[a.rank] + dbuf), nvec, v0, nvec, stride);
}

// oneshot-stream: one-shot push over host memory for larger messages, streamed: the message
// is cut into chunks (of a.part bytes, or tapered: peer_tapered_start). The last a.writers
// blocks write (writer w: chunks w, w + writers, ...), the other `readers` blocks read: one a
// chunk in turn (reader r: chunks r, r + readers, ...), or, where there are two or more per
// chunk, a group of them each (peer_stream_read_grouped). A writer stores its chunk into
// sender slot peer_slot(r, p) of every peer p's data half of this call's parity, then
// releases the chunk's flag to every peer (PeerPad.flags[0][chunk][sender], the value of a
// first barrier), and goes on to its next chunk without waiting; a reader waits for every
// peer's flag of its chunk, then reduces the peers' slots with its own input, in rank order.
// So reads of early chunks cross the link while later chunks are still being written (the
// link carries writes and reads in opposite directions). Every byte crosses the link once
// each way: one-shot pull reads its own data back, Lamport mailboxes need a second write of
// each (their reset). Calls are compared by block 0 (a reader, with the wait for its first
// chunk); the other readers wait for its verdict in device memory before they write output
// (peer_share_agreement). Writers write only into this call's staging half, which no rank
// reads before its flags, and nothing a rank reads is written there again too early: a peer
// writes this half again two calls later, after its next call saw every flag of this rank's
// next call, which this rank raises only after this call's reads (a kernel boundary). No
// closing barrier. In place, a chunk's readers also wait until this rank's writer has sent it
// (PeerState.chunk_sent, in device memory): they overwrite the input it sends from.
__device__ __forceinline__ uint32_t peer_stream_readers(const PeerArgs& a) { return gridDim.x - a.writers; }

// The first vector of chunk k of a tapered streamed one-shot push (the kernels
// peer_oneshot_tapered_*: Streamed::taper): a first chunk of a.taper_vecs vectors, then
// a.taper_big chunks of a.part bytes, then chunks of a.taper_vecs again, so that the first
// chunk's flag comes early and little is left to read after the last flag. (The even cut's
// chunk k starts at k * a.part / 16.)
__device__ __forceinline__ uint64_t peer_tapered_start(const PeerArgs& a, uint64_t k) {
    const uint64_t cv = a.part / 16, cs = a.taper_vecs, big = a.taper_big;
    if (k == 0) return 0;
    return k <= big + 1 ? cs + (k - 1) * cv : cs + big * cv + (k - 1 - big) * cs;
}

// The end of tapered chunk k (the message's end for the last).
__device__ __forceinline__ uint64_t peer_tapered_end(const PeerArgs& a, uint64_t k, uint64_t nvec) {
    const uint64_t end = peer_tapered_start(a, k + 1);
    return end < nvec ? end : nvec;
}

// The tapered chunks of a message of nvec vectors.
__device__ __forceinline__ uint64_t peer_tapered_count(const PeerArgs& a, uint64_t nvec) {
    const uint64_t cv = a.part / 16, cs = a.taper_vecs, head = cs + a.taper_big * cv;
    return 1 + a.taper_big + (nvec > head ? (nvec - head + cs - 1) / cs : 0);
}

// This thread's first input vector in a streamed one-shot push (its writer block's first
// chunk), or ~0 where it has none (readers, threads past the chunk or the message).
template <bool TAPERED> __device__ __forceinline__ uint64_t peer_stream_first(const PeerArgs& a, uint64_t nvec) {
    const uint32_t readers = peer_stream_readers(a);
    if constexpr (!TAPERED) {
        if (blockIdx.x < readers || threadIdx.x >= a.part / 16) return ~0ull;
        const uint64_t v = (uint64_t)(blockIdx.x - readers) * (a.part / 16) + threadIdx.x;
        return v < nvec ? v : ~0ull;
    }
    if (blockIdx.x < readers) return ~0ull;
    const uint64_t k = blockIdx.x - readers, v = peer_tapered_start(a, k) + threadIdx.x;
    return v < peer_tapered_end(a, k, nvec) ? v : ~0ull;
}

// The readers of a streamed push with `per` (>= 2) blocks a chunk: reader block b is block
// b % per of chunk b / per (every chunk has one group, the grid holding readers / per
// groups). The group's first block polls the chunk's flags in host memory and tells the
// others through PeerState.chunk_seen in device memory, so a chunk is read by several SMs
// while only one polls the link.
template <int DT, int OP>
__device__ void peer_stream_read_grouped(const PeerArgs& a, const PeerCtx& c, const uint4* inbox, uint64_t nvec,
                                         uint32_t per, bool in_place, bool split, uint32_t q) {
    const uint64_t cv = a.part / 16;
    const uint32_t world = a.world, me = a.rank, value = 2u * c.seq + 1u, p = threadIdx.x;
    const uint32_t k = blockIdx.x / per, j = blockIdx.x % per;
    if ((uint64_t)k * cv >= nvec) return;
    if (j == 0) {
        if (p < world && p != me && !*c.dead)
            peer_wait_value(a, c, &peer_pad(c, me)->flags[0][k][p], value, PEER_TIMEOUT_BARRIER, 0, p);
        else if (p == me && in_place && !*c.dead)
            peer_wait_on_device(a, c, &c.state->chunk_sent[k], value, PEER_TIMEOUT_BARRIER, (me + 1u) % world);
        if (!split && blockIdx.x == 0 && q < world && q != me && !*c.dead) peer_await_call(a, c, q);
    }
    peer_trace_seen(a, c);
    __syncthreads();
    if (threadIdx.x == 0 && !*c.dead) {
        if (j == 0)
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&c.state->chunk_seen[k]), "r"(value) : "memory");
        else
            peer_wait_on_device(a, c, &c.state->chunk_seen[k], value, PEER_TIMEOUT_BARRIER, (me + 1u) % world);
    }
    __syncthreads();
    peer_trace_waited(a, c);
    if (!peer_share_agreement(a, c)) return;
    const uint64_t end = (uint64_t)(k + 1) * cv, to = end < nvec ? end : nvec;
    peer_reduce_slots<DT, OP>(a, inbox, nvec, k * cv + j * blockDim.x + threadIdx.x, to, per * blockDim.x);
}

// The readers of a streamed push with one block a chunk: reader r reads chunks r, r +
// readers, ... Block 0 also compares the calls, with the wait for its first chunk.
template <int DT, int OP, bool TAPERED>
__device__ void peer_stream_read_each(const PeerArgs& a, const PeerCtx& c, const uint4* inbox, uint64_t nvec,
                                      uint64_t chunks, bool in_place, bool split, uint32_t q) {
    const uint64_t cv = a.part / 16;
    const uint32_t readers = peer_stream_readers(a), world = a.world, me = a.rank;
    const uint32_t value = 2u * c.seq + 1u, p = threadIdx.x;
    for (uint64_t k = blockIdx.x; k < chunks; k += readers) {
        if (p < world && p != me && !*c.dead)
            peer_wait_value(a, c, &peer_pad(c, me)->flags[0][k][p], value, PEER_TIMEOUT_BARRIER, 0, p);
        else if (p == me && in_place && !*c.dead)
            peer_wait_on_device(a, c, &c.state->chunk_sent[k], value, PEER_TIMEOUT_BARRIER, (me + 1u) % world);
        if (!split && blockIdx.x == 0 && k == 0 && q < world && q != me && !*c.dead) peer_await_call(a, c, q);
        if (k == blockIdx.x) {
            peer_trace_seen(a, c);
            __syncthreads();
            peer_trace_waited(a, c);
            if (!peer_share_agreement(a, c)) return;
        } else {
            __syncthreads();
            if (*c.dead) return;
        }
        if constexpr (TAPERED) {
            peer_reduce_slots<DT, OP>(a, inbox, nvec, peer_tapered_start(a, k) + threadIdx.x,
                                      peer_tapered_end(a, k, nvec), blockDim.x);
        } else {
            const uint64_t to = (k + 1) * cv < nvec ? (k + 1) * cv : nvec;
            peer_reduce_slots<DT, OP>(a, inbox, nvec, k * cv + threadIdx.x, to, blockDim.x);
        }
    }
}

// GROUPED: the readers come in groups of two or more a chunk (the kernels
// peer_oneshot_grouped_*, which the host launches only with such grids: Streamed::grouped;
// those of one reader a chunk carry none of the groups' code). TAPERED: the chunks taper
// (peer_tapered_start; one reader a chunk), in kernels of their own too, and the even cut
// keeps its own expressions below, so that the even kernels' images are those measured
// before the taper: with its code among theirs, 256-512 KiB (even chunks) took 0.3-1.1 us
// longer (one H100, two ranks, graphs).
template <int DT, int OP, bool GROUPED, bool TAPERED>
__device__ void peer_oneshot_streamed(const PeerArgs& a, const PeerCtx& c, uint64_t nvec, uint4 first) {
    const bool aligned = a.aligned != 0;
    const uint64_t dbuf = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const uint64_t cv = a.part / 16, chunks = TAPERED ? peer_tapered_count(a, nvec) : (nvec + cv - 1) / cv;
    const uint32_t readers = peer_stream_readers(a), world = a.world, me = a.rank;
    const uint32_t value = 2u * c.seq + 1u, p = threadIdx.x;
    const bool in_place = a.input == a.output;
    if (blockIdx.x >= readers) {
        const auto send = [&](uint64_t v, uint4 w) {
            for (uint32_t k = 1; k < world; ++k) {
                const uint32_t q = (me + k) % world;
                reinterpret_cast<uint4*>(c.region[q] + dbuf)[peer_slot(me, q) * nvec + v] = w;
            }
        };
        const uint64_t first_v = peer_stream_first<TAPERED>(a, nvec);
        // Two ranks on one link take turns to write first: the rank other than seq % 2
        // holds its writers back until the peer's chunk a.late_chunk - 1 is flagged, its
        // readers taking in the peer's first chunks meanwhile (see Streamed::late_chunk).
        if (TAPERED && a.late_chunk != 0 && world == 2 && me != (c.seq & 1u)) {
            if (threadIdx.x == 0 && !*c.dead)
                peer_wait_value(a, c, &peer_pad(c, me)->flags[0][a.late_chunk - 1u][1u - me], value,
                                PEER_TIMEOUT_BARRIER, 0, 1u - me);
            __syncthreads();
            if (*c.dead) return;
        }
        for (uint64_t k = blockIdx.x - readers; k < chunks; k += a.writers) {
            const uint64_t from = TAPERED ? peer_tapered_start(a, k) : k * cv;
            const uint64_t to = TAPERED ? peer_tapered_end(a, k, nvec) : from + cv < nvec ? from + cv : nvec;
            uint64_t v = from + threadIdx.x;
            if (v == first_v) {
                send(v, first);
                v += blockDim.x;
            }
            peer_copy_strided(
                v, to, blockDim.x, [&](uint64_t i) { return peer_load_user<DT>(a.input, i, a.count, aligned); }, send);
            __syncthreads();
            // The release orders every thread's stores of the chunk (seen through the
            // block barrier) before the flag.
            if (p < world && p != me) peer_st_release(&peer_pad(c, p)->flags[0][k][me], value, false);
            else if (p == me && in_place) peer_st_release(&c.state->chunk_sent[k], value, true);
        }
        peer_trace_sent(a, c);
        return;
    }
    // Block 0 compares the calls: thread 32 + q for peer q while thread q waits for the
    // flag, or thread q after it where the block is a lone warp.
    const bool split = blockDim.x >= 64;
    const uint32_t q = split ? threadIdx.x - 32u : threadIdx.x;
    if (split && blockIdx.x == 0 && q < world && q != me && !*c.dead) peer_await_call(a, c, q);
    const uint4* inbox = reinterpret_cast<const uint4*>(c.region[me] + dbuf);
    if constexpr (GROUPED) {
        peer_stream_read_grouped<DT, OP>(a, c, inbox, nvec, readers / (uint32_t)chunks, in_place, split, q);
    } else {
        peer_stream_read_each<DT, OP, TAPERED>(a, c, inbox, nvec, chunks, in_place, split, q);
    }
}

// twoshot-push (Lamport): push slice s of the input into rank s's slice mailbox; reduce
// this rank's slice from every rank's contribution (rank order); push the result into
// every peer's result mailbox; wait for the other slices' results.
template <int DT, int OP> __device__ void peer_twoshot_push(const PeerArgs& a, const PeerCtx& c, uint64_t nvec) {
    const bool aligned = a.aligned != 0;
    const uint32_t me = a.rank, buf = c.seq % 3u;
    const uint64_t S = (nvec + a.world - 1) / a.world;
    const uint64_t recv0 = a.off_recv + (uint64_t)buf * a.world * a.slice_cap;
    const uint64_t result0 = a.off_result + (uint64_t)buf * a.lcap;
    for (uint32_t k = 1; k < a.world; ++k) {
        const uint32_t s = (me + k) % a.world;
        uint4* dst = reinterpret_cast<uint4*>(c.region[s] + recv0 + me * a.slice_cap);
        for (uint64_t i = peer_tid(); i < S && s * S + i < nvec; i += peer_stride())
            peer_st_volatile(dst + i, peer_sanitize<DT>(peer_load_user<DT>(a.input, s * S + i, a.count, aligned)));
    }
    peer_trace_sent(a, c);
    peer_reset_old_mailboxes(a, c, PEER_RESET_PEERS);
    const char* inbox = c.region[me] + recv0;
    const auto box = [inbox, cap = a.slice_cap](uint32_t p) { return inbox + p * cap; };
    // The calls are compared with the wait for each thread's first vector of the slice.
    const uint64_t i0 = peer_tid();
    const bool have = i0 < S && me * S + i0 < nvec;
    const uint4 own0 = have ? peer_sanitize<DT>(peer_load_user<DT>(a.input, me * S + i0, a.count, aligned)) : uint4{};
    uint4 w0[PEER_MAX_RANKS];
    if (!peer_poll_agreeing<DT>(a, c, box, have, own0, i0, w0)) return;
    const uint4 r0 = have ? peer_reduce<DT, OP>(a, w0) : uint4{};
    if (!peer_share_agreement(a, c)) return;
    // This rank's slice: entries [0, mine) of the slice mailboxes, vectors me * S + i.
    const uint64_t mine = me * S >= nvec ? 0 : (nvec - me * S < S ? nvec - me * S : S);
    const auto publish = [&](uint64_t i, uint4 reduced) {
        const uint64_t v = me * S + i;
        const uint4 r = peer_sanitize<DT>(reduced);
        for (uint32_t k = 1; k < a.world; ++k) {
            const uint32_t p = (me + k) % a.world;
            peer_st_volatile(reinterpret_cast<uint4*>(c.region[p] + result0) + v, r);
        }
        peer_store_user<DT>(a.output, v, a.count, aligned, r);
    };
    if (have) publish(i0, r0);
    if (!peer_reduce_batches<DT, OP>(
            a, c, box, i0 + peer_stride(), mine, [&](uint64_t i) { return me * S + i; }, publish))
        return;
    const uint4* results = reinterpret_cast<const uint4*>(c.region[me] + result0);
    for (uint32_t k = 1; k < a.world; ++k) {
        const uint32_t s = (me + k) % a.world;
        const uint64_t theirs = s * S >= nvec ? 0 : (nvec - s * S < S ? nvec - s * S : S);
        if (!peer_take_batches<DT>(a, c, results + s * S, theirs, s,
                                   [&](uint64_t i, uint4 w) { peer_store_user<DT>(a.output, s * S + i, a.count, aligned, w); }))
            return;
    }
}

// oneshot-copy: the copy engines have brought every peer's part of this launch into
// `staged` (rank p's at p * staged_pitch) and the barriers around the copies are kernels of
// their own (comm_peer::copies); this kernel only reduces, like one-shot pull, in rank order
// in f32, this rank's part straight from its input. It touches no peer memory and no call
// counter; after a failed agreement or barrier (the communicator is then unusable) it
// writes nothing.
template <int DT, int OP> __device__ void peer_sum_staged(const PeerArgs& a) {
    peer_wait_previous();
    peer_let_next_start();
    if (*(volatile const uint32_t*)&a.state->abort) return;
    const uint64_t nvec = (a.count + PeerDt<DT>::VEC - 1) / PeerDt<DT>::VEC;
    const bool aligned = a.aligned != 0;
    for (uint64_t v = peer_tid(); v < nvec; v += peer_stride()) {
        uint4 w[PEER_MAX_RANKS];
#pragma unroll
        for (int p = 0; p < PEER_MAX_RANKS; ++p) {
            if (p < (int)a.world) {
                w[p] = p == (int)a.rank
                           ? peer_load_user<DT>(a.input, v, a.count, aligned)
                           : reinterpret_cast<const uint4*>(a.staged + (uint64_t)p * a.staged_pitch)[v];
            }
        }
        peer_store_user<DT>(a.output, v, a.count, aligned, peer_reduce<DT, OP>(a, w));
    }
}

#define PEER_ONESHOT_PULL 0
#define PEER_TWOSHOT_PULL 1
#define PEER_ONESHOT_PUSH 2
#define PEER_TWOSHOT_PUSH 3
#define PEER_ONESHOT_COPY 4
#define PEER_ONESHOT_LOCAL 5
#define PEER_ONESHOT_STREAM 6
#define PEER_ONESHOT_GROUPED 7
#define PEER_ONESHOT_TAPERED 8

template <int ALGO, int DT, int OP> __device__ void peer_all_reduce_over_peers(const PeerArgs& a) {
    PEER_PROLOGUE_WAIT(a)
    const uint64_t nvec = (a.count + PeerDt<DT>::VEC - 1) / PeerDt<DT>::VEC;
    // The one-shot kernels' first input vector of this thread, loaded while thread 0 loads
    // the call state, so that the first store (to the data buffer or the peers' mailboxes)
    // waits for one memory round trip, not two. Zero-copy pull reads inputs where they lie.
    constexpr bool streamed =
        ALGO == PEER_ONESHOT_STREAM || ALGO == PEER_ONESHOT_GROUPED || ALGO == PEER_ONESHOT_TAPERED;
    constexpr bool oneshot =
        ALGO == PEER_ONESHOT_PULL || ALGO == PEER_ONESHOT_PUSH || ALGO == PEER_ONESHOT_LOCAL || streamed;
    // A streamed one-shot push's writer loads the first vector of its first chunk.
    uint64_t v_first;
    if constexpr (streamed) v_first = peer_stream_first<ALGO == PEER_ONESHOT_TAPERED>(a, nvec);
    else v_first = peer_tid();
    const bool early = oneshot && v_first < nvec && (ALGO != PEER_ONESHOT_PULL || a.inputs == nullptr);
    const uint4 first = early ? peer_load_user<DT>(a.input, v_first, a.count, a.aligned != 0) : uint4{};
    PEER_PROLOGUE_STATE(a, c)
    peer_publish_call(a, c);
    const uint64_t S = (nvec + a.world - 1) / a.world;
    uint32_t calls = 1;
    if constexpr (ALGO == PEER_ONESHOT_PULL) peer_oneshot_pull<DT, OP>(a, c, nvec, first);
    else if constexpr (ALGO == PEER_TWOSHOT_PULL) calls = peer_twoshot_pull<DT, OP>(a, c);
    else if constexpr (ALGO == PEER_ONESHOT_PUSH) {
        if (a.writers != 0) peer_oneshot_flagged<DT, OP>(a, c, nvec, first);
        else peer_oneshot_lamport<DT, OP, false>(a, c, nvec, first);
    }
    else if constexpr (streamed)
        peer_oneshot_streamed<DT, OP, ALGO == PEER_ONESHOT_GROUPED, ALGO == PEER_ONESHOT_TAPERED>(a, c, nvec, first);
    else if constexpr (ALGO == PEER_ONESHOT_LOCAL) peer_oneshot_lamport<DT, OP, true>(a, c, nvec, first);
    else peer_twoshot_push<DT, OP>(a, c, nvec);
    // Push kernels reset what peers wrote while their own data travels (a large one-shot
    // reset over host memory, after the first wait: peer_resets_late); what peers read (a
    // one-shot local buffer) waits until every peer is seen in this call.
    constexpr bool push =
        ALGO == PEER_ONESHOT_PUSH || ALGO == PEER_TWOSHOT_PUSH || ALGO == PEER_ONESHOT_LOCAL || streamed;
    constexpr bool oneshot_mailbox = ALGO == PEER_ONESHOT_PUSH || ALGO == PEER_ONESHOT_LOCAL;
    // One-shot push by data and flags writes no mailbox and has reset none of them yet.
    const bool flagged = streamed || (ALGO == PEER_ONESHOT_PUSH && a.writers != 0);
    const uint64_t oneshot_used =
        oneshot_mailbox && !flagged ? nvec * 16 | (ALGO == PEER_ONESHOT_LOCAL ? PEER_USED_OWN : 0) : 0;
    // Two-shot pull has reset the previous call's mailboxes itself, and counts a call per part.
    constexpr bool parts = ALGO == PEER_TWOSHOT_PULL;
    peer_epilogue(a, c, oneshot_used, ALGO == PEER_TWOSHOT_PUSH ? S : 0, ALGO == PEER_TWOSHOT_PUSH ? nvec : 0,
                  parts ? 0u : push && !flagged ? PEER_RESET_OWN : PEER_RESET_ALL, calls);
}

template <int ALGO, int DT, int OP> __device__ void peer_all_reduce(const PeerArgs& a) {
    if constexpr (ALGO == PEER_ONESHOT_COPY) peer_sum_staged<DT, OP>(a);
    else peer_all_reduce_over_peers<ALGO, DT, OP>(a);
}

// ---------------------------------------------------------------------------------------
// reduce_scatter, all_gather, broadcast: staged through the data buffer of this call's parity.

// reduce_scatter: input holds world x count elements; rank r gets slice r reduced. Staged
// slice by slice (each slice from a 16-byte boundary), so vector i of every slice is
// written and read by the same block.
template <int DT, int OP> __device__ void peer_reduce_scatter(const PeerArgs& a) {
    PEER_PROLOGUE(a, c)
    peer_publish_call(a, c);
    constexpr int VEC = PeerDt<DT>::VEC;
    const uint64_t svec = (a.count + VEC - 1) / VEC;
    const uint64_t half = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const uint64_t sbytes = a.count * PeerDt<DT>::SIZE;
    const bool slices_aligned = a.aligned != 0 && sbytes % 16 == 0;
    uint4* mine = reinterpret_cast<uint4*>(c.region[a.rank] + half);
    for (uint32_t s = 0; s < a.world; ++s) {
        const char* src = a.input + s * sbytes;
        peer_copy(
            svec, [&](uint64_t i) { return peer_load_user<DT>(src, i, a.count, slices_aligned); },
            [&](uint64_t i, uint4 w) { mine[s * svec + i] = w; });
    }
    if (peer_agreeing_barrier(a, c)) {
        for (uint64_t i = peer_tid(); i < svec; i += peer_stride())
            peer_store_user<DT>(a.output, i, a.count, a.aligned != 0,
                                peer_reduce_staged<DT, OP>(a, c, half, a.rank * svec + i));
    }
    peer_epilogue(a, c, 0, 0, 0);
}

// all_gather (bytes): stage, barrier, copy every rank's staged input to its place.
extern "C" __global__ void __launch_bounds__(PEER_MAX_THREADS) peer_all_gather(PeerArgs a) {
    PEER_PROLOGUE(a, c)
    peer_publish_call(a, c);
    const uint64_t bytes = a.count, nvec = (bytes + 15) / 16;
    const uint64_t half = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    uint4* mine = reinterpret_cast<uint4*>(c.region[a.rank] + half);
    peer_copy(
        nvec, [&](uint64_t v) { return peer_load_bytes(a.input, v, bytes, a.aligned != 0); },
        [&](uint64_t v, uint4 w) { mine[v] = w; });
    if (peer_agreeing_barrier(a, c)) {
        for (uint32_t k = 0; k < a.world; ++k) {
            const uint32_t p = (a.rank + k) % a.world;
            const uint4* src = reinterpret_cast<const uint4*>(c.region[p] + half);
            char* dst = a.output + p * bytes;
            const bool aligned = a.aligned != 0 && (p * bytes) % 16 == 0;
            peer_copy(
                nvec, [&](uint64_t v) { return peer_ld_cg(src + v); },
                [&](uint64_t v, uint4 w) { peer_store_bytes(dst, v, bytes, aligned, w); });
        }
    }
    peer_epilogue(a, c, 0, 0, 0);
}

// broadcast (bytes, in place): the root stages, barrier, everyone else copies.
extern "C" __global__ void __launch_bounds__(PEER_MAX_THREADS) peer_broadcast(PeerArgs a) {
    PEER_PROLOGUE(a, c)
    peer_publish_call(a, c);
    const uint64_t bytes = a.count, nvec = (bytes + 15) / 16;
    const uint64_t half = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
    const bool aligned = a.aligned != 0;
    if (a.rank == a.root) {
        uint4* mine = reinterpret_cast<uint4*>(c.region[a.rank] + half);
        peer_copy(
            nvec, [&](uint64_t v) { return peer_load_bytes(a.output, v, bytes, aligned); },
            [&](uint64_t v, uint4 w) { mine[v] = w; });
    }
    if (peer_agreeing_barrier(a, c) && a.rank != a.root) {
        const uint4* src = reinterpret_cast<const uint4*>(c.region[a.root] + half);
        peer_copy(
            nvec, [&](uint64_t v) { return peer_ld_cg(src + v); },
            [&](uint64_t v, uint4 w) { peer_store_bytes(a.output, v, bytes, aligned, w); });
    }
    peer_epilogue(a, c, 0, 0, 0);
}

// ---------------------------------------------------------------------------------------
// Fused all-reduce + residual add + RMSNorm, bf16 rows of `hidden` (a multiple of 8;
// 16-byte aligned buffers): a = allreduce(x) rounded to bf16, residual' = bf16(residual +
// a) (written back), out = bf16(residual' * rsqrt(mean(residual'^2) + eps) * weight), as
// the unfused pipeline (all-reduce, then fused_add_rms_norm) computes it. The exchange is
// oneshot-push, oneshot-pull, or - where every rank's region is one device's memory - the
// one-shot local exchange (each rank writes its own slot once and reads its peers', as
// peer_oneshot_lamport<LOCAL>).
// - Rows are cut into `parts` (PeerRows): the host launches either rows x parts blocks,
//   block b taking part b % parts of row b / parts, one vector per thread; or at most a
//   block per row (parts = 1), block b taking rows b, b + grid, ... The same on every rank.
// - A block sums the squares of its vectors with comm-core's block sum (with one part, the
//   row's sum exactly as the examples' unfused add + RMSNorm computes it). The parts of a
//   row add theirs through PeerState.row_sums, in part order, so every rank gets the same
//   bits (the normalised output may differ from the unfused kernel's by a rounding). A part
//   waits for the other blocks of its own launch there: like the exchange's waits for the
//   peers' blocks, that needs every block resident, which the host's grid keeps.
#include "comm_reduce.cuh"

struct PeerRows {
    uint64_t rows, rvec;  // rows, and 16-byte vectors per row
    uint32_t parts;       // blocks per row
    uint64_t row0, rows_step;  // this block's first row, and the step to its next
    uint64_t j0, j_step;       // this thread's first vector of a row, and the step to its next
};

__device__ __forceinline__ PeerRows peer_rows(const PeerArgs& a) {
    PeerRows r;
    r.rvec = a.hidden / 8;
    r.rows = a.count / a.hidden;
    r.parts = gridDim.x > r.rows ? gridDim.x / (uint32_t)r.rows : 1u;
    r.row0 = blockIdx.x / r.parts;
    r.rows_step = gridDim.x / r.parts;
    r.j0 = (uint64_t)(blockIdx.x % r.parts) * blockDim.x + threadIdx.x;
    r.j_step = (uint64_t)r.parts * blockDim.x;
    return r;
}

// A row's sum of squares from this block's part (`mine`, the same in every thread): each
// part's is published tagged with the call, then read from every block of the row in part
// order. False (and *c.dead) when the wait gave up.
__device__ __forceinline__ bool peer_row_sum(const PeerArgs& a, const PeerCtx& c, const PeerRows& r, float mine,
                                             float* total) {
    __shared__ float s_part[PEER_MAX_BLOCKS];
    const uint64_t tag = (uint64_t)(c.seq + 1u) << 32;
    const uint32_t first = blockIdx.x - blockIdx.x % r.parts, q = threadIdx.x;
    if (q == 0) {
        const uint64_t word = tag | __float_as_uint(mine);
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(&c.state->row_sums[blockIdx.x]), "l"(word) : "memory");
    }
    if (q < r.parts) {
        float got = mine;
        if (first + q != blockIdx.x) {
            const uint64_t* slot = &c.state->row_sums[first + q];
            const uint64_t start = peer_now();
            uint32_t spins = 0;
            while (true) {
                uint64_t word;
                asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(word) : "l"(slot) : "memory");
                if ((word & ~0xffffffffull) == tag) {
                    got = __uint_as_float((uint32_t)word);
                    break;
                }
                if (peer_give_up(a, c, start, spins, PEER_TIMEOUT_BARRIER, 2, a.rank)) break;
            }
        }
        s_part[q] = got;
    }
    __syncthreads();
    float sum = 0.0f;
    for (uint32_t i = 0; i < r.parts; ++i) sum += s_part[i];
    *total = sum;
    __syncthreads();  // s_part is read before any thread's next row writes it
    return !*c.dead;
}

// This block's part of one row after the exchange: `reduced(j)` gives vector j of
// allreduce(x) (bf16 bits). False when a wait gave up (nothing more is written).
template <typename Reduced>
__device__ __forceinline__ bool peer_norm_row(const PeerArgs& a, const PeerCtx& c, const PeerRows& r, uint64_t row,
                                              Reduced reduced) {
    uint4* res = reinterpret_cast<uint4*>(a.residual) + row * r.rvec;
    uint4* out = reinterpret_cast<uint4*>(a.output) + row * r.rvec;
    const uint4* wt = reinterpret_cast<const uint4*>(a.weight);
    float sumsq = 0.0f;
    for (uint64_t j = r.j0; j < r.rvec; j += r.j_step) {
        float s[8], x[8];
        peer_unpack<COMM_BF16>(reduced(j), s);  // the all-reduce's bf16 result
        peer_unpack<COMM_BF16>(res[j], x);
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = x[e] + s[e];
        const uint4 h = peer_pack<COMM_BF16>(x);
        res[j] = h;
        peer_unpack<COMM_BF16>(h, x);  // the rounded residual is what gets normalised
#pragma unroll
        for (int e = 0; e < 8; ++e) sumsq += x[e] * x[e];
    }
    float total = comm_block_sum<PEER_MAX_THREADS>(sumsq);
    if (r.parts > 1 && !peer_row_sum(a, c, r, total, &total)) return false;
    const float scale = rsqrtf(total / (float)a.hidden + a.eps);
    for (uint64_t j = r.j0; j < r.rvec; j += r.j_step) {
        float x[8], w[8];
        peer_unpack<COMM_BF16>(res[j], x);  // this thread's own store above
        peer_unpack<COMM_BF16>(wt[j], w);
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = x[e] * scale * w[e];
        out[j] = peer_pack<COMM_BF16>(x);
    }
    return true;
}

// The Lamport half of the fused op once this rank's rows are out: wait for every peer's
// slot (slot p at box(p), as peer_poll) row by row, reduce, and normalise the rows. The calls
// are compared with the wait for each thread's first vector (of the block's first row),
// reduced at once (r0: four registers where the ranks' vectors would hold 32 through the
// rows, and spill), which the row's first pass then takes.
template <typename Box>
__device__ __forceinline__ void peer_norm_arrivals(const PeerArgs& a, const PeerCtx& c, Box box, const PeerRows& r) {
    const uint4* in = reinterpret_cast<const uint4*>(a.input);
    const uint64_t v0 = r.row0 * r.rvec + r.j0;
    const bool have = r.row0 < r.rows && r.j0 < r.rvec;
    const uint4 own0 = have ? peer_sanitize<COMM_BF16>(in[v0]) : uint4{};
    uint4 r0;
    bool agreed;
    {
        uint4 w0[PEER_MAX_RANKS];
        agreed = peer_poll_agreeing<COMM_BF16>(a, c, box, have, own0, v0, w0);
        r0 = have ? peer_reduce<COMM_BF16, COMM_SUM>(a, w0) : uint4{};
    }
    // Every thread, also after a failed wait (it ends with __syncthreads where it waits).
    agreed = peer_share_agreement(a, c) && agreed;
    for (uint64_t row = r.row0; agreed && row < r.rows; row += r.rows_step) {
        const bool done = peer_norm_row(a, c, r, row, [&](uint64_t j) {
            const uint64_t v = row * r.rvec + j;
            if (v == v0 && have) return r0;
            uint4 w[PEER_MAX_RANKS];
            peer_poll<COMM_BF16>(a, c, box, a.rank, peer_sanitize<COMM_BF16>(in[v]), v, w, 0);
            return peer_reduce<COMM_BF16, COMM_SUM>(a, w);
        });
        if (!done || *c.dead) break;  // uniform: read after the block sum's barriers
    }
}

template <int ALGO> __device__ void peer_fused_rmsnorm(const PeerArgs& a) {
    PEER_PROLOGUE(a, c)
    peer_publish_call(a, c);
    const PeerRows r = peer_rows(a);
    const uint64_t nvec = r.rows * r.rvec;
    const uint4* in = reinterpret_cast<const uint4*>(a.input);
    constexpr bool lamport = ALGO == PEER_ONESHOT_PUSH || ALGO == PEER_ONESHOT_LOCAL;
    if constexpr (lamport) {
        const uint64_t slot0 = a.off_push + (uint64_t)(c.seq % 3u) * a.world * a.lcap;
        uint4* mine = reinterpret_cast<uint4*>(c.region[a.rank] + slot0 + a.rank * a.lcap);
        for (uint64_t row = r.row0; row < r.rows; row += r.rows_step)
            for (uint64_t j = r.j0; j < r.rvec; j += r.j_step) {
                const uint64_t v = row * r.rvec + j;
                const uint4 w = peer_sanitize<COMM_BF16>(in[v]);
                if constexpr (ALGO == PEER_ONESHOT_LOCAL) peer_st_volatile(mine + v, w);
                else peer_push(a, c, slot0, a.lcap, v, w);
            }
        peer_reset_old_mailboxes(a, c, PEER_RESET_PEERS);
        // The slots, from a table in shared memory (computed where the waits use them, the
        // addresses would hold registers through the rows, and spill): every peer's own slot
        // (local), or this rank's mailbox slot of each peer (push).
        __shared__ const char* s_slot[PEER_MAX_RANKS];
        const uint32_t t = threadIdx.x;
        if (t < a.world) s_slot[t] = c.region[ALGO == PEER_ONESHOT_LOCAL ? t : a.rank] + slot0 + t * a.lcap;
        __syncthreads();
        peer_norm_arrivals(a, c, [](uint32_t p) { return s_slot[p]; }, r);
    } else {
        const uint64_t half = a.off_data + (uint64_t)(c.seq & 1u) * a.cap;
        uint4* mine = reinterpret_cast<uint4*>(c.region[a.rank] + half);
        for (uint64_t row = r.row0; row < r.rows; row += r.rows_step)
            for (uint64_t j = r.j0; j < r.rvec; j += r.j_step) mine[row * r.rvec + j] = in[row * r.rvec + j];
        if (peer_agreeing_barrier(a, c)) {
            for (uint64_t row = r.row0; row < r.rows; row += r.rows_step) {
                const bool done = peer_norm_row(a, c, r, row, [&](uint64_t j) {
                    return peer_reduce_staged<COMM_BF16, COMM_SUM>(a, c, half, row * r.rvec + j);
                });
                if (!done) break;
            }
        }
    }
    const uint64_t used = !lamport ? 0 : nvec * 16 | (ALGO == PEER_ONESHOT_LOCAL ? PEER_USED_OWN : 0);
    peer_epilogue(a, c, used, 0, 0, lamport ? PEER_RESET_OWN : PEER_RESET_ALL);
}

extern "C" __global__ void __launch_bounds__(PEER_MAX_THREADS) peer_fused_rmsnorm_push(PeerArgs a) {
    peer_fused_rmsnorm<PEER_ONESHOT_PUSH>(a);
}
extern "C" __global__ void __launch_bounds__(PEER_MAX_THREADS) peer_fused_rmsnorm_local(PeerArgs a) {
    peer_fused_rmsnorm<PEER_ONESHOT_LOCAL>(a);
}
extern "C" __global__ void __launch_bounds__(PEER_MAX_THREADS) peer_fused_rmsnorm_pull(PeerArgs a) {
    peer_fused_rmsnorm<PEER_ONESHOT_PULL>(a);
}

// ---------------------------------------------------------------------------------------
// Signal primitives as one-block launches (thread p handles peer p): they use only the
// user channels and the signal counts, never the collectives' call counter.

extern "C" __global__ void peer_put_signal_kernel(PeerArgs a) {
    PEER_PROLOGUE(a, c)
    if (threadIdx.x == 0) peer_put_signal(a, c, a.peer, a.channel);
}

extern "C" __global__ void peer_wait_signal_kernel(PeerArgs a) {
    PEER_PROLOGUE(a, c)
    if (threadIdx.x == 0) peer_wait_signal(a, c, a.peer, a.channel);
}

// A barrier the host waits for carries a ticket (count != 0): once every rank has arrived,
// the kernel hands it to the host-mapped status, and the host reads it there instead of
// waiting for the stream (whose completion may reach the host late where ranks share a
// device: comm_peer::PeerGroup::barrier_and_wait).
extern "C" __global__ void peer_barrier_kernel(PeerArgs a) {
    PEER_PROLOGUE(a, c)
    const uint32_t p = threadIdx.x;
    if (p < a.world && p != a.rank) {
        peer_put_signal(a, c, p, a.channel);
        peer_wait_signal(a, c, p, a.channel);
    }
    if (a.count != 0) {
        __syncthreads();
        if (threadIdx.x == 0 && !*c.dead) *(volatile uint32_t*)&a.status[PEER_STATUS_BARRIER] = (uint32_t)a.count;
    }
}

// A call's agreement without moving data: for a rank that rejected its arguments (its call
// words say so) and for a call with nothing to move, so that peers making another call fail
// at once rather than wait; when every rank makes the same such call, the calls agree and
// the call number advances everywhere alike.
extern "C" __global__ void peer_agree_only(PeerArgs a) {
    PEER_PROLOGUE(a, c)
    peer_publish_call(a, c);
    peer_check_calls(a, c);
    peer_epilogue(a, c, 0, 0, 0);
}

// ---------------------------------------------------------------------------------------
// Names: peer_<oneshot_pull|twoshot_pull|oneshot_push|twoshot_push|oneshot_copy|oneshot_local|
// oneshot_stream|oneshot_grouped|oneshot_tapered>_<f32|f16|bf16>_<op>,
// peer_reduce_scatter_<dtype>_<op> (op: sum, avg, max, min); two-rank versions of some,
// <name>_pair (PEER_AR_PAIR).

#define PEER_AR(ALGO, ANAME, DT, DNAME, OP, ONAME)                                                             \
    extern "C" __global__ void __launch_bounds__(PEER_MAX_THREADS, 1) peer_##ANAME##_##DNAME##_##ONAME(PeerArgs a) { \
        peer_all_reduce<ALGO, DT, OP>(a);                                                                      \
    }
// Two ranks: the same all-reduce with the world a constant (the arguments copied, world 2),
// so that the code for more peers, which every loop over PEER_MAX_RANKS unrolls, drops out
// (peer_oneshot_push_bf16_sum: 172 KB of sm_90 code, its pair 112 KB). Which kernels have
// one, and for which launches, is comm_peer's every_pair_kernel (measured there).
template <int ALGO, int DT, int OP> __device__ __forceinline__ void peer_all_reduce_pair(const PeerArgs& a) {
    PeerArgs pair = a;
    pair.world = 2;
    peer_all_reduce<ALGO, DT, OP>(pair);
}
#define PEER_AR_PAIR(ALGO, ANAME, DT, DNAME, OP, ONAME)                                                        \
    extern "C" __global__ void __launch_bounds__(PEER_MAX_THREADS, 1)                                        \
        peer_##ANAME##_##DNAME##_##ONAME##_pair(PeerArgs a) {                                                  \
        peer_all_reduce_pair<ALGO, DT, OP>(a);                                                                 \
    }
#define PEER_RS(DT, DNAME, OP, ONAME)                                                                          \
    extern "C" __global__ void __launch_bounds__(PEER_MAX_THREADS, 1) peer_reduce_scatter_##DNAME##_##ONAME(PeerArgs a) { \
        peer_reduce_scatter<DT, OP>(a);                                                                        \
    }
#define PEER_OPS(DT, DNAME, OP, ONAME)                                \
    PEER_AR(PEER_ONESHOT_PULL, oneshot_pull, DT, DNAME, OP, ONAME)    \
    PEER_AR(PEER_TWOSHOT_PULL, twoshot_pull, DT, DNAME, OP, ONAME)    \
    PEER_AR(PEER_ONESHOT_PUSH, oneshot_push, DT, DNAME, OP, ONAME)    \
    PEER_AR(PEER_TWOSHOT_PUSH, twoshot_push, DT, DNAME, OP, ONAME)    \
    PEER_AR(PEER_ONESHOT_COPY, oneshot_copy, DT, DNAME, OP, ONAME)    \
    PEER_AR(PEER_ONESHOT_LOCAL, oneshot_local, DT, DNAME, OP, ONAME)  \
    PEER_AR(PEER_ONESHOT_STREAM, oneshot_stream, DT, DNAME, OP, ONAME) \
    PEER_AR(PEER_ONESHOT_GROUPED, oneshot_grouped, DT, DNAME, OP, ONAME) \
    PEER_AR(PEER_ONESHOT_TAPERED, oneshot_tapered, DT, DNAME, OP, ONAME) \
    PEER_AR_PAIR(PEER_ONESHOT_PUSH, oneshot_push, DT, DNAME, OP, ONAME) \
    PEER_AR_PAIR(PEER_ONESHOT_LOCAL, oneshot_local, DT, DNAME, OP, ONAME) \
    PEER_AR_PAIR(PEER_ONESHOT_TAPERED, oneshot_tapered, DT, DNAME, OP, ONAME) \
    PEER_RS(DT, DNAME, OP, ONAME)
#define PEER_DTYPE(DT, DNAME)                 \
    PEER_OPS(DT, DNAME, COMM_SUM, sum)        \
    PEER_OPS(DT, DNAME, COMM_AVG, avg)        \
    PEER_OPS(DT, DNAME, COMM_MAX, max)        \
    PEER_OPS(DT, DNAME, COMM_MIN, min)

PEER_DTYPE(COMM_F32, f32)
PEER_DTYPE(COMM_F16, f16)
PEER_DTYPE(COMM_BF16, bf16)
