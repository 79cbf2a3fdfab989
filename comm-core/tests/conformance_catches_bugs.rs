//! The suite must fail backends that are wrong: a wrong element, and results that are
//! within tolerance but not bitwise identical across ranks.

use comm_core::conformance::{self, Config};
use comm_core::{BufferMut, BufferRef, Capabilities, Communicator, LocalComm, ReduceOp, Result};

/// LocalComm, except that rank 1 changes the first output element of every all-reduce.
struct Faulty {
    inner: LocalComm,
    /// Added to the raw bits of the first element's lowest byte.
    flip: u8,
}

impl Faulty {
    fn damage(&self, mut out: BufferMut<'_>) {
        if self.inner.rank() == 1 && !out.is_empty() {
            let bytes = out.host_bytes_mut().unwrap();
            bytes[0] = bytes[0].wrapping_add(self.flip);
        }
    }
}

impl Communicator for Faulty {
    fn name(&self) -> &str {
        "faulty"
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn all_reduce(&self, send: BufferRef<'_>, mut recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.inner.all_reduce(send, recv.reborrow(), op)?;
        self.damage(recv);
        Ok(())
    }
    fn all_reduce_in_place(&self, mut buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.inner.all_reduce_in_place(buf.reborrow(), op)?;
        self.damage(buf);
        Ok(())
    }
    fn all_gather(&self, send: BufferRef<'_>, recv: BufferMut<'_>) -> Result<()> {
        self.inner.all_gather(send, recv)
    }
    fn reduce_scatter(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.inner.reduce_scatter(send, recv, op)
    }
    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<()> {
        self.inner.broadcast(buf, root)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
}

fn failures(flip: u8) -> Vec<conformance::Failure> {
    let config = Config {
        random_cases: 0,
        large_count: None,
        error_cases: false,
        ..Config::default()
    };
    let handles: Vec<_> = LocalComm::create(3)
        .into_iter()
        .map(|inner| {
            let config = config.clone();
            std::thread::spawn(move || conformance::run(&Faulty { inner, flip }, &config))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap()
                .expect_err("a faulty backend must fail the suite")
        })
        .collect()
}

#[test]
fn a_wrong_element_fails_every_rank() {
    // The sweep starts with f32: +128 ulp is far outside the sum's tolerance.
    let all = failures(0x80);
    for f in &all {
        assert!(
            f.message.contains("wrong") || f.message.contains("rank 1"),
            "{f}"
        );
    }
    // Every rank stopped at the same case.
    assert!(all.iter().all(|f| f.case == all[0].case), "{all:?}");
}

#[test]
fn a_one_ulp_difference_between_ranks_is_caught() {
    // One ulp of f32 is within tolerance: only the bitwise-identity check can catch it.
    let all = failures(1);
    assert!(
        all.iter()
            .any(|f| f.message.contains("differ across ranks")),
        "{all:?}"
    );
}
