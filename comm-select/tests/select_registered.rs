//! What `SelectComm` says about its members' algorithms that cannot run here, and where it
//! sends a request for a registered buffer: host members standing in for GPU ones.

use comm_core::{
    BufferMut, BufferRef, Capabilities, Communicator, DType, Error, LocalComm, ReduceOp,
    RegisteredBuffer, Result, ThreadsBootstrap,
};
use comm_select::{CallInfo, Memory, SelectComm, SelectOptions};

/// A `LocalComm` that declares an algorithm it cannot offer, and may register buffers.
struct Member {
    inner: LocalComm,
    caps: Capabilities,
    registers: bool,
}

#[derive(Debug)]
struct Fake(usize);

impl RegisteredBuffer for Fake {
    fn backend(&self) -> &str {
        "local"
    }
    fn device_ptr(&self) -> u64 {
        0x1000
    }
    fn bytes(&self) -> usize {
        self.0
    }
    fn ordinal(&self) -> usize {
        0
    }
}

impl Communicator for Member {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    fn all_reduce(&self, send: BufferRef<'_>, recv: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.inner.all_reduce(send, recv, op)
    }
    fn all_reduce_in_place(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.inner.all_reduce_in_place(buf, op)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn alloc_registered(&self, bytes: usize) -> Result<Box<dyn RegisteredBuffer>> {
        if self.registers {
            Ok(Box::new(Fake(bytes)))
        } else {
            Err(Error::Unsupported("local registers no buffers".into()))
        }
    }
}

fn selectors(registers: bool) -> Vec<SelectComm> {
    let handles: Vec<_> = ThreadsBootstrap::create(2)
        .into_iter()
        .zip(LocalComm::create(2))
        .map(|(boot, inner)| {
            std::thread::spawn(move || {
                let mut caps = inner.capabilities().clone();
                caps.unavailable
                    .push(("symmetric".into(), "NCCL 2.26.2 is too old".into()));
                let member = Member {
                    inner,
                    caps,
                    registers,
                };
                SelectComm::new(boot, vec![Box::new(member)], SelectOptions::default()).unwrap()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn explain_names_algorithms_that_cannot_run_here_and_why() {
    for comm in selectors(false) {
        let call = CallInfo::all_reduce(DType::BF16, ReduceOp::Sum, 21504, Memory::Host);
        let text = comm.explain(&call);
        assert!(
            text.contains("unavailable: local:symmetric (NCCL 2.26.2 is too old)"),
            "{text}"
        );
    }
}

#[test]
fn registered_buffers_come_from_the_first_member_that_registers() {
    for comm in selectors(true) {
        let buf = comm.alloc_registered(4096).unwrap();
        assert_eq!((buf.backend(), buf.bytes()), ("local", 4096));
    }
    for comm in selectors(false) {
        let err = comm.alloc_registered(4096).unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
        assert!(
            err.to_string().contains("local registers no buffers"),
            "{err}"
        );
    }
}
