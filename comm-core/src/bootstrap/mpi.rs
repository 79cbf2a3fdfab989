//! MPI bootstrap: ranks are MPI processes, small messages travel by MPI collectives.
//!
//! [`MpiBootstrap::init`] initialises MPI once per process (see the `mpi_process` notes:
//! `MPI_THREAD_MULTIPLE` requested, an existing initialisation reused, `MPI_Finalize` at
//! exit) and duplicates `MPI_COMM_WORLD`, so that its traffic never meets the program's.
//! The local rank and size come from a shared-memory split of that duplicate
//! (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`). Exchanges use nonblocking collectives
//! (`MPI_Iallgather(v)`, `MPI_Ibcast`, `MPI_Ibarrier`) polled until the timeout, so a rank
//! that never arrives gives [`Error::Timeout`] instead of a hang; after that the bootstrap
//! is unusable ([`Error::Aborted`]).

use std::ffi::c_int;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ::mpi::ffi;

use super::{Bootstrap, default_timeout};
use crate::error::{Error, Result};
use crate::mpi_process::{Handle, MpiProcess, count, process, wait_bounded};

/// One rank of an MPI job.
///
/// ```no_run
/// use comm_core::{Bootstrap, MpiBootstrap};
///
/// let boot = MpiBootstrap::init()?;
/// let all = boot.all_gather_bytes(&[boot.rank() as u8])?;
/// assert_eq!(all.len(), boot.world_size());
/// # Ok::<(), comm_core::Error>(())
/// ```
#[derive(Debug)]
pub struct MpiBootstrap {
    mpi: &'static MpiProcess,
    comm: Handle<ffi::MPI_Comm>,
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_world_size: usize,
    timeout: Duration,
    /// Why the bootstrap became unusable.
    broken: Mutex<Option<String>>,
}

impl MpiBootstrap {
    /// Initialises MPI if needed and joins `MPI_COMM_WORLD`, with the default timeout
    /// ([`default_timeout`]). Collective over the world.
    pub fn init() -> Result<Self> {
        Self::init_with_timeout(default_timeout())
    }

    /// As [`Self::init`], with waits bounded by `timeout`.
    pub fn init_with_timeout(timeout: Duration) -> Result<Self> {
        let mpi = process()?;
        let deadline = Instant::now() + timeout;
        // SAFETY: reading an immutable handle exported by the MPI shim.
        let world = unsafe { ffi::RSMPI_COMM_WORLD };
        let comm = dup(
            mpi,
            world,
            deadline,
            timeout,
            "MPI_Comm_idup(MPI_COMM_WORLD)",
        )?;
        let (rank, world_size) = rank_and_size(mpi, comm)?;
        // Every rank has completed the duplicate, so all are here for the (blocking) split.
        let mut local = comm.0;
        mpi.call("MPI_Comm_split_type", || {
            // SAFETY: `comm` is a valid communicator; `local` is a valid out-pointer.
            unsafe {
                ffi::MPI_Comm_split_type(
                    comm.0,
                    ffi::RSMPI_COMM_TYPE_SHARED,
                    rank as c_int,
                    ffi::RSMPI_INFO_NULL,
                    &mut local,
                )
            }
        })?;
        let local = Handle(local);
        let (local_rank, local_world_size) = rank_and_size(mpi, local)?;
        free(mpi, local);
        Ok(MpiBootstrap {
            mpi,
            comm,
            rank,
            world_size,
            local_rank,
            local_world_size,
            timeout,
            broken: Mutex::new(None),
        })
    }

    /// The MPI library, as `MPI_Get_library_version` names it.
    pub fn library_version(&self) -> &str {
        &self.mpi.library
    }

