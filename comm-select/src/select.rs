//! `SelectComm`: one communicator that routes every call to the backend expected to be
//! fastest for it.
//!
//! Authority, in order: a forced choice (`COMM_BACKEND=name[:algorithm]` or
//! [`SelectOptions::forced`]), a tuning table measured on this host, the cost model, and
//! finally the first backend that can do the call. Only backends whose capabilities accept
//! the call (dtype, op, size, host or device memory) are candidates, so an unsupported call
//! falls back to the next one. Every rank makes the same choice: the choice depends only on
//! the call and on state every rank shares (the backends, and rank 0's topology, tuning
//! table and forced choice, broadcast at construction).
//!
//! A device call made while its stream is being captured into a CUDA graph (feature
//! `cuda`) is routed from the table's graph rows, any other call from its eager rows; where
//! no row of the call's mode fits, the cost model decides, as without a table. A table with
//! no graph row at all (measured eagerly only) answers graph calls from its eager rows, so
//! that such tables route captured calls as they did before tables knew modes.
//! [`SelectComm::choose`] takes the mode as part of the [`CallInfo`].
//!
//! Ranks route their calls alone, so ranks that disagree about a call can land in
//! different members and wait there for each other until a member gives up. The fast path
//! pays nothing for that case; once a member call fails, the ranks exchange what they
//! called through the bootstrap (a bounded wait) and every rank reports
//! [`Error::Mismatch`] naming the calls, or the member's own error. A failure that may
//! have left any member out of step poisons the selector on every rank: later calls
//! return [`Error::Aborted`], so no member can hand out a peer's contribution to the
//! abandoned call as a later call's.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;

use comm_core::{
    Bootstrap, BufferMut, BufferRef, CallDescriptor, Capabilities, Collective, Communicator, DType,
    Disagreements, Error, MemoryLocation, ReduceOp, RegisteredBuffer, Result,
};
use serde::{Deserialize, Serialize};

use crate::backend::Memory;
use crate::cost::CostModel;
use crate::topology::{Link, Topology};
use crate::tuning::{Launch, TuningTable};

mod diagnosis;

use diagnosis::{LastCall, leaves_out_of_step};

/// What the selector is told besides the backends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SelectOptions {
    /// The topology; `None` assumes ranks sharing host memory of one node.
    pub topology: Option<Topology>,
    /// A measured tuning table.
    pub tuning: Option<TuningTable>,
    /// `backend` or `backend:algorithm` to use whenever it can do the call.
    pub forced: Option<String>,
}

impl SelectOptions {
    /// Reads `COMM_BACKEND`, `COMM_TUNING` (a tuning-table file) and `COMM_TOPOLOGY` (a
    /// topology file).
    pub fn from_env() -> Result<Self> {
        let var = |name| {
            std::env::var(name)
                .ok()
                .filter(|v: &String| !v.trim().is_empty())
        };
        Ok(SelectOptions {
            topology: var("COMM_TOPOLOGY").map(Topology::load).transpose()?,
            tuning: var("COMM_TUNING").map(TuningTable::load).transpose()?,
            forced: var("COMM_BACKEND").filter(|b| b != "auto"),
        })
    }
}

/// One call, as far as selection cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallInfo {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: DType,
    /// Reduction operator, if any.
    pub op: Option<ReduceOp>,
    /// Bytes per rank (the send side).
    pub bytes: usize,
    /// Where the buffers live.
    pub memory: Memory,
    /// Eager, or captured into a CUDA graph (device calls only: a host call runs when it
    /// is made).
    pub launch: Launch,
}

impl CallInfo {
    /// An eager all-reduce of `count` elements of `dtype` with `op` in `memory`.
    pub fn all_reduce(dtype: DType, op: ReduceOp, count: usize, memory: Memory) -> Self {
        CallInfo {
            collective: Collective::AllReduce,
            dtype,
            op: Some(op),
            bytes: count * dtype.size(),
            memory,
            launch: Launch::Eager,
        }
    }

