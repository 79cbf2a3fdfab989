//! [`KernelCache`]: compile once per (source, arch, NVRTC), load once per context.
//!
//! Images are kept in memory and on disk, under a key made of the source's hash (its
//! text, the headers' texts and the compile options), the arch and the NVRTC version, so
//! that an edited kernel, another GPU or another NVRTC never reuses a stale image. The
//! folder is `$COMM_KERNEL_CACHE` (`off` disables the disk cache), else
//! `$XDG_CACHE_HOME/comm/kernels`, else `$HOME/.cache/comm/kernels`. Disk failures only
//! cost a recompilation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, sys};
use cudarc::nvrtc::Ptx;

use super::nvrtc::{Image, compile, nvrtc_version, options, supported_archs};
use super::{HEADERS, KernelSource, fnv1a64};
use crate::cuda::error::driver_error;
use crate::cuda::probe::arch_of;
use crate::error::{Error, Result};

/// Compiled images and loaded modules, shared by every user in the process
/// ([`KernelCache::global`]).
#[derive(Debug)]
pub struct KernelCache {
    dir: Option<PathBuf>,
    images: Mutex<HashMap<String, Arc<Image>>>,
    modules: Mutex<HashMap<(usize, String), Arc<CudaModule>>>,
}

/// The cache key of `source` compiled for `arch` by NVRTC `version`; also the file name
/// on disk.
pub fn cache_key(source: &KernelSource, arch: &str, version: (i32, i32)) -> String {
    let opts = options(arch).join(" ");
    let mut parts: Vec<&[u8]> = vec![source.source.as_bytes(), opts.as_bytes()];
    for h in HEADERS {
        parts.push(h.name.as_bytes());
        parts.push(h.source.as_bytes());
    }
    let hash = fnv1a64(&parts);
    let stem = source.name.trim_end_matches(".cu");
    let ext = if arch.starts_with("sm_") {
        "cubin"
    } else {
        "ptx"
    };
    format!(
        "{stem}-{arch}-nvrtc{}.{}-{hash:016x}.{ext}",
        version.0, version.1
    )
}

impl KernelCache {
    /// A cache whose disk folder is `dir` (`None`: memory only).
    pub fn new(dir: Option<PathBuf>) -> Self {
        KernelCache {
            dir,
            images: Mutex::new(HashMap::new()),
            modules: Mutex::new(HashMap::new()),
        }
    }

    /// The process-wide cache, in [`KernelCache::default_dir`].
    pub fn global() -> &'static KernelCache {
        static GLOBAL: OnceLock<KernelCache> = OnceLock::new();
        GLOBAL.get_or_init(|| KernelCache::new(Self::default_dir()))
    }

    /// The disk folder from the environment (see the module docs).
    pub fn default_dir() -> Option<PathBuf> {
        if let Ok(dir) = std::env::var("COMM_KERNEL_CACHE") {
            return match dir.as_str() {
                "" | "off" | "0" => None,
                _ => Some(PathBuf::from(dir)),
            };
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
        Some(base.join("comm").join("kernels"))
    }

    /// The disk folder in use, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The image of `source` for `arch`: from memory, else disk, else NVRTC.
    pub fn image(&self, source: &KernelSource, arch: &str) -> Result<Arc<Image>> {
        let key = cache_key(source, arch, nvrtc_version()?);
        if let Some(image) = lock(&self.images)?.get(&key) {
            return Ok(image.clone());
        }
        let cubin = arch.starts_with("sm_");
        let image = match self.read_disk(&key) {
            Some(bytes) if cubin => Image::Cubin(bytes),
            Some(bytes) => Image::Ptx(bytes),
            None => {
                let image = compile(source, arch)?;
                self.write_disk(&key, image.bytes());
                image
            }
        };
        let image = Arc::new(image);
        lock(&self.images)?.insert(key, image.clone());
        Ok(image)
    }

    /// `source` loaded into `ctx`, compiled for its device's arch. Where this NVRTC does
    /// not know the arch (a GPU newer than the library), PTX for the newest arch it knows
    /// is loaded instead and the driver compiles it.
    pub fn module(&self, ctx: &Arc<CudaContext>, source: &KernelSource) -> Result<Arc<CudaModule>> {
        let arch = self.arch_for(ctx)?;
        let key = (
            ctx.cu_ctx() as usize,
            cache_key(source, &arch, nvrtc_version()?),
        );
        if let Some(module) = lock(&self.modules)?.get(&key) {
            return Ok(module.clone());
        }
        let image = self.image(source, &arch)?;
        // Loaded under the lock, so that a context loads a module once: loading may wait
        // for the whole context, and ranks of one process share their device's context.
        let mut modules = lock(&self.modules)?;
        if let Some(module) = modules.get(&key) {
            return Ok(module.clone());
        }
        let module = ctx
            .load_module(Ptx::from_binary(image.bytes().to_vec()))
            .map_err(driver_error)?;
        modules.insert(key, module.clone());
        Ok(module)
    }

    /// Kernel `name` of `source`, loaded into `ctx` completely.
    ///
    /// Under CUDA's lazy loading (the default) a function handle may be only partially
    /// loaded, and its first launch finishes the loading, which may wait for the whole
    /// context: a rank launching a kernel for the first time while a peer's kernel spins on
    /// the same device, waiting for this very rank, would wait until the peer timed out.
    /// So the loading is finished here, where no collective is running yet.
    pub fn function(
        &self,
        ctx: &Arc<CudaContext>,
        source: &KernelSource,
        name: &str,
    ) -> Result<CudaFunction> {
        let function = self
            .module(ctx, source)?
            .load_function(name)
            .map_err(driver_error)?;
        // SAFETY: a valid function handle of a module this cache keeps loaded.
        unsafe { sys::cuFuncLoad(function.cu_function()) }
            .result()
            .map_err(driver_error)?;
        Ok(function)
    }

    fn arch_for(&self, ctx: &CudaContext) -> Result<String> {
        let arch = arch_of(ctx)?;
        let number: i32 = arch[3..].parse().unwrap_or(0);
        let known = supported_archs()?;
        if known.contains(&number) {
            return Ok(arch);
        }
        known
            .iter()
            .copied()
            .filter(|&a| a <= number)
            .max()
            .map(|a| format!("compute_{a}"))
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "this NVRTC cannot compile for {arch} (it knows {known:?})"
                ))
            })
    }

    fn read_disk(&self, key: &str) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.dir.as_ref()?.join(key)).ok()?;
        (!bytes.is_empty()).then_some(bytes)
    }

    fn write_disk(&self, key: &str, bytes: &[u8]) {
        let Some(dir) = &self.dir else { return };
        // Write then rename, so that a concurrent reader never sees half a file.
        let tmp = dir.join(format!(".{key}.{}", std::process::id()));
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, dir.join(key)));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::Aborted("the kernel cache was poisoned by a panic".into()))
}
