//! `MpiBootstrap` and `MpiComm` as real processes under `mpirun -np 2` and `-np 4`
//! (feature `mpi`). The reference for every reduction is `BootstrapComm` over a second
//! `MpiBootstrap`, which reduces in rank order with the crate's host kernels: integer
//! results must match it bit for bit (wrapping, exact averages), and so must float results
//! on inputs whose sums are exact; on general float inputs every rank must agree bit for bit.

#![cfg(feature = "mpi")]

use comm_core::conformance::mpirun;

use std::time::{Duration, Instant};

use comm_core::conformance::{self, Config};
use comm_core::{
    Bootstrap, BootstrapComm, BufferMut, Communicator, CommunicatorExt, DType, Element, Error,
    MpiBootstrap, MpiComm, RawStream, ReduceOp, bf16, f16,
};

fn env_usize(name: &str) -> usize {
    std::env::var(name).unwrap().parse().unwrap()
}

/// MPI's result and the reference's, for every reducing collective and op.
fn compare<T: Element>(
    comm: &MpiComm,
    reference: &BootstrapComm<MpiBootstrap>,
    value: impl Fn(usize, usize) -> T,
    exact: bool,
) {
    let (me, n) = (comm.rank(), comm.world_size());
    for len in [0usize, 1, 7, 1030] {
        let mine: Vec<T> = (0..len).map(|i| value(me, i)).collect();
        for op in ReduceOp::ALL {
            let what = format!("{} {op} x {len}", T::DTYPE);
            let mut want = vec![T::zeroed(); len];
            reference.all_reduce_slice(&mine, &mut want, op).unwrap();
            let mut got = vec![T::zeroed(); len];
            comm.all_reduce_slice(&mine, &mut got, op).unwrap();
            let mut inplace = mine.clone();
            comm.all_reduce_in_place_slice(&mut inplace, op).unwrap();
            assert_eq!(
                bytemuck::cast_slice::<T, u8>(&got),
                bytemuck::cast_slice::<T, u8>(&inplace),
                "in place vs out of place: {what}"
            );
            if exact {
                assert_eq!(got, want, "all_reduce {what}");
            }
            // Every rank holds the same bits.
            let everyone = comm.all_gather_vec(&got).unwrap();
            for r in 0..n {
                assert_eq!(
                    bytemuck::cast_slice::<T, u8>(&everyone[r * len..(r + 1) * len]),
                    bytemuck::cast_slice::<T, u8>(&got),
                    "rank {r} differs: {what}"
                );
            }
            let send: Vec<T> = (0..len * n).map(|i| value(me, i)).collect();
            let got = comm.reduce_scatter_vec(&send, op).unwrap();
            let want = reference.reduce_scatter_vec(&send, op).unwrap();
            if exact {
                assert_eq!(got, want, "reduce_scatter {what}");
            }
        }
        let gathered = comm.all_gather_vec(&mine).unwrap();
        assert_eq!(gathered, reference.all_gather_vec(&mine).unwrap());
        for root in 0..n {
            let mut buf = if me == root {
                mine.clone()
            } else {
                vec![T::zeroed(); len]
            };
            comm.broadcast_slice(&mut buf, root).unwrap();
            let want: Vec<T> = (0..len).map(|i| value(root, i)).collect();
            assert_eq!(buf, want);
        }
    }
}

/// A cheap deterministic scramble, for inputs over an integer type's whole range.
fn mix(rank: usize, i: usize) -> u64 {
    let mut x = (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29)
}

/// Small integers: exact in every dtype, whatever the order of the sum.
fn small(rank: usize, i: usize) -> f32 {
    ((rank * 7 + i * 3) % 9) as f32 - 4.0
}