    /// The all-reduce of `buf` with `op` as it would run now: from the view's dtype,
    /// length and memory, launched into a graph when its stream is capturing.
    pub fn of_all_reduce(buf: &BufferRef<'_>, op: ReduceOp) -> Self {
        let location = buf.location();
        CallInfo {
            collective: Collective::AllReduce,
            dtype: buf.dtype(),
            op: Some(op),
            bytes: buf.len() * buf.dtype().size(),
            memory: memory_of(&location),
            launch: launch_of(&location),
        }
    }

    /// The same call, launched as `launch`.
    pub fn with_launch(self, launch: Launch) -> Self {
        CallInfo { launch, ..self }
    }

    fn location(&self) -> MemoryLocation {
        if self.memory == Memory::Device {
            MemoryLocation::Device {
                ordinal: 0,
                stream: comm_core::RawStream::default(),
            }
        } else {
            MemoryLocation::Host
        }
    }
}

/// Where a choice came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `COMM_BACKEND` or [`SelectOptions::forced`].
    Forced,
    /// The tuning table.
    Tuning,
    /// The cost model.
    CostModel,
    /// The first backend that can do the call.
    Default,
}

/// The backend (and algorithm) chosen for a call, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// Backend name.
    pub backend: String,
    /// Algorithm, or `None` for the backend's own choice.
    pub algorithm: Option<String>,
    /// Which authority decided.
    pub source: Source,
    /// The launch mode the call was routed for.
    pub launch: Launch,
    /// Why, in words (with measured or predicted times).
    pub reason: String,
    index: usize,
}

impl Choice {
    /// `backend` or `backend:algorithm`.
    pub fn label(&self) -> String {
        label(&self.backend, self.algorithm.as_deref())
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?}: {})", self.label(), self.source, self.reason)
    }
}

fn label(backend: &str, algorithm: Option<&str>) -> String {
    match algorithm {
        Some(a) => format!("{backend}:{a}"),
        None => backend.to_string(),
    }
}

struct Backend {
    comm: Box<dyn Communicator>,
    caps: Capabilities,
    /// Index in `caps.algorithms` of the algorithm last set on it (`None`: its own
    /// choice), to skip redundant `set_algorithm` calls.
    current: Cell<Option<usize>>,
}

/// Where a call goes: a member and an index in its algorithms. Cached per [`CallInfo`],
/// so routing a call allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    member: usize,
    algorithm: Option<usize>,
}

/// A [`Communicator`] over several backends that picks one per call.
pub struct SelectComm {
    rank: usize,
    world: usize,
    backends: Vec<Backend>,
    caps: Capabilities,
    topology: Topology,
    model: CostModel,
    tuning: Option<TuningTable>,
    forced: Option<(String, Option<String>)>,
    routes: RefCell<HashMap<CallInfo, Route>>,
    bootstrap: Box<dyn Bootstrap>,
    calls: Cell<u64>,
    /// The last call routed, for the diagnosis of an asynchronous error.
    last: Cell<Option<LastCall>>,
    poisoned: RefCell<Option<String>>,
}

impl fmt::Debug for SelectComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelectComm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("backends", &self.backend_names())
            .field("forced", &self.forced)
            .field("tuned", &self.tuning.is_some())
            .finish()
    }
}

