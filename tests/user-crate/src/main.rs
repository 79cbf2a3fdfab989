//! What a user writes to get `auto`: a bootstrap, `comm_select::auto`, collectives. On a
//! GPU the all-reduce runs on a cudarc stream; without one, on host memory. Prints the
//! backends and the result's first element, which the caller checks.

use std::sync::Arc;

use comm_core::{Bootstrap, Communicator, CommunicatorExt, EnvBootstrap, ReduceOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bootstrap = Arc::new(EnvBootstrap::from_env()?);
    let comm = comm_select::auto(bootstrap.clone())?;
    let rank = bootstrap.rank() as f32;
    let got = match comm_core::cuda::device_count() {
        Ok(gpus) => {
            // A stream of our own: the legacy default stream cannot be captured and is
            // shared by every thread.
            let stream = comm_core::cuda::context(bootstrap.local_rank() % gpus)?.new_stream()?;
            let mut x = stream.memcpy_stod(&vec![rank + 1.0; 21504])?;
            comm.all_reduce_in_place((&mut x).into(), ReduceOp::Sum)?;
            stream.synchronize()?;
            comm.async_error()?;
            stream.memcpy_dtov(&x)?[0]
        }
        Err(_) => {
            let mut x = vec![rank + 1.0; 21504];
            comm.all_reduce_in_place_slice(&mut x, ReduceOp::Sum)?;
            x[0]
        }
    };
    println!("backends {:?} sum {got}", comm.backend_names());
    Ok(())
}
