//! Call descriptors: the shape of one collective call, checked locally and across ranks.
//!
//! Every backend validates a call in two steps. [`CallDescriptor`]'s constructors check
//! what a rank can see alone (buffer sizes, dtypes, root); then the ranks compare their
//! descriptors ([`CallDescriptor::agree`]), so that mismatched counts, dtypes or ops give
//! [`Error::Mismatch`] on *every* rank instead of a hang or a wrong answer.

use std::fmt;

use crate::bootstrap::Bootstrap;
use crate::buffer::{BufferMut, BufferRef};
use crate::communicator::Collective;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

/// What one rank asked for in one collective call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallDescriptor {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: DType,
    /// Elements each rank contributes (the send count).
    pub count: u64,
    /// Reduction operator, for reducing collectives.
    pub op: Option<ReduceOp>,
    /// Root rank, for rooted collectives.
    pub root: Option<u32>,
}

/// Encoded size of a descriptor, in bytes.
pub const DESCRIPTOR_BYTES: usize = 16;

impl CallDescriptor {
    /// Validates an out-of-place all-reduce of `send` into `recv`.
    pub fn all_reduce(send: &BufferRef<'_>, recv: &BufferMut<'_>, op: ReduceOp) -> Result<Self> {
        same_dtype(send.dtype(), recv.dtype())?;
        if send.len() != recv.len() {
            return Err(Error::InvalidArgument(format!(
                "all_reduce: send has {} elements, recv has {}",
                send.len(),
                recv.len()
            )));
        }
        Ok(Self::reducing(
            Collective::AllReduce,
            send.dtype(),
            send.len(),
            op,
        ))
    }

    /// Validates an in-place all-reduce.
    pub fn all_reduce_in_place(buf: &BufferMut<'_>, op: ReduceOp) -> Result<Self> {
        Ok(Self::reducing(
            Collective::AllReduce,
            buf.dtype(),
            buf.len(),
            op,
        ))
    }

    /// Validates an all-gather: `recv` holds `world_size` times `send`.
    pub fn all_gather(
        send: &BufferRef<'_>,
        recv: &BufferMut<'_>,
        world_size: usize,
    ) -> Result<Self> {
        same_dtype(send.dtype(), recv.dtype())?;
        if recv.len() != send.len() * world_size {
            return Err(Error::InvalidArgument(format!(
                "all_gather: recv must hold world_size ({world_size}) x send ({}) = {} elements, has {}",
                send.len(),
                send.len() * world_size,
                recv.len()
            )));
        }
        Ok(CallDescriptor {
            collective: Collective::AllGather,
            dtype: send.dtype(),
            count: send.len() as u64,
            op: None,
            root: None,
        })
    }

    /// Validates a reduce-scatter: `send` holds `world_size` times `recv`.
    pub fn reduce_scatter(
        send: &BufferRef<'_>,
        recv: &BufferMut<'_>,
        op: ReduceOp,
        world_size: usize,
    ) -> Result<Self> {
        same_dtype(send.dtype(), recv.dtype())?;
        if send.len() % world_size != 0 {
            return Err(Error::InvalidArgument(format!(
                "reduce_scatter: send count {} is not divisible by world_size {world_size}",
                send.len()
            )));
        }
        if recv.len() * world_size != send.len() {
            return Err(Error::InvalidArgument(format!(
                "reduce_scatter: recv must hold send ({}) / world_size ({world_size}) = {} elements, has {}",
                send.len(),
                send.len() / world_size,
                recv.len()
            )));
        }
        Ok(Self::reducing(
            Collective::ReduceScatter,
            send.dtype(),
            send.len(),
            op,
        ))
    }

    /// Validates an in-place broadcast from `root`.
    pub fn broadcast(buf: &BufferMut<'_>, root: usize, world_size: usize) -> Result<Self> {
        if root >= world_size {
            return Err(Error::InvalidArgument(format!(
                "broadcast: root {root} is not a rank of a world of {world_size}"
            )));
        }
        Ok(CallDescriptor {
            collective: Collective::Broadcast,
            dtype: buf.dtype(),
            count: buf.len() as u64,
            op: None,
            root: Some(root as u32),
        })
    }

