//! One collective call with fresh data, checked against the local reference.

use std::fmt;

use super::data;
use super::memory::TestMemory;
use crate::communicator::{Collective, Communicator};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;

/// Elements of canary on both sides of every output view: writes outside it are bugs.
const GUARD: usize = 3;

/// One case: a collective with its arguments. `count` is the per-rank element count of
/// the collective's smaller side (the send of all-gather, the recv of reduce-scatter).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Case {
    pub(crate) collective: Collective,
    pub(crate) dtype: DType,
    pub(crate) op: ReduceOp,
    pub(crate) count: usize,
    pub(crate) in_place: bool,
    /// Views start this many elements into their allocation, so they are not 16-byte aligned.
    pub(crate) offset: usize,
    pub(crate) root: usize,
    pub(crate) seed: u64,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} x {}", self.collective, self.count, self.dtype)?;
        match self.collective {
            Collective::AllReduce | Collective::ReduceScatter => write!(f, " {}", self.op)?,
            Collective::Broadcast => write!(f, " root {}", self.root)?,
            _ => {}
        }
        if self.in_place {
            f.write_str(" in-place")?;
        }
        write!(f, " offset {} seed {:#x}", self.offset, self.seed)
    }
}

/// What one rank saw.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Elements outside tolerance (or not written).
    pub(crate) wrong: usize,
    /// Guard elements that changed.
    pub(crate) guard_damage: usize,
    /// Digest of the output, to compare across ranks (0 where outputs legitimately differ).
    pub(crate) digest: u64,
}

impl Case {
    fn lengths(&self, n: usize) -> (usize, usize) {
        match self.collective {
            Collective::AllGather => (self.count, self.count * n),
            Collective::ReduceScatter => (self.count * n, self.count),
            _ => (self.count, self.count),
        }
    }

    fn op_or_none(&self) -> Option<ReduceOp> {
        matches!(
            self.collective,
            Collective::AllReduce | Collective::ReduceScatter
        )
        .then_some(self.op)
    }

    /// Runs the case on this rank. An `Err` is the backend's error for this call.
    pub(crate) fn run(&self, comm: &dyn Communicator, memory: &dyn TestMemory) -> Result<Outcome> {
        let n = comm.world_size();
        let rank = comm.rank();
        let (send_len, recv_len) = self.lengths(n);
        let size = self.dtype.size();
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|r| data::input(self.dtype, self.op_or_none(), self.seed, r, send_len))
            .collect();

        let canary = data::input(self.dtype, None, !self.seed, n + 1, self.offset + GUARD);
        let (front, back) = canary.split_at(self.offset * size);
        let framed = |body: &[u8]| [front, body, back].concat();

        let mut recv = memory.alloc(self.dtype, self.offset + recv_len + GUARD)?;
        let mut send = memory.alloc(self.dtype, self.offset + send_len + GUARD)?;
        send.write(&framed(&inputs[rank]))?;
        let poisoned = data::poison(self.dtype, recv_len);
        let starts_with_input = match self.collective {
            Collective::AllReduce => self.in_place,
            Collective::Broadcast => rank == self.root,
            _ => false,
        };
        recv.write(&framed(if starts_with_input {
            &inputs[rank]
        } else {
            &poisoned
        }))?;

        let out = recv.view_mut(self.offset, recv_len);
        match self.collective {
            Collective::AllReduce if self.in_place => comm.all_reduce_in_place(out, self.op)?,
            Collective::AllReduce => {
                comm.all_reduce(send.view(self.offset, send_len), out, self.op)?
            }
            Collective::AllGather => comm.all_gather(send.view(self.offset, send_len), out)?,
            Collective::ReduceScatter => {
                comm.reduce_scatter(send.view(self.offset, send_len), out, self.op)?
            }
            Collective::Broadcast => comm.broadcast(out, self.root)?,
            Collective::Barrier => comm.barrier()?,
        }
        let all = recv.read()?;
        let body = &all[self.offset * size..(self.offset + recv_len) * size];
        let guard_damage = count_changed(size, front, &all[..self.offset * size])
            + count_changed(size, back, &all[(self.offset + recv_len) * size..]);

        let wrong = match self.collective {
            Collective::AllReduce | Collective::ReduceScatter => {
                let start = if self.collective == Collective::ReduceScatter {
                    rank * recv_len
                } else {
                    0
                };
                let reference = data::reduce(self.dtype, self.op, &inputs, start..start + recv_len);
                data::count_wrong(
                    self.dtype,
                    self.op,
                    n,
                    &data::decode(self.dtype, body),
                    &reference,
                )
            }
            Collective::AllGather => count_changed(size, &inputs.concat(), body),
            Collective::Broadcast => count_changed(size, &inputs[self.root], body),
            Collective::Barrier => 0,
        };
        let digest = if self.collective == Collective::ReduceScatter {
            0
        } else {
            data::digest(body)
        };
        Ok(Outcome {
            wrong,
            guard_damage,
            digest,
        })
    }
}

/// Elements (of `size` bytes) whose bits differ between `want` and `got`.
fn count_changed(size: usize, want: &[u8], got: &[u8]) -> usize {
    if want.len() != got.len() {
        return want.len().max(got.len()) / size;
    }
    want.chunks_exact(size)
        .zip(got.chunks_exact(size))
        .filter(|(w, g)| w != g)
        .count()
}
