//! Without libcuda, libnvrtc or a GPU, every CUDA entry point returns a clear error and
//! nothing panics. CI (no GPU) sets `COMM_EXPECT_NO_GPU=1` so that this must be the error
//! path, and `COMM_EXPECT_NVRTC=1` where the NVRTC wheel is on `LD_LIBRARY_PATH`.
#![cfg(feature = "cuda")]

use comm_core::cuda::kernels::{FILL_CHECK, Image, compile, nvrtc_version, resources};
use comm_core::cuda::stream::is_capturing;
use comm_core::cuda::{DeviceMemory, context, device_count};
use comm_core::{Error, RawStream};

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

fn is_clean_absence(e: &Error) -> bool {
    match e {
        Error::LibraryMissing { name } => name.contains("libcuda"),
        Error::NoDevice(why) => !why.is_empty(),
        _ => false,
    }
}

#[test]
fn device_entry_points_fail_cleanly_without_a_gpu() {
    match device_count() {
        Ok(n) => {
            assert!(!flag("COMM_EXPECT_NO_GPU"), "found {n} devices");
            assert!(n > 0);
            return;
        }
        Err(e) => assert!(is_clean_absence(&e), "unexpected error: {e}"),
    }
    let e = context(0).unwrap_err();
    assert!(is_clean_absence(&e), "{e}");
    let e = DeviceMemory::new(0).unwrap_err();
    assert!(is_clean_absence(&e), "{e}");
    let e = is_capturing(RawStream::default()).unwrap_err();
    assert!(is_clean_absence(&e), "{e}");
    // Asking again gives the same answer (the probe is cached, not half-initialised).
    let e = device_count().unwrap_err();
    assert!(is_clean_absence(&e), "{e}");
}

#[test]
fn nvrtc_builds_a_kernel_or_says_it_is_missing() {
    match compile(&FILL_CHECK, "sm_120") {
        Ok(Image::Cubin(bytes)) => assert!(bytes.len() > 1000),
        Ok(other) => panic!(
            "sm_120 must give a cubin, got {} bytes of PTX",
            other.bytes().len()
        ),
        Err(Error::LibraryMissing { name }) => {
            assert!(!flag("COMM_EXPECT_NVRTC"), "libnvrtc missing: {name}");
            assert!(name.contains("nvrtc"));
            assert!(nvrtc_version().is_err());
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn a_bad_arch_is_an_error_with_nvrtcs_log() {
    match compile(&FILL_CHECK, "sm_1") {
        Err(Error::LibraryMissing { .. }) => assert!(!flag("COMM_EXPECT_NVRTC")),
        Err(e) => assert!(
            matches!(
                e,
                Error::Backend {
                    backend: "nvrtc",
                    ..
                }
            ),
            "{e}"
        ),
        Ok(_) => panic!("sm_1 compiled"),
    }
}

#[test]
fn ptxas_reports_every_entry_of_a_source() {
    match resources(&FILL_CHECK, "sm_90") {
        Ok(entries) => {
            assert!(
                entries.iter().any(|k| k.name == "comm_fill_bf16"),
                "{entries:?}"
            );
            assert!(
                entries
                    .iter()
                    .any(|k| k.name == "comm_check_all_reduce_f32"),
                "{entries:?}"
            );
            assert!(entries.iter().all(|k| k.registers > 0), "{entries:?}");
        }
        Err(Error::LibraryMissing { name }) => {
            assert!(!flag("COMM_EXPECT_NVRTC"), "libnvrtc missing: {name}")
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}
