//! `verify-step` on host backends, as a user runs it: in-process ranks, and one process
//! per rank under `mpirun`. Both must match the reference (exit status 0).

use std::process::Command;

fn verify_step() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_verify-step"));
    cmd.args([
        "--calls", "9", "--count", "101", "--steps", "3", "--warmup", "1",
    ]);
    cmd
}

#[test]
fn in_process_ranks_match_the_reference() {
    let out = verify_step()
        .args(["--ranks", "3", "--backend", "local,bootstrap,symm,auto"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["local", "bootstrap", "symm", "auto"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(name) && l.contains("loop")),
            "{text}"
        );
    }
}

#[test]
fn under_mpirun_ranks_match_the_reference() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("skipped: no mpirun");
        return;
    }
    let exe = env!("CARGO_BIN_EXE_verify-step");
    let out = Command::new("mpirun")
        .args(["--oversubscribe", "--bind-to", "none", "-np", "2", exe])
        .args([
            "--calls", "9", "--count", "101", "--steps", "3", "--warmup", "1",
        ])
        .args(["--backend", "bootstrap,symm,auto"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("2 ranks (env)"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("auto") && l.contains(" 0 ")),
        "{text}"
    );
}
