//! `MpiComm`: a host backend on MPI's own collectives (feature `mpi`).
//!
//! Each call first settles its arguments across ranks, then runs one blocking MPI
//! collective (`MPI_Allreduce` with `MPI_IN_PLACE` for in-place calls,
//! `MPI_Allgather`, `MPI_Reduce_scatter_block`, `MPI_Bcast`). Settling exchanges the
//! 16-byte verdict of every rank ([`encode_verdict`]) with a nonblocking `MPI_Iallgather`
//! polled until the timeout, on heap buffers that are leaked if it expires: a rank with
//! bad arguments, or one that makes another call, fails the call on every rank
//! ([`settle`]); a rank that never arrives gives [`Error::Timeout`] and leaves the
//! communicator unusable ([`Error::Aborted`] afterwards). Only when every verdict agrees
//! does the data collective start, so it cannot deadlock on mismatched arguments.
//! [`MpiComm::set_validation`] can drop that round trip, at the cost of the check.
//! How each dtype and operator maps onto MPI is in the `reduction` module.

mod reduction;

use std::ffi::c_int;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use ::mpi::ffi;

use self::reduction::{Reducer, Shape, wire_count};
use crate::bootstrap::mpi::{dup, free, rank_and_size};
use crate::bootstrap::{Bootstrap, MpiBootstrap};
use crate::buffer::{BufferMut, BufferRef, MemoryLocation};
use crate::call::{CallDescriptor, DESCRIPTOR_BYTES, decode_verdict, encode_verdict, settle};
use crate::communicator::{Capabilities, Collective, Communicator, TrafficPattern};
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::mpi_process::{Handle, MpiProcess, count, wait_bounded};

/// The backend's name.
const NAME: &str = "mpi";

/// A [`Communicator`] over an MPI communicator of its own.
///
/// ```no_run
/// use comm_core::{CommunicatorExt, MpiBootstrap, MpiComm, ReduceOp};
///
/// // Under `mpirun -np N`:
/// let comm = MpiComm::new(&MpiBootstrap::init()?)?;
/// let mut x = [1.0f32; 4];
/// comm.all_reduce_in_place_slice(&mut x, ReduceOp::Sum)?;
/// # Ok::<(), comm_core::Error>(())
/// ```
#[derive(Debug)]
pub struct MpiComm {
    mpi: &'static MpiProcess,
    comm: Handle<ffi::MPI_Comm>,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    validation: bool,
    /// Why the communicator became unusable.
    broken: Mutex<Option<String>>,
}

impl MpiComm {
    /// A communicator over the ranks of `bootstrap`, on a duplicate of its MPI
    /// communicator; waits are bounded by the bootstrap's timeout. Collective.
    pub fn new(bootstrap: &MpiBootstrap) -> Result<Self> {
        let mpi = bootstrap.process();
        let timeout = bootstrap.timeout();
        let deadline = Instant::now() + timeout;
        let comm = dup(mpi, bootstrap.comm().0, deadline, timeout, "MPI_Comm_idup")?;
        let (rank, world_size) = rank_and_size(mpi, comm)?;
        Ok(MpiComm {
            mpi,
            comm,
            rank,
            world_size,
            timeout,
            validation: true,
            broken: Mutex::new(None),
        })
    }

    /// Sets the bound on waiting for peers to arrive at a call.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The bound on waiting for peers to arrive at a call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Turns the cross-rank check of every call on (the default) or off.
    ///
    /// Off saves one small round trip per call (an `MPI_Iallgather` of 16 bytes per rank),
    /// but then nothing checks that the ranks' arguments agree, and nothing bounds the
    /// wait: mismatched calls behave as in raw MPI (a hang, an MPI error or wrong data),
    /// and a rank that never arrives blocks the others. Barriers stay bounded
    /// (`MPI_Ibarrier`). Every rank must use the same setting.
    pub fn set_validation(&mut self, on: bool) {
        self.validation = on;
    }

    /// Whether calls are checked across ranks.
    pub fn validation(&self) -> bool {
        self.validation
    }

    /// The MPI library, as `MPI_Get_library_version` names it.
    pub fn library_version(&self) -> &str {
        &self.mpi.library
    }

