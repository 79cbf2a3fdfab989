//! `comm_rs.Communicator`: one rank's communicator, over any tensor [`tensor::read`] reads.
//!
//! Every method reads its tensors with the GIL held, then releases it for the call itself:
//! a host call waits for the peers there, a device call enqueues on the tensor's stream
//! (torch's current stream for torch tensors) and returns.

use std::sync::{Arc, Mutex, MutexGuard};

use comm_core::{Bootstrap, DType, EnvBootstrap, Error, ReduceOp};
use comm_select::{CallInfo, Launch};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{IntoPyObjectExt, intern};

use crate::errors::{invalid, to_py};
use crate::factory::{self, Inner};
use crate::registered::{self, Buffers, RegisteredMemory};
use crate::tensor::{self, View};

/// One rank's communicator (see the module docs of `comm_rs`).
#[pyclass(module = "comm_rs", name = "Communicator", frozen)]
#[derive(Debug)]
pub struct PyCommunicator {
    /// `None` once closed.
    inner: Mutex<Option<Inner>>,
    /// What `empty` allocated, freed with the communicator.
    registered: Buffers,
    rank: usize,
    world_size: usize,
    backend: String,
    device: Option<usize>,
}

/// Keyword arguments every tensor method shares.
struct Reading {
    dtype: Option<DType>,
    device: Option<usize>,
    stream: Option<usize>,
}

impl Reading {
    fn read(&self, obj: &Bound<'_, PyAny>) -> PyResult<View> {
        tensor::read(obj, self.dtype, self.device, self.stream)
    }

    fn read_out(&self, obj: &Bound<'_, PyAny>) -> PyResult<View> {
        let view = self.read(obj)?;
        if view.readonly {
            return Err(invalid("the output tensor is read-only"));
        }
        Ok(view)
    }
}

fn parse_op(op: &str) -> PyResult<ReduceOp> {
    op.parse().map_err(to_py)
}

impl PyCommunicator {
    fn reading(&self, dtype: Option<&str>, stream: Option<usize>) -> PyResult<Reading> {
        Ok(Reading {
            dtype: dtype.map(tensor::parse_dtype).transpose()?,
            device: self.device,
            stream,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Option<Inner>> {
        // A panic inside a call poisons the lock; the communicator's own state decides
        // whether it is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the communicator with the GIL released.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Inner) -> comm_core::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| match self.lock().as_ref() {
            Some(inner) => f(inner),
            None => Err(Error::Aborted(format!("{}: closed", self.backend))),
        })
        .map_err(to_py)
    }
}

/// A new 1-D tensor of `len` elements like `like` (torch: `new_empty`; numpy: `empty`).
fn new_output<'py>(like: &Bound<'py, PyAny>, len: usize) -> PyResult<Bound<'py, PyAny>> {
    let py = like.py();
    if like.hasattr(intern!(py, "new_empty"))? {
        return like.call_method1(intern!(py, "new_empty"), ((len,),));
    }
    if like.hasattr(intern!(py, "__array_interface__"))? {
        let numpy = py.import("numpy")?;
        let dtype = like.getattr(intern!(py, "dtype"))?;
        return numpy.call_method1("empty", (len, dtype));
    }
    Err(invalid(
        "pass `out=`: no way to allocate a tensor like the input",
    ))
}

#[pymethods]
impl PyCommunicator {
    /// Joins the job this process belongs to (torchrun's `RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, or mpirun's) with
    /// backend `backend`, on CUDA device `device` (an ordinal, `"cuda:N"` or a
    /// `torch.device`; `None`: `LOCAL_RANK % device_count`). Collective.
    #[staticmethod]
    #[pyo3(signature = (backend = "auto".to_string(), device = None))]
    fn from_env(
        py: Python<'_>,
        backend: String,
        device: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let device = device.map(|d| parse_device(&d)).transpose()?;
        factory::check_name(&backend).map_err(to_py)?;
        let (inner, device) = py
            .detach(|| {
                let bootstrap: Arc<dyn Bootstrap> = Arc::new(EnvBootstrap::from_env()?);
                factory::start(&backend, bootstrap, device)
            })
            .map_err(to_py)?;
        let comm = inner.comm();
        Ok(PyCommunicator {
            rank: comm.rank(),
            world_size: comm.world_size(),
            backend: comm.name().to_string(),
            device,
            inner: Mutex::new(Some(inner)),
            registered: Buffers::default(),
        })
    }

