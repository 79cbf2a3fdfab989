//! `BootstrapComm`: a host backend for ranks in separate processes, with no library
//! beyond a [`Bootstrap`].
//!
//! Every call is one [`Bootstrap::all_gather_bytes`]: each rank sends its 16-byte verdict
//! on its own arguments ([`encode_verdict`]) followed by its data, so the check that all
//! ranks made the same call and the data travel together. Every rank then settles the
//! verdicts ([`settle`]) — a bad call fails on all of them, never hangs — and computes its
//! result from the gathered data: reductions combine the ranks' contributions in rank
//! order with [`reduce_host`], so every rank gets the same bits. This is what `mpirun -np 4`
//! runs from a default build (over [`EnvBootstrap`](crate::EnvBootstrap)), and a way to
//! test multi-process code with threads (over [`ThreadsBootstrap`](crate::ThreadsBootstrap)).
//! It moves `world_size` times more bytes than an algorithm that gathers only what each
//! rank needs, which is the price of reusing the bootstrap as the data path.

use std::sync::LazyLock;

use crate::bootstrap::Bootstrap;
use crate::buffer::{BufferMut, BufferRef, MemoryLocation};
use crate::call::{CallDescriptor, DESCRIPTOR_BYTES, decode_verdict, encode_verdict, settle};
use crate::communicator::{Capabilities, Collective, Communicator, TrafficPattern};
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::reduce::reduce_host;

/// The backend's name.
const NAME: &str = "bootstrap";

/// A [`Communicator`] whose data moves through a [`Bootstrap`].
///
/// ```
/// use comm_core::{BootstrapComm, CommunicatorExt, ReduceOp, ThreadsBootstrap};
///
/// let handles: Vec<_> = ThreadsBootstrap::create(3)
///     .into_iter()
///     .map(|boot| {
///         std::thread::spawn(move || {
///             let comm = BootstrapComm::new(boot);
///             let mut x = [1.5f32, 2.0];
///             comm.all_reduce_in_place_slice(&mut x, ReduceOp::Sum).unwrap();
///             x
///         })
///     })
///     .collect();
/// for h in handles {
///     assert_eq!(h.join().unwrap(), [4.5, 6.0]);
/// }
/// ```
#[derive(Debug)]
pub struct BootstrapComm<B: Bootstrap> {
    bootstrap: B,
}

/// What the ranks agreed on, and what each of them sent.
struct Gathered {
    call: CallDescriptor,
    /// Every rank's message; its data starts at [`DESCRIPTOR_BYTES`].
    messages: Vec<Vec<u8>>,
}

impl Gathered {
    fn data(&self, rank: usize) -> &[u8] {
        &self.messages[rank][DESCRIPTOR_BYTES..]
    }
}

impl<B: Bootstrap> BootstrapComm<B> {
    /// A communicator over the ranks of `bootstrap`; its waits are bounded by
    /// [`Bootstrap::timeout`].
    pub fn new(bootstrap: B) -> Self {
        BootstrapComm { bootstrap }
    }

    /// The bootstrap underneath.
    pub fn bootstrap(&self) -> &B {
        &self.bootstrap
    }

    /// Gives the bootstrap back.
    pub fn into_bootstrap(self) -> B {
        self.bootstrap
    }

    /// Checks this rank's call against the backend's capabilities, exchanges verdicts and
    /// `data` (this rank's host bytes; `None` for device memory) with every rank, and
    /// settles the call.
    fn exchange(
        &self,
        verdict: Result<CallDescriptor>,
        location: MemoryLocation,
        data: Option<&[u8]>,
    ) -> Result<Gathered> {
        let verdict = verdict.and_then(|d| {
            self.capabilities()
                .check(NAME, d.collective, d.dtype, d.op, d.send_bytes(), location)
                .map(|()| d)
        });
        let mut message = encode_verdict(&verdict).to_vec();
        if verdict.is_ok() {
            // The capability check has refused device memory, so `data` is present.
            message.extend_from_slice(data.unwrap_or_default());
        }
        let messages = self.bootstrap.all_gather_bytes(&message)?;
        if messages.len() != self.world_size() {
            return Err(Error::Bootstrap(format!(
                "gathered {} messages from a world of {}",
                messages.len(),
                self.world_size()
            )));
        }
        let verdicts = messages
            .iter()
            .enumerate()
            .map(|(rank, m)| {
                m.get(..DESCRIPTOR_BYTES)
                    .ok_or_else(|| Error::Bootstrap(format!("rank {rank} sent a truncated call")))
                    .and_then(decode_verdict)
            })
            .collect::<Result<Vec<_>>>()?;
        let call = settle(verdict, &verdicts)?;
        for (rank, m) in messages.iter().enumerate() {
            let want = match call.collective {
                Collective::Barrier => 0,
                Collective::Broadcast if call.root != Some(rank as u32) => 0,
                _ => call.send_bytes(),
            };
            if m.len() - DESCRIPTOR_BYTES != want {
                return Err(Error::Bootstrap(format!(
                    "rank {rank} sent {} bytes for {call}, expected {want}",
                    m.len() - DESCRIPTOR_BYTES
                )));
            }
        }
        Ok(Gathered { call, messages })
    }