impl SelectComm {
    /// Collective: builds the selector over `backends` (same names, same order on every
    /// rank). Rank 0's `options` are broadcast and used by every rank. The selector keeps
    /// `bootstrap` for its whole life (pass an `Arc<B>` to share it with the backends, as
    /// [`crate::auto`] does; a reference only if it is `'static`) and uses it only after a
    /// failed call, to tell a mismatch from a slow peer.
    pub fn new(
        bootstrap: impl Bootstrap + 'static,
        backends: Vec<Box<dyn Communicator>>,
        options: SelectOptions,
    ) -> Result<Self> {
        let world = bootstrap.world_size();
        let rank = bootstrap.rank();
        if backends.is_empty() {
            return Err(Error::InvalidArgument(
                "SelectComm needs at least one backend".into(),
            ));
        }
        for b in &backends {
            if b.world_size() != world || b.rank() != rank {
                return Err(Error::InvalidArgument(format!(
                    "backend {} is rank {} of {}, the bootstrap rank {rank} of {world}",
                    b.name(),
                    b.rank(),
                    b.world_size()
                )));
            }
        }
        let names: Vec<String> = backends.iter().map(|b| b.name().to_string()).collect();
        let all_names = bootstrap.all_gather_bytes(names.join(",").as_bytes())?;
        if let Some(r) = all_names.iter().position(|n| *n != all_names[0]) {
            return Err(Error::Mismatch(format!(
                "rank {r} has backends [{}], rank 0 has [{}]",
                String::from_utf8_lossy(&all_names[r]),
                String::from_utf8_lossy(&all_names[0])
            )));
        }
        let mine = serde_json::to_vec(&options).expect("options serialise");
        let shared = bootstrap.broadcast_bytes(&mine, 0)?;
        let options: SelectOptions = serde_json::from_slice(&shared).map_err(|e| {
            Error::Bootstrap(format!("malformed selector options from rank 0: {e}"))
        })?;
        let topology = options
            .topology
            .unwrap_or_else(|| Topology::uniform(world, Link::HOST));
        if topology.world_size() != world {
            return Err(Error::InvalidArgument(format!(
                "topology has {} ranks, the world {world}",
                topology.world_size()
            )));
        }
        let forced = options.forced.map(|f| match f.split_once(':') {
            Some((b, a)) => (b.to_string(), Some(a.to_string())),
            None => (f, None),
        });
        let backends: Vec<Backend> = backends
            .into_iter()
            .map(|comm| Backend {
                caps: comm.capabilities().clone(),
                comm,
                current: Cell::new(None),
            })
            .collect();
        Ok(SelectComm {
            rank,
            world,
            caps: union(&backends),
            backends,
            model: CostModel::new(&topology),
            topology,
            tuning: options.tuning,
            forced,
            routes: RefCell::new(HashMap::new()),
            bootstrap: Box::new(bootstrap),
            calls: Cell::new(0),
            last: Cell::new(None),
            poisoned: RefCell::new(None),
        })
    }

    /// Names of the backends, in order.
    pub fn backend_names(&self) -> Vec<String> {
        self.backends
            .iter()
            .map(|b| b.comm.name().to_string())
            .collect()
    }

    /// The topology decisions are made on.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The backend chosen for `call`, and why.
    pub fn choose(&self, call: &CallInfo) -> Result<Choice> {
        self.decide(call)
    }

    /// A readable account of the choice for `call`, with the alternatives considered.
    pub fn explain(&self, call: &CallInfo) -> String {
        let what = format!(
            "{} of {} B {}, {} launch",
            call.collective, call.bytes, call.dtype, call.launch
        );
        let mut out = match self.choose(call) {
            Ok(c) => format!("{what}: {c}"),
            Err(e) => return format!("{what}: no backend: {e}"),
        };
        let predictions: Vec<String> = self
            .candidates(call)
            .into_iter()
            .filter_map(|(i, a)| {
                let name = self.backends[i].comm.name();
                let t = self.predicted_us(call, i, a.as_deref())?;
                Some(format!("{} {t:.1} us", label(name, a.as_deref())))
            })
            .collect();
        if !predictions.is_empty() {
            out.push_str(&format!("; model: {}", predictions.join(", ")));
        }
        let unavailable: Vec<String> = self
            .backends
            .iter()
            .flat_map(|b| {
                b.caps
                    .unavailable
                    .iter()
                    .map(|(a, why)| format!("{} ({why})", label(b.comm.name(), Some(a))))
            })
            .collect();
        if !unavailable.is_empty() {
            out.push_str(&format!("; unavailable: {}", unavailable.join(", ")));
        }
        out
    }

    /// The cost model's time for `call` on member `index` with `algorithm`. A backend's own
    /// choice (`None`), where the backend declares no pattern of its own (it picks among its
    /// algorithms per call, by its own measured rules), costs what its cheapest algorithm
    /// does: it comes before them among the candidates, so the model picks the backend and
    /// leaves the algorithm to it. A linear model cannot tell algorithms that move the same
    /// bytes apart where a backend's plans do (two ranks without P2P, two H200s, 2 MiB:
    /// one-shot pull 129 us against two-shot pull's 82, both priced ~90 by the model).
    fn predicted_us(&self, call: &CallInfo, index: usize, algorithm: Option<&str>) -> Option<f64> {
        let caps = &self.backends[index].caps;
        let predict = |pattern| {
            self.model
                .predict_collective(call.collective, pattern, call.bytes)
        };
        match (algorithm, caps.pattern) {
            (None, None) => caps
                .algorithms
                .iter()
                .filter(|name| *name != "auto")
                .filter_map(|name| predict(caps.pattern_of(Some(name))?))
                .min_by(f64::total_cmp),
            _ => predict(caps.pattern_of(algorithm)?),
        }
    }