fn body() {
    let boot = MpiBootstrap::init().expect("MPI initialises under mpirun");
    let (me, n) = (boot.rank(), boot.world_size());
    assert_eq!(n, env_usize("OMPI_COMM_WORLD_SIZE"));
    assert_eq!(me, env_usize("OMPI_COMM_WORLD_RANK"));
    assert_eq!(boot.local_rank(), env_usize("OMPI_COMM_WORLD_LOCAL_RANK"));
    assert_eq!(
        boot.local_world_size(),
        env_usize("OMPI_COMM_WORLD_LOCAL_SIZE")
    );
    assert!(
        boot.library_version().contains("Open MPI"),
        "{}",
        boot.library_version()
    );

    // The bootstrap: variable lengths, broadcast, barrier.
    for round in 0..20 {
        let all = boot
            .all_gather_bytes(&vec![me as u8; (me + round) % 5])
            .unwrap();
        for (r, d) in all.iter().enumerate() {
            assert_eq!(d, &vec![r as u8; (r + round) % 5]);
        }
        let root = round % n;
        let got = boot
            .broadcast_bytes(format!("root {me}").as_bytes(), root)
            .unwrap();
        assert_eq!(got, format!("root {root}").as_bytes());
        boot.barrier().unwrap();
    }
    assert!(matches!(
        boot.broadcast_bytes(b"", n),
        Err(Error::InvalidArgument(_))
    ));

    let reference = BootstrapComm::new(MpiBootstrap::init().unwrap());
    let comm = MpiComm::new(&boot).unwrap();
    assert_eq!(
        (comm.name(), comm.rank(), comm.world_size()),
        ("mpi", me, n)
    );

    compare::<f32>(&comm, &reference, small, true);
    compare::<f64>(&comm, &reference, |r, i| small(r, i) as f64, true);
    compare::<f16>(&comm, &reference, |r, i| f16::from_f32(small(r, i)), true);
    compare::<bf16>(&comm, &reference, |r, i| bf16::from_f32(small(r, i)), true);
    compare::<i32>(&comm, &reference, |r, i| mix(r, i) as i32, true);
    compare::<i64>(&comm, &reference, |r, i| mix(r, i) as i64, true);
    compare::<u8>(&comm, &reference, |r, i| mix(r, i) as u8, true);
    // General floats: MPI's order of additions is its own; ranks must still agree.
    let noisy = |r: usize, i: usize| (mix(r, i) % 2_000_001) as f32 * 1e-3 - 1000.0;
    compare::<f32>(&comm, &reference, noisy, false);
    compare::<bf16>(&comm, &reference, |r, i| bf16::from_f32(noisy(r, i)), false);
    compare::<f64>(&comm, &reference, |r, i| noisy(r, i) as f64 * 1e-7, false);
    comm.barrier().unwrap();

    // Bad calls fail on every rank, and the communicator goes on.
    let mut x = vec![1.0f32; 4 + me % 2];
    let err = comm
        .all_reduce_in_place_slice(&mut x, ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Mismatch(m) if m.contains("rank 1")),
        "rank {me}: {err}"
    );
    let send = [1u8; 4];
    let mut recv = vec![0u8; if me == 0 { 3 } else { 4 }];
    let err = comm
        .all_reduce_slice(&send, &mut recv, ReduceOp::Sum)
        .unwrap_err();
    if me == 0 {
        assert!(matches!(err, Error::InvalidArgument(_)), "rank {me}: {err}");
    } else {
        assert!(
            matches!(&err, Error::Mismatch(m) if m.contains("rank 0")),
            "rank {me}: {err}"
        );
    }
    let err = if me == n - 1 {
        comm.barrier()
    } else {
        comm.broadcast_slice(&mut [0f64; 2], 0)
    }
    .unwrap_err();
    assert!(matches!(err, Error::Mismatch(_)), "rank {me}: {err}");
    // SAFETY: never dereferenced: the backend refuses device memory.
    let dev = unsafe { BufferMut::from_device_ptr(0x1000, 4, DType::F32, 0, RawStream(0)) };
    let err = comm.all_reduce_in_place(dev, ReduceOp::Sum).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "rank {me}: {err}");
    let mut ok = [me as i64 + 1];
    comm.all_reduce_in_place_slice(&mut ok, ReduceOp::Sum)
        .unwrap();
    assert_eq!(ok[0], (n * (n + 1) / 2) as i64);

    // Without validation: one fewer round trip, same results.
    let mut fast = MpiComm::new(&boot).unwrap();
    fast.set_validation(false);
    assert!(!fast.validation());
    let rounds = 500;
    let time = |c: &MpiComm| {
        let start = Instant::now();
        let mut v = [1f32; 16];
        for _ in 0..rounds {
            c.all_reduce_in_place_slice(&mut v, ReduceOp::Sum).unwrap();
        }
        c.barrier().unwrap();
        start.elapsed() / rounds
    };
    let (checked, unchecked) = (time(&comm), time(&fast));
    let mut v = [me as f64; 3];
    fast.all_reduce_in_place_slice(&mut v, ReduceOp::Max)
        .unwrap();
    assert_eq!(v, [(n - 1) as f64; 3]);
    if me == 0 {
        println!(
            "MPI all_reduce of 64 B over {n} processes: {checked:?} per call validated, \
             {unchecked:?} without validation"
        );
    }

    // The conformance suite, checked and unchecked (no error cases then: they would
    // reach MPI unchecked).
    let config = Config {
        large_count: Some(1 << 22),
        ..Config::default()
    };
    let report = conformance::run(&comm, &config).unwrap_or_else(|f| panic!("rank {me}: {f}"));
    assert!(
        report.coverage_cases > 100 && report.error_cases > 0,
        "{report:?}"
    );
    let unchecked = Config {
        error_cases: false,
        large_count: None,
        random_cases: 16,
        ..config
    };
    conformance::run(&fast, &unchecked).unwrap_or_else(|f| panic!("rank {me}: {f}"));

    // Ranks that disagree about a call (validated): Mismatch everywhere, still usable.
    conformance::check_disagreements_keep_usable(
        &comm,
        &conformance::HostMemory,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|f| panic!("rank {me}: {f}"));

    // A rank that skips a call: the others time out, then the communicator is aborted.
    let bound = Duration::from_millis(500);
    let mut short = MpiComm::new(&boot).unwrap();
    short.set_timeout(bound);
    let waited = conformance::check_timeout(&short, 1, bound * 4)
        .unwrap_or_else(|f| panic!("rank {me}: {f}"));
    assert!(waited < bound * 4);
    // The others' MPI state is untouched by it.
    boot.barrier().unwrap();
}

#[test]
fn mpi_under_mpirun_np2() {
    mpirun::on_mpirun("mpi_under_mpirun_np2", 2, body);
}

#[test]
fn mpi_under_mpirun_np4() {
    mpirun::on_mpirun("mpi_under_mpirun_np4", 4, body);
}