    fn reducer(&self) -> Reducer<'_> {
        Reducer {
            mpi: self.mpi,
            comm: self.comm,
            world_size: self.world_size,
        }
    }

    /// Checks the call locally, settles it across ranks (if validating), then runs `work`.
    /// `addrs` are the host addresses the call touches, checked for alignment.
    fn run(
        &self,
        verdict: Result<CallDescriptor>,
        location: MemoryLocation,
        addrs: &[usize],
        work: impl FnOnce(&CallDescriptor) -> Result<()>,
    ) -> Result<()> {
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &*broken {
            return Err(Error::Aborted(why.clone()));
        }
        let verdict = verdict.and_then(|d| self.admit(d, location, addrs));
        let call = if self.validation {
            match self.settle(verdict) {
                Err(e) if e.is_fatal() || matches!(e, Error::Backend { .. }) => {
                    *broken = Some(format!("an earlier call failed: {e}"));
                    return Err(e);
                }
                other => other?,
            }
        } else {
            verdict?
        };
        let result = match call.collective {
            // Every rank has delivered its verdict: that was the barrier.
            Collective::Barrier if self.validation => Ok(()),
            Collective::Barrier => self.ibarrier(),
            // Nothing to move; empty slices' dangling pointers would only upset MPI's
            // argument checks (a send buffer equal to the receive buffer).
            _ if call.count == 0 => Ok(()),
            _ => work(&call),
        };
        if let Err(e) = &result {
            // A data collective that failed on one rank leaves the others in an unknown state.
            *broken = Some(format!("an earlier call failed: {e}"));
        }
        result
    }

    /// What this rank alone can say about the call: capabilities, MPI's count limit,
    /// alignment.
    fn admit(
        &self,
        d: CallDescriptor,
        location: MemoryLocation,
        addrs: &[usize],
    ) -> Result<CallDescriptor> {
        self.capabilities()
            .check(NAME, d.collective, d.dtype, d.op, d.send_bytes(), location)?;
        let elems = d.count as usize;
        let on_wire = match (d.collective, d.op) {
            (Collective::AllReduce | Collective::ReduceScatter, Some(op)) => {
                wire_count(d.dtype, op, elems)
            }
            _ => d.send_bytes(),
        };
        count(on_wire, &d.to_string())?;
        if let Some(addr) = addrs.iter().find(|&&a| a % d.dtype.size() != 0) {
            return Err(Error::InvalidArgument(format!(
                "{d}: buffer at {addr:#x} is not aligned for {}",
                d.dtype
            )));
        }
        Ok(d)
    }

    /// Exchanges verdicts with a bounded `MPI_Iallgather` and settles them.
    fn settle(&self, verdict: Result<CallDescriptor>) -> Result<CallDescriptor> {
        let what = verdict
            .as_ref()
            .map_or_else(|_| "an MPI call".to_string(), |d| format!("MPI {d}"));
        let mine = encode_verdict(&verdict).to_vec();
        let mut all = vec![0u8; DESCRIPTOR_BYTES * self.world_size];
        // SAFETY: reading an immutable handle exported by the MPI shim.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        self.mpi.call("MPI_Iallgather", || {
            // SAFETY: both buffers are heap memory owned by the wait below, of 16 and
            // 16 * world_size bytes.
            unsafe {
                ffi::MPI_Iallgather(
                    mine.as_ptr().cast(),
                    DESCRIPTOR_BYTES as c_int,
                    ffi::RSMPI_UINT8_T,
                    all.as_mut_ptr().cast(),
                    DESCRIPTOR_BYTES as c_int,
                    ffi::RSMPI_UINT8_T,
                    self.comm.0,
                    &mut request,
                )
            }
        })?;
        let deadline = Instant::now() + self.timeout;
        let (_, all) = wait_bounded(
            self.mpi,
            request,
            (mine, all),
            deadline,
            self.timeout,
            &what,
        )?;
        let verdicts = all
            .chunks_exact(DESCRIPTOR_BYTES)
            .map(decode_verdict)
            .collect::<Result<Vec<_>>>()?;
        settle(verdict, &verdicts)
    }

    fn ibarrier(&self) -> Result<()> {
        // SAFETY: reading an immutable handle exported by the MPI shim.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        self.mpi.call("MPI_Ibarrier", || {
            // SAFETY: a barrier touches no buffer.
            unsafe { ffi::MPI_Ibarrier(self.comm.0, &mut request) }
        })?;
        let deadline = Instant::now() + self.timeout;
        wait_bounded(self.mpi, request, (), deadline, self.timeout, "MPI barrier")
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        let broken = self.broken.get_mut().map_or(true, |b| b.is_some());
        // A timed-out exchange may still be pending on the communicator: leave it be.
        if !broken {
            free(self.mpi, self.comm);
        }
    }
}