    /// Every (backend, algorithm) that can do `call`: each backend's own choice (`None`)
    /// and each of its named algorithms except `auto`.
    fn candidates(&self, call: &CallInfo) -> Vec<(usize, Option<String>)> {
        self.routes_for(call)
            .into_iter()
            .map(|r| (r.member, self.algorithm_name(r).map(String::from)))
            .collect()
    }

    fn algorithm_name(&self, route: Route) -> Option<&str> {
        route
            .algorithm
            .map(|a| self.backends[route.member].caps.algorithms[a].as_str())
    }

    /// [`Self::candidates`] as routes.
    fn routes_for(&self, call: &CallInfo) -> Vec<Route> {
        let mut out = Vec::new();
        for (i, b) in self.backends.iter().enumerate() {
            let ok = b
                .caps
                .check(
                    b.comm.name(),
                    call.collective,
                    call.dtype,
                    call.op,
                    call.bytes,
                    call.location(),
                )
                .is_ok();
            if !ok {
                continue;
            }
            out.push(Route {
                member: i,
                algorithm: None,
            });
            if call.collective == Collective::AllReduce {
                out.extend(
                    (0..b.caps.algorithms.len())
                        .filter(|&a| b.caps.algorithms[a] != "auto")
                        .map(|a| Route {
                            member: i,
                            algorithm: Some(a),
                        }),
                );
            }
        }
        out
    }

    fn decide(&self, call: &CallInfo) -> Result<Choice> {
        let candidates = self.candidates(call);
        let Some(first) = candidates.first().cloned() else {
            return Err(Error::Unsupported(format!(
                "no backend of [{}] can do {} of {} B {} in {} memory",
                self.backend_names().join(", "),
                call.collective,
                call.bytes,
                call.dtype,
                call.memory.name()
            )));
        };
        let name = |i: usize| self.backends[i].comm.name().to_string();
        let make = |(index, algorithm): (usize, Option<String>), source, reason: String| Choice {
            backend: name(index),
            algorithm,
            source,
            launch: call.launch,
            reason,
            index,
        };
        let mut notes = Vec::new();
        if let Some((backend, algorithm)) = &self.forced {
            let hit = candidates
                .iter()
                .find(|(i, a)| name(*i) == *backend && (algorithm.is_none() || a == algorithm));
            match hit {
                Some(c) => {
                    return Ok(make(
                        c.clone(),
                        Source::Forced,
                        "forced by COMM_BACKEND".into(),
                    ));
                }
                None => notes.push(format!(
                    "forced {} cannot do this call",
                    label(backend, algorithm.as_deref())
                )),
            }
        }
        if let Some(table) = &self.tuning {
            let accept = |b: &str, a: Option<&str>| {
                candidates
                    .iter()
                    .any(|(i, ca)| name(*i) == b && ca.as_deref() == a)
            };
            let memory = call.memory;
            let rows = table.answering(call.launch);
            let tuned = table.best(
                call.collective,
                call.dtype,
                call.bytes,
                memory,
                rows,
                accept,
            );
            if let Some(t) = tuned {
                let hit = candidates
                    .iter()
                    .find(|(i, a)| name(*i) == t.backend && *a == t.algorithm)
                    .cloned()
                    .expect("accepted candidates exist");
                let mut reason = format!(
                    "measured {:.1} us at {} B, {rows}",
                    t.time_us, t.measured_bytes
                );
                if rows != call.launch {
                    reason.push_str(&format!(" (the table has no {} rows)", call.launch));
                }
                if let Some((other, time)) = &t.runner_up {
                    reason.push_str(&format!(", next {other} {time:.1} us"));
                }
                notes.push(reason);
                return Ok(make(hit, Source::Tuning, notes.join("; ")));
            }
            notes.push(format!("no {} measurement fits", call.launch));
        }
        let predicted = candidates
            .iter()
            .filter_map(|(i, a)| {
                Some(((*i, a.clone()), self.predicted_us(call, *i, a.as_deref())?))
            })
            .min_by(|x, y| x.1.total_cmp(&y.1));
        if let Some((c, t)) = predicted {
            notes.push(format!(
                "cost model predicts {t:.1} us on {:?}",
                self.model.fabric()
            ));
            return Ok(make(c, Source::CostModel, notes.join("; ")));
        }
        notes.push("first backend that can do the call".into());
        Ok(make(first, Source::Default, notes.join("; ")))
    }

