//! Anonymous shared memory: a `memfd` mapped `MAP_SHARED`.
//!
//! A memfd has no name, so nothing is left behind when processes die: the memory lives
//! exactly as long as some process maps it or holds its descriptor.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use comm_core::{Error, Result};

/// A mapping of a shared-memory file, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all access goes through raw pointers whose
// synchronisation is the users' responsibility (signal pads with release/acquire).
unsafe impl Send for Mapping {}
// SAFETY: as above; `Mapping` itself has no interior state.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates a zero-filled shared-memory file of `len` bytes and maps it.
    pub fn create(len: usize) -> Result<(OwnedFd, Mapping)> {
        let name = CString::new("comm-symm").expect("no NUL");
        // SAFETY: `name` is a valid C string.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(os_error("memfd_create"));
        }
        // SAFETY: memfd_create returned a fresh descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `fd` is a valid descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(os_error("ftruncate"));
        }
        let mapping = Mapping::map(fd.as_fd(), len)?;
        Ok((fd, mapping))
    }

    /// Maps `len` bytes of a peer's shared-memory file, checking its size first.
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping> {
        // SAFETY: an all-zero stat is valid; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is valid and `st` is writable.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(os_error("fstat"));
        }
        if (st.st_size as usize) < len {
            return Err(Error::InvalidArgument(format!(
                "shared segment holds {} bytes, {len} expected",
                st.st_size
            )));
        }
        if len == 0 {
            return Ok(Mapping {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            });
        }
        // SAFETY: mapping a valid descriptor; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(os_error("mmap"));
        }
        Ok(Mapping {
            ptr: ptr as *mut u8,
            len,
        })
    }

    /// Start of the mapping.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mapping.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: `ptr`/`len` came from a successful mmap and are unmapped once.
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        }
    }
}

fn os_error(what: &str) -> Error {
    let e = io::Error::last_os_error();
    Error::Io(io::Error::new(e.kind(), format!("{what}: {e}")))
}
