//! NVRTC compilation of one [`KernelSource`] for one arch, through raw `nvrtc::sys` calls
//! where `cudarc` has no wrapper (headers, cubin output).

use std::ffi::{CStr, CString, c_char, c_int};

use cudarc::nvrtc::result::NvrtcError;
use cudarc::nvrtc::sys;

use super::{HEADERS, KernelSource};
use crate::cuda::error::nvrtc_error;
use crate::cuda::probe;
use crate::error::{Error, Result};

/// A compiled kernel image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    /// Machine code for one `sm_XX` (from `nvrtcGetCUBIN`).
    Cubin(Vec<u8>),
    /// PTX for a virtual `compute_XX` arch, NUL-terminated (the driver compiles it at load).
    Ptx(Vec<u8>),
}

impl Image {
    /// The bytes to hand to `cuModuleLoadData`.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Image::Cubin(b) | Image::Ptx(b) => b,
        }
    }
}

/// The options every compilation gets. Part of the cache key.
pub(crate) fn options(arch: &str) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "-lineinfo".to_string(),
    ];
    // Lets a kernel include toolkit headers (cuda_bf16.h...) where a toolkit or the pip
    // wheel `nvidia-cuda-runtime` provides them; ours need none.
    if let Ok(dir) = std::env::var("COMM_CUDA_INCLUDE") {
        if !dir.is_empty() {
            opts.push(format!("--include-path={dir}"));
        }
    }
    opts
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    probe::nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    check(unsafe { sys::nvrtcVersion(&mut major, &mut minor) })?;
    Ok((major, minor))
}

/// The real archs this NVRTC can make cubins for (`[75, 80, ..., 120]`).
pub fn supported_archs() -> Result<Vec<i32>> {
    probe::nvrtc()?;
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) })?;
    let mut archs = vec![0; n.max(0) as usize];
    // SAFETY: the buffer holds the `n` entries NVRTC reported.
    check(unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) })?;
    Ok(archs)
}

/// Compiles `source` for `arch`: `sm_XX` gives a cubin, `compute_XX` PTX. A compile error
/// comes back as [`Error::Backend`] carrying NVRTC's log.
pub fn compile(source: &KernelSource, arch: &str) -> Result<Image> {
    compile_with(source, arch, &[]).map(|(image, _)| image)
}

/// [`compile`] with `extra` options after ours; also returns NVRTC's log.
pub(crate) fn compile_with(
    source: &KernelSource,
    arch: &str,
    extra: &[&str],
) -> Result<(Image, String)> {
    probe::nvrtc()?;
    let c = |s: &str| {
        CString::new(s).map_err(|_| {
            Error::InvalidArgument(format!("NUL byte in kernel text of {}", source.name))
        })
    };
    let text = c(source.source)?;
    let name = c(source.name)?;
    let header_texts = HEADERS
        .iter()
        .map(|h| c(h.source))
        .collect::<Result<Vec<_>>>()?;
    let header_names = HEADERS
        .iter()
        .map(|h| c(h.name))
        .collect::<Result<Vec<_>>>()?;
    let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|s| s.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
    let opts = options(arch)
        .into_iter()
        .chain(extra.iter().map(|o| o.to_string()))
        .map(|o| c(&o))
        .collect::<Result<Vec<_>>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string; the arrays hold
    // `HEADERS.len()` entries each.
    check(unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            text.as_ptr(),
            name.as_ptr(),
            HEADERS.len() as c_int,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    })?;
    let prog = Program(prog);
    // SAFETY: a live program; the options outlive the call.
    let compiled =
        unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
        let log = prog.log().unwrap_or_default();
        return Err(Error::backend(
            "nvrtc",
            format!(
                "compiling {} for {arch}: {}\n{log}",
                source.name,
                NvrtcError(compiled)
            ),
        ));
    }
    let image = if arch.starts_with("sm_") {
        let mut size = 0usize;
        // SAFETY: a compiled program and a valid out-pointer.
        check(unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) })?;
        let mut out = vec![0u8; size];
        // SAFETY: the buffer holds the `size` bytes NVRTC reported.
        check(unsafe { sys::nvrtcGetCUBIN(prog.0, out.as_mut_ptr() as *mut c_char) })?;
        Image::Cubin(out)
    } else {
        let mut size = 0usize;
        // SAFETY: a compiled program and a valid out-pointer.
        check(unsafe { sys::nvrtcGetPTXSize(prog.0, &mut size) })?;
        let mut out = vec![0u8; size];
        // SAFETY: the buffer holds the `size` bytes NVRTC reported (NUL included).
        check(unsafe { sys::nvrtcGetPTX(prog.0, out.as_mut_ptr() as *mut c_char) })?;
        Image::Ptx(out)
    };
    Ok((image, prog.log().unwrap_or_default()))
}

fn check(r: sys::nvrtcResult) -> Result<()> {
    r.result().map_err(nvrtc_error)
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Program {
    fn log(&self) -> Result<String> {
        let mut size = 0usize;
        // SAFETY: a live program and a valid out-pointer.
        check(unsafe { sys::nvrtcGetProgramLogSize(self.0, &mut size) })?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: the buffer holds the `size` bytes NVRTC reported.
        check(unsafe { sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr() as *mut c_char) })?;
        Ok(CStr::from_bytes_until_nul(&buf)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default())
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed only here.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}