    /// The member for `call` with its algorithm set; decided once per kind of call.
    fn route(&self, call: CallInfo) -> Result<(usize, &dyn Communicator)> {
        let cached = self.routes.borrow().get(&call).copied();
        let route = match cached {
            Some(route) => route,
            None => {
                let choice = self.decide(&call)?;
                let route = Route {
                    member: choice.index,
                    algorithm: choice.algorithm.as_ref().map(|name| {
                        self.backends[choice.index]
                            .caps
                            .algorithms
                            .iter()
                            .position(|a| a == name)
                            .expect("a chosen algorithm is the backend's")
                    }),
                };
                self.routes.borrow_mut().insert(call, route);
                route
            }
        };
        let backend = &self.backends[route.member];
        if call.collective == Collective::AllReduce && backend.current.get() != route.algorithm {
            backend.comm.set_algorithm(self.algorithm_name(route))?;
            backend.current.set(route.algorithm);
        }
        Ok((route.member, &*backend.comm))
    }

    /// Runs `call` on its member; after a failure, settles with the peers what it was.
    fn dispatch(
        &self,
        call: CallDescriptor,
        location: MemoryLocation,
        run: impl FnOnce(&dyn Communicator) -> Result<()>,
    ) -> Result<()> {
        if let Some(why) = &*self.poisoned.borrow() {
            return Err(Error::Aborted(why.clone()));
        }
        let number = self.calls.get();
        self.calls.set(number + 1);
        let info = CallInfo {
            collective: call.collective,
            dtype: call.dtype,
            op: call.op,
            bytes: call.send_bytes(),
            memory: memory_of(&location),
            launch: launch_of(&location),
        };
        let (member, result) = match self.route(info) {
            Ok((member, comm)) => (Some(member), run(comm)),
            Err(e) => (None, Err(e)),
        };
        self.last.set(Some(LastCall {
            number,
            call,
            member,
        }));
        match result {
            Ok(()) => Ok(()),
            // The member settled the call with every peer: all of them got an error, and
            // it is still in step.
            Err(e) if member.is_some() && !leaves_out_of_step(&e) => Err(e),
            Err(e) => Err(self.diagnose(
                LastCall {
                    number,
                    call,
                    member,
                },
                e,
            )),
        }
    }
}

fn memory_of(location: &MemoryLocation) -> Memory {
    if location.is_host() {
        Memory::Host
    } else {
        Memory::Device
    }
}

/// How a call on `location` runs: a device call whose stream is capturing runs in the
/// graph's replays. One driver query, no allocation.
fn launch_of(location: &MemoryLocation) -> Launch {
    match location {
        #[cfg(feature = "cuda")]
        MemoryLocation::Device { stream, .. } => {
            match comm_core::cuda::stream::is_capturing(*stream) {
                Ok(true) => Launch::Graph,
                Ok(false) => Launch::Eager,
                // A stream the driver cannot query fails in whichever member gets the
                // call, with that member's own error: the eager route is as good as any.
                Err(_) => Launch::Eager,
            }
        }
        _ => Launch::Eager,
    }
}

