//! `verify-step --fused`: the step as a model's layers run it, each layer an all-reduce, a
//! residual add and an RMSNorm over rows of `--hidden` bf16, captured into one CUDA graph.
//!
//! Backends with the fused op (`ipc`, `symm-cuda`: `PeerComm::all_reduce_residual_rmsnorm`)
//! run one kernel per layer; any other GPU backend runs its all-reduce, then
//! `add_rmsnorm.cu`, which follows the fused kernel's contract. Host backends are refused.
//!
//! Layer `k` reduces its own input (fresh random bf16 per rank and layer, so that every call
//! moves new data) and writes its own output buffer (so that every layer's result is
//! checked); one residual runs through every layer, which makes each layer depend on the one
//! before, as in a model. The inputs are multiples of [`quantum`] in [-1, 1]: every partial
//! sum over the ranks is then a bf16 value, so an all-reduce's result does not depend on the
//! order or the rounding of a backend's reduction (NCCL's ring rounds at every hop). The
//! residual chain must then match the f64 reference bit for bit, and only the normalised
//! output, computed in f32 and rounded once, gets a tolerance.

use std::sync::Arc;

use comm_core::cuda::cudarc::driver::{CudaContext, sys};
use comm_core::cuda::{DeviceMemory, DeviceOwned, KernelSource, device_count, driver_error};
use comm_core::{Bootstrap, Communicator, DType, Error, ReduceOp, Result, bf16};
use comm_peer::PeerComm;

use super::gpu::{StepKernel, time_replays};
use super::{Config, How, Timing};
use crate::backends::RankContext;
use crate::gpu::data::{all_inputs, decode, fused_reference};
use crate::gpu::{Backend, GpuComm};

/// Residual add + RMSNorm after a separate all-reduce.
pub const ADD_RMSNORM: KernelSource = KernelSource {
    name: "add_rmsnorm.cu",
    source: include_str!("../../kernels/add_rmsnorm.cu"),
};

/// The norm's epsilon (as the checks of the fused op use).
pub const EPS: f32 = 1e-6;

/// The seed of the step's data: the same on every rank, which computes every rank's inputs
/// for the reference.
const SEED: u64 = 0x5eed_0f05_ed00_0122;

/// The most threads `add_rmsnorm.cu` takes per block (its `ADD_RMSNORM_MAX_THREADS`).
const MAX_THREADS: usize = 1024;

/// How one layer runs on a backend.
#[derive(Clone, Copy)]
pub enum Layer<'a> {
    /// The backend's fused all-reduce + residual add + RMSNorm.
    Fused(&'a PeerComm),
    /// The backend's all-reduce, then [`ADD_RMSNORM`].
    Separate(&'a dyn Communicator),
}

impl std::fmt::Debug for Layer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The communicator has no `Debug`: its name says which it is.
        write!(f, "{}({})", self.how().label(), self.comm().name())
    }
}

impl<'a> Layer<'a> {
    fn comm(self) -> &'a dyn Communicator {
        match self {
            Layer::Fused(peer) => peer,
            Layer::Separate(comm) => comm,
        }
    }

    fn how(self) -> How {
        match self {
            Layer::Fused(_) => How::GraphFused,
            Layer::Separate(_) => How::GraphNorm,
        }
    }
}

/// The fused step's shape: `calls` layers of `count` bf16, rows of `hidden`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Layers per step.
    pub calls: usize,
    /// Elements per layer.
    pub count: usize,
    /// Elements per row (the model's hidden size).
    pub hidden: usize,
}

impl Shape {
    /// The shape of `cfg`, or why `--fused` cannot run it: the fused op takes bf16 rows of a
    /// non-zero multiple of 8 elements (both pipelines keep its rules, so that they run the
    /// same shapes).
    pub fn of(cfg: &Config) -> std::result::Result<Shape, String> {
        let (calls, count, hidden) = (cfg.calls, cfg.count, cfg.hidden);
        if cfg.dtype != DType::BF16 {
            return Err(format!(
                "--fused: the fused op is bf16 only, not {}",
                cfg.dtype
            ));
        }
        if hidden == 0 || hidden % 8 != 0 {
            return Err(format!(
                "--fused: --hidden {hidden} is not a non-zero multiple of 8"
            ));
        }
        if count == 0 || count % hidden != 0 {
            return Err(format!(
                "--fused: --count {count} is not a non-zero number of rows of --hidden {hidden}"
            ));
        }
        if calls == 0 {
            return Err("--fused: --calls must be at least 1".into());
        }
        Ok(Shape {
            calls,
            count,
            hidden,
        })
    }

