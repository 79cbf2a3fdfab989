//! Symmetric windows: memory from `ncclMemAlloc` registered with every rank
//! (`ncclCommWindowRegister`), the [`Registry`] that tells a call's buffers in a window
//! from plain ones, and the [`Place`] of a buffer that ranks compare before a call.

use std::sync::{Arc, Mutex};

use comm_core::cuda::cudarc::driver::CudaContext;
use comm_core::cuda::driver_error;
use comm_core::{Bootstrap, Error, Result};

use crate::raw::{RawComm, WindowHandle, mem_alloc, mem_free};

/// Where a call's buffer lies: in a window (which one, at which byte offset) or not.
/// Ranks must agree on it: NCCL picks its symmetric kernels from it, and ranks that ran
/// different kernels would wait for each other forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Memory NCCL has no window for.
    Plain,
    /// Inside window `id` (the registration's number, alike on every rank) at `offset`.
    Window { id: u64, offset: u64 },
}

impl Place {
    pub(crate) const BYTES: usize = 17;

    pub(crate) fn to_bytes(self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        if let Place::Window { id, offset } = self {
            out[0] = 1;
            out[1..9].copy_from_slice(&id.to_le_bytes());
            out[9..17].copy_from_slice(&offset.to_le_bytes());
        }
        out
    }

    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let word = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
        match bytes.first()? {
            0 => Some(Place::Plain),
            1 => Some(Place::Window {
                id: word(1)?,
                offset: word(9)?,
            }),
            _ => None,
        }
    }

    pub(crate) fn is_window(self) -> bool {
        matches!(self, Place::Window { .. })
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Plain => f.write_str("unregistered memory"),
            Place::Window { id, offset } => write!(f, "window {id} at byte {offset}"),
        }
    }
}

/// The windows of one communicator: `(id, base, bytes)`.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    entries: Mutex<Vec<(u64, u64, usize)>>,
    next_id: Mutex<u64>,
}

impl Registry {
    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<(u64, u64, usize)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where `bytes` at `addr` lie; an error when they start in a window and run past its end.
    pub(crate) fn place(&self, addr: u64, bytes: usize) -> Result<Place> {
        let entries = self.entries();
        let Some(&(id, base, len)) = entries
            .iter()
            .find(|(_, base, len)| addr >= *base && addr < base + *len as u64)
        else {
            return Ok(Place::Plain);
        };
        let offset = addr - base;
        if offset + bytes as u64 > len as u64 {
            return Err(Error::InvalidArgument(format!(
                "nccl: {bytes} bytes at byte {offset} of window {id} run past its end ({len} bytes)"
            )));
        }
        Ok(Place::Window { id, offset })
    }

    /// The number the next registration gets: alike on every rank, since registrations
    /// are collective and counted only where they succeeded everywhere.
    fn next_id(&self) -> u64 {
        *self.next_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, id: u64, base: u64, bytes: usize) {
        *self.next_id.lock().unwrap_or_else(|p| p.into_inner()) = id + 1;
        self.entries().push((id, base, bytes));
    }

    fn remove(&self, id: u64) {
        self.entries().retain(|(i, _, _)| *i != id);
    }

    /// Windows registered now.
    pub(crate) fn len(&self) -> usize {
        self.entries().len()
    }
}

