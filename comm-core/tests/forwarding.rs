//! Every handle over a communicator hands on every method: an error injected in the inner
//! communicator reaches the caller of the outer one.

use std::sync::Arc;

use comm_core::conformance::forwarding::{Failing, Forwarding, check_forwarding};
use comm_core::{Communicator, Forward};

fn check(outer: &dyn Communicator) {
    if let Err(e) = check_forwarding(outer, Forwarding::Everything) {
        panic!("{e}");
    }
}

#[test]
fn handles_forward_every_method() {
    check(&Box::new(Failing::new(0, 1)));
    let boxed: Box<dyn Communicator> = Box::new(Failing::new(0, 1));
    check(&boxed);
    check(&Box::new(boxed));
    check(&Arc::new(Failing::new(0, 1)));
    let shared: Arc<dyn Communicator + Sync> = Arc::new(Failing::new(0, 1));
    check(&shared);
    let inner = Failing::new(0, 1);
    check(&&inner);
}

#[test]
fn a_type_that_forwards_loses_nothing() {
    struct Wrapper {
        inner: Failing,
    }
    impl Forward for Wrapper {
        type Target = Failing;
        fn target(&self) -> &Failing {
            &self.inner
        }
    }
    check(&Wrapper {
        inner: Failing::new(0, 1),
    });
}

/// The check itself: a wrapper that answers one method on its own is caught.
#[test]
fn the_check_names_a_dropped_method() {
    use comm_core::{BufferMut, BufferRef, Capabilities, ReduceOp, Result};
    struct DropsAsyncError(Failing);
    impl Communicator for DropsAsyncError {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn rank(&self) -> usize {
            self.0.rank()
        }
        fn world_size(&self) -> usize {
            self.0.world_size()
        }
        fn capabilities(&self) -> &Capabilities {
            self.0.capabilities()
        }
        fn all_reduce(&self, s: BufferRef<'_>, r: BufferMut<'_>, op: ReduceOp) -> Result<()> {
            self.0.all_reduce(s, r, op)
        }
        fn all_reduce_in_place(&self, b: BufferMut<'_>, op: ReduceOp) -> Result<()> {
            self.0.all_reduce_in_place(b, op)
        }
        fn all_gather(&self, s: BufferRef<'_>, r: BufferMut<'_>) -> Result<()> {
            self.0.all_gather(s, r)
        }
        fn reduce_scatter(&self, s: BufferRef<'_>, r: BufferMut<'_>, op: ReduceOp) -> Result<()> {
            self.0.reduce_scatter(s, r, op)
        }
        fn broadcast(&self, b: BufferMut<'_>, root: usize) -> Result<()> {
            self.0.broadcast(b, root)
        }
        fn barrier(&self) -> Result<()> {
            self.0.barrier()
        }
        fn set_algorithm(&self, a: Option<&str>) -> Result<()> {
            self.0.set_algorithm(a)
        }
    }
    let e = check_forwarding(&DropsAsyncError(Failing::new(0, 1)), Forwarding::Everything)
        .expect_err("async_error is dropped");
    assert!(e.contains("async_error returned Ok(())"), "{e}");
    assert!(!e.contains("all_reduce"), "{e}");
}
