//! A step on host memory: a plain loop of all-reduces, each followed by the dependent op
//! on the CPU, timed with the wall clock.

use std::time::{Duration, Instant};

use comm_core::{Bootstrap, BufferMut, BufferRef, Communicator, ReduceOp, Result};

use super::chain;
use super::{Config, How, Timing};
use crate::perf::data::Value;

/// Runs warm-up and timed steps of `comm` on host buffers, then one checked step.
pub fn run<T: Value>(comm: &dyn Communicator, ctl: &dyn Bootstrap, cfg: &Config) -> Result<Timing> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let init: Vec<T> = chain::input(rank, world, cfg.count)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let mut x = init.clone();
    let mut y = vec![T::poison(); cfg.count];
    let step = |x: &mut [T], y: &mut [T]| -> Result<()> {
        for k in 0..cfg.calls {
            comm.all_reduce(BufferRef::host(x), BufferMut::host(y), ReduceOp::Sum)?;
            let add = f64::from(chain::add(k));
            for (x, y) in x.iter_mut().zip(y.iter()) {
                *x = T::from_f64(y.to_f64() / world as f64 + add);
            }
        }
        Ok(())
    };
    step(&mut x, &mut y)?;
    let got: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let wrong = chain::count_wrong(&got, &chain::reference(world, cfg.count, cfg.calls));
    for _ in 0..cfg.warmup {
        step(&mut x, &mut y)?;
    }
    ctl.barrier()?;
    let mut times: Vec<Duration> = Vec::with_capacity(cfg.steps);
    for _ in 0..cfg.steps {
        // The chain moves on from step to step; only its speed matters from here.
        x.copy_from_slice(&init);
        let start = Instant::now();
        step(&mut x, &mut y)?;
        times.push(start.elapsed());
    }
    Ok(Timing {
        step: crate::perf::sweep::median(&mut times),
        wrong,
        how: How::Loop,
    })
}
