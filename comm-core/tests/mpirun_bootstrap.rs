//! `BootstrapComm` over `EnvBootstrap` as real processes under `mpirun` (default build, no
//! MPI linked): the tests re-launch this binary with `mpirun -np 2` and `-np 4`.

use comm_core::conformance::mpirun;

use std::time::{Duration, Instant};

use comm_core::conformance::{self, Config};
use comm_core::{
    Bootstrap, BootstrapComm, Communicator, CommunicatorExt, EnvBootstrap, Error, ReduceOp, bf16,
};

fn body() {
    let boot = EnvBootstrap::from_env().expect("joining the job from mpirun's variables");
    let n = boot.world_size();
    let me = boot.rank();
    assert_eq!(n, mpirun::mpirun_world_size());
    assert_eq!(boot.launch_info().launcher, "openmpi");

    // The bootstrap itself: variable lengths, broadcast, barrier.
    let all = boot.all_gather_bytes(&vec![me as u8; me * 3]).unwrap();
    for (r, d) in all.iter().enumerate() {
        assert_eq!(d, &vec![r as u8; r * 3]);
    }
    assert_eq!(boot.broadcast_bytes(b"hello", n - 1).unwrap(), b"hello");
    boot.barrier().unwrap();

    let comm = BootstrapComm::new(boot);
    let tri = (n * (n + 1) / 2) as f32;
    let mut x = vec![me as f32 + 1.0; 1000];
    comm.all_reduce_in_place_slice(&mut x, ReduceOp::Sum)
        .unwrap();
    assert!(x.iter().all(|&v| v == tri));
    let y: Vec<bf16> = (0..333)
        .map(|i| bf16::from_f32((i % 7 + me) as f32))
        .collect();
    let mut out = vec![bf16::ZERO; y.len()];
    comm.all_reduce_slice(&y, &mut out, ReduceOp::Max).unwrap();
    for (i, v) in out.iter().enumerate() {
        assert_eq!(v.to_f32(), (i % 7 + n - 1) as f32);
    }
    let mut avg = [me as i64 * 10 - 5];
    comm.all_reduce_in_place_slice(&mut avg, ReduceOp::Avg)
        .unwrap();
    assert_eq!(
        avg[0],
        (0..n as i64).map(|r| r * 10 - 5).sum::<i64>() / n as i64
    );
    let gathered = comm.all_gather_vec(&[me as u8, 7]).unwrap();
    let want: Vec<u8> = (0..n as u8).flat_map(|r| [r, 7]).collect();
    assert_eq!(gathered, want);
    let send: Vec<i32> = (0..4 * n as i32).collect();
    let share = comm.reduce_scatter_vec(&send, ReduceOp::Sum).unwrap();
    let base = (4 * me) as i32;
    assert_eq!(
        share,
        (base..base + 4).map(|v| v * n as i32).collect::<Vec<_>>()
    );
    let mut b = if me == 1 { [1.5f64, -2.0] } else { [0.0; 2] };
    comm.broadcast_slice(&mut b, 1).unwrap();
    assert_eq!(b, [1.5, -2.0]);

    // Sums that depend on the order of additions still agree bit for bit on every rank.
    let noisy: Vec<f32> = (0..4096)
        .map(|i| ((i * 31 + me * 17) % 1000) as f32 * 1e-3 + 1e7 * (me % 2) as f32)
        .collect();
    let mut sum = vec![0f32; noisy.len()];
    comm.all_reduce_slice(&noisy, &mut sum, ReduceOp::Sum)
        .unwrap();
    let everyone = comm.all_gather_vec(&sum).unwrap();
    for r in 0..n {
        let theirs = &everyone[r * sum.len()..(r + 1) * sum.len()];
        assert!(
            theirs
                .iter()
                .zip(&sum)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rank {r} differs"
        );
    }

    // A mismatched call fails on every rank, and the job goes on.
    let mut bad = vec![1u8; 4 + me % 2];
    let err = comm
        .all_reduce_in_place_slice(&mut bad, ReduceOp::Sum)
        .unwrap_err();
    assert!(matches!(err, Error::Mismatch(_)), "rank {me}: {err}");
    conformance::check_disagreements_keep_usable(
        &comm,
        &conformance::HostMemory,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|f| panic!("rank {me}: {f}"));

    // The conformance suite, as separate processes.
    let config = Config {
        large_count: Some(1 << 20),
        ..Config::default()
    };
    let report = conformance::run(&comm, &config).unwrap_or_else(|f| panic!("rank {me}: {f}"));
    assert!(report.coverage_cases > 100, "{report:?}");
    assert!(report.large_case && report.error_cases > 0, "{report:?}");

    // Latency of small all-reduces (informative).
    let rounds = 500;
    let start = Instant::now();
    let mut small = [1f32; 16];
    for _ in 0..rounds {
        comm.all_reduce_in_place_slice(&mut small, ReduceOp::Sum)
            .unwrap();
    }
    let per_call = start.elapsed() / rounds;
    comm.barrier().unwrap();
    if me == 0 {
        println!("bootstrap all_reduce of 64 B over {n} processes: {per_call:?} per call");
    }
}

#[test]
fn bootstrap_comm_under_mpirun_np2() {
    mpirun::on_mpirun("bootstrap_comm_under_mpirun_np2", 2, body);
}

#[test]
fn bootstrap_comm_under_mpirun_np4() {
    mpirun::on_mpirun("bootstrap_comm_under_mpirun_np4", 4, body);
}
