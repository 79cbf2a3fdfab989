//! Checks that a communicator built around another hands on what the inner one says.
//!
//! [`Failing`] fails every call with an error that names the method; a wrapper, handle or
//! selector built around it must return that error from the same method. A method that a
//! wrapper forgets (left at the trait's default) answers `Ok` or its own error, and the
//! check names it.

use crate::buffer::{BufferMut, BufferRef};
use crate::communicator::{Capabilities, Communicator};
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::registered::RegisteredBuffer;

/// The algorithm [`Failing`] claims, so that `set_algorithm` reaches it.
pub const FAILING_ALGORITHM: &str = "failing";

/// A communicator whose every call fails with an error naming the method.
///
/// Collectives fail with [`Error::InvalidArgument`] (an error that leaves a communicator
/// usable, so a selector need not poison itself), [`Communicator::async_error`] with
/// [`Error::Mismatch`], as a device backend reports a disagreement found by its kernels.
#[derive(Debug)]
pub struct Failing {
    rank: usize,
    world: usize,
    capabilities: Capabilities,
}

impl Failing {
    /// Rank `rank` of `world`, claiming every collective, dtype and op on host memory, and
    /// one algorithm, [`FAILING_ALGORITHM`].
    pub fn new(rank: usize, world: usize) -> Self {
        Failing {
            rank,
            world,
            capabilities: Capabilities::host_complete().with_algorithms(&[FAILING_ALGORITHM]),
        }
    }

    /// The error method `method` fails with.
    pub fn marker(method: &str) -> String {
        format!("injected into `{method}`")
    }

    fn fail(method: &str) -> Result<()> {
        Err(Error::InvalidArgument(Self::marker(method)))
    }
}

impl Communicator for Failing {
    fn name(&self) -> &str {
        "failing"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }
    fn all_reduce(&self, _: BufferRef<'_>, _: BufferMut<'_>, _: ReduceOp) -> Result<()> {
        Self::fail("all_reduce")
    }
    fn all_reduce_in_place(&self, _: BufferMut<'_>, _: ReduceOp) -> Result<()> {
        Self::fail("all_reduce_in_place")
    }
    fn all_gather(&self, _: BufferRef<'_>, _: BufferMut<'_>) -> Result<()> {
        Self::fail("all_gather")
    }
    fn reduce_scatter(&self, _: BufferRef<'_>, _: BufferMut<'_>, _: ReduceOp) -> Result<()> {
        Self::fail("reduce_scatter")
    }
    fn broadcast(&self, _: BufferMut<'_>, _: usize) -> Result<()> {
        Self::fail("broadcast")
    }
    fn barrier(&self) -> Result<()> {
        Self::fail("barrier")
    }
    fn async_error(&self) -> Result<()> {
        Err(Error::Mismatch(Self::marker("async_error")))
    }
    fn set_algorithm(&self, algorithm: Option<&str>) -> Result<()> {
        match algorithm {
            Some(FAILING_ALGORITHM) => Self::fail("set_algorithm"),
            _ => Ok(()),
        }
    }
    fn alloc_registered(&self, _: usize) -> Result<Box<dyn RegisteredBuffer>> {
        Err(Error::InvalidArgument(Self::marker("alloc_registered")))
    }
}

/// What of [`Communicator`] the outer communicator takes from the inner one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarding {
    /// Every method, `name`, `capabilities` and `set_algorithm` included (a handle, a
    /// wrapper, an enum over backings).
    Everything,
    /// The errors of the collectives, `barrier` and `async_error` (a selector, which has a
    /// name, capabilities and algorithms of its own).
    Errors,
}

/// Checks that `outer`, built around a [`Failing`], returns each method's error (the
/// inner error's message, possibly inside its own). `async_error` is checked last: after
/// an asynchronous error a communicator may refuse everything. Every rank of the outer
/// communicator's world must call this together.
pub fn check_forwarding(
    outer: &dyn Communicator,
    forwarding: Forwarding,
) -> std::result::Result<(), String> {
    let mut lost = Vec::new();
    let mut identity = Vec::new();
    let mut expect = |method: &str, result: Result<()>| match result {
        Err(e) if e.to_string().contains(&Failing::marker(method)) => {}
        other => lost.push(format!("{method} returned {other:?}")),
    };
    let world = outer.world_size();
    let send = [1.0f32; 4];
    let mut recv = vec![0.0f32; 4 * world];
    expect(
        "all_reduce",
        outer.all_reduce(
            BufferRef::host(&send),
            BufferMut::host(&mut recv[..4]),
            ReduceOp::Sum,
        ),
    );
    expect(
        "all_reduce_in_place",
        outer.all_reduce_in_place(BufferMut::host(&mut recv[..4]), ReduceOp::Sum),
    );
    expect(
        "all_gather",
        outer.all_gather(BufferRef::host(&send), BufferMut::host(&mut recv)),
    );
    expect(
        "reduce_scatter",
        outer.reduce_scatter(
            BufferRef::host(&recv.clone()),
            BufferMut::host(&mut recv[..4]),
            ReduceOp::Sum,
        ),
    );
    expect(
        "broadcast",
        outer.broadcast(BufferMut::host(&mut recv[..4]), 0),
    );
    expect("barrier", outer.barrier());
    expect("alloc_registered", outer.alloc_registered(4096).map(drop));
    if forwarding == Forwarding::Everything {
        expect(
            "set_algorithm",
            outer.set_algorithm(Some(FAILING_ALGORITHM)),
        );
        if outer.name() != "failing" {
            identity.push(format!("name is `{}`", outer.name()));
        }
        if !outer
            .capabilities()
            .algorithms
            .iter()
            .any(|a| a == FAILING_ALGORITHM)
        {
            identity.push("capabilities are not the inner communicator's".to_string());
        }
    }
    expect("async_error", outer.async_error());
    lost.extend(identity);
    if lost.is_empty() {
        Ok(())
    } else {
        Err(format!("{} lost: {}", outer.name(), lost.join("; ")))
    }
}
