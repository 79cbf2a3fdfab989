//! A crate outside the workspace (`tests/user-crate`), as a user's project would be: it
//! depends on the comm crates by path and gets `auto` in a few lines. It must build, and
//! its program must all-reduce right on its own and as two processes (host memory without
//! a GPU; a cudarc stream with one).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("comm-select lives in the repository")
        .to_path_buf()
}

/// Runs the user's program with only the given launcher variables (none of this test's).
fn run(program: &Path, vars: &[(&str, String)]) -> std::process::Child {
    let mut cmd = Command::new(program);
    cmd.env_clear();
    for key in ["PATH", "HOME", "LD_LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    cmd.envs(vars.iter().map(|(k, v)| (*k, v)))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the user's program starts")
}

/// The sum the program printed.
fn sum(out: &Output) -> f32 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .split_whitespace()
        .skip_while(|w| *w != "sum")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sum in {stdout:?}"))
}

#[test]
fn a_user_crate_gets_auto() {
    let root = repository();
    let crate_dir = root.join("tests/user-crate");
    let target = root.join("target/user-crate");
    // The workspace's lock file, so that the user crate builds with the same versions.
    std::fs::copy(root.join("Cargo.lock"), crate_dir.join("Cargo.lock")).expect("lock file");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = Command::new(cargo)
        .args(["build", "--quiet", "--manifest-path"])
        .arg(crate_dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("cargo runs");
    assert!(built.success(), "the user crate does not build");
    let program = target.join("debug/comm-user-crate");

    // Alone: a world of one.
    let alone = run(&program, &[]).wait_with_output().unwrap();
    assert_eq!(sum(&alone), 1.0);

    // Two processes meeting through the environment's TCP store: 1 + 2 on every rank.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let vars = [
                ("RANK", rank.to_string()),
                ("LOCAL_RANK", rank.to_string()),
                ("WORLD_SIZE", "2".to_string()),
                ("LOCAL_WORLD_SIZE", "2".to_string()),
                ("MASTER_ADDR", "127.0.0.1".to_string()),
                ("MASTER_PORT", port.to_string()),
                ("COMM_TIMEOUT_SECS", "60".to_string()),
            ];
            run(&program, &vars)
        })
        .collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert_eq!(sum(&out), 3.0, "rank {rank}");
    }
}