    /// Reduces bytes `range` of every rank's data into `out`, in rank order.
    fn reduce(&self, got: &Gathered, range: std::ops::Range<usize>, out: &mut [u8]) -> Result<()> {
        let call = &got.call;
        let op = call
            .op
            .ok_or_else(|| Error::InvalidArgument(format!("{call} has no reduction operator")))?;
        let parts: Vec<&[u8]> = (0..self.world_size())
            .map(|r| &got.data(r)[range.clone()])
            .collect();
        // The transport's buffers carry no alignment promise; `reduce_host` needs elements
        // aligned, so the (rare) misaligned part is copied into storage of 8-byte words.
        let align = call.dtype.size();
        let copies: Vec<Option<Vec<u64>>> = parts
            .iter()
            .map(|p| {
                (p.as_ptr() as usize % align != 0).then(|| {
                    let mut words = vec![0u64; p.len().div_ceil(8)];
                    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..p.len()].copy_from_slice(p);
                    words
                })
            })
            .collect();
        let sources: Vec<&[u8]> = parts
            .iter()
            .zip(&copies)
            .map(|(p, copy)| match copy {
                Some(words) => &bytemuck::cast_slice::<u64, u8>(words)[..p.len()],
                None => *p,
            })
            .collect();
        reduce_host(call.dtype, op, &sources, out);
        Ok(())
    }
}

/// The location a call is checked against: host only if both views are host memory.
fn location_of(a: MemoryLocation, b: MemoryLocation) -> MemoryLocation {
    if a.is_host() { b } else { a }
}

impl<B: Bootstrap> Communicator for BootstrapComm<B> {
    fn name(&self) -> &str {
        NAME
    }

    fn rank(&self) -> usize {
        self.bootstrap.rank()
    }

    fn world_size(&self) -> usize {
        self.bootstrap.world_size()
    }

    fn capabilities(&self) -> &Capabilities {
        static CAPS: LazyLock<Capabilities> =
            LazyLock::new(|| Capabilities::host_complete().with_pattern(TrafficPattern::GatherAll));
        &CAPS
    }

    fn all_reduce(&self, send: BufferRef<'_>, mut recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let verdict = CallDescriptor::all_reduce(&send, &recv, op);
        let location = location_of(send.location(), recv.location());
        let got = self.exchange(verdict, location, send.host_bytes())?;
        let out = recv.require_host(NAME)?;
        self.reduce(&got, 0..out.len(), out)
    }

    fn all_reduce_in_place(&self, mut buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        let verdict = CallDescriptor::all_reduce_in_place(&buf, op);
        let got = self.exchange(verdict, buf.location(), buf.as_ref().host_bytes())?;
        let out = buf.require_host(NAME)?;
        self.reduce(&got, 0..out.len(), out)
    }

    fn all_gather(&self, send: BufferRef<'_>, mut recv: BufferMut<'_>) -> Result<()> {
        let verdict = CallDescriptor::all_gather(&send, &recv, self.world_size());
        let location = location_of(send.location(), recv.location());
        let got = self.exchange(verdict, location, send.host_bytes())?;
        let out = recv.require_host(NAME)?;
        let bytes = got.call.send_bytes();
        if bytes > 0 {
            for (rank, slot) in out.chunks_exact_mut(bytes).enumerate() {
                slot.copy_from_slice(got.data(rank));
            }
        }
        Ok(())
    }

    fn reduce_scatter(
        &self,
        send: BufferRef<'_>,
        mut recv: BufferMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        let verdict = CallDescriptor::reduce_scatter(&send, &recv, op, self.world_size());
        let location = location_of(send.location(), recv.location());
        let got = self.exchange(verdict, location, send.host_bytes())?;
        let out = recv.require_host(NAME)?;
        let start = self.rank() * out.len();
        self.reduce(&got, start..start + out.len(), out)
    }

    fn broadcast(&self, mut buf: BufferMut<'_>, root: usize) -> Result<()> {
        let verdict = CallDescriptor::broadcast(&buf, root, self.world_size());
        let me = self.rank();
        let data = if me == root {
            buf.as_ref().host_bytes()
        } else {
            Some(&[][..])
        };
        let got = self.exchange(verdict, buf.location(), data)?;
        if me != root {
            buf.require_host(NAME)?.copy_from_slice(got.data(root));
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.exchange(
            Ok(CallDescriptor::barrier()),
            MemoryLocation::Host,
            Some(&[]),
        )
        .map(drop)
    }
}

#[cfg(test)]
mod tests;
