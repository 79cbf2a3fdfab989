//! Multi-process tests: runs a test body as the ranks of an `mpirun` job.
//!
//! The test re-launches its own binary under `mpirun -np N`, filtered to itself, and the
//! re-launched copies (which see OpenMPI's variables) run the body. Each rank leaves a
//! marker when its body passed, so a job whose body never ran cannot pass. Without
//! `mpirun` the test says so on the terminal, past the test harness's capture, instead of
//! passing quietly.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// True in a process that `mpirun` started.
pub fn under_mpirun() -> bool {
    std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
}

/// The rank count of the `mpirun` job this process is in.
pub fn mpirun_world_size() -> usize {
    std::env::var("OMPI_COMM_WORLD_SIZE")
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("OMPI_COMM_WORLD_SIZE")
}

/// Variable naming the folder where each rank leaves a marker once its body has passed.
const PASS_DIR: &str = "COMM_TEST_PASS_DIR";

/// Bound on one `mpirun` job, start to finish.
const JOB_LIMIT: Duration = Duration::from_secs(300);

/// Inside `mpirun`: runs `body` (this process is one rank). Outside: runs test `name` of
/// this binary as `np` ranks under `mpirun` and panics unless every rank passed; when
/// `mpirun` is not installed, says "skipped" on the terminal.
pub fn on_mpirun(name: &str, np: usize, body: impl FnOnce()) {
    if under_mpirun() {
        body();
        // Proof that this rank ran the body to its end (not, say, zero filtered tests).
        if let Some(dir) = std::env::var_os(PASS_DIR) {
            let rank = std::env::var("OMPI_COMM_WORLD_RANK").unwrap_or_default();
            std::fs::write(
                std::path::Path::new(&dir).join(format!("rank-{rank}.ok")),
                b"",
            )
            .expect("writing the pass marker");
        }
        return;
    }
    let pass_dir =
        std::env::temp_dir().join(format!("comm-mpirun-{}-{name}-{np}", std::process::id()));
    let _ = std::fs::remove_dir_all(&pass_dir);
    std::fs::create_dir_all(&pass_dir).expect("creating the pass-marker folder");
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--oversubscribe",
        "--bind-to",
        "none",
        "-np",
        &np.to_string(),
    ])
    .arg(&exe)
    // A test that needs a GPU is ignored where there is none; here it was asked for.
    .args([
        name,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    // Containers often forbid the cross-memory attach that OpenMPI's shared-memory
    // transport uses for large messages.
    .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    // A rank that hangs fails its peers well within the job limit.
    .env("COMM_TIMEOUT_SECS", "60")
    .env(PASS_DIR, &pass_dir)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Straight to the terminal: the harness captures `eprintln!` of passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "\n*** {name}: skipped: mpirun not found (install openmpi-bin) ***\n"
            );
            return;
        }
        Err(e) => panic!("cannot start mpirun: {e}"),
    };
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break Some(status);
        }
        if start.elapsed() > JOB_LIMIT {
            // SAFETY: plain syscall on the pid of our own child, which has not been reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    let passed = std::fs::read_dir(&pass_dir).map_or(0, |d| d.count());
    let _ = std::fs::remove_dir_all(&pass_dir);
    match status {
        Some(s) if s.success() && passed == np => {
            let _ = writeln!(
                std::io::stderr(),
                "{name}: mpirun -np {np}: {passed} ranks passed in {:.1?}",
                start.elapsed()
            );
        }
        _ => panic!(
            "mpirun -np {np} {name}: {status:?}, {passed} of {np} ranks passed\n\
             --- stdout ---\n{out}\n--- stderr ---\n{err}"
        ),
    }
}
