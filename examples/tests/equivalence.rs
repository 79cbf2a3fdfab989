//! Cross-backend equivalence, as property tests: for random counts (0, 1, odd, up to a
//! maximum), dtypes, ops and world sizes, every backend of the registry that runs here
//! gives the f64 (or exact integer) reference within the dtype's tolerance, and the
//! backends agree with each other bit for bit (every backend reduces in rank order).
//!
//! In-process ranks over the host backends (`local`, `bootstrap`, `symm`, `auto`); the
//! same under `mpirun -np 2` and `3`; on a GPU (ignored without one) over `nccl` (world
//! 1), `ipc`, `symm-cuda` and `auto` on device memory. Cases come from a fixed seed, so
//! every rank (and every process) draws the same ones.

use comm_core::cuda::{DeviceMemory, device_count};
use comm_core::{
    BufferMut, BufferRef, Collective, Communicator, DType, Element, MemoryLocation, ReduceOp,
    Result, bf16, f16,
};
use comm_examples::backends::{self, RankContext};
use comm_examples::launch::{Mode, process_context, run_threads};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Largest count drawn (odd, and past symm's small-message algorithms).
const MAX_COUNT: usize = 4099;

/// One case: what every rank reduces.
#[derive(Debug, Clone)]
struct Case {
    dtype: DType,
    op: ReduceOp,
    count: usize,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    case_of(
        vec![
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
            DType::U8,
        ],
        ReduceOp::ALL.to_vec(),
    )
}

/// Cases of the dtypes and ops that several GPU backends share (the others are refused by
/// most of them, and a case one backend alone takes compares nothing).
fn gpu_case() -> impl Strategy<Value = Case> {
    case_of(
        vec![DType::F32, DType::F16, DType::BF16],
        vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg],
    )
}

fn case_of(dtypes: Vec<DType>, ops: Vec<ReduceOp>) -> impl Strategy<Value = Case> {
    let count = prop_oneof![
        Just(0usize),
        Just(1),
        (0..MAX_COUNT / 2).prop_map(|n| 2 * n + 1),
        2..=MAX_COUNT
    ];
    (
        prop::sample::select(dtypes),
        prop::sample::select(ops),
        count,
        any::<u64>(),
    )
        .prop_map(|(dtype, op, count, seed)| Case {
            dtype,
            op,
            count,
            seed,
        })
}

/// The same cases on every rank and every run.
fn runner(cases: u32) -> TestRunner {
    let seed = *b"comm-select equivalence 2026-11!";
    TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed),
    )
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of `rank`'s input, as f64 (exactly representable in the dtype).
fn value(c: &Case, rank: usize, i: usize) -> f64 {
    let h = splitmix(c.seed ^ splitmix(((rank as u64) << 40) ^ i as u64));
    let small = |span: u64| (h % (2 * span + 1)) as f64 - span as f64;
    match (c.dtype, c.op) {
        (DType::U8, ReduceOp::Prod) => (h % 4) as f64,
        (DType::U8, _) => (h % 256) as f64,
        (_, ReduceOp::Prod) if !c.dtype.is_float() => small(3),
        (d, _) if !d.is_float() => small(100),
        // Floats: in [-2, 2), rounded to the dtype so that the reference sees what the
        // backend sees; prod keeps away from 0 so that relative error means something.
        (d, op) => {
            let unit = (h >> 11) as f64 / (1u64 << 53) as f64;
            let v = if op == ReduceOp::Prod {
                0.5 + unit
            } else {
                4.0 * unit - 2.0
            };
            round(d, v)
        }
    }
}

fn round(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => f64::from(v as f32),
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| -> Vec<u8> {
            match dtype {
                DType::F32 => (v as f32).to_le_bytes().to_vec(),
                DType::F64 => v.to_le_bytes().to_vec(),
                DType::F16 => f16::from_f64(v).to_le_bytes().to_vec(),
                DType::BF16 => bf16::from_f64(v).to_le_bytes().to_vec(),
                DType::I32 => (v as i32).to_le_bytes().to_vec(),
                DType::I64 => (v as i64).to_le_bytes().to_vec(),
                DType::U8 => vec![v as u8],
                other => panic!("no encoding for {other}"),
            }
        })
        .collect()
}

fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(dtype.size())
        .map(|w| match dtype {
            DType::F32 => f64::from(f32::from_le_bytes(w.try_into().unwrap())),
            DType::F64 => f64::from_le_bytes(w.try_into().unwrap()),
            DType::F16 => f16::from_le_bytes(w.try_into().unwrap()).to_f64(),
            DType::BF16 => bf16::from_le_bytes(w.try_into().unwrap()).to_f64(),
            DType::I32 => f64::from(i32::from_le_bytes(w.try_into().unwrap())),
            DType::I64 => i64::from_le_bytes(w.try_into().unwrap()) as f64,
            DType::U8 => f64::from(w[0]),
            other => panic!("no decoding for {other}"),
        })
        .collect()
}

/// Elements that miss the reference: exact for integers (wrapping u8) and min/max,
/// within a few ulps of the dtype per rank for float sums, averages and products.
fn count_wrong(c: &Case, world: usize, got: &[f64]) -> usize {
    let eps = match c.dtype {
        DType::F32 => f64::from(f32::EPSILON),
        DType::F64 => f64::EPSILON,
        DType::F16 => 9.77e-4,
        DType::BF16 => 7.82e-3,
        _ => 0.0,
    };
    (0..c.count)
        .filter(|&i| {
            let xs: Vec<f64> = (0..world).map(|r| value(c, r, i)).collect();
            let want = match c.op {
                ReduceOp::Sum | ReduceOp::Avg => xs.iter().sum::<f64>(),
                ReduceOp::Prod => xs.iter().product(),
                ReduceOp::Min => xs.iter().copied().fold(f64::INFINITY, f64::min),
                ReduceOp::Max => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                other => panic!("no reference for {other}"),
            };
            let want = if c.op == ReduceOp::Avg {
                want / world as f64
            } else {
                want
            };
            let scale = xs.iter().map(|x| x.abs()).sum::<f64>().max(want.abs());
            let g = got[i];
            if !c.dtype.is_float() {
                let wrapped = match c.dtype {
                    DType::U8 => (want as i128).rem_euclid(256) as f64,
                    _ => want,
                };
                g != wrapped && !(c.op == ReduceOp::Avg && (g - want.trunc()).abs() <= 1.0)
            } else if matches!(c.op, ReduceOp::Min | ReduceOp::Max) {
                g != want
            } else {
                // NaN fails too.
                (g - want)
                    .abs()
                    .partial_cmp(&(2.0 * eps * world as f64 * scale))
                    != Some(std::cmp::Ordering::Less)
                    && g != want
            }
        })
        .count()
}