/// The union of the members' capabilities.
fn union(backends: &[Backend]) -> Capabilities {
    let mut caps = backends[0].caps.clone();
    for b in &backends[1..] {
        let c = &b.caps;
        for x in &c.collectives {
            if !caps.collectives.contains(x) {
                caps.collectives.push(*x);
            }
        }
        for x in &c.dtypes {
            if !caps.dtypes.contains(x) {
                caps.dtypes.push(*x);
            }
        }
        for x in &c.ops {
            if !caps.ops.contains(x) {
                caps.ops.push(*x);
            }
        }
        caps.host_memory |= c.host_memory;
        caps.device_memory |= c.device_memory;
        caps.max_bytes = caps.max_bytes.zip(c.max_bytes).map(|(a, b)| a.max(b));
        caps.graph_capture_safe &= c.graph_capture_safe;
        if c.disagreements == Disagreements::Poison {
            caps.disagreements = Disagreements::Poison;
        }
    }
    caps.algorithms = Vec::new();
    caps
}

/// What a call is, without validating it: the member validates it.
fn describe(
    collective: Collective,
    dtype: DType,
    count: usize,
    op: Option<ReduceOp>,
    root: Option<usize>,
) -> CallDescriptor {
    CallDescriptor {
        collective,
        dtype,
        count: count as u64,
        op,
        root: root.map(|r| r as u32),
    }
}

impl Communicator for SelectComm {
    fn name(&self) -> &str {
        "auto"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    /// The union of the backends' capabilities.
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn all_reduce(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let call = describe(
            Collective::AllReduce,
            send.dtype(),
            send.len(),
            Some(op),
            None,
        );
        self.dispatch(call, send.location(), |c| c.all_reduce(send, recv, op))
    }

    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let call = describe(
            Collective::AllReduce,
            buf.dtype(),
            buf.len(),
            Some(op),
            None,
        );
        self.dispatch(call, buf.location(), |c| c.all_reduce_in_place(buf, op))
    }

    fn all_gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        let call = describe(Collective::AllGather, send.dtype(), send.len(), None, None);
        self.dispatch(call, send.location(), |c| c.all_gather(send, recv))
    }

    fn reduce_scatter(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let call = describe(
            Collective::ReduceScatter,
            send.dtype(),
            send.len(),
            Some(op),
            None,
        );
        self.dispatch(call, send.location(), |c| c.reduce_scatter(send, recv, op))
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        let call = describe(
            Collective::Broadcast,
            buf.dtype(),
            buf.len(),
            None,
            Some(root),
        );
        self.dispatch(call, buf.location(), |c| c.broadcast(buf, root))
    }

    fn barrier(&self) -> Result<()> {
        self.dispatch(CallDescriptor::barrier(), MemoryLocation::Host, |c| {
            c.barrier()
        })
    }

    /// The first member's asynchronous error. A wait that ended without its peer is
    /// diagnosed as a failed call is: the ranks compare their last calls through the
    /// bootstrap, so that ranks whose calls disagree all get [`Error::Mismatch`] naming
    /// them, also where they were routed to different members. A member that reports an asynchronous
    /// error is unusable, and no member may run a later call that a peer routes elsewhere:
    /// the selector is poisoned.
    fn async_error(&self) -> Result<()> {
        if let Some(why) = &*self.poisoned.borrow() {
            return Err(Error::Aborted(why.clone()));
        }
        let Err(e) = self.backends.iter().try_for_each(|b| b.comm.async_error()) else {
            return Ok(());
        };
        // A member whose kernels compared the calls names them already, on every rank; a
        // wait that ended without its peer may be ranks routed to different members.
        let e = match self.last.get() {
            Some(last) if leaves_out_of_step(&e) => self.diagnose(last, e),
            _ => e,
        };
        self.poison_quietly(e.to_string());
        Err(e)
    }

    /// Collective: a buffer registered by the first member, in order, that registers
    /// buffers (members that do not answer [`Error::Unsupported`] alike on every rank). Calls on
    /// it are routed as any other: a member that did not register it treats it as plain
    /// device memory.
    fn alloc_registered(&self, bytes: usize) -> Result<Box<dyn RegisteredBuffer>> {
        if let Some(why) = &*self.poisoned.borrow() {
            return Err(Error::Aborted(why.clone()));
        }
        let mut refusals = Vec::new();
        for b in &self.backends {
            match b.comm.alloc_registered(bytes) {
                Err(Error::Unsupported(why)) => refusals.push(why),
                other => return other,
            }
        }
        Err(Error::Unsupported(format!(
            "auto: no member registers buffers ({})",
            refusals.join("; ")
        )))
    }
}