    pub(crate) fn process(&self) -> &'static MpiProcess {
        self.mpi
    }

    pub(crate) fn comm(&self) -> Handle<ffi::MPI_Comm> {
        self.comm
    }

    /// Runs one exchange; a failure leaves the bootstrap unusable.
    fn guarded<T>(&self, f: impl FnOnce(Instant) -> Result<T>) -> Result<T> {
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &*broken {
            return Err(Error::Aborted(why.clone()));
        }
        let result = f(Instant::now() + self.timeout);
        if let Err(e) = &result {
            if !matches!(e, Error::Unsupported(_) | Error::InvalidArgument(_)) {
                *broken = Some(format!("an earlier MPI bootstrap call failed: {e}"));
            }
        }
        result
    }

    fn iallgather_u64(&self, value: u64, deadline: Instant, what: &str) -> Result<Vec<u64>> {
        let send = vec![value];
        let mut recv = vec![0u64; self.world_size];
        let request = self.start(what, |req| {
            // SAFETY: both buffers are heap memory owned by the wait below, of 1 and
            // world_size u64s; `req` is a valid out-pointer.
            unsafe {
                ffi::MPI_Iallgather(
                    send.as_ptr().cast(),
                    1,
                    ffi::RSMPI_UINT64_T,
                    recv.as_mut_ptr().cast(),
                    1,
                    ffi::RSMPI_UINT64_T,
                    self.comm.0,
                    req,
                )
            }
        })?;
        let (_, recv) = wait_bounded(
            self.mpi,
            request,
            (send, recv),
            deadline,
            self.timeout,
            what,
        )?;
        Ok(recv)
    }

    /// Starts a nonblocking call `f`, which fills in its request.
    fn start(
        &self,
        what: &str,
        f: impl FnOnce(*mut ffi::MPI_Request) -> c_int,
    ) -> Result<ffi::MPI_Request> {
        // SAFETY: reading an immutable handle exported by the MPI shim.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        self.mpi.call(what, || f(&mut request))?;
        Ok(request)
    }
}

impl Drop for MpiBootstrap {
    fn drop(&mut self) {
        let broken = self.broken.get_mut().map_or(true, |b| b.is_some());
        // A timed-out exchange may still be pending on the communicator: leave it be.
        if !broken {
            free(self.mpi, self.comm);
        }
    }
}

/// Duplicates `comm` with a bounded wait (`MPI_Comm_idup`).
pub(crate) fn dup(
    mpi: &MpiProcess,
    comm: ffi::MPI_Comm,
    deadline: Instant,
    timeout: Duration,
    what: &str,
) -> Result<Handle<ffi::MPI_Comm>> {
    let mut new = Box::new(comm);
    // SAFETY: reading an immutable handle exported by the MPI shim.
    let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
    mpi.call(what, || {
        // SAFETY: `comm` is a valid communicator; `new` is heap memory owned by the wait
        // below (MPI writes the new handle there on completion).
        unsafe { ffi::MPI_Comm_idup(comm, &mut *new, &mut request) }
    })?;
    let new = wait_bounded(mpi, request, new, deadline, timeout, what)?;
    let new = Handle(*new);
    mpi.call("MPI_Comm_set_errhandler", || {
        // SAFETY: `new` is a valid communicator; errors are returned instead of aborting.
        unsafe { ffi::MPI_Comm_set_errhandler(new.0, ffi::RSMPI_ERRORS_RETURN) }
    })?;
    Ok(new)
}

/// Frees a communicator this crate created, unless MPI is already finalised.
pub(crate) fn free(mpi: &MpiProcess, comm: Handle<ffi::MPI_Comm>) {
    if mpi::is_finalized() {
        return;
    }
    let mut comm = comm.0;
    // SAFETY: `comm` was created by this crate and is freed once; a failure only leaks it.
    let _ = mpi.call("MPI_Comm_free", || unsafe { ffi::MPI_Comm_free(&mut comm) });
}

pub(crate) fn rank_and_size(
    mpi: &MpiProcess,
    comm: Handle<ffi::MPI_Comm>,
) -> Result<(usize, usize)> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: `comm` is a valid communicator; the out-pointers are valid.
    mpi.call("MPI_Comm_rank", || unsafe {
        ffi::MPI_Comm_rank(comm.0, &mut rank)
    })?;
    // SAFETY: as above.
    mpi.call("MPI_Comm_size", || unsafe {
        ffi::MPI_Comm_size(comm.0, &mut size)
    })?;
    Ok((rank.max(0) as usize, size.max(1) as usize))
}

