//! allreduce-perf end to end: in-process sweeps, their JSON/CSV, the check catching a
//! faulty backend, and the binary's output, time bounds and exit codes.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use comm_core::{
    BufferMut, BufferRef, Capabilities, Communicator, DType, Error, LocalComm, ReduceOp, Result,
};
use comm_examples::backends::{self, RankContext};
use comm_examples::launch::Mode;
use comm_examples::perf::launches::Launches;
use comm_examples::perf::meta::RunInfo;
use comm_examples::perf::report::{self, CSV_HEADER};
use comm_examples::perf::{Algorithms, Row, SweepConfig, run_in_process};
use comm_select::Launch;

fn config(sizes: &[u64], dtype: DType, op: ReduceOp, check: bool) -> SweepConfig {
    SweepConfig {
        sizes: sizes.to_vec(),
        dtype,
        op,
        iters: Some(2),
        warmup: Some(1),
        check,
        out_of_place: true,
        in_place: true,
        seed: 12345,
        algorithms: Algorithms::Default,
        launches: Launches::Eager,
    }
}

fn local(ctx: &RankContext) -> Result<Box<dyn Communicator>> {
    backends::find("local").unwrap().create(ctx)
}

fn sweep(
    create: &comm_examples::perf::sweep::Create<'_>,
    ranks: usize,
    cfg: &SweepConfig,
) -> Vec<Row> {
    run_in_process("test", create, ranks, cfg, &|_| {}).expect("sweep runs")
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("comm-perf-{}-{name}", std::process::id()))
}

fn run_info() -> RunInfo {
    RunInfo {
        program: "allreduce-perf".into(),
        version: "0.0.0".into(),
        hostname: "test-host".into(),
        command: vec!["allreduce-perf".into(), "--check".into()],
        date: "2026-11-29T10:22:05Z".into(),
        world_size: 2,
        bootstrap: "threads".into(),
        gpus: 0,
        dtype: "f32".into(),
        op: "sum".into(),
        sizes: vec![8, 64, 1024],
        iters: Some(2),
        warmup: None,
        check: true,
        seed: 12345,
        out_of_place: true,
        in_place: true,
        launch: Launches::Eager,
    }
}

#[test]
fn json_and_csv_have_both_placements_of_every_size() {
    let cfg = config(&[8, 64, 1024], DType::F32, ReduceOp::Sum, true);
    let rows = sweep(&local, 2, &cfg);
    assert_eq!(rows.len(), 3);

    let json = temp("schema.json");
    report::write_json(&json, &run_info(), &rows).unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["run"]["hostname"], "test-host");
    assert_eq!(doc["run"]["command"][1], "--check");
    assert_eq!(doc["run"]["warmup"], serde_json::Value::Null);
    assert_eq!(doc["run"]["launch"], "eager");
    let results = doc["results"].as_array().expect("results array");
    assert_eq!(results.len(), 3);
    for (r, size) in results.iter().zip([8u64, 64, 1024]) {
        assert_eq!(r["backend"], "test");
        assert_eq!(r["bytes"], size);
        assert_eq!(r["count"], size / 4);
        assert_eq!(r["dtype"], "f32");
        assert_eq!(r["op"], "sum");
        assert_eq!(r["ranks"], 2);
        assert_eq!(r["launch"], "eager");
        for placement in ["out_of_place", "in_place"] {
            let t = &r[placement];
            assert_eq!(t["wrong"], 0, "{placement}");
            assert_eq!(t["identical"], true, "{placement}");
            for key in ["time_us", "algbw", "busbw"] {
                assert!(
                    t[key].as_f64().is_some_and(|v| v >= 0.0),
                    "{placement} {key}: {}",
                    t[key]
                );
            }
            // Two ranks: busbw = algbw * 2(n-1)/n = algbw.
            assert_eq!(t["busbw"], t["algbw"]);
        }
    }
    let back: report::Results = serde_json::from_value(doc).expect("reads back");
    // Floats come back to within their last digit; the rest exactly.
    let key = |r: &Row| (r.bytes, r.count, r.in_place.map(|t| t.wrong), r.iters);
    assert_eq!(
        back.results.iter().map(key).collect::<Vec<_>>(),
        rows.iter().map(key).collect::<Vec<_>>()
    );

    let csv = temp("schema.csv");
    report::write_csv(&csv, &rows).unwrap();
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], CSV_HEADER);
    assert_eq!(lines.len(), 1 + 3 * 2);
    let fields = CSV_HEADER.split(',').count();
    assert!(lines.iter().all(|l| l.split(',').count() == fields));
    assert!(lines[1].starts_with("test,,threads,2,f32,sum,eager,false,8,2,"));
    assert!(lines[2].starts_with("test,,threads,2,f32,sum,eager,true,8,2,"));
    let _ = (std::fs::remove_file(json), std::fs::remove_file(csv));
}

