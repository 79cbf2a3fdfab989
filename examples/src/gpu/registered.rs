//! Zero-copy calls that the conformance suite cannot make through safe views: one registered
//! range given as both input and output of an out-of-place call (as a framework passing one
//! tensor twice), and ranks naming different registered buffers at one offset.

use std::sync::Arc;
use std::time::Duration;

use comm_core::cuda::{DeviceMemory, driver_error};
use comm_core::{Bootstrap, BufferMut, BufferRef, Communicator, DType, Error, ReduceOp, Result};
use comm_peer::{Algorithm, PeerComm, PeerConfig};

use super::check::{Options, device_of};
use super::data::{all_inputs, count_wrong};
use super::{GpuComm, timeout_or};

/// Out of place with input and output one registered range: the call must be run as in
/// place (no peer may still read an input that is already being overwritten). Fresh random
/// data, output checked against the f64 reference; `counts` elements of bf16 each.
pub fn aliased(
    comm: &PeerComm,
    bootstrap: &dyn Bootstrap,
    memory: &DeviceMemory,
    counts: &[usize],
    seed: u64,
) -> Result<String> {
    let (rank, world) = (bootstrap.rank(), bootstrap.world_size());
    let dtype = DType::BF16;
    for (k, &count) in counts.iter().enumerate() {
        let inputs = all_inputs(dtype, count, seed + k as u64, world);
        let bytes = count * dtype.size();
        let mut buf = comm.alloc(bytes)?;
        buf.upload(memory.stream(), 0, &inputs[rank])?;
        let (addr, stream) = (buf.device_ptr(), memory.raw_stream());
        let ordinal = comm.context().ordinal() as i32;
        // SAFETY: both views cover `buf`, which lives past the synchronisation below; that
        // they alias is the point of the case.
        let (send, recv) = unsafe {
            (
                BufferRef::from_device_ptr(addr, count, dtype, ordinal, stream),
                BufferMut::from_device_ptr(addr, count, dtype, ordinal, stream),
            )
        };
        let called = Communicator::all_reduce(comm, send, recv, ReduceOp::Sum);
        let synced = called.and_then(|()| comm.synchronize(stream));
        let mut got = vec![0u8; bytes];
        let read = synced.and_then(|()| buf.download(memory.stream(), 0, &mut got));
        // Every rank must be done reading this rank's buffer before it is freed.
        bootstrap.barrier()?;
        drop(buf);
        read?;
        let wrong = count_wrong(dtype, ReduceOp::Sum, &inputs, &got, count);
        if wrong > 0 {
            return Err(Error::Mismatch(format!(
                "bf16 x {count}, input as output: {wrong} elements wrong"
            )));
        }
    }
    Ok(format!(
        "bf16 x {counts:?}, out of place with one range for both"
    ))
}

/// Rank 0 reads its input from one registered buffer, the others from another, at the same
/// offset: with the calls compared on the device (the default), every rank must get
/// `Error::Mismatch` naming both buffers, not a result.
pub fn other_buffers(bootstrap: &Arc<dyn Bootstrap>, opts: &Options) -> Result<String> {
    let config = PeerConfig {
        max_bytes: 1 << 20,
        algorithm: Some(Algorithm::OneshotPull),
        timeout: Some(timeout_or(Duration::from_secs(20))),
        agree_on_host: false,
        ..PeerConfig::default()
    };
    let device = device_of(&**bootstrap)?;
    let joined = GpuComm::join(opts.backend, bootstrap, device, config, opts.backing)?;
    let comm = joined.peer();
    if comm.group().host_memory() {
        return Ok("skipped: no zero-copy buffers where the regions are host memory".into());
    }
    let memory = DeviceMemory::with_stream(comm.context().new_stream().map_err(driver_error)?);
    let count = 4096;
    let bytes = count * DType::BF16.size();
    let mut first = comm.alloc(bytes)?;
    let mut second = comm.alloc(bytes)?;
    let data = all_inputs(DType::BF16, count, 77, 1).remove(0);
    first.upload(memory.stream(), 0, &data)?;
    second.upload(memory.stream(), 0, &data)?;
    let mut out = memory.alloc(DType::BF16, count)?;
    let input = if bootstrap.rank() == 0 {
        &first
    } else {
        &second
    };
    let result = Communicator::all_reduce(
        comm,
        input.view(DType::BF16, 0, count, memory.stream())?,
        out.view_mut(0, count)?,
        ReduceOp::Sum,
    )
    .and_then(|()| comm.synchronize(memory.raw_stream()));
    bootstrap.barrier()?;
    drop((first, second));
    match result {
        Err(Error::Mismatch(why)) if why.contains("buffer #0") && why.contains("buffer #1") => {
            Ok(format!("refused: {why}"))
        }
        other => Err(Error::Mismatch(format!(
            "expected a mismatch naming both registered buffers, got {other:?}"
        ))),
    }
}
