//! The [`Communicator`] trait, its [`Capabilities`], and the typed [`CommunicatorExt`].

use std::fmt;

use crate::buffer::{BufferMut, BufferRef, MemoryLocation};
use crate::call::CallDescriptor;
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::registered::RegisteredBuffer;

/// A collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Collective {
    /// Reduce across ranks; every rank gets the result.
    AllReduce,
    /// Concatenate every rank's buffer in rank order; every rank gets the whole.
    AllGather,
    /// Reduce across ranks; rank `r` gets the `r`-th slice of the result.
    ReduceScatter,
    /// Copy the root's buffer to every rank.
    Broadcast,
    /// Wait until every rank has arrived.
    Barrier,
}

impl Collective {
    /// Every collective, in a stable order.
    pub const ALL: [Collective; 5] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Barrier,
    ];

    /// Snake-case name (`all_reduce`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Barrier => "barrier",
        }
    }

    pub(crate) const fn code(self) -> u8 {
        match self {
            Collective::AllReduce => 0,
            Collective::AllGather => 1,
            Collective::ReduceScatter => 2,
            Collective::Broadcast => 3,
            Collective::Barrier => 4,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an algorithm moves data, for cost models. Each backend declares its own in
/// [`Capabilities`], so that a selector needs no table of backend names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TrafficPattern {
    /// Barrier, then every rank reads the whole message from every peer.
    OneShotPull,
    /// Every rank's slice `j` meets at rank `j` (written there, or read there in place),
    /// barrier, rank `j` reduces it, barrier, every rank reads the other reduced slices.
    TwoShotPull,
    /// Every rank writes its message into every peer (sentinel-detected), no barrier.
    OneShotPush,
    /// Push slice `j` to rank `j`, which reduces and pushes the result back.
    TwoShotPush,
    /// A ring (NCCL, MPI): `2(n - 1)` steps over neighbour links.
    Ring,
    /// Ranks are threads meeting at a lock, reading each other's memory.
    HostThreads,
    /// Every rank gathers every rank's message through the bootstrap.
    GatherAll,
    /// A library's kernels over symmetric windows that every rank registered (NCCL 2.27+):
    /// one-shot loads and stores between peers at the library's call cost, with a copy into
    /// and out of a registered staging window for buffers outside one.
    SymmetricWindow,
}

/// What happens when ranks disagree about a call (another count, dtype, collective...),
/// or when some rank rejects its arguments while others accept theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Disagreements {
    /// Settled before anything runs (the ranks exchange their calls): the call fails on
    /// every rank and the communicator stays usable.
    Settled,
    /// Found by the work itself, with no exchange per call (device kernels compare the
    /// calls): every rank gets an error from the call or, for enqueued work, from its next
    /// call or [`Communicator::async_error`]; the communicator is unusable afterwards, as
    /// after an NCCL asynchronous error. No output is written.
    Poison,
}

/// What a backend can do. A call outside these gets [`Error::Unsupported`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Collectives implemented.
    pub collectives: Vec<Collective>,
    /// Element types accepted.
    pub dtypes: Vec<DType>,
    /// Reduction operators accepted.
    pub ops: Vec<ReduceOp>,
    /// Accepts host memory.
    pub host_memory: bool,
    /// Accepts CUDA device memory.
    pub device_memory: bool,
    /// Largest message, in bytes per rank, if bounded.
    pub max_bytes: Option<usize>,
    /// Calls may be recorded inside CUDA-graph capture.
    pub graph_capture_safe: bool,
    /// Named algorithms the backend can be asked for.
    pub algorithms: Vec<String>,
    /// How the backend moves data when left to choose. `None` where that depends on the
    /// call: selectors then price its own choice as its cheapest named algorithm (and none
    /// without named patterns).
    pub pattern: Option<TrafficPattern>,
    /// How each named algorithm that has a known pattern moves data.
    pub algorithm_patterns: Vec<(String, TrafficPattern)>,
    /// What ranks that disagree about a call get.
    pub disagreements: Disagreements,
    /// Algorithms the backend has but cannot offer here, each with the reason (an old
    /// library, a registration that failed), for selectors to explain.
    pub unavailable: Vec<(String, String)>,
}

