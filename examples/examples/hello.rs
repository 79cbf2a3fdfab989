//! Hello, comm: every rank contributes `rank + 1`, all-reduces with a sum, prints the result.
//!
//! `cargo run -p comm-examples --example hello` runs 4 ranks as threads (`LocalComm`);
//! `mpirun -np 2 target/debug/examples/hello` (or torchrun) runs one rank per process,
//! meeting through the launcher's variables and a TCP store (`EnvBootstrap`).

use comm_core::bootstrap::LaunchInfo;
use comm_core::{BootstrapComm, Communicator, CommunicatorExt, EnvBootstrap, LocalComm};
use comm_core::{ReduceOp, Result};

fn hello(comm: &dyn Communicator) -> Result<()> {
    let mut x = vec![comm.rank() as f32 + 1.0; 4];
    comm.all_reduce_in_place_slice(&mut x, ReduceOp::Sum)?;
    let (rank, n, name) = (comm.rank(), comm.world_size(), comm.name());
    println!("rank {rank} of {n} ({name}): {x:?}");
    Ok(())
}

fn main() -> Result<()> {
    if LaunchInfo::detect()?.is_some() {
        // One rank per process.
        return hello(&BootstrapComm::new(EnvBootstrap::from_env()?));
    }
    // No launcher: four ranks as threads of this process.
    let ranks: Vec<_> = LocalComm::create(4)
        .into_iter()
        .map(|comm| std::thread::spawn(move || hello(&comm)))
        .collect();
    for rank in ranks {
        rank.join().expect("rank thread panicked")?;
    }
    Ok(())
}