/// One symmetric window: its memory, its registration, and what dropping it needs.
pub(crate) struct Window {
    raw: Arc<RawComm>,
    ctx: Arc<CudaContext>,
    bootstrap: Arc<dyn Bootstrap>,
    registry: Arc<Registry>,
    handle: WindowHandle,
    id: u64,
    ptr: u64,
    bytes: usize,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("id", &self.id)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

/// What a rank brings to a registration: its memory, or why it has none.
type Offer = std::result::Result<u64, String>;

impl Window {
    /// Collective: allocates `bytes` with `ncclMemAlloc` and registers them as a symmetric
    /// window on every rank. `unavailable` is this rank's reason not to (old NCCL, ...).
    /// Ranks that ask for different sizes, or where any rank cannot, all get an error and
    /// register nothing; nothing is left allocated.
    pub(crate) fn register(
        raw: &Arc<RawComm>,
        ctx: &Arc<CudaContext>,
        bootstrap: &Arc<dyn Bootstrap>,
        registry: &Arc<Registry>,
        bytes: usize,
        unavailable: Option<&str>,
    ) -> Result<Window> {
        let offer: Offer = match unavailable {
            Some(why) => Err(why.to_string()),
            None if bytes == 0 => Err("a window of 0 bytes".into()),
            None => ctx
                .bind_to_thread()
                .map_err(driver_error)
                .and_then(|()| mem_alloc(bytes))
                .map_err(|e| format!("ncclMemAlloc of {bytes} bytes: {e}")),
        };
        let free_offer = |offer: &Offer| {
            if let Ok(ptr) = offer {
                // SAFETY: just allocated, never registered nor handed out.
                let _ = unsafe { mem_free(*ptr) };
            }
        };
        if let Err(e) = agree(
            bootstrap,
            bytes,
            offer.as_ref().map(|_| ()).map_err(Clone::clone),
        ) {
            free_offer(&offer);
            return Err(e);
        }
        let ptr = offer.expect("agreed: every rank has its memory");
        // SAFETY: memory from ncclMemAlloc on this device, freed only after deregistration.
        let registered = unsafe { raw.register_window(ptr, bytes) };
        let outcome = agree(
            bootstrap,
            bytes,
            registered.as_ref().map(|_| ()).map_err(|e| e.to_string()),
        );
        match (registered, outcome) {
            (Ok(handle), Ok(())) => {
                let id = registry.next_id();
                registry.insert(id, ptr, bytes);
                Ok(Window {
                    raw: raw.clone(),
                    ctx: ctx.clone(),
                    bootstrap: bootstrap.clone(),
                    registry: registry.clone(),
                    handle,
                    id,
                    ptr,
                    bytes,
                })
            }
            // Registered here but not everywhere: deregistering may wait for the ranks
            // that have no such window, so the window and its memory stay with the
            // communicator (NCCL frees its windows when it is destroyed).
            (Ok(_), Err(e)) => Err(e),
            (Err(e), _) => {
                free_offer(&Ok(ptr));
                Err(e)
            }
        }
    }

    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

/// Collective: `Ok` when every rank offers a window of `bytes`; else the same error on every
/// rank, naming the first rank that cannot (or that asked for another size).
fn agree(
    bootstrap: &Arc<dyn Bootstrap>,
    bytes: usize,
    mine: std::result::Result<(), String>,
) -> Result<()> {
    let mut msg = (bytes as u64).to_le_bytes().to_vec();
    match &mine {
        Ok(()) => msg.push(1),
        Err(why) => {
            msg.push(0);
            msg.extend_from_slice(why.as_bytes());
        }
    }
    let all = bootstrap.all_gather_bytes(&msg)?;
    for (rank, m) in all.iter().enumerate() {
        let theirs = m
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
        if theirs != Some(bytes as u64) {
            return Err(Error::Mismatch(format!(
                "nccl: rank {rank} registers a window of {} bytes, rank {} of {bytes}",
                theirs.map_or("?".into(), |b| b.to_string()),
                bootstrap.rank()
            )));
        }
        if m.get(8) != Some(&1) {
            let why = String::from_utf8_lossy(m.get(9..).unwrap_or_default());
            return Err(Error::Unsupported(format!(
                "nccl: rank {rank} cannot register a symmetric window: {why}"
            )));
        }
    }
    Ok(())
}

impl Drop for Window {
    /// Collective, as registering is: every rank waits (bounded) for the others, so that
    /// no peer's kernel still reads this window, then deregisters it and frees the memory.
    fn drop(&mut self) {
        self.registry.remove(self.id);
        if self.bootstrap.world_size() > 1 {
            let _ = self.bootstrap.barrier();
        }
        if !self.raw.is_aborted() {
            // SAFETY: registered by this window, deregistered once, after every rank
            // synchronised its streams (the contract of dropping) and met at the barrier.
            let _ = unsafe { self.raw.deregister_window(self.handle) };
        }
        let _ = self.ctx.bind_to_thread();
        // SAFETY: from ncclMemAlloc, no longer registered nor used.
        let _ = unsafe { mem_free(self.ptr) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_round_trip_and_ranges_past_a_window_are_refused() {
        let r = Registry::default();
        r.insert(0, 0x1000, 256);
        r.insert(1, 0x4000, 64);
        assert_eq!(r.next_id(), 2);
        assert_eq!(
            r.place(0x1000, 256).unwrap(),
            Place::Window { id: 0, offset: 0 }
        );
        assert_eq!(
            r.place(0x4020, 32).unwrap(),
            Place::Window {
                id: 1,
                offset: 0x20
            }
        );
        assert_eq!(r.place(0x3000, 4096).unwrap(), Place::Plain);
        let err = r.place(0x1010, 256).unwrap_err();
        assert!(err.to_string().contains("run past its end"), "{err}");
        r.remove(0);
        assert_eq!(r.place(0x1000, 4).unwrap(), Place::Plain);
        assert_eq!(r.len(), 1);
        for p in [Place::Plain, Place::Window { id: 7, offset: 9 }] {
            assert_eq!(Place::from_bytes(&p.to_bytes()), Some(p));
        }
        assert_eq!(Place::from_bytes(&[2]), None);
        assert_eq!(Place::from_bytes(&[1, 0]), None);
    }

    #[test]
    fn ranks_that_ask_for_different_sizes_or_cannot_all_get_an_error() {
        use comm_core::ThreadsBootstrap;
        let handles: Vec<_> = ThreadsBootstrap::create(3)
            .into_iter()
            .map(|b| {
                std::thread::spawn(move || {
                    let b: Arc<dyn Bootstrap> = Arc::new(b);
                    let same = agree(&b, 4096, Ok(()));
                    let bytes = if b.rank() == 1 { 8192 } else { 4096 };
                    let sizes = agree(&b, bytes, Ok(()));
                    let mine = if b.rank() == 2 {
                        Err("old".into())
                    } else {
                        Ok(())
                    };
                    let refused = agree(&b, 4096, mine);
                    (same, sizes, refused)
                })
            })
            .collect();
        for h in handles {
            let (same, sizes, refused) = h.join().unwrap();
            assert!(same.is_ok());
            assert!(matches!(sizes, Err(Error::Mismatch(_))), "{sizes:?}");
            let refused = refused.unwrap_err().to_string();
            assert!(
                refused.contains("rank 2") && refused.contains("old"),
                "{refused}"
            );
        }
    }
}