impl Capabilities {
    /// Everything, on host memory: what a complete host backend offers.
    pub fn host_complete() -> Self {
        Capabilities {
            collectives: Collective::ALL.to_vec(),
            dtypes: DType::ALL.to_vec(),
            ops: ReduceOp::ALL.to_vec(),
            host_memory: true,
            device_memory: false,
            max_bytes: None,
            graph_capture_safe: false,
            algorithms: Vec::new(),
            pattern: None,
            algorithm_patterns: Vec::new(),
            disagreements: Disagreements::Settled,
            unavailable: Vec::new(),
        }
    }

    /// Sets [`Self::algorithms`].
    pub fn with_algorithms(mut self, algorithms: &[&str]) -> Self {
        self.algorithms = algorithms.iter().map(|a| a.to_string()).collect();
        self
    }

    /// Sets [`Self::pattern`].
    pub fn with_pattern(mut self, pattern: TrafficPattern) -> Self {
        self.pattern = Some(pattern);
        self
    }

    /// Sets [`Self::algorithm_patterns`].
    pub fn with_algorithm_patterns(mut self, patterns: &[(&str, TrafficPattern)]) -> Self {
        self.algorithm_patterns = patterns.iter().map(|(a, p)| (a.to_string(), *p)).collect();
        self
    }

    /// How `algorithm` (`None`: the backend's own choice) moves data, if declared.
    pub fn pattern_of(&self, algorithm: Option<&str>) -> Option<TrafficPattern> {
        match algorithm {
            None => self.pattern,
            Some(name) => self
                .algorithm_patterns
                .iter()
                .find(|(a, _)| a == name)
                .map(|(_, p)| *p),
        }
    }

    /// Adds this backend's limits to a rank's verdict on its call: `Ok(call)` stays only if
    /// the backend can run it with buffers at every one of `locations`.
    pub fn admit(
        &self,
        backend: &str,
        verdict: Result<CallDescriptor>,
        locations: &[MemoryLocation],
    ) -> Result<CallDescriptor> {
        let call = verdict?;
        for &location in locations {
            self.check(
                backend,
                call.collective,
                call.dtype,
                call.op,
                call.send_bytes(),
                location,
            )?;
        }
        Ok(call)
    }

    /// Returns `Err(Unsupported)` unless this backend can run `collective` on `dtype` with
    /// `op` over `bytes` per rank in memory at `location`.
    pub fn check(
        &self,
        backend: &str,
        collective: Collective,
        dtype: DType,
        op: Option<ReduceOp>,
        bytes: usize,
        location: MemoryLocation,
    ) -> Result<()> {
        let refuse = |why: String| Err(Error::Unsupported(format!("{backend}: {why}")));
        if !self.collectives.contains(&collective) {
            return refuse(format!("{collective} is not implemented"));
        }
        if collective == Collective::Barrier {
            return Ok(());
        }
        if !self.dtypes.contains(&dtype) {
            return refuse(format!("dtype {dtype} is not supported"));
        }
        if let Some(op) = op {
            if !self.ops.contains(&op) {
                return refuse(format!("op {op} is not supported"));
            }
        }
        if let Some(max) = self.max_bytes {
            if bytes > max {
                return refuse(format!("{bytes} bytes exceed the maximum of {max}"));
            }
        }
        match location {
            MemoryLocation::Host if !self.host_memory => {
                refuse("host memory is not supported".into())
            }
            MemoryLocation::Device { .. } if !self.device_memory => {
                refuse("device memory is not supported".into())
            }
            _ => Ok(()),
        }
    }
}

/// One rank's handle on a group of ranks that run collectives together.
///
/// Object safe: `comm-select` holds several as `Box<dyn Communicator>`. Every rank of the
/// group must make the same sequence of calls with agreeing arguments; backends check this
/// and return [`Error::Mismatch`] on every rank when they disagree. Results are bitwise
/// identical on every rank. On GPU backends a call enqueues work on the buffers' stream
/// and returns; on host backends it returns when this rank's result is complete.
///
/// Buffers are [`BufferRef`]/[`BufferMut`] views; [`CommunicatorExt`] adds typed slice
/// methods.
///
/// ```
/// use comm_core::{Communicator, CommunicatorExt, LocalComm, ReduceOp};
///
/// let handles: Vec<_> = LocalComm::create(4)
///     .into_iter()
///     .map(|comm| {
///         std::thread::spawn(move || {
///             let mut x = vec![comm.rank() as f32 + 1.0; 3];
///             comm.all_reduce_in_place_slice(&mut x, ReduceOp::Sum).unwrap();
///             x
///         })
///     })
///     .collect();
/// for h in handles {
///     assert_eq!(h.join().unwrap(), vec![10.0; 3]);
/// }
/// ```
pub trait Communicator: Send {
    /// Backend name (`local`, `mpi`, `nccl`, ...).
    fn name(&self) -> &str;

    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// What this backend can do; computed once, borrowed on every call.
    fn capabilities(&self) -> &Capabilities;

