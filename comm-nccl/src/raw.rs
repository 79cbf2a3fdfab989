//! [`RawComm`]: an owned `ncclComm_t` and the raw `nccl::sys` calls that `cudarc`'s safe
//! `Comm` does not offer (it is not `Send`, hides its handle, and has no async-error
//! query or abort). Wrapped here once; the rest of the crate uses only this.

use std::cell::Cell;
use std::ffi::{CStr, c_void};

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

/// An owned NCCL communicator handle; destroyed on drop unless aborted.
#[derive(Debug)]
pub(crate) struct RawComm {
    comm: sys::ncclComm_t,
    aborted: Cell<bool>,
}

// SAFETY: an ncclComm_t may be used from any thread, one at a time; `RawComm` is not
// `Sync`, so shared use from two threads at once cannot happen.
unsafe impl Send for RawComm {}

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
            aborted: Cell::new(false),
        })
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
        if !self.aborted.replace(true) {
            // SAFETY: a live communicator, aborted once; nothing to do if it fails.
            let _ = unsafe { sys::ncclCommAbort(self.comm) };
        }
    }

    /// True once [`Self::abort`] ran.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.get()
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        if !self.aborted.get() {
            // SAFETY: a live communicator, destroyed once.
            let _ = unsafe { sys::ncclCommDestroy(self.comm) };
        }
    }
}
