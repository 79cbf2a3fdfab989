//! `comm_select::auto` on GPUs: one bf16 all-reduce of the seeds' size on a stream of the
//! caller's. Run one process per GPU (`mpirun -np 2`, or torchrun); with one process it is
//! a world of one.
//!
//! The context comes from `comm_core::cuda::context` (cudarc's event tracking off: with it,
//! cudarc synchronises the whole device when a handle makes its first stream, which can
//! wait behind a peer's spinning kernel) and the stream is created, not the legacy default
//! stream (which no graph can capture and every thread shares).

use std::sync::Arc;

use comm_core::{Bootstrap, Communicator, EnvBootstrap, ReduceOp, bf16};
use comm_select::CallInfo;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bootstrap = Arc::new(EnvBootstrap::from_env()?);
    let comm = comm_select::auto(bootstrap.clone())?; // nccl, ipc, symm-cuda: what starts everywhere
    let gpu = bootstrap.local_rank() % comm_core::cuda::device_count()?;
    let stream = comm_core::cuda::context(gpu)?.new_stream()?;
    // 42 KB, as after an MLP: every rank holds its rank + 1.
    let mine = vec![bf16::from_f32(comm.rank() as f32 + 1.0); 3 * 7168];
    let mut hidden = stream.clone_htod(&mine)?;
    comm.all_reduce_in_place((&mut hidden).into(), ReduceOp::Sum)?; // enqueued on `stream`
    // Part of a buffer: a view of its first row.
    comm.all_reduce_in_place(hidden.slice_mut(0..7168).into(), ReduceOp::Sum)?;
    stream.synchronize()?;
    comm.async_error()?; // what the kernels found after the calls returned
    let got = stream.clone_dtoh(&hidden)?;
    let world = comm.world_size() as f32;
    let sum = world * (world + 1.0) / 2.0;
    assert_eq!(got[0].to_f32(), sum * world); // the first row was reduced twice
    assert_eq!(got[7168].to_f32(), sum);
    let call = CallInfo::of_all_reduce(&(&hidden).into(), ReduceOp::Sum);
    println!("rank {}: {}", comm.rank(), comm.explain(&call));
    Ok(())
}