#[test]
fn one_placement_alone_is_measured_alone() {
    let mut cfg = config(&[64, 4096], DType::I32, ReduceOp::Max, true);
    cfg.out_of_place = false;
    for row in sweep(&local, 3, &cfg) {
        assert!(row.out_of_place.is_none(), "{row:?}");
        assert_eq!(row.in_place.map(|t| t.wrong), Some(Some(0)), "{row:?}");
    }
    (cfg.out_of_place, cfg.in_place) = (true, false);
    for row in sweep(&local, 3, &cfg) {
        assert!(row.in_place.is_none(), "{row:?}");
        assert_eq!(row.out_of_place.map(|t| t.wrong), Some(Some(0)), "{row:?}");
    }
}

/// Every in-process backend of the registry passes the check, for every dtype and op.
#[test]
fn registered_backends_pass_the_check_for_every_dtype_and_op() {
    for backend in backends::defaults(Mode::Threads) {
        for dtype in DType::ALL {
            for op in ReduceOp::ALL {
                let cfg = config(&[1, 24, 1000, 70_000], dtype, op, true);
                for row in sweep(&|ctx: &RankContext| backend.create(ctx), 3, &cfg) {
                    let what = format!("{} {dtype} {op}", backend.name);
                    assert!(row.out_of_place.is_some() && row.in_place.is_some());
                    assert!(!row.failed(), "{what}: {row:?}");
                }
            }
        }
    }
}

/// `--tune` on host backends: eager tables only, with no complaint; `--graph`: an error
/// that says why, for every host backend.
#[test]
fn host_backends_run_eagerly_and_refuse_graph_mode() {
    let mut cfg = config(&[64, 4096], DType::F32, ReduceOp::Sum, true);
    cfg.launches = Launches::Both;
    let rows = sweep(&local, 2, &cfg);
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| r.launch == Launch::Eager && !r.failed())
    );
    cfg.launches = Launches::Graph;
    for backend in backends::defaults(Mode::Threads) {
        let create = |ctx: &RankContext| backend.create(ctx);
        let err = run_in_process(backend.name, &create, 2, &cfg, &|_| {}).unwrap_err();
        assert!(
            matches!(err, Error::Unsupported(_)),
            "{}: {err}",
            backend.name
        );
        assert!(err.to_string().contains("host memory"), "{err}");
    }
}

#[test]
fn each_algorithm_gets_its_own_rows() {
    let symm = backends::find("symm").unwrap();
    let symm = move |ctx: &RankContext| symm.create(ctx);
    let mut cfg = config(&[64, 4096], DType::F32, ReduceOp::Sum, true);
    cfg.algorithms = Algorithms::All;
    let rows = sweep(&symm, 2, &cfg);
    let labels: Vec<String> = rows.iter().map(Row::label).collect();
    assert!(labels.contains(&"test:oneshot".to_string()), "{labels:?}");
    assert!(labels.contains(&"test:twoshot".to_string()), "{labels:?}");
    assert!(rows.iter().all(|r| !r.failed()));

    cfg.algorithms = Algorithms::Named(vec!["twoshot".into(), "no-such".into()]);
    let rows = sweep(&symm, 2, &cfg);
    assert!(
        rows.iter()
            .all(|r| r.algorithm.as_deref() == Some("twoshot"))
    );
    // A backend without named algorithms runs its own choice.
    let rows = sweep(&local, 2, &cfg);
    assert!(rows.iter().all(|r| r.algorithm.is_none()));

    cfg.algorithms = Algorithms::Named(vec!["no-such".into()]);
    let err = run_in_process("test", &symm, 2, &cfg, &|_| {}).unwrap_err();
    assert!(err.to_string().contains("oneshot"), "{err}");
}

/// The host `symm` backend, refusing its `twoshot` algorithm as unsupported, the way a GPU
/// backend refuses an algorithm a configuration cannot run.
struct RefusesTwoshot {
    inner: Box<dyn Communicator>,
    twoshot: std::sync::atomic::AtomicBool,
}

impl RefusesTwoshot {
    fn refuse(&self) -> Result<()> {
        if self.twoshot.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Unsupported("twoshot is refused here".into()));
        }
        Ok(())
    }
}

