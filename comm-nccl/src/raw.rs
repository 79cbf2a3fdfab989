//! [`RawComm`]: an owned `ncclComm_t` and the raw `nccl::sys` calls that `cudarc`'s safe
//! `Comm` does not offer (it is not `Send`, hides its handle, and has no async-error
//! query, abort or window registration). Wrapped here once; the rest of the crate uses
//! only this.

use std::ffi::{CStr, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use comm_core::Error;
use cudarc::nccl::sys;

/// Turns an NCCL result code into [`Error::Backend`], with NCCL's description and, when
/// a communicator is given, its last error message.
pub(crate) fn nccl_error(code: sys::ncclResult_t, comm: Option<sys::ncclComm_t>) -> Error {
    // SAFETY: NCCL returns a static NUL-terminated string for every code.
    let what = unsafe { cstr(sys::ncclGetErrorString(code)) };
    // SAFETY: as above; a null comm asks for the thread's last error.
    let last = unsafe { cstr(sys::ncclGetLastError(comm.unwrap_or(std::ptr::null_mut()))) };
    let detail = if last.is_empty() {
        String::new()
    } else {
        format!(": {last}")
    };
    Error::backend("nccl", format!("{code:?} ({what}){detail}"))
}

/// # Safety
/// `p` is null or a NUL-terminated string that lives for the call.
unsafe fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: forwarded from the caller.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn check(code: sys::ncclResult_t, comm: Option<sys::ncclComm_t>) -> Result<(), Error> {
    match code {
        sys::ncclResult_t::ncclSuccess => Ok(()),
        other => Err(nccl_error(other, comm)),
    }
}

/// A fresh unique id, as bytes for the bootstrap.
pub(crate) fn unique_id() -> Result<[u8; 128], Error> {
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: a valid out-pointer.
    check(unsafe { sys::ncclGetUniqueId(&mut id) }, None)?;
    Ok(id.internal.map(|c| c as u8))
}

/// `NCCL_WIN_COLL_SYMMETRIC` of `nccl.h` (a macro, so not in the bindings): the window
/// is registered by every rank at the same offsets, for NCCL's symmetric kernels.
const NCCL_WIN_COLL_SYMMETRIC: i32 = 0x01;

/// An owned NCCL communicator handle; destroyed on drop unless aborted.
///
/// Shared (`Arc`) by the communicator and the windows registered with it, which may be
/// dropped on other threads: every NCCL call on the handle takes `calls`.
#[derive(Debug)]
pub(crate) struct RawComm {
    comm: sys::ncclComm_t,
    aborted: AtomicBool,
    calls: Mutex<()>,
}

// SAFETY: an ncclComm_t may be used from any thread, one at a time; every use of it goes
// through `calls` (or `&mut self` in drop).
unsafe impl Send for RawComm {}
// SAFETY: as above.
unsafe impl Sync for RawComm {}

/// A window handle from `ncclCommWindowRegister`, as an address so that it can cross
/// threads with the window that owns it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowHandle(usize);

/// An NCCL collective, with its arguments in NCCL's terms.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    AllReduce { op: sys::ncclRedOp_t },
    AllGather,
    ReduceScatter { op: sys::ncclRedOp_t },
    Broadcast { root: i32 },
}