impl Bootstrap for MpiBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn local_world_size(&self) -> usize {
        self.local_world_size
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn all_gather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.guarded(|deadline| {
            let what = "MPI bootstrap all_gather_bytes";
            let lens = self.iallgather_u64(data.len() as u64, deadline, what)?;
            let total: u64 = lens.iter().sum();
            let counts = lens
                .iter()
                .map(|&l| count(l as usize, what))
                .collect::<Result<Vec<c_int>>>()?;
            count(total as usize, what)?;
            let displs: Vec<c_int> = counts
                .iter()
                .scan(0, |at, &c| {
                    let here = *at;
                    *at += c;
                    Some(here)
                })
                .collect();
            let send = data.to_vec();
            let mut recv = vec![0u8; total as usize];
            let request = self.start(what, |req| {
                // SAFETY: every buffer is heap memory owned by the wait below; `counts`
                // and `displs` describe `recv` exactly (their sum is its length).
                unsafe {
                    ffi::MPI_Iallgatherv(
                        send.as_ptr().cast(),
                        counts[self.rank],
                        ffi::RSMPI_UINT8_T,
                        recv.as_mut_ptr().cast(),
                        counts.as_ptr(),
                        displs.as_ptr(),
                        ffi::RSMPI_UINT8_T,
                        self.comm.0,
                        req,
                    )
                }
            })?;
            let (_, recv, counts, displs) = wait_bounded(
                self.mpi,
                request,
                (send, recv, counts, displs),
                deadline,
                self.timeout,
                what,
            )?;
            Ok(counts
                .iter()
                .zip(&displs)
                .map(|(&c, &d)| recv[d as usize..(d + c) as usize].to_vec())
                .collect())
        })
    }

    fn broadcast_bytes(&self, data: &[u8], root: usize) -> Result<Vec<u8>> {
        if root >= self.world_size {
            return Err(Error::InvalidArgument(format!(
                "broadcast root {root} is not a rank of a world of {}",
                self.world_size
            )));
        }
        self.guarded(|deadline| {
            let what = "MPI bootstrap broadcast_bytes";
            let mut len = vec![data.len() as u64];
            let request = self.start(what, |req| {
                // SAFETY: `len` is heap memory owned by the wait below; root is a rank.
                unsafe {
                    ffi::MPI_Ibcast(
                        len.as_mut_ptr().cast(),
                        1,
                        ffi::RSMPI_UINT64_T,
                        root as c_int,
                        self.comm.0,
                        req,
                    )
                }
            })?;
            let len = wait_bounded(self.mpi, request, len, deadline, self.timeout, what)?[0];
            let n = count(len as usize, what)?;
            let mut buf = if self.rank == root {
                data.to_vec()
            } else {
                vec![0u8; len as usize]
            };
            let request = self.start(what, |req| {
                // SAFETY: `buf` is heap memory of `n` bytes owned by the wait below.
                unsafe {
                    ffi::MPI_Ibcast(
                        buf.as_mut_ptr().cast(),
                        n,
                        ffi::RSMPI_UINT8_T,
                        root as c_int,
                        self.comm.0,
                        req,
                    )
                }
            })?;
            wait_bounded(self.mpi, request, buf, deadline, self.timeout, what)
        })
    }

    fn barrier(&self) -> Result<()> {
        self.guarded(|deadline| {
            let what = "MPI bootstrap barrier";
            let request = self.start(what, |req| {
                // SAFETY: a barrier touches no buffer; `req` is a valid out-pointer.
                unsafe { ffi::MPI_Ibarrier(self.comm.0, req) }
            })?;
            wait_bounded(self.mpi, request, (), deadline, self.timeout, what)
        })
    }
}