    /// The names `from_env` takes.
    #[staticmethod]
    fn backends() -> Vec<&'static str> {
        factory::names()
    }

    /// This rank, in `0..world_size`.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.world_size
    }

    /// The backend's name (`auto` for the per-call selector).
    #[getter]
    fn backend(&self) -> &str {
        &self.backend
    }

    /// The CUDA ordinal device calls use, or `None` for host backends.
    #[getter]
    fn device(&self) -> Option<usize> {
        self.device
    }

    /// The backends `auto` chooses among (the backend itself otherwise).
    #[getter]
    fn members(&self) -> Vec<String> {
        match self.lock().as_ref() {
            Some(Inner::Select(s)) => s.backend_names(),
            _ => vec![self.backend.clone()],
        }
    }

    /// Reduces `t` across ranks with `op` (`sum`, `prod`, `min`, `max`, `avg`): into `out`
    /// when given, else in place. Returns the result tensor.
    #[pyo3(signature = (t, op = "sum".to_string(), out = None, *, dtype = None, stream = None))]
    fn all_reduce<'py>(
        &self,
        py: Python<'py>,
        t: Bound<'py, PyAny>,
        op: String,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<String>,
        stream: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let reading = self.reading(dtype.as_deref(), stream)?;
        let op = parse_op(&op)?;
        match out {
            None => {
                let buf = reading.read_out(&t)?;
                self.run(py, |c| {
                    // SAFETY: `t` is alive (held by this frame) until the call returns,
                    // and a device call orders its work on the tensor's stream.
                    c.comm().all_reduce_in_place(unsafe { buf.as_mut()? }, op)
                })?;
                Ok(t)
            }
            Some(out) => {
                let send = reading.read(&t)?;
                let recv = reading.read_out(&out)?;
                self.run(py, |c| {
                    // SAFETY: as above, for both tensors.
                    let (s, r) = unsafe { (send.as_ref()?, recv.as_mut()?) };
                    c.comm().all_reduce(s, r, op)
                })?;
                Ok(out)
            }
        }
    }

    /// Gathers every rank's `t` into `out` (`world_size * t.numel()` elements, rank
    /// order; allocated when omitted). Returns `out`.
    #[pyo3(signature = (t, out = None, *, dtype = None, stream = None))]
    fn all_gather<'py>(
        &self,
        py: Python<'py>,
        t: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<String>,
        stream: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let reading = self.reading(dtype.as_deref(), stream)?;
        let send = reading.read(&t)?;
        let out = match out {
            Some(out) => out,
            None => new_output(&t, send.len * self.world_size)?,
        };
        let recv = reading.read_out(&out)?;
        self.run(py, |c| {
            // SAFETY: both tensors are held by this frame until the call returns.
            let (s, r) = unsafe { (send.as_ref()?, recv.as_mut()?) };
            c.comm().all_gather(s, r)
        })?;
        Ok(out)
    }

    /// Reduces `t` (`world_size * n` elements) across ranks; this rank's slice `n * rank ..
    /// n * (rank + 1)` of the result goes to `out` (allocated when omitted). Returns `out`.
    #[pyo3(signature = (t, out = None, op = "sum".to_string(), *, dtype = None, stream = None))]
    fn reduce_scatter<'py>(
        &self,
        py: Python<'py>,
        t: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        op: String,
        dtype: Option<String>,
        stream: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let reading = self.reading(dtype.as_deref(), stream)?;
        let op = parse_op(&op)?;
        let send = reading.read(&t)?;
        let out = match out {
            Some(out) => out,
            None => {
                if send.len % self.world_size != 0 {
                    return Err(invalid(format!(
                        "reduce_scatter: {} elements are not divisible by world_size {}",
                        send.len, self.world_size
                    )));
                }
                new_output(&t, send.len / self.world_size)?
            }
        };
        let recv = reading.read_out(&out)?;
        self.run(py, |c| {
            // SAFETY: both tensors are held by this frame until the call returns.
            let (s, r) = unsafe { (send.as_ref()?, recv.as_mut()?) };
            c.comm().reduce_scatter(s, r, op)
        })?;
        Ok(out)
    }

    /// Copies rank `root`'s `t` into `t` on every rank. Returns `t`.
    #[pyo3(signature = (t, root = 0, *, dtype = None, stream = None))]
    fn broadcast<'py>(
        &self,
        py: Python<'py>,
        t: Bound<'py, PyAny>,
        root: usize,
        dtype: Option<String>,
        stream: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let buf = self.reading(dtype.as_deref(), stream)?.read_out(&t)?;
        self.run(py, |c| {
            // SAFETY: `t` is held by this frame until the call returns.
            c.comm().broadcast(unsafe { buf.as_mut()? }, root)
        })?;
        Ok(t)
    }

    /// Returns once every rank has entered the barrier.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |c| c.comm().barrier())
    }

    /// Raises the error that enqueued work recorded after its call returned (a peer that
    /// disagreed or never came), if any; such an error leaves the communicator unusable.
    fn async_error(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |c| c.comm().async_error())
    }

    /// Which backend (and algorithm) an all-reduce of `t` with `op` goes to, and why: as
    /// it would run now (captured when its stream is capturing), or as captured (`graph`).
    #[pyo3(signature = (t, op = "sum".to_string(), graph = false, *, dtype = None))]
    fn explain(
        &self,
        t: Bound<'_, PyAny>,
        op: String,
        graph: bool,
        dtype: Option<String>,
    ) -> PyResult<String> {
        let view = self.reading(dtype.as_deref(), None)?.read(&t)?;
        let op = parse_op(&op)?;
        // SAFETY: the view is only described, never read or written.
        let buf = unsafe { view.as_ref() }.map_err(to_py)?;
        let mut call = CallInfo::of_all_reduce(&buf, op);
        if graph {
            call = call.with_launch(Launch::Graph);
        }
        Ok(match self.lock().as_ref() {
            Some(Inner::Select(s)) => s.explain(&call),
            Some(inner) => {
                let caps = inner.comm().capabilities();
                let verdict = caps.check(
                    &self.backend,
                    call.collective,
                    call.dtype,
                    call.op,
                    call.bytes,
                    view.location(),
                );
                match verdict {
                    Ok(()) => format!(
                        "{} of {} B {}: {} (chosen by name)",
                        call.collective, call.bytes, call.dtype, self.backend
                    ),
                    Err(e) => format!(
                        "{} of {} B {}: {e}",
                        call.collective, call.bytes, call.dtype
                    ),
                }
            }
            None => format!("{}: closed", self.backend),
        })
    }

    /// The fused all-reduce + residual add + RMSNorm (bf16, rows of `weight.numel()`):
    /// `residual += all_reduce(t)`, then `out = rmsnorm(residual) * weight`. `out`
    /// (allocated when omitted) is returned; `residual` is updated in place. Backends
    /// `ipc` and `symm-cuda` have it.
    #[pyo3(signature = (t, residual, weight, eps = 1e-6, out = None, *, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_residual_rmsnorm<'py>(
        &self,
        py: Python<'py>,
        t: Bound<'py, PyAny>,
        residual: Bound<'py, PyAny>,
        weight: Bound<'py, PyAny>,
        eps: f32,
        out: Option<Bound<'py, PyAny>>,
        stream: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let reading = self.reading(None, stream)?;
        let input = reading.read(&t)?;
        let res = reading.read_out(&residual)?;
        let w = reading.read(&weight)?;
        let out = match out {
            Some(out) => out,
            None => new_output(&t, input.len)?,
        };
        let o = reading.read_out(&out)?;
        let backend = self.backend.clone();
        self.run(py, move |c| {
            let peer = c.peer().ok_or_else(|| {
                Error::Unsupported(format!(
                    "{backend}: no fused all-reduce + RMSNorm (ipc and symm-cuda have it)"
                ))
            })?;
            // SAFETY: every tensor is held by this frame until the call returns, and the
            // work is ordered on their stream.
            unsafe {
                peer.all_reduce_residual_rmsnorm(
                    input.as_ref()?,
                    res.as_mut()?,
                    o.as_mut()?,
                    w.as_ref()?,
                    eps,
                )
            }
        })?;
        Ok(out)
    }

    /// Collective: a new tensor of `shape` and `dtype` (a name or a `torch.dtype`; f32 by
    /// default) in device memory the backend registered with every rank, so that
    /// collectives on it (or on a slice of it) take the backend's zero-copy path. Every
    /// rank allocates the same shapes in the same order; the contents are unspecified. A
    /// torch tensor when torch is imported, else a `RegisteredMemory` (DLPack and
    /// `__cuda_array_interface__`). The memory lives until `close()`, which frees all of
    /// it: allocate once and reuse. Raises `Unsupported` where the backend registers
    /// nothing (host backends).
    #[pyo3(signature = (shape, dtype = None, device = None))]
    fn empty<'py>(
        &self,
        py: Python<'py>,
        shape: Bound<'py, PyAny>,
        dtype: Option<Bound<'py, PyAny>>,
        device: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dtype = match dtype {
            None => DType::F32,
            Some(d) => match d.extract::<String>() {
                Ok(name) => tensor::parse_dtype(&name)?,
                Err(_) => tensor::parse_dtype(&d.str()?.to_string())?,
            },
        };
        let shape = registered::parse_shape(&shape)?;
        if let (Some(asked), Some(own)) =
            (device.map(|d| parse_device(&d)).transpose()?, self.device)
        {
            if asked != own {
                return Err(invalid(format!(
                    "device {asked}: this communicator's memory is on device {own}"
                )));
            }
        }
        let bytes = shape
            .iter()
            .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
            .ok_or_else(|| invalid(format!("shape {shape:?} overflows")))?;
        if bytes == 0 {
            return Err(invalid(format!(
                "shape {shape:?}: registered memory needs at least one element"
            )));
        }
        // Kept while `run` holds the communicator, so that a `close()` on another thread
        // cannot miss it.
        let slot = self.run(py, |c| {
            Ok(self.registered.keep(c.comm().alloc_registered(bytes)?))
        })?;
        let memory = RegisteredMemory::new(slot, shape, dtype)?;
        let modules = py.import("sys")?.getattr("modules")?;
        match modules.get_item("torch") {
            Ok(torch) => memory.into_torch(py, torch.cast::<PyModule>()?),
            Err(_) => Ok(Bound::new(py, memory)?.into_any()),
        }
    }

    /// Collective: frees the communicator and every buffer `empty` allocated, on every
    /// rank together (after waiting for the device's work). Later calls raise `Aborted`,
    /// and so does exporting such a buffer again; torch kernels on a tensor from `empty`
    /// would use freed memory, so drop those tensors first (a `ResourceWarning` tells of
    /// any still alive).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let alive = self.registered.still_referenced();
        py.detach(|| {
            let mut inner = self.lock();
            self.registered.free_all(self.device);
            drop(inner.take());
        });
        registered::warn_still_referenced(py, alive)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: Bound<'_, PyTuple>) -> PyResult<Py<PyAny>> {
        self.close(py)?;
        false.into_py_any(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "Communicator(backend={:?}, rank={}, world_size={}, device={})",
            self.backend,
            self.rank,
            self.world_size,
            self.device.map_or("None".to_string(), |d| d.to_string())
        )
    }
}

/// A communicator collected without `close()` still frees its registered buffers before
/// its backend, as `close()` does: left to the tensors, they would be freed one rank at a
/// time.
impl Drop for PyCommunicator {
    fn drop(&mut self) {
        let mut inner = self.lock();
        self.registered.free_all(self.device);
        drop(inner.take());
    }
}

/// An ordinal, `"cuda:N"`, `"cuda"` (device 0) or anything with an integer `index`
/// (`torch.device`).
fn parse_device(d: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(n) = d.extract::<usize>() {
        return Ok(n);
    }
    if let Ok(s) = d.extract::<String>() {
        return match s.strip_prefix("cuda") {
            Some("") => Ok(0),
            Some(rest) => rest
                .strip_prefix(':')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| invalid(format!("device `{s}`"))),
            None => Err(invalid(format!("device `{s}` (expected cuda:N)"))),
        };
    }
    match d.getattr("index") {
        Ok(index) if !index.is_none() => index.extract(),
        Ok(_) => Ok(0),
        Err(_) => Err(invalid(format!("device {d}"))),
    }
}