    /// Rows per layer.
    pub fn rows(self) -> usize {
        self.count / self.hidden
    }
}

/// Collective: the backend named `name` as its concrete type when it has the fused op
/// (`None` for any other backend), on this rank's device.
pub fn peer_backend(name: &str, ctx: &RankContext) -> Result<Option<GpuComm>> {
    let backend = match name {
        "ipc" => Backend::Ipc,
        "symm-cuda" => Backend::SymmCuda,
        _ => return Ok(None),
    };
    // No GPU here is the same answer on every rank: none joins.
    ctx.device()?;
    GpuComm::from_env(backend, ctx.bootstrap()).map(Some)
}

/// Why backend `name`, on host memory, does not run `--fused`: no GPU here (skipped, as
/// the GPU backends are), or a host backend on a machine that has one (skipped under
/// `all`, a failure when named).
pub fn refuse(name: &str, has_gpu: bool) -> Error {
    if has_gpu {
        Error::Unsupported(format!(
            "--fused runs on GPU backends ({name} works on host memory)"
        ))
    } else {
        Error::NoDevice(format!("--fused runs on GPU backends, {name} found none"))
    }
}

/// The inputs' grid: `2^(ceil(log2 world) - 8)`. Multiples of it in [-1, 1] have at most
/// 256 steps, and so has any sum of up to `world` of them: all are bf16 values (8 significant
/// bits), whatever the order of the additions and wherever they are rounded.
pub fn quantum(world: usize) -> f64 {
    let bits = world.max(1).next_power_of_two().trailing_zeros() as i32;
    2f64.powi(bits - 8)
}

/// Every rank's inputs of every layer (`calls * count` bf16 each): random, on the grid of
/// [`quantum`].
pub fn layer_inputs(shape: Shape, world: usize) -> Vec<Vec<u8>> {
    let q = quantum(world);
    all_inputs(DType::BF16, shape.calls * shape.count, SEED, world)
        .into_iter()
        .map(|bytes| {
            (0..bytes.len() / 2)
                .flat_map(|i| {
                    // + 0.0 turns -0.0 into +0.0, which the Lamport exchange would do anyway
                    // (-0.0 is its sentinel): every backend then reduces the same values.
                    let v = (decode(DType::BF16, &bytes, i) / q).round() * q + 0.0;
                    bf16::from_f64(v).to_le_bytes()
                })
                .collect()
        })
        .collect()
}

/// The residual every rank starts with (`count` bf16), and the norm's weight (`hidden`).
pub fn residual_and_weight(shape: Shape) -> (Vec<u8>, Vec<u8>) {
    let residual = all_inputs(DType::BF16, shape.count, SEED ^ 0xabc, 1).remove(0);
    let weight = all_inputs(DType::BF16, shape.hidden, SEED ^ 0xdef, 1).remove(0);
    (residual, weight)
}

/// The step in f64, layer by layer: the final residual and every layer's output (`calls *
/// count`, layer-major).
pub fn reference(
    inputs: &[Vec<u8>],
    residual: &[u8],
    weight: &[u8],
    shape: Shape,
) -> (Vec<f64>, Vec<f64>) {
    let bytes = shape.count * 2;
    let mut res = residual.to_vec();
    let mut outs = Vec::with_capacity(shape.calls * shape.count);
    for k in 0..shape.calls {
        let layer: Vec<Vec<u8>> = inputs
            .iter()
            .map(|x| x[k * bytes..(k + 1) * bytes].to_vec())
            .collect();
        let (next, out) = fused_reference(&layer, &res, weight, shape.rows(), shape.hidden, EPS);
        // The new residual is bf16 already: encoding it is exact.
        res = next
            .iter()
            .flat_map(|&v| bf16::from_f64(v).to_le_bytes())
            .collect();
        outs.extend(out);
    }
    let res = (0..shape.count)
        .map(|i| decode(DType::BF16, &res, i))
        .collect();
    (res, outs)
}

/// Elements that missed the reference: a residual element that differs at all, an output
/// element further from it than its bf16 rounding allows (half an ulp, at most 2^-8
/// relative, plus the f32 arithmetic's 2^-16). NaN (an unwritten, poisoned element) misses.
pub fn count_wrong(got_res: &[u8], got_out: &[u8], want_res: &[f64], want_out: &[f64]) -> usize {
    let decoded = |bytes: &[u8]| -> Vec<f64> {
        (0..bytes.len() / 2)
            .map(|i| decode(DType::BF16, bytes, i))
            .collect()
    };
    let (got_res, got_out) = (decoded(got_res), decoded(got_out));
    let tol = 2f64.powi(-8) + 2f64.powi(-16);
    let res = got_res.iter().zip(want_res).filter(|(g, w)| g != w).count();
    let out = got_out
        .iter()
        .zip(want_out)
        .filter(|&(g, w)| (g - w).abs() > tol * w.abs() || g.is_nan())
        .count();
    res + out + got_res.len().abs_diff(want_res.len()) + got_out.len().abs_diff(want_out.len())
}

