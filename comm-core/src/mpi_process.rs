//! Process-wide MPI state shared by `MpiBootstrap` and `MpiComm`: initialisation (once),
//! finalisation at exit, serialised calls, errors, and bounded waits on nonblocking calls.
//!
//! MPI is initialised at most once per process, asking for `MPI_THREAD_MULTIPLE`; if the
//! program (or another library) initialised it already, that initialisation is used as it
//! is and finalising stays the program's business. When this module initialised MPI, it
//! finalises it at process exit (`atexit`), because MPI cannot be re-initialised and a
//! rank that exits without `MPI_Finalize` makes `mpirun` report the job as failed. Below
//! `MPI_THREAD_MULTIPLE`, every call here takes one process-wide lock (so the types can be
//! `Sync`), and below `MPI_THREAD_SERIALIZED` calls from other threads than MPI's main
//! thread are refused with [`Error::Unsupported`].
//!
//! Nonblocking calls are waited for with [`wait_bounded`], which polls `MPI_Test` until a
//! deadline. The buffers such a call reads and writes are owned by the wait: on timeout
//! they are leaked, so MPI can never write into memory that Rust has freed or reused.

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ::mpi::ffi;

use crate::error::{Error, Result};

/// What this process's MPI library is and offers.
#[derive(Debug)]
pub(crate) struct MpiProcess {
    /// Thread level MPI provides (`MPI_THREAD_*`).
    provided: c_int,
    /// `MPI_IN_PLACE` of this library, if known (see [`in_place_sentinel`]).
    in_place: Option<usize>,
    /// `MPI_Get_library_version`.
    pub(crate) library: String,
}

static PROCESS: OnceLock<std::result::Result<MpiProcess, String>> = OnceLock::new();

/// Serialises MPI calls when the library is not fully thread safe.
static CALL_LOCK: Mutex<()> = Mutex::new(());

/// Initialises MPI if nobody has, once, and describes it.
pub(crate) fn process() -> Result<&'static MpiProcess> {
    PROCESS
        .get_or_init(init)
        .as_ref()
        .map_err(|why| Error::Bootstrap(why.clone()))
}

fn init() -> std::result::Result<MpiProcess, String> {
    let mut finalized: c_int = 0;
    // SAFETY: MPI_Finalized may be called at any time, even before MPI_Init.
    unsafe { ffi::MPI_Finalized(&mut finalized) };
    if finalized != 0 {
        return Err("MPI has already been finalised in this process".into());
    }
    if !mpi::is_initialized() {
        // `None` means another thread initialised MPI meanwhile: use that.
        if let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Multiple) {
            // The universe would finalise MPI when dropped; MPI must live as long as the
            // process instead, and is finalised at exit.
            std::mem::forget(universe);
            // SAFETY: registers a plain `extern "C" fn()` with no captured state.
            if unsafe { libc::atexit(finalize_at_exit) } != 0 {
                return Err("cannot register MPI_Finalize at exit".into());
            }
        }
    }
    let mut provided: c_int = 0;
    // SAFETY: MPI is initialised; `provided` is a valid out-pointer.
    unsafe { ffi::MPI_Query_thread(&mut provided) };
    let library = library_version();
    let in_place = in_place_sentinel(&library);
    Ok(MpiProcess {
        provided,
        in_place,
        library,
    })
}

extern "C" fn finalize_at_exit() {
    let mut finalized: c_int = 0;
    // SAFETY: MPI_Finalized may be called at any time; MPI_Finalize only once, here, and
    // only by the module that initialised MPI.
    unsafe {
        ffi::MPI_Finalized(&mut finalized);
        if finalized == 0 {
            ffi::MPI_Finalize();
        }
    }
}