/// The location a call is checked against: host only if both views are host memory.
fn location_of(a: MemoryLocation, b: MemoryLocation) -> MemoryLocation {
    if a.is_host() { b } else { a }
}

fn op_of(call: &CallDescriptor) -> Result<ReduceOp> {
    call.op
        .ok_or_else(|| Error::InvalidArgument(format!("{call} has no reduction operator")))
}

impl Communicator for MpiComm {
    fn name(&self) -> &str {
        NAME
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn capabilities(&self) -> &Capabilities {
        static CAPS: LazyLock<Capabilities> =
            LazyLock::new(|| Capabilities::host_complete().with_pattern(TrafficPattern::Ring));
        &CAPS
    }

    fn all_reduce(&self, send: BufferRef<'_>, mut recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let verdict = CallDescriptor::all_reduce(&send, &recv, op);
        let location = location_of(send.location(), recv.location());
        let addrs = [send.addr(), recv.addr()];
        self.run(verdict, location, &addrs, |call| {
            let input = send.require_host(NAME)?;
            let out = recv.require_host(NAME)?;
            self.reducer()
                .reduce(Shape::All, call.dtype, op_of(call)?, Some(input), out)
        })
    }

    fn all_reduce_in_place(&self, mut buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let verdict = CallDescriptor::all_reduce_in_place(&buf, op);
        let location = buf.location();
        let addrs = [buf.addr()];
        self.run(verdict, location, &addrs, |call| {
            let out = buf.require_host(NAME)?;
            self.reducer()
                .reduce(Shape::All, call.dtype, op_of(call)?, None, out)
        })
    }

    fn all_gather(&self, send: BufferRef<'_>, mut recv: BufferMut<'_>) -> Result<()> {
        let verdict = CallDescriptor::all_gather(&send, &recv, self.world_size);
        let location = location_of(send.location(), recv.location());
        let addrs = [send.addr(), recv.addr()];
        self.run(verdict, location, &addrs, |call| {
            let input = send.require_host(NAME)?;
            let out = recv.require_host(NAME)?;
            let n = count(call.send_bytes(), "all_gather")?;
            self.mpi.call("MPI_Allgather", || {
                // SAFETY: `input` holds `n` bytes and `out` world_size * `n`; both stay
                // borrowed for the (blocking) call.
                unsafe {
                    ffi::MPI_Allgather(
                        input.as_ptr().cast(),
                        n,
                        ffi::RSMPI_UINT8_T,
                        out.as_mut_ptr().cast(),
                        n,
                        ffi::RSMPI_UINT8_T,
                        self.comm.0,
                    )
                }
            })
        })
    }

    fn reduce_scatter(
        &self,
        send: BufferRef<'_>,
        mut recv: BufferMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        let verdict = CallDescriptor::reduce_scatter(&send, &recv, op, self.world_size);
        let location = location_of(send.location(), recv.location());
        let addrs = [send.addr(), recv.addr()];
        self.run(verdict, location, &addrs, |call| {
            let input = send.require_host(NAME)?;
            let out = recv.require_host(NAME)?;
            self.reducer()
                .reduce(Shape::Scatter, call.dtype, op_of(call)?, Some(input), out)
        })
    }

    fn broadcast(&self, mut buf: BufferMut<'_>, root: usize) -> Result<()> {
        let verdict = CallDescriptor::broadcast(&buf, root, self.world_size);
        let location = buf.location();
        let addrs = [buf.addr()];
        self.run(verdict, location, &addrs, |call| {
            let data = buf.require_host(NAME)?;
            let n = count(call.send_bytes(), "broadcast")?;
            self.mpi.call("MPI_Bcast", || {
                // SAFETY: `data` holds `n` bytes and stays borrowed for the (blocking) call;
                // `root` was checked against the world size.
                unsafe {
                    ffi::MPI_Bcast(
                        data.as_mut_ptr().cast(),
                        n,
                        ffi::RSMPI_UINT8_T,
                        root as c_int,
                        self.comm.0,
                    )
                }
            })
        })
    }

    fn barrier(&self) -> Result<()> {
        self.run(
            Ok(CallDescriptor::barrier()),
            MemoryLocation::Host,
            &[],
            |_| Ok(()),
        )
    }
}