/// Runs the fused step of `layer`'s backend on this rank's GPU as a graph: checked once,
/// then timed.
pub fn run(layer: Layer<'_>, ctl: &dyn Bootstrap, cfg: &Config) -> Result<Timing> {
    let shape = Shape::of(cfg).map_err(Error::InvalidArgument)?;
    let comm = layer.comm();
    let (rank, world) = (comm.rank(), comm.world_size());
    let (count, hidden) = (shape.count, shape.hidden);
    let memory = DeviceMemory::new(ctl.local_rank() % device_count()?)?;
    let pipeline = match layer {
        Layer::Fused(peer) => Pipeline::Fused(peer),
        Layer::Separate(comm) => Pipeline::Separate(comm, NormKernel::load(memory.context())?),
    };
    let inputs = layer_inputs(shape, world);
    let (res0, w) = residual_and_weight(shape);
    let mut x = memory.alloc(DType::BF16, shape.calls * count)?;
    let mut res = memory.alloc(DType::BF16, count)?;
    let mut out = memory.alloc(DType::BF16, shape.calls * count)?;
    let mut reduced = memory.alloc(DType::BF16, count)?;
    let mut weight = memory.alloc(DType::BF16, hidden)?;
    x.write(&inputs[rank])?;
    res.write(&res0)?;
    weight.write(&w)?;
    let stream = memory.stream().clone();
    let (x, weight) = (&x, &weight);
    let step =
        |res: &mut DeviceOwned, out: &mut DeviceOwned, reduced: &mut DeviceOwned| -> Result<()> {
            for k in 0..shape.calls {
                let at = k * count;
                match &pipeline {
                    Pipeline::Fused(peer) => peer.all_reduce_residual_rmsnorm(
                        x.view(at, count)?,
                        res.view_mut(0, count)?,
                        out.view_mut(at, count)?,
                        weight.view(0, hidden)?,
                        EPS,
                    )?,
                    Pipeline::Separate(comm, norm) => {
                        comm.all_reduce(
                            x.view(at, count)?,
                            reduced.view_mut(0, count)?,
                            ReduceOp::Sum,
                        )?;
                        norm.launch(reduced, res, out, at, weight, stream.cu_stream())?;
                    }
                }
            }
            Ok(())
        };
    // Every rank has loaded its kernels and allocated before any collective starts: a rank
    // doing either while a peer's kernel spins for it on a shared device would wait for it.
    ctl.barrier()?;
    // One eager step first: backends set up lazily, which a capture cannot hold.
    step(&mut res, &mut out, &mut reduced)?;
    memory.synchronize()?;
    comm.async_error()?;
    ctl.barrier()?;

    let graph = crate::graph::capture(&stream, || step(&mut res, &mut out, &mut reduced))?;
    crate::graph::line_up_to_launch(&graph, &memory, ctl)?;

    // The eager step moved the residual on; every output is NaN (0xffff) until a layer
    // writes it, so that one no layer wrote counts as wrong.
    res.write(&res0)?;
    out.poison(0xff)?;
    graph.launch().map_err(driver_error)?;
    memory.synchronize()?;
    // A peer kernel that gave up (a timeout, ranks that disagree) says so here; its outputs
    // would only count as wrong.
    comm.async_error()?;
    let (want_res, want_out) = reference(&inputs, &res0, &w, shape);
    let wrong = count_wrong(&res.read()?, &out.read()?, &want_res, &want_out);
    Ok(Timing {
        step: time_replays(&graph, &memory, ctl, cfg)?,
        wrong,
        how: layer.how(),
    })
}