    /// A barrier.
    pub fn barrier() -> Self {
        CallDescriptor {
            collective: Collective::Barrier,
            dtype: DType::U8,
            count: 0,
            op: None,
            root: None,
        }
    }

    fn reducing(collective: Collective, dtype: DType, count: usize, op: ReduceOp) -> Self {
        CallDescriptor {
            collective,
            dtype,
            count: count as u64,
            op: Some(op),
            root: None,
        }
    }

    /// Bytes this rank sends (`count * dtype.size()`).
    pub fn send_bytes(&self) -> usize {
        self.count as usize * self.dtype.size()
    }

    /// Fixed-size encoding, for exchange between processes.
    pub fn to_bytes(&self) -> [u8; DESCRIPTOR_BYTES] {
        let mut out = [0u8; DESCRIPTOR_BYTES];
        out[0] = self.collective.code();
        out[1] = self.dtype.code();
        out[2] = self.op.map_or(0xff, ReduceOp::code);
        out[3] = u8::from(self.root.is_some());
        out[4..8].copy_from_slice(&self.root.unwrap_or(0).to_le_bytes());
        out[8..16].copy_from_slice(&self.count.to_le_bytes());
        out
    }

    /// Decodes [`Self::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = || Error::Bootstrap(format!("malformed call descriptor ({} bytes)", bytes.len()));
        if bytes.len() != DESCRIPTOR_BYTES {
            return Err(bad());
        }
        let collective = Collective::ALL
            .into_iter()
            .find(|c| c.code() == bytes[0])
            .ok_or_else(bad)?;
        let dtype = DType::ALL
            .into_iter()
            .find(|d| d.code() == bytes[1])
            .ok_or_else(bad)?;
        let op = match bytes[2] {
            0xff => None,
            code => Some(
                ReduceOp::ALL
                    .into_iter()
                    .find(|o| o.code() == code)
                    .ok_or_else(bad)?,
            ),
        };
        let root = (bytes[3] == 1).then(|| u32::from_le_bytes(bytes[4..8].try_into().unwrap()));
        let count = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        Ok(CallDescriptor {
            collective,
            dtype,
            count,
            op,
            root,
        })
    }

    /// Checks that every rank's descriptor (indexed by rank) equals rank 0's. All ranks
    /// see the same slice, so all of them return the same verdict.
    pub fn agree(all: &[CallDescriptor]) -> Result<()> {
        let Some(first) = all.first() else {
            return Ok(());
        };
        let differing: Vec<String> = all
            .iter()
            .enumerate()
            .filter(|(_, d)| *d != first)
            .map(|(rank, d)| format!("rank {rank}: {d}"))
            .collect();
        if differing.is_empty() {
            Ok(())
        } else {
            Err(Error::Mismatch(format!(
                "rank 0: {first}; {}",
                differing.join("; ")
            )))
        }
    }
}

/// Encodes this rank's verdict on its own arguments for exchange: the descriptor, or a
/// marker (all bytes `0xff`) when the arguments were rejected locally.
pub fn encode_verdict(verdict: &Result<CallDescriptor>) -> [u8; DESCRIPTOR_BYTES] {
    match verdict {
        Ok(d) => d.to_bytes(),
        Err(_) => [0xff; DESCRIPTOR_BYTES],
    }
}

/// Decodes [`encode_verdict`]: `None` for a rank that rejected its arguments.
pub fn decode_verdict(bytes: &[u8]) -> Result<Option<CallDescriptor>> {
    if bytes.len() == DESCRIPTOR_BYTES && bytes.iter().all(|&b| b == 0xff) {
        Ok(None)
    } else {
        CallDescriptor::from_bytes(bytes).map(Some)
    }
}