impl Communicator for RefusesTwoshot {
    fn name(&self) -> &str {
        "refuses-twoshot"
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn all_reduce(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.refuse()?;
        self.inner.all_reduce(send, recv, op)
    }
    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.refuse()?;
        self.inner.all_reduce_in_place(buf, op)
    }
    fn all_gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        self.inner.all_gather(send, recv)
    }
    fn reduce_scatter(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.inner.reduce_scatter(send, recv, op)
    }
    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        self.inner.broadcast(buf, root)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        self.twoshot.store(
            algorithm == Some("twoshot"),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.inner.set_algorithm(algorithm)
    }
}

#[test]
fn an_algorithm_refused_as_unsupported_is_skipped_under_all_and_an_error_when_named() {
    let refusing = |ctx: &RankContext| -> Result<Box<dyn Communicator>> {
        Ok(Box::new(RefusesTwoshot {
            inner: backends::find("symm").unwrap().create(ctx)?,
            twoshot: Default::default(),
        }))
    };
    let mut cfg = config(&[64, 4096], DType::F32, ReduceOp::Sum, true);
    cfg.algorithms = Algorithms::All;
    let notes = std::sync::Mutex::new(Vec::new());
    let observe = |event: comm_examples::perf::sweep::Event<'_>| {
        if let comm_examples::perf::sweep::Event::Note { message, .. } = event {
            notes.lock().unwrap().push(message);
        }
    };
    let rows = run_in_process("test", &refusing, 2, &cfg, &observe).expect("sweep runs");
    let labels: Vec<String> = rows.iter().map(Row::label).collect();
    assert!(labels.contains(&"test:oneshot".to_string()), "{labels:?}");
    assert!(!labels.iter().any(|l| l.contains("twoshot")), "{labels:?}");
    assert!(rows.iter().all(|r| !r.failed()));
    let notes = notes.into_inner().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("twoshot") && n.contains("skipped")),
        "{notes:?}"
    );

    cfg.algorithms = Algorithms::Named(vec!["oneshot".into(), "twoshot".into()]);
    let err = run_in_process("test", &refusing, 2, &cfg, &|_| {}).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
}

/// A backend that gets rank 1's first element wrong, out of place only.
struct Faulty(LocalComm);

impl Communicator for Faulty {
    fn name(&self) -> &str {
        "faulty"
    }
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn capabilities(&self) -> &Capabilities {
        self.0.capabilities()
    }
    fn all_reduce(&self, send: BufferRef<'_>, mut recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.0.all_reduce(send, recv.reborrow(), op)?;
        if self.rank() == 1 {
            recv.host_slice_mut::<f32>().expect("an f32 host buffer")[0] += 1.0;
        }
        Ok(())
    }
    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.0.all_reduce_in_place(buf, op)
    }
    fn all_gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        self.0.all_gather(send, recv)
    }
    fn reduce_scatter(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.0.reduce_scatter(send, recv, op)
    }
    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        self.0.broadcast(buf, root)
    }
    fn barrier(&self) -> Result<()> {
        self.0.barrier()
    }
}

#[test]
fn check_catches_a_corrupted_element() {
    let faulty = |ctx: &RankContext| -> Result<Box<dyn Communicator>> {
        let group = ctx.thread_group().expect("in-process");
        let comm = group.take("faulty", ctx.rank(), LocalComm::create);
        Ok(Box::new(Faulty(comm)))
    };
    let cfg = config(&[16, 4096], DType::F32, ReduceOp::Sum, true);
    let rows = sweep(&faulty, 2, &cfg);
    for row in &rows {
        let (out, inp) = (row.out_of_place.unwrap(), row.in_place.unwrap());
        assert_eq!(
            (out.wrong, out.identical),
            (Some(1), Some(false)),
            "{row:?}"
        );
        assert_eq!((inp.wrong, inp.identical), (Some(0), Some(true)), "{row:?}");
        assert!(row.failed());
    }
    // Without --check nothing is claimed either way.
    let rows = sweep(&faulty, 2, &config(&[16], DType::F32, ReduceOp::Sum, false));
    for (_, t) in rows[0].timings() {
        assert_eq!((t.wrong, t.identical), (None, None));
    }
}

fn perf_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allreduce-perf"));
    cmd.args(args)
        .env_remove("OMPI_COMM_WORLD_SIZE")
        .env_remove("WORLD_SIZE")
        .env_remove("RANK")
        .env_remove("PMI_RANK")
        .env_remove("OMPI_COMM_WORLD_RANK");
    cmd
}

fn perf(args: &[&str]) -> Output {
    perf_command(args).output().expect("allreduce-perf starts")
}

/// Runs allreduce-perf, killed if it is still running after `limit`; the output and
/// the time it took.
fn perf_within(args: &[&str], limit: Duration) -> (Output, Duration) {
    let start = Instant::now();
    let mut child = perf_command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allreduce-perf starts");
    while child.try_wait().expect("wait").is_none() && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    (child.wait_with_output().expect("output"), start.elapsed())
}