/// What a layer enqueues.
enum Pipeline<'a> {
    /// One fused kernel.
    Fused(&'a PeerComm),
    /// The all-reduce, then the norm kernel.
    Separate(&'a dyn Communicator, NormKernel),
}

/// `comm_add_rmsnorm_bf16` of `add_rmsnorm.cu` on one device.
struct NormKernel(StepKernel);

impl NormKernel {
    fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        StepKernel::load(ctx, &ADD_RMSNORM, "comm_add_rmsnorm_bf16").map(NormKernel)
    }

    /// Enqueues residual add + RMSNorm of `reduced` into `residual` and `out[at ..]`, rows of
    /// `weight.len()`.
    fn launch(
        &self,
        reduced: &DeviceOwned,
        residual: &mut DeviceOwned,
        out: &mut DeviceOwned,
        at: usize,
        weight: &DeviceOwned,
        stream: sys::CUstream,
    ) -> Result<()> {
        let (count, hidden) = (reduced.len(), weight.len());
        // The kernel indexes without bounds: the sizes are checked here.
        let bf16s = [reduced, &*residual, &*out, weight]
            .iter()
            .all(|b| b.dtype() == DType::BF16);
        if !bf16s
            || hidden == 0
            || count % hidden != 0
            || residual.len() != count
            || out.len() < at + count
        {
            return Err(Error::InvalidArgument(format!(
                "add_rmsnorm: {count} reduced, {} residual, {} output from {at}, {hidden} \
                 weight elements (bf16 rows of the weight's length)",
                residual.len(),
                out.len()
            )));
        }
        let mut a = reduced.buffer().device_ptr();
        let mut r = residual.buffer().device_ptr();
        let mut o = out.buffer().device_ptr() + (at * 2) as u64;
        let mut w = weight.buffer().device_ptr();
        let mut rows = (count / hidden) as u64;
        let mut hidden = hidden as u64;
        let mut eps = EPS;
        let mut params = comm_core::kernel_params![a, r, o, w, rows, hidden, eps];
        let (blocks, threads) = launch_shape(rows as usize, hidden as usize);
        // SAFETY: the parameters match the kernel's (u64 reduced, residual, out, weight,
        // rows, hidden, float eps); the buffers hold the rows checked above; the threads are
        // whole warps within the kernel's bound.
        unsafe { self.0.launch(blocks, threads, stream, &mut params) }
    }
}

