//! The collective kernels keep every value in registers on the archs we measure (sm_90) and
//! serve first (sm_120): a stack frame or a spill puts values in local memory, which a
//! latency-bound all-reduce pays for on every call. Needs NVRTC only, no GPU; where NVRTC is
//! missing it says so, and `COMM_EXPECT_NVRTC=1` (CI) makes that a failure. It holds for the
//! fused all-reduce + RMSNorm kernels too.

use comm_core::Error;
use comm_core::cuda::kernels::resources;

#[test]
fn collective_kernels_use_no_local_memory() {
    let source = comm_peer::KERNELS
        .iter()
        .find(|k| k.name == "peer_collectives.cu")
        .expect("the collectives' source");
    for arch in ["sm_90", "sm_120"] {
        let entries = match resources(source, arch) {
            Ok(entries) => entries,
            Err(Error::LibraryMissing { name }) => {
                assert!(
                    std::env::var("COMM_EXPECT_NVRTC").as_deref() != Ok("1"),
                    "libnvrtc missing: {name}"
                );
                eprintln!("skipped: {name} is missing");
                return;
            }
            Err(e) => panic!("{arch}: {e}"),
        };
        assert!(entries.len() > 50, "{arch}: only {} entries", entries.len());
        let local: Vec<_> = entries.iter().filter(|k| !k.no_local_memory()).collect();
        assert!(local.is_empty(), "{arch}: local memory in {local:#?}");
    }
}