/// Runs `c` on every backend in `names` that can take it on this rank; returns the
/// (backend, output bytes) of each, in order.
fn run_case(ctx: &RankContext, names: &[&str], c: &Case, device: bool) -> Vec<(String, Vec<u8>)> {
    let (rank, world) = (ctx.rank(), ctx.world_size());
    let input = encode(
        c.dtype,
        &(0..c.count).map(|i| value(c, rank, i)).collect::<Vec<_>>(),
    );
    let mut out = Vec::new();
    for name in names {
        let backend = backends::find(name).unwrap();
        let comm = match backend.create(ctx) {
            Ok(comm) => comm,
            Err(e) => panic!("{name} does not start: {e}"),
        };
        let location = if device {
            MemoryLocation::Device {
                ordinal: 0,
                stream: Default::default(),
            }
        } else {
            MemoryLocation::Host
        };
        let bytes = c.count * c.dtype.size();
        if comm
            .capabilities()
            .check(
                name,
                Collective::AllReduce,
                c.dtype,
                Some(c.op),
                bytes,
                location,
            )
            .is_err()
        {
            continue;
        }
        let got = if device {
            let memory =
                DeviceMemory::new(ctx.bootstrap().local_rank() % device_count().unwrap()).unwrap();
            let mut send = memory.alloc(c.dtype, c.count.max(1)).unwrap();
            let mut recv = memory.alloc(c.dtype, c.count.max(1)).unwrap();
            let mut padded = input.clone();
            padded.resize(c.count.max(1) * c.dtype.size(), 0);
            send.write(&padded).unwrap();
            recv.poison(0xff).unwrap();
            comm.all_reduce(
                send.view(0, c.count).unwrap(),
                recv.view_mut(0, c.count).unwrap(),
                c.op,
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            memory.synchronize().unwrap();
            recv.read().unwrap()[..bytes].to_vec()
        } else {
            let call = match c.dtype {
                DType::F32 => host_call::<f32>,
                DType::F64 => host_call::<f64>,
                DType::F16 => host_call::<f16>,
                DType::BF16 => host_call::<bf16>,
                DType::I32 => host_call::<i32>,
                DType::I64 => host_call::<i64>,
                DType::U8 => host_call::<u8>,
                other => panic!("no host type for {other}"),
            };
            call(&*comm, &input, c.op).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let wrong = count_wrong(c, world, &decode(c.dtype, &got));
        assert_eq!(
            wrong, 0,
            "{name}, rank {rank} of {world}: {wrong} wrong in {c:?}"
        );
        out.push((name.to_string(), got));
    }
    // Every host backend takes every case; GPU backends may lack a dtype or op.
    assert!(device || !out.is_empty(), "no backend took {c:?}");
    for (name, got) in &out[1.min(out.len())..] {
        assert!(*got == out[0].1, "{name} and {} differ in {c:?}", out[0].0);
    }
    out
}

/// One all-reduce of `input` (raw bytes of `T`) on host memory; the output's bytes.
fn host_call<T: Element>(comm: &dyn Communicator, input: &[u8], op: ReduceOp) -> Result<Vec<u8>> {
    let n = input.len() / std::mem::size_of::<T>();
    let mut send = vec![T::zeroed(); n];
    bytemuck::cast_slice_mut(&mut send).copy_from_slice(input);
    // Poisoned: all bits set.
    let mut recv = vec![T::zeroed(); n];
    bytemuck::cast_slice_mut(&mut recv).fill(0xffu8);
    comm.all_reduce(BufferRef::host(&send), BufferMut::host(&mut recv), op)?;
    Ok(bytemuck::cast_slice(&recv).to_vec())
}

const HOST: &[&str] = &["local", "bootstrap", "symm", "auto"];

/// One rank's (backend, output bytes) of a case.
type Outputs = Vec<(String, Vec<u8>)>;

/// In-process: each backend on fresh threads (in-process groups are built once per
/// run), then every rank's output compared across backends. Returns how many backends
/// took the case.
fn in_process(names: &[&str], c: &Case, world: usize, device: bool) -> usize {
    let mut first: Option<(&str, Vec<Outputs>)> = None;
    let mut took = 0;
    for name in names {
        let outs = run_threads(world, |ctx| run_case(&ctx, &[name], c, device)).unwrap();
        if outs.iter().all(|o| o.is_empty()) {
            continue;
        }
        took += 1;
        match &first {
            None => first = Some((name, outs)),
            Some((other, want)) => {
                for (rank, (got, want)) in outs.iter().zip(want).enumerate() {
                    assert!(
                        got[0].1 == want[0].1,
                        "{name} and {other} differ on rank {rank}: {c:?}"
                    );
                }
            }
        }
    }
    took
}

#[test]
fn host_backends_agree_in_process() {
    let mut runner = runner(24);
    runner
        .run(&(case(), 1usize..=4), |(c, world)| {
            in_process(HOST, &c, world, false);
            Ok(())
        })
        .unwrap();
}

fn under_launcher(names: &[&str]) {
    let ctx = process_context(Mode::Env).expect("env bootstrap");
    let mut runner = runner(16);
    runner
        .run(&case(), |c| {
            run_case(&ctx, names, &c, false);
            Ok(())
        })
        .unwrap();
}

#[test]
fn host_backends_agree_under_mpirun_2() {
    comm_core::conformance::mpirun::on_mpirun("host_backends_agree_under_mpirun_2", 2, || {
        under_launcher(&["bootstrap", "symm", "auto"])
    });
}

#[test]
fn host_backends_agree_under_mpirun_3() {
    comm_core::conformance::mpirun::on_mpirun("host_backends_agree_under_mpirun_3", 3, || {
        under_launcher(&["bootstrap", "symm", "auto"])
    });
}

/// On a GPU: ipc and symm-cuda at 1..=4 in-process ranks (spread over the GPUs, several
/// per GPU where ranks outnumber them), nccl too where each rank has a GPU of its own.
/// GPU backends may refuse a case (dtype, op); most cases must still compare at least two.
#[test]
#[ignore = "needs a GPU"]
fn gpu_backends_agree() {
    let _turn = comm_core::conformance::ranks::gpu_turn();
    let gpus = device_count().expect("a GPU");
    let cases = 16;
    let compared = std::cell::Cell::new(0);
    let mut runner = runner(cases);
    runner
        .run(&(gpu_case(), 1usize..=4), |(c, world)| {
            let names: &[&str] = if world <= gpus {
                &["nccl", "ipc", "symm-cuda"]
            } else {
                &["ipc", "symm-cuda"]
            };
            if in_process(names, &c, world, true) >= 2 {
                compared.set(compared.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    let compared = compared.get();
    eprintln!("gpu_backends_agree: {compared} of {cases} cases compared >= 2 GPU backends");
    assert!(
        compared * 4 >= cases as usize * 3,
        "only {compared} of {cases} cases compared two GPU backends"
    );
}