/// Blocks and threads of `add_rmsnorm.cu`: a block per row (up to 1024, the rest strided),
/// about 8 elements per thread as the fused kernel has, in whole warps (the block sum
/// shuffles full warps).
fn launch_shape(rows: usize, hidden: usize) -> (u32, u32) {
    let threads = hidden
        .div_ceil(8)
        .next_multiple_of(32)
        .clamp(32, MAX_THREADS);
    (rows.clamp(1, 1024) as u32, threads as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(calls: usize, rows: usize, hidden: usize) -> Shape {
        Shape {
            calls,
            count: rows * hidden,
            hidden,
        }
    }

    #[test]
    fn shapes_follow_the_fused_op_rules() {
        let cfg = Config {
            fused: true,
            ..Config::default()
        };
        assert_eq!(Shape::of(&cfg).unwrap(), shape(122, 3, 7168));
        assert_eq!(Shape::of(&cfg).unwrap().rows(), 3);
        let bad = [
            Config {
                dtype: DType::F32,
                ..cfg.clone()
            },
            Config {
                hidden: 7,
                ..cfg.clone()
            },
            Config {
                count: 7168 + 8,
                ..cfg.clone()
            },
            Config {
                count: 0,
                ..cfg.clone()
            },
            Config {
                calls: 0,
                ..cfg.clone()
            },
        ];
        for c in bad {
            assert!(Shape::of(&c).is_err(), "{c:?}");
        }
    }

    #[test]
    fn inputs_are_on_a_grid_where_every_partial_sum_is_exact_in_bf16() {
        assert_eq!(quantum(1), 2f64.powi(-8));
        assert_eq!(quantum(2), 2f64.powi(-7));
        assert_eq!(quantum(3), 2f64.powi(-6));
        assert_eq!(quantum(8), 2f64.powi(-5));
        for world in [1, 2, 3, 8] {
            let s = shape(2, 2, 16);
            let inputs = layer_inputs(s, world);
            assert_eq!(inputs.len(), world);
            let values: Vec<Vec<f64>> = inputs
                .iter()
                .map(|x| {
                    (0..s.calls * s.count)
                        .map(|i| decode(DType::BF16, x, i))
                        .collect()
                })
                .collect();
            // Every input on the grid and not -0.0, every partial sum a bf16 value.
            for i in 0..s.calls * s.count {
                let mut sum = 0f64;
                for x in &values {
                    assert!(x[i].abs() <= 1.0 && (x[i] / quantum(world)).fract() == 0.0);
                    assert!(x[i].to_bits() != (-0f64).to_bits());
                    sum += x[i];
                    assert_eq!(bf16::from_f64(sum).to_f64(), sum, "world {world}");
                }
            }
        }
        assert_ne!(
            layer_inputs(shape(1, 1, 8), 2)[0],
            layer_inputs(shape(1, 1, 8), 2)[1]
        );
    }

    /// The kernel's arithmetic on the host: f32, rounded where `add_rmsnorm.cu` rounds.
    fn kernel_on_host(reduced: &[f64], residual: &mut [f64], weight: &[f64]) -> Vec<f64> {
        let round = |v: f32| f64::from(bf16::from_f32(v).to_f32());
        let hidden = weight.len();
        let mut out = vec![0f64; residual.len()];
        for (row, (res, out)) in residual
            .chunks_mut(hidden)
            .zip(out.chunks_mut(hidden))
            .enumerate()
        {
            let mut sumsq = 0f32;
            for (j, r) in res.iter_mut().enumerate() {
                *r = round(*r as f32 + reduced[row * hidden + j] as f32);
                sumsq += (*r as f32) * (*r as f32);
            }
            let scale = 1.0 / (sumsq / hidden as f32 + EPS).sqrt();
            for (j, o) in out.iter_mut().enumerate() {
                *o = round(res[j] as f32 * scale * weight[j] as f32);
            }
        }
        out
    }

    #[test]
    fn the_chain_of_layers_matches_the_kernels_arithmetic_and_catches_errors() {
        let s = shape(5, 3, 64);
        let world = 3;
        let inputs = layer_inputs(s, world);
        let (res0, w) = residual_and_weight(s);
        let (want_res, want_out) = reference(&inputs, &res0, &w, s);
        assert_eq!(
            (want_res.len(), want_out.len()),
            (s.count, s.calls * s.count)
        );

        // The step as the GPU computes it, in f32: all-reduce, then the norm, per layer.
        let bf = |bytes: &[u8], n: usize| -> Vec<f64> {
            (0..n).map(|i| decode(DType::BF16, bytes, i)).collect()
        };
        let weight = bf(&w, s.hidden);
        let mut res = bf(&res0, s.count);
        let mut outs = Vec::new();
        for k in 0..s.calls {
            let reduced: Vec<f64> = (0..s.count)
                .map(|i| {
                    let sum: f32 = inputs
                        .iter()
                        .map(|x| decode(DType::BF16, x, k * s.count + i) as f32)
                        .sum();
                    f64::from(bf16::from_f32(sum).to_f32())
                })
                .collect();
            outs.extend(kernel_on_host(&reduced, &mut res, &weight));
        }
        let encode = |v: &[f64]| -> Vec<u8> {
            v.iter()
                .flat_map(|&v| bf16::from_f64(v).to_le_bytes())
                .collect()
        };
        let (got_res, got_out) = (encode(&res), encode(&outs));
        // The residual chain is exact; the outputs are within their rounding.
        assert_eq!(res, want_res);
        assert_eq!(count_wrong(&got_res, &got_out, &want_res, &want_out), 0);

        // An unwritten output, a residual one ulp off, an output off by 1%, short buffers.
        let mut poisoned = got_out.clone();
        poisoned[2 * 7..2 * 7 + 2].copy_from_slice(&[0xff, 0xff]);
        assert_eq!(count_wrong(&got_res, &poisoned, &want_res, &want_out), 1);
        let mut off = got_res.clone();
        off[0] ^= 1;
        assert_eq!(count_wrong(&off, &got_out, &want_res, &want_out), 1);
        let mut scaled = outs.clone();
        scaled[s.count + 5] *= 1.05;
        assert_eq!(
            count_wrong(&got_res, &encode(&scaled), &want_res, &want_out),
            usize::from(want_out[s.count + 5] != 0.0)
        );
        assert_eq!(
            count_wrong(&got_res[..4], &got_out, &want_res, &want_out),
            s.count - 2
        );

        // A rank's contribution missing from one layer changes that layer and the residual.
        let mut missing = inputs.clone();
        missing[1][2 * s.count..4 * s.count].fill(0);
        let (r2, o2) = reference(&missing, &res0, &w, s);
        assert!(count_wrong(&got_res, &got_out, &r2, &o2) > s.count);
    }

    #[test]
    fn launch_shapes_are_whole_warps_within_the_kernels_bound() {
        assert_eq!(launch_shape(3, 7168), (3, 896));
        assert_eq!(launch_shape(1, 8), (1, 32));
        assert_eq!(launch_shape(5000, 65536), (1024, 1024));
        for hidden in (8..20000).step_by(8) {
            let (_, t) = launch_shape(1, hidden);
            assert!(t % 32 == 0 && (32..=MAX_THREADS as u32).contains(&t));
        }
    }
}
