//! `comm_select::auto` on GPUs: one bf16 all-reduce of the seeds' size on a cudarc stream.
//! Run one process per GPU (`mpirun -np 2`, or torchrun); with one process it is a world
//! of one.

use std::sync::Arc;

use comm_core::cuda::cudarc::driver::CudaContext;
use comm_core::{Bootstrap, Communicator, EnvBootstrap, ReduceOp, bf16};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bootstrap = Arc::new(EnvBootstrap::from_env()?);
    let comm = comm_select::auto(bootstrap.clone())?; // nccl, ipc, symm-cuda: what starts everywhere
    let gpu = bootstrap.local_rank() % comm_core::cuda::device_count()?;
    let stream = CudaContext::new(gpu)?.default_stream();
    let mut hidden = stream.alloc_zeros::<bf16>(3 * 7168)?; // 42 KB, as after an MLP
    comm.all_reduce_in_place((&mut hidden).into(), ReduceOp::Sum)?; // enqueued on `stream`
    stream.synchronize()?;
    let call =
        comm_select::CallInfo::all_reduce(comm_core::DType::BF16, ReduceOp::Sum, 43008, true);
    println!("rank {}: {}", comm.rank(), comm.explain(&call));
    Ok(())
}
