//! Event timing on a GPU: one gap per call, each the GPU time of that call.
#![cfg(feature = "cuda")]

use std::time::Duration;

use comm_core::DType;
use comm_core::cuda::{DeviceMemory, event_times, record_each, timing_events};

const CALLS: usize = 8;

#[test]
#[ignore = "needs a GPU"]
fn every_call_gets_the_gap_between_its_two_events() {
    let memory = DeviceMemory::new(0).unwrap();
    // Fills of 64 KiB and 256 MiB in turn: the large ones must show in their own gaps.
    let mut small = memory.alloc(DType::F32, 16 << 10).unwrap();
    let mut large = memory.alloc(DType::F32, 64 << 20).unwrap();
    let events = timing_events(memory.context(), CALLS + 1).unwrap();
    let mut calls = 0;
    record_each(memory.stream(), &events, || {
        calls += 1;
        if calls % 2 == 1 {
            small.poison(calls as u8)
        } else {
            large.poison(calls as u8)
        }
    })
    .unwrap();
    memory.synchronize().unwrap();
    assert_eq!(calls, CALLS);

    let gaps = event_times(&events).unwrap();
    assert_eq!(gaps.len(), CALLS);
    let slowest_small = gaps.iter().step_by(2).max().unwrap();
    let fastest_large = gaps.iter().skip(1).step_by(2).min().unwrap();
    assert!(
        *fastest_large > *slowest_small * 4,
        "256 MiB fills {fastest_large:?} vs 64 KiB fills {slowest_small:?}: {gaps:?}"
    );
    // The gaps tile the whole span: their sum is the first event to the last (each gap
    // rounded to the events' resolution of about half a microsecond).
    let span_ms = events[0].elapsed_ms(&events[CALLS]).unwrap();
    let span = Duration::from_secs_f64(f64::from(span_ms) / 1e3);
    let sum: Duration = gaps.iter().sum();
    assert!(
        sum.abs_diff(span) < Duration::from_micros(CALLS as u64),
        "gaps sum to {sum:?}, the span is {span:?}"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn no_event_or_one_event_enqueues_nothing() {
    let memory = DeviceMemory::new(0).unwrap();
    let events = timing_events(memory.context(), 1).unwrap();
    for events in [&events[..0], &events[..]] {
        let mut calls = 0;
        record_each(memory.stream(), events, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 0);
    }
    memory.synchronize().unwrap();
    assert!(event_times(&events).unwrap().is_empty());
}