fn library_version() -> String {
    let mut buf = vec![0 as c_char; ffi::MPI_MAX_LIBRARY_VERSION_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_LIBRARY_VERSION_STRING characters, as required.
    unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr(), &mut len) };
    let bytes: Vec<u8> = buf[..len.clamp(0, buf.len() as c_int) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// `MPI_IN_PLACE` is a C macro, which the `mpi` crate does not export: `(void *) 1` in
/// Open MPI, `(void *) -1` in MPICH and its derivatives (Intel MPI, MVAPICH, Cray MPICH).
/// Other libraries get `None`, and callers copy instead of working in place.
fn in_place_sentinel(library: &str) -> Option<usize> {
    if library.contains("Open MPI") {
        Some(1)
    } else if ["MPICH", "Intel(R) MPI", "MVAPICH"]
        .iter()
        .any(|name| library.contains(name))
    {
        Some(usize::MAX)
    } else {
        None
    }
}

impl MpiProcess {
    /// `MPI_IN_PLACE`, if this library's value is known.
    pub(crate) fn in_place(&self) -> Option<*const c_void> {
        self.in_place.map(|v| v as *const c_void)
    }

    /// Makes one MPI call `f` (returning an MPI error code) under the thread rules above.
    pub(crate) fn call(&self, what: &str, f: impl FnOnce() -> c_int) -> Result<()> {
        let _guard = self.serialise(what)?;
        check(what, f())
    }

    fn serialise(&self, what: &str) -> Result<Option<MutexGuard<'static, ()>>> {
        // SAFETY: reading immutable `int` constants exported by the MPI shim.
        let (multiple, serialized) =
            unsafe { (ffi::RSMPI_THREAD_MULTIPLE, ffi::RSMPI_THREAD_SERIALIZED) };
        if self.provided >= multiple {
            return Ok(None);
        }
        if self.provided < serialized {
            let mut main: c_int = 0;
            // SAFETY: MPI is initialised; `main` is a valid out-pointer.
            unsafe { ffi::MPI_Is_thread_main(&mut main) };
            if main == 0 {
                return Err(Error::Unsupported(format!(
                    "{what}: MPI was initialised without thread support; call from the thread \
                     that initialised it"
                )));
            }
        }
        Ok(Some(CALL_LOCK.lock().unwrap_or_else(|p| p.into_inner())))
    }
}

/// Turns an MPI error code into an error naming the call.
pub(crate) fn check(what: &str, code: c_int) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    let mut buf = vec![0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters, as required.
    unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    let text: Vec<u8> = buf[..len.clamp(0, buf.len() as c_int) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    Err(Error::backend(
        "mpi",
        format!("{what} failed ({code}): {}", String::from_utf8_lossy(&text)),
    ))
}

/// An MPI handle (communicator, ...), made `Send`/`Sync`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handle<T>(pub(crate) T);

// SAFETY: MPI handles are process-wide identifiers, valid in any thread; every call that
// uses them goes through `MpiProcess::call`, which serialises calls unless the library is
// fully thread safe, and refuses other threads when it supports only the main one.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Handle<T> {}

/// Converts a count to MPI's `int`, or explains why it cannot be sent in one call.
pub(crate) fn count(n: usize, what: &str) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| {
        Error::Unsupported(format!(
            "mpi: {what} of {n} elements exceeds MPI's count limit ({})",
            c_int::MAX
        ))
    })
}

/// Waits for nonblocking request `request` until `deadline`, polling `MPI_Test`.
///
/// `buffers` must own every buffer the request reads or writes (heap memory, so that
/// moving `buffers` does not move them). They are returned when the request completes;
/// on timeout or error they are leaked along with the request, because MPI may still
/// write into them.
pub(crate) fn wait_bounded<T>(
    mpi: &MpiProcess,
    mut request: ffi::MPI_Request,
    buffers: T,
    deadline: Instant,
    timeout: Duration,
    what: &str,
) -> Result<T> {
    let start = Instant::now();
    loop {
        let mut done: c_int = 0;
        let tested = mpi.call("MPI_Test", || {
            // SAFETY: `request` is an active request of this process; the status is ignored.
            unsafe { ffi::MPI_Test(&mut request, &mut done, ffi::RSMPI_STATUS_IGNORE) }
        });
        if let Err(e) = tested {
            std::mem::forget(buffers);
            return Err(e);
        }
        if done != 0 {
            return Ok(buffers);
        }
        let now = Instant::now();
        if now >= deadline {
            std::mem::forget(buffers);
            return Err(Error::Timeout {
                what: format!("{what} (peers never arrived)"),
                after: timeout,
            });
        }
        // Peers usually arrive within microseconds: poll hot at first, then back off so a
        // long wait does not burn a core.
        if now - start < Duration::from_millis(1) {
            std::hint::spin_loop();
        } else if now - start < Duration::from_millis(20) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200).min(deadline - now));
        }
    }
}
