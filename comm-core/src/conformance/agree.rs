//! Cross-rank agreement through the communicator under test.
//!
//! After each case the ranks must agree on the verdict (so that all of them stop or go on
//! together) and compare result digests (bitwise identity). The only collective every
//! backend offers is a sum all-reduce, so each rank writes its words as bytes into its own
//! slot of a zeroed vector and the ranks sum it: one non-zero term per element, small
//! integers, exact in every dtype.

use super::memory::TestMemory;
use crate::communicator::{Capabilities, Collective, Communicator};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

/// The dtype used for agreement on this backend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Agreement {
    dtype: DType,
}

impl Agreement {
    pub(crate) fn pick(caps: &Capabilities) -> Result<Self> {
        if !caps.collectives.contains(&Collective::AllReduce) || !caps.ops.contains(&ReduceOp::Sum)
        {
            return Err(Error::Unsupported(
                "the suite needs a sum all_reduce".into(),
            ));
        }
        [
            DType::F32,
            DType::I32,
            DType::F64,
            DType::I64,
            DType::BF16,
            DType::F16,
            DType::U8,
        ]
        .into_iter()
        .find(|d| caps.dtypes.contains(d))
        .map(|dtype| Agreement { dtype })
        .ok_or_else(|| Error::Unsupported("no dtype to agree through".into()))
    }

    /// Returns every rank's `words`, indexed by rank.
    pub(crate) fn share(
        &self,
        comm: &dyn Communicator,
        memory: &dyn TestMemory,
        words: &[u64],
    ) -> Result<Vec<Vec<u64>>> {
        let n = comm.world_size();
        let per_rank = words.len() * 8;
        let mut values = vec![0u8; n * per_rank];
        let mine = &mut values[comm.rank() * per_rank..(comm.rank() + 1) * per_rank];
        for (slot, word) in mine.chunks_exact_mut(8).zip(words) {
            slot.copy_from_slice(&word.to_le_bytes());
        }
        let encoded: Vec<u8> = values
            .iter()
            .flat_map(|&b| encode_small(self.dtype, b))
            .collect();
        let mut buf = memory.alloc(self.dtype, values.len())?;
        buf.write(&encoded)?;
        comm.all_reduce_in_place(buf.view_mut(0, values.len()), ReduceOp::Sum)?;
        let summed = buf.read()?;
        let bytes: Vec<u8> = summed
            .chunks_exact(self.dtype.size())
            .map(|c| decode_small(self.dtype, c))
            .collect::<Result<_>>()?;
        Ok(bytes
            .chunks_exact(per_rank)
            .map(|rank| {
                rank.chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                    .collect()
            })
            .collect())
    }
}

pub(crate) fn encode_small(dtype: DType, b: u8) -> Vec<u8> {
    match dtype {
        DType::F32 => f32::from(b).to_le_bytes().to_vec(),
        DType::F64 => f64::from(b).to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f32(f32::from(b)).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f32(f32::from(b)).to_le_bytes().to_vec(),
        DType::I32 => i32::from(b).to_le_bytes().to_vec(),
        DType::I64 => i64::from(b).to_le_bytes().to_vec(),
        DType::U8 => vec![b],
    }
}

fn decode_small(dtype: DType, c: &[u8]) -> Result<u8> {
    let v: f64 = match super::data::decode(dtype, c) {
        super::data::Values::Float(v) => v[0],
        super::data::Values::Int(v) => v[0] as f64,
    };
    if v.fract() == 0.0 && (0.0..=255.0).contains(&v) {
        Ok(v as u8)
    } else {
        Err(Error::Mismatch(format!(
            "agreement all_reduce returned {v}, not a byte: the backend's sum is wrong"
        )))
    }
}