impl RawComm {
    /// `ncclCommInitRank` on the current CUDA context's device. Blocks until every rank
    /// of `id` has joined.
    pub(crate) fn init(world_size: usize, id: &[u8; 128], rank: usize) -> Result<Self, Error> {
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id came from ncclGetUniqueId on rank 0.
        let code = unsafe { sys::ncclCommInitRank(&mut comm, world_size as i32, id, rank as i32) };
        check(code, None)?;
        Ok(RawComm {
            comm,
            aborted: AtomicBool::new(false),
            calls: Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enqueues `op` of `count` elements on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of this communicator's device, large enough
    /// for `op` of `count` elements, and stay valid until the work on `stream` is done;
    /// `stream` must be a live stream of that device's context.
    pub(crate) unsafe fn enqueue(
        &self,
        op: Op,
        send: u64,
        recv: u64,
        count: usize,
        dtype: sys::ncclDataType_t,
        stream: usize,
    ) -> Result<(), Error> {
        let (s, r) = (send as *const c_void, recv as *mut c_void);
        let st = stream as sys::cudaStream_t;
        let _one_at_a_time = self.lock();
        // SAFETY: forwarded from the caller.
        let code = unsafe {
            match op {
                Op::AllReduce { op } => sys::ncclAllReduce(s, r, count, dtype, op, self.comm, st),
                Op::AllGather => sys::ncclAllGather(s, r, count, dtype, self.comm, st),
                Op::ReduceScatter { op } => {
                    sys::ncclReduceScatter(s, r, count, dtype, op, self.comm, st)
                }
                Op::Broadcast { root } => {
                    sys::ncclBroadcast(s, r, count, dtype, root, self.comm, st)
                }
            }
        };
        check(code, Some(self.comm))
    }

    /// The communicator's asynchronous error (a peer failed, a network error...), if any.
    pub(crate) fn async_error(&self) -> Result<(), Error> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        let _one_at_a_time = self.lock();
        // SAFETY: a live communicator and a valid out-pointer.
        let code = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut state) };
        check(code, Some(self.comm))?;
        match state {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => Ok(()),
            other => Err(nccl_error(other, Some(self.comm))),
        }
    }

    /// `ncclCommAbort`: stops the communicator's kernels and frees it. Idempotent.
    pub(crate) fn abort(&self) {
        // Not under `calls`: an abort must get through while another thread waits in NCCL.
        if !self.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: a live communicator, aborted once; nothing to do if it fails.
            let _ = unsafe { sys::ncclCommAbort(self.comm) };
        }
    }

    /// True once [`Self::abort`] ran.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Collective (`ncclCommWindowRegister`): registers `bytes` at `ptr` as a symmetric
    /// window. Every rank registers the same size, in the same order.
    ///
    /// # Safety
    /// `ptr .. ptr + bytes` is memory from [`mem_alloc`] on this communicator's device,
    /// and stays allocated until the window is deregistered.
    pub(crate) unsafe fn register_window(
        &self,
        ptr: u64,
        bytes: usize,
    ) -> Result<WindowHandle, Error> {
        let mut win: sys::ncclWindow_t = std::ptr::null_mut();
        let _one_at_a_time = self.lock();
        // SAFETY: forwarded from the caller; a valid out-pointer.
        let code = unsafe {
            sys::ncclCommWindowRegister(
                self.comm,
                ptr as *mut c_void,
                bytes,
                &mut win,
                NCCL_WIN_COLL_SYMMETRIC,
            )
        };
        check(code, Some(self.comm))?;
        Ok(WindowHandle(win as usize))
    }

    /// `ncclCommWindowDeregister` of a window of this communicator.
    ///
    /// # Safety
    /// `window` came from [`Self::register_window`] and is deregistered once, after every
    /// rank's work on it has finished.
    pub(crate) unsafe fn deregister_window(&self, window: WindowHandle) -> Result<(), Error> {
        let _one_at_a_time = self.lock();
        // SAFETY: forwarded from the caller.
        let code =
            unsafe { sys::ncclCommWindowDeregister(self.comm, window.0 as sys::ncclWindow_t) };
        check(code, Some(self.comm))
    }
}

/// `ncclMemAlloc`: `bytes` of device memory on the current context's device, of the kind
/// NCCL can register as a symmetric window (`cuMem*`, mapped for peer access).
pub(crate) fn mem_alloc(bytes: usize) -> Result<u64, Error> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    check(unsafe { sys::ncclMemAlloc(&mut ptr, bytes) }, None)?;
    Ok(ptr as u64)
}

/// `ncclMemFree`.
///
/// # Safety
/// `ptr` came from [`mem_alloc`], is freed once, and nothing uses it any more.
pub(crate) unsafe fn mem_free(ptr: u64) -> Result<(), Error> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::ncclMemFree(ptr as *mut c_void) }, None)
}

/// True when the loaded `libnccl` exports `name` (cudarc panics on a missing symbol, so
/// entry points newer than the oldest supported NCCL are looked up first).
pub(crate) fn has_symbol(name: &str) -> bool {
    // SAFETY: only looks the symbol up; the library is present (callers checked) and
    // nothing is called.
    unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(name.as_bytes())
            .is_ok()
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        if !self.is_aborted() {
            // SAFETY: a live communicator, destroyed once.
            let _ = unsafe { sys::ncclCommDestroy(self.comm) };
        }
    }
}