    /// Reduces `send` across ranks into `recv` (same length and dtype).
    fn all_reduce(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()>;

    /// Reduces `buf` across ranks in place.
    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()>;

    /// Gathers every rank's `send` into `recv` (`world_size * send.len()`), in rank order.
    /// Optional: a backend without it leaves it out of [`Capabilities::collectives`].
    fn all_gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        let _ = (send, recv);
        Err(not_implemented(self.name(), Collective::AllGather))
    }

    /// Reduces `send` (`world_size * recv.len()` elements) across ranks; rank `r` receives
    /// elements `r * recv.len() .. (r + 1) * recv.len()` of the result. Optional.
    fn reduce_scatter(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let _ = (send, recv, op);
        Err(not_implemented(self.name(), Collective::ReduceScatter))
    }

    /// Copies `buf` of rank `root` into `buf` of every other rank. Optional.
    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        let _ = (buf, root);
        Err(not_implemented(self.name(), Collective::Broadcast))
    }

    /// Returns once every rank has entered the barrier.
    fn barrier(&self) -> Result<()>;

    /// An error that enqueued work recorded after its call returned (as NCCL's
    /// `ncclCommGetAsyncError`): device backends whose kernels find that ranks disagree
    /// about a call, or that a peer never came, report it here once the work has been
    /// waited for (and at their next call). Such an error leaves the communicator unusable.
    /// Host backends finish every call before returning: `Ok` always.
    fn async_error(&self) -> Result<()> {
        Ok(())
    }

    /// Uses `algorithm` (one of [`Capabilities::algorithms`]) for the following calls, or
    /// the backend's own choice for `None`. Every rank must choose alike. Backends without
    /// named algorithms accept only `None`.
    fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        match algorithm {
            None => Ok(()),
            Some(name) => Err(Error::Unsupported(format!(
                "{} has no algorithm `{name}`",
                self.name()
            ))),
        }
    }

    /// Collective: `bytes` of device memory registered with every rank, for collectives
    /// whose buffers lie in it (see [`RegisteredBuffer`]). Backends that register nothing
    /// return [`Error::Unsupported`]; memory of this kind works with them as plain memory.
    fn alloc_registered(&self, bytes: usize) -> Result<Box<dyn RegisteredBuffer>> {
        let _ = bytes;
        Err(Error::Unsupported(format!(
            "{} registers no buffers",
            self.name()
        )))
    }
}

fn not_implemented(backend: &str, collective: Collective) -> Error {
    Error::Unsupported(format!("{backend}: {collective} is not implemented"))
}

/// Typed conveniences over any [`Communicator`], by blanket impl.
pub trait CommunicatorExt: Communicator {
    /// [`Communicator::all_reduce`] on slices.
    fn all_reduce_slice<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce(BufferRef::host(send), BufferMut::host(recv), op)
    }

    /// [`Communicator::all_reduce_in_place`] on a slice.
    fn all_reduce_in_place_slice<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_in_place(BufferMut::host(buf), op)
    }

    /// [`Communicator::all_gather`] into a new vector.
    fn all_gather_vec<T: Element>(&self, send: &[T]) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); send.len() * self.world_size()];
        self.all_gather(BufferRef::host(send), BufferMut::host(&mut out))?;
        Ok(out)
    }

    /// [`Communicator::reduce_scatter`] into a new vector.
    fn reduce_scatter_vec<T: Element>(&self, send: &[T], op: ReduceOp) -> Result<Vec<T>> {
        let n = self.world_size();
        if send.len() % n != 0 {
            return Err(Error::InvalidArgument(format!(
                "reduce_scatter: send count {} is not divisible by world_size {n}",
                send.len()
            )));
        }
        let mut out = vec![T::zeroed(); send.len() / n];
        self.reduce_scatter(BufferRef::host(send), BufferMut::host(&mut out), op)?;
        Ok(out)
    }

    /// [`Communicator::broadcast`] on a slice.
    fn broadcast_slice<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.broadcast(BufferMut::host(buf), root)
    }
}

impl<C: Communicator + ?Sized> CommunicatorExt for C {}
