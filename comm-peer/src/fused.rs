//! The fused all-reduce + residual add + RMSNorm of [`PeerComm`].

use comm_core::{BufferMut, BufferRef, CallDescriptor, DType, Error, ReduceOp, Result};

use crate::algorithm::Algorithm;
use crate::comm::PeerComm;
use crate::grid::{by_block_size, fused_grid};
use crate::kernels::{PeerArgs, fused_rmsnorm_kernel};

impl PeerComm {
    /// The fused `all_reduce + residual add + RMSNorm` (bf16, rows of `weight.len()`):
    /// `a = allreduce_sum(input)` (f32 accumulation, rounded to bf16), `residual =
    /// bf16(residual + a)`, `out = bf16(residual * rsqrt(mean(residual^2) + eps) * weight)`,
    /// per row, as the unfused all-reduce followed by a fused add + RMSNorm computes it (the
    /// residual bit for bit; where a row is cut over several blocks, its sum of squares adds
    /// their parts in another order, which may move the output by a rounding). Lamport
    /// exchange (one-shot push; where every rank's region is one device's memory, each rank
    /// writes only its own slot) when the message fits the mailboxes and the algorithm is
    /// `oneshot-push`, or automatic where every rank has a device of its own; else one-shot
    /// pull (ranks sharing a device pulled faster). Needs `hidden` a multiple of 8 and
    /// 16-byte aligned buffers on this rank's device and one stream.
    pub fn all_reduce_residual_rmsnorm(
        &self,
        input: BufferRef<'_>,
        residual: BufferMut<'_>,
        out: BufferMut<'_>,
        weight: BufferRef<'_>,
        eps: f32,
    ) -> Result<()> {
        self.group.live()?;
        let name = self.name;
        let hidden = weight.len();
        let bytes = input.bytes();
        let push = bytes <= self.layout.lcap
            && match self.algorithm.get() {
                None => self.memory().fused_pushes(),
                Some(chosen) => chosen == Algorithm::OneshotPush,
            };
        let locations = [
            input.location(),
            residual.location(),
            out.location(),
            weight.location(),
        ];
        let mine = (|| {
            let call = CallDescriptor::all_reduce(&input, &residual, ReduceOp::Sum)?;
            for (what, d) in [
                ("input", input.dtype()),
                ("out", out.dtype()),
                ("weight", weight.dtype()),
            ] {
                if d != DType::BF16 {
                    return Err(Error::Unsupported(format!(
                        "{name} fused rmsnorm: {what} must be bf16, is {d}"
                    )));
                }
            }
            if out.len() != input.len() {
                return Err(Error::InvalidArgument(format!(
                    "{name} fused rmsnorm: out holds {} elements, input {}",
                    out.len(),
                    input.len()
                )));
            }
            if hidden == 0 || hidden % 8 != 0 || input.len() % hidden != 0 {
                return Err(Error::InvalidArgument(format!(
                    "{name} fused rmsnorm: {} elements are not rows of hidden = {hidden} \
                     (a non-zero multiple of 8)",
                    input.len()
                )));
            }
            if [input.addr(), residual.addr(), out.addr(), weight.addr()]
                .iter()
                .any(|a| a % 16 != 0)
            {
                return Err(Error::InvalidArgument(format!(
                    "{name} fused rmsnorm: buffers must be 16-byte aligned"
                )));
            }
            if bytes > self.layout.cap {
                return Err(Error::Unsupported(format!(
                    "{name} fused rmsnorm: {bytes} bytes exceed the maximum of {}",
                    self.layout.cap
                )));
            }
            let stream = self.stream_of(&locations)?;
            Ok((call, stream))
        })();
        // As an all-reduce's plan (algorithm, no zero-copy), then the row and the epsilon.
        let algorithm = if push {
            Algorithm::OneshotPush
        } else {
            Algorithm::OneshotPull
        };
        let mut plan = [0u8; 10];
        plan[0] = algorithm as u8;
        plan[2..6].copy_from_slice(&(hidden as u32).to_le_bytes());
        plan[6..].copy_from_slice(&eps.to_bits().to_le_bytes());
        let agreed = self.agree(mine, &plan, &locations)?;
        self.after_agreement(|| {
            let rows = input.len() / hidden.max(1);
            if rows == 0 {
                return self.agree_only(agreed.words, agreed.stream);
            }
            let args = PeerArgs {
                input: input.addr() as u64,
                output: out.addr() as u64,
                residual: residual.addr() as u64,
                weight: weight.addr() as u64,
                count: input.len() as u64,
                hidden: hidden as u64,
                eps,
                aligned: 1,
                call: agreed.words,
                ..self.args()
            };
            // Rows cut into parts as far as the spread of small one-shot all-reduces allows;
            // on host memory (no spread) a block per row, each block costing more than it
            // carries there.
            let spread = |threads| {
                self.spread_blocks
                    .map_or(0, |most| by_block_size(most, threads))
            };
            let grid = fused_grid(
                rows,
                hidden / 8,
                self.config.threads,
                spread,
                self.max_blocks,
            );
            let kernel = fused_rmsnorm_kernel(push, self.group.same_device());
            self.group.launch(kernel, grid, agreed.stream, &args)
        })
    }
}