/// One large size on a slow host backend: the untimed calls before the sweep are bounded
/// by time, not only by count (500 calls of 64 MiB took minutes and printed nothing).
#[test]
fn a_large_first_size_finishes_quickly() {
    let limit = Duration::from_secs(60);
    let (out, took) = perf_within(
        &[
            "--backend",
            "bootstrap",
            "--sizes",
            "64M",
            "--ranks",
            "2",
            "-n",
            "1",
        ],
        limit,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        took < limit && out.status.success(),
        "took {took:?}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&(64u64 << 20).to_string()), "{stdout}");
}

#[test]
fn binary_rejects_bad_flags_with_status_2() {
    for bad in [
        &["--sizes", "8:lots"][..],
        &["--dtype", "f128"],
        &["--backend", "nope"],
        &["--whatever"],
    ] {
        let out = perf(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("allreduce-perf:") && !err.contains("panicked"),
            "{err}"
        );
    }
}

#[test]
fn binary_runs_a_checked_sweep_and_writes_files() {
    let (json, csv, svg) = (temp("bin.json"), temp("bin.csv"), temp("bin.svg"));
    let out = perf(&[
        "--sizes",
        "8,4K,64K",
        "--backend",
        "local,bootstrap",
        "--ranks",
        "2",
        "--iters",
        "3",
        "--check",
        "--dtype",
        "bf16",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // nccl-tests' layout: a header with the run's parameters, then both placements.
    for expected in [
        "busbw",
        "OK",
        "out-of-place",
        "in-place",
        "# command: ",
        "ranks: 2 (threads)",
        "iters: 3  warm-up: auto  check: on",
        "launch: eager",
    ] {
        assert!(stdout.contains(expected), "no `{expected}` in\n{stdout}");
    }
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let run = &doc["run"];
    assert_eq!(run["world_size"], 2);
    assert_eq!(run["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(run["iters"], 3);
    assert_eq!(run["launch"], "eager");
    assert!(
        run["hostname"].as_str().is_some_and(|h| !h.is_empty()),
        "{run}"
    );
    assert!(
        run["command"].as_array().is_some_and(|c| c.len() == 18),
        "{run}"
    );
    let date = run["date"].as_str().unwrap_or_default();
    assert!(
        date.len() == 20 && date.starts_with("20") && date.ends_with('Z'),
        "{date}"
    );
    let results = doc["results"].as_array().unwrap();
    let backends: Vec<&str> = results
        .iter()
        .map(|r| r["backend"].as_str().unwrap())
        .collect();
    assert_eq!(
        backends,
        [
            "local",
            "local",
            "local",
            "bootstrap",
            "bootstrap",
            "bootstrap"
        ]
    );
    assert!(results.iter().all(|r| r["out_of_place"]["wrong"] == 0
        && r["in_place"]["wrong"] == 0
        && r["dtype"] == "bf16"));
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap().lines().count(),
        1 + 6 * 2
    );
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    for f in [json, csv, svg] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn tune_writes_a_table_the_selector_reads() {
    let table = temp("tune.json");
    let out = perf(&[
        "--backend",
        "local,symm",
        "--sizes",
        "1K,256K",
        "--ranks",
        "2",
        "--iters",
        "2",
        "--tune",
        table.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = comm_select::TuningTable::load(&table).expect("a tuning table");
    assert_eq!(table.world_size, 2);
    let labels: Vec<String> = table
        .measurements
        .iter()
        .map(|m| format!("{}:{}", m.backend, m.algorithm.as_deref().unwrap_or("-")))
        .collect();
    assert!(labels.contains(&"local:-".to_string()), "{labels:?}");
    assert!(labels.contains(&"symm:twoshot".to_string()), "{labels:?}");
    assert!(table.measurements.iter().all(|m| m.time_us > 0.0));
    // Host backends: eager rows only, measured over host memory.
    assert!(table.measurements.iter().all(|m| m.launch == Launch::Eager));
    assert_eq!(table.fabric, "host");
}

#[test]
fn graph_mode_on_a_host_backend_is_a_clear_error() {
    let out = perf(&[
        "--backend",
        "local",
        "--sizes",
        "1K",
        "--ranks",
        "2",
        "--graph",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("unsupported")
            && stderr.contains("host memory")
            && stderr.contains("--graph")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn auto_backend_passes_the_check() {
    let out = perf(&[
        "--backend",
        "auto",
        "--sizes",
        "8,64K",
        "--ranks",
        "3",
        "--iters",
        "2",
        "--check",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("backend: auto") && stdout.contains("OK"),
        "{stdout}"
    );
}