/// Settles this rank's verdict with every rank's through `bootstrap`: one all-gather of
/// the encoded verdicts, then [`settle`]. For backends whose data path cannot compare calls
/// itself; every rank returns the same outcome. A bootstrap failure is returned as is (the
/// caller decides whether it leaves the communicator unusable).
pub fn settle_through(
    bootstrap: &dyn Bootstrap,
    mine: Result<CallDescriptor>,
) -> Result<CallDescriptor> {
    let all = bootstrap.all_gather_bytes(&encode_verdict(&mine))?;
    let verdicts = all
        .iter()
        .map(|m| decode_verdict(m))
        .collect::<Result<Vec<_>>>()?;
    settle(mine, &verdicts)
}

/// Combines this rank's verdict with every rank's (indexed by rank; `None` = rejected):
/// this rank's own error if it had one, otherwise an error naming the rank that rejected
/// its arguments, otherwise [`CallDescriptor::agree`]. Every rank thus fails together.
pub fn settle(
    mine: Result<CallDescriptor>,
    all: &[Option<CallDescriptor>],
) -> Result<CallDescriptor> {
    let mine = mine?;
    if let Some(rank) = all.iter().position(Option::is_none) {
        return Err(Error::Mismatch(format!(
            "rank {rank} rejected its arguments for {}",
            mine.collective
        )));
    }
    let all: Vec<CallDescriptor> = all.iter().map(|d| d.unwrap()).collect();
    CallDescriptor::agree(&all)?;
    Ok(mine)
}

impl fmt::Display for CallDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {} x {}", self.collective, self.count, self.dtype)?;
        if let Some(op) = self.op {
            write!(f, " ({op})")?;
        }
        if let Some(root) = self.root {
            write!(f, " from root {root}")?;
        }
        Ok(())
    }
}

fn same_dtype(send: DType, recv: DType) -> Result<()> {
    if send == recv {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "send is {send} but recv is {recv}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_through_bytes() {
        let send = [0f32; 6];
        let mut recv = [0f32; 3];
        let d = CallDescriptor::reduce_scatter(
            &BufferRef::host(&send),
            &BufferMut::host(&mut recv),
            ReduceOp::Max,
            2,
        )
        .unwrap();
        assert_eq!(CallDescriptor::from_bytes(&d.to_bytes()).unwrap(), d);
        let mut b = [0u8; 4];
        let d = CallDescriptor::broadcast(&BufferMut::host(&mut b), 3, 4).unwrap();
        assert_eq!(CallDescriptor::from_bytes(&d.to_bytes()).unwrap(), d);
    }

    #[test]
    fn local_shape_errors_are_invalid_argument() {
        let send = [0f32; 7];
        let mut recv = [0f32; 3];
        let r = CallDescriptor::reduce_scatter(
            &BufferRef::host(&send),
            &BufferMut::host(&mut recv),
            ReduceOp::Sum,
            2,
        );
        assert!(matches!(r, Err(Error::InvalidArgument(m)) if m.contains("divisible")));
        let mut recv = [0f64; 7];
        let r = CallDescriptor::all_reduce(
            &BufferRef::host(&send),
            &BufferMut::host(&mut recv),
            ReduceOp::Sum,
        );
        assert!(matches!(r, Err(Error::InvalidArgument(_))));
        let mut b = [0u8; 1];
        assert!(CallDescriptor::broadcast(&BufferMut::host(&mut b), 2, 2).is_err());
    }

    #[test]
    fn disagreement_is_a_mismatch_naming_the_rank() {
        let a = CallDescriptor::barrier();
        let mut b = a;
        b.count = 3;
        assert!(CallDescriptor::agree(&[a, a, a]).is_ok());
        let err = CallDescriptor::agree(&[a, a, b]).unwrap_err();
        assert!(
            matches!(&err, Error::Mismatch(m) if m.contains("rank 2")),
            "{err}"
        );
    }
}
