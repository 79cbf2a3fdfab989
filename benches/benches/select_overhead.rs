//! The host cost SelectComm adds to a call: an 8-byte all-reduce on a world of one, through
//! the selector over one LocalComm, next to the LocalComm alone. A world of one keeps the
//! peers' arrival times out of the figure, so what remains is the per-call work of each
//! layer (validation, routing, capability checks).

use std::hint::black_box;

use comm_core::{Communicator, CommunicatorExt, LocalComm, ReduceOp, ThreadsBootstrap};
use comm_select::{SelectComm, SelectOptions};
use criterion::{Criterion, criterion_group, criterion_main};

fn all_reduce_8_bytes(c: &mut Criterion) {
    let mut group = c.benchmark_group("all_reduce 8 B, world 1");
    let mut x = [1.0f32; 2];

    let local = LocalComm::create(1).remove(0);
    group.bench_function("LocalComm", |b| {
        b.iter(|| local.all_reduce_in_place_slice(black_box(&mut x), ReduceOp::Sum))
    });

    let boot = ThreadsBootstrap::create(1).remove(0);
    let members: Vec<Box<dyn Communicator>> = vec![Box::new(LocalComm::create(1).remove(0))];
    let select = SelectComm::new(boot, members, SelectOptions::default()).expect("selector");
    group.bench_function("SelectComm over LocalComm", |b| {
        b.iter(|| select.all_reduce_in_place_slice(black_box(&mut x), ReduceOp::Sum))
    });
    group.finish();
}

criterion_group!(benches, all_reduce_8_bytes);
criterion_main!(benches);
