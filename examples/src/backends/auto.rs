//! The `auto` backend: a [`SelectComm`] over every backend that starts on this machine.
//!
//! With a GPU, the members are first the GPU backends (`nccl` where it can start: a
//! world of one, or one GPU per rank of a node; `ipc`; `symm-cuda`), then the mode's
//! default host backends, so that device and host buffers both have somewhere to go.
//! Each GPU backend is tried on every rank, and the ranks agree through the bootstrap on
//! whether it started everywhere: one that failed on any rank is dropped on all of them,
//! with a note on rank 0's stderr, so the member lists stay identical. The topology is
//! [`probe`](comm_select::probe)d on this rank's device; `COMM_BACKEND`, `COMM_TUNING`
//! and `COMM_TOPOLOGY` ([`SelectOptions::from_env`]) override as usual.

use comm_core::{Bootstrap, Communicator, Result};
use comm_select::{SelectComm, SelectOptions};

use super::{RankContext, all, defaults};

/// GPU backends, in the order the selector holds them (earlier wins a tie).
const GPU_MEMBERS: [&str; 3] = ["nccl", "ipc", "symm-cuda"];

/// Collective: builds rank `ctx`'s selector (see the module docs).
pub fn create_select(ctx: &RankContext) -> Result<SelectComm> {
    let bootstrap = &**ctx.bootstrap();
    let device = agreed_device(bootstrap)?;
    let mut members: Vec<Box<dyn Communicator>> = Vec::new();
    if let Some(count) = device.map(|_| comm_core::cuda::device_count().unwrap_or(1)) {
        for name in GPU_MEMBERS {
            // NCCL refuses two ranks on one GPU, and may hang rather than fail: not tried.
            if name == "nccl" && bootstrap.world_size() > 1 && bootstrap.local_world_size() > count
            {
                note(bootstrap, name, "left out: NCCL needs one GPU per rank");
                continue;
            }
            let backend = all().into_iter().find(|b| b.name == name);
            let made = backend
                .map(|b| (b.create)(ctx))
                .unwrap_or_else(|| Err(comm_core::Error::Unsupported("not built".into())));
            let ok = made.is_ok();
            if agree(bootstrap, ok)? {
                members.extend(made.ok());
            } else {
                let why = match made {
                    Err(e) => e.to_string(),
                    Ok(_) => "failed to start on another rank".into(),
                };
                note(bootstrap, name, &format!("left out: {why}"));
            }
        }
    }
    for b in defaults(ctx.mode()).iter().filter(|b| b.name != "auto") {
        members.push((b.create)(ctx)?);
    }
    let mut options = SelectOptions::from_env()?;
    // Probing is collective, so every rank probes whatever rank 0 will use.
    let probed = comm_select::probe(bootstrap, device)?;
    options.topology.get_or_insert(probed);
    SelectComm::new(ctx.bootstrap().clone(), members, options)
}

/// This rank's CUDA ordinal when every rank sees a GPU (`local_rank % count`, the rule
/// of the GPU backends), else `None` everywhere.
fn agreed_device(bootstrap: &dyn Bootstrap) -> Result<Option<usize>> {
    let count = comm_core::cuda::device_count().unwrap_or(0);
    let device = (count > 0).then(|| bootstrap.local_rank() % count);
    Ok(if agree(bootstrap, device.is_some())? {
        device
    } else {
        None
    })
}

/// Collective: true when `ok` is true on every rank.
fn agree(bootstrap: &dyn Bootstrap, ok: bool) -> Result<bool> {
    Ok(bootstrap
        .all_gather_bytes(&[u8::from(ok)])?
        .iter()
        .all(|b| b.as_slice() == [1]))
}

fn note(bootstrap: &dyn Bootstrap, backend: &str, message: &str) {
    if bootstrap.rank() == 0 {
        eprintln!("auto: {backend} {message}");
    }
}
