//! Reading a Python tensor: where its elements are, how many, of which dtype, on which
//! device and stream.
//!
//! Torch tensors take a fast path: every generic protocol costs microseconds per call in
//! torch (`__cuda_array_interface__` about 1.7 us, `__dlpack__` 2.7, the current stream's
//! `cuda_stream` 4.1), more than the all-reduce it feeds; `data_ptr()`, `numel()`,
//! `dtype`, `get_device()` and `torch._C._cuda_getCurrentRawStream` cost about 0.1 us
//! each. Everything else comes through `__cuda_array_interface__` (device),
//! `__array_interface__` (host: numpy) or `__dlpack__`, in that order.

use std::ffi::c_void;

use comm_core::{BufferMut, BufferRef, DType, MemoryLocation, RawStream};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict, PyString, PyType};

use crate::errors::invalid;

/// One tensor, as a collective sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// Address of the first element.
    pub addr: u64,
    /// Elements.
    pub len: usize,
    /// Element type.
    pub dtype: DType,
    /// CUDA ordinal and stream, or `None` for host memory.
    pub device: Option<(i32, usize)>,
    /// The producer marked the memory read-only.
    pub readonly: bool,
}

impl View {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.len * self.dtype.size()
    }

    /// A read-only buffer view of the tensor.
    ///
    /// # Safety
    /// The tensor must stay alive, and its memory unwritten by others, until the call that
    /// uses the view has finished with it (for device memory: until the work enqueued on
    /// its stream has run).
    pub unsafe fn as_ref(&self) -> comm_core::Result<BufferRef<'static>> {
        match self.device {
            // SAFETY: the caller keeps the device memory alive (see above).
            Some((ordinal, stream)) => Ok(unsafe {
                BufferRef::from_device_ptr(
                    self.addr,
                    self.len,
                    self.dtype,
                    ordinal,
                    RawStream(stream),
                )
            }),
            None => {
                // SAFETY: the producer guarantees `bytes()` readable bytes at `addr` while
                // the tensor lives, which the caller ensures.
                let bytes = unsafe { host_bytes(self.addr, self.bytes()) };
                BufferRef::from_host_bytes(bytes, self.dtype)
            }
        }
    }

    /// A writable buffer view of the tensor.
    ///
    /// # Safety
    /// As [`View::as_ref`], and nothing else may read or write the memory meanwhile.
    pub unsafe fn as_mut(&self) -> comm_core::Result<BufferMut<'static>> {
        match self.device {
            // SAFETY: the caller keeps the device memory alive and unshared (see above).
            Some((ordinal, stream)) => Ok(unsafe {
                BufferMut::from_device_ptr(
                    self.addr,
                    self.len,
                    self.dtype,
                    ordinal,
                    RawStream(stream),
                )
            }),
            None => {
                // SAFETY: as in `as_ref`, and the caller holds the only access.
                let bytes = unsafe { host_bytes_mut(self.addr, self.bytes()) };
                BufferMut::from_host_bytes(bytes, self.dtype)
            }
        }
    }

    /// Where the memory lives, as the backends see it.
    pub fn location(&self) -> MemoryLocation {
        match self.device {
            Some((ordinal, stream)) => MemoryLocation::Device {
                ordinal,
                stream: RawStream(stream),
            },
            None => MemoryLocation::Host,
        }
    }
}

/// Where empty host views point: aligned for every dtype.
static ALIGNED_EMPTY: [u64; 0] = [];

/// # Safety
/// `len` readable bytes at `addr` (any address when `len` is 0).
unsafe fn host_bytes(addr: u64, len: usize) -> &'static [u8] {
    if len == 0 {
        // Producers give empty arrays any address (numpy: 1); views want it aligned.
        // SAFETY: as below, read-only.
        return unsafe { std::slice::from_raw_parts(ALIGNED_EMPTY.as_ptr() as *const u8, 0) };
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len) }
}

/// # Safety
/// `len` writable bytes at `addr`, accessed by nothing else meanwhile.
unsafe fn host_bytes_mut(addr: u64, len: usize) -> &'static mut [u8] {
    if len == 0 {
        // SAFETY: an empty slice at an address aligned for every dtype touches nothing.
        return unsafe { std::slice::from_raw_parts_mut(ALIGNED_EMPTY.as_ptr() as *mut u8, 0) };
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut u8, len) }
}

/// What the torch fast path needs, looked up once torch is imported.
struct Torch {
    tensor: Py<PyType>,
    dtypes: Vec<(Py<PyAny>, DType)>,
    current_stream: Option<Py<PyAny>>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

/// The torch lookups, once the program has imported torch; `None` before that (a torch
/// tensor cannot exist then).
fn torch(py: Python<'_>) -> PyResult<Option<&'static Torch>> {
    if let Some(t) = TORCH.get(py) {
        return Ok(Some(t));
    }
    let modules = py.import("sys")?.getattr("modules")?;
    if !modules.contains("torch")? {
        return Ok(None);
    }
    TORCH
        .get_or_try_init(py, || {
            let torch = py.import("torch")?;
            let mut dtypes = Vec::new();
            for (name, dtype) in [
                ("bfloat16", DType::BF16),
                ("float16", DType::F16),
                ("float32", DType::F32),
                ("float64", DType::F64),
                ("int32", DType::I32),
                ("int64", DType::I64),
                ("uint8", DType::U8),
            ] {
                dtypes.push((torch.getattr(name)?.unbind(), dtype));
            }
            let current_stream = torch
                .getattr("_C")?
                .getattr("_cuda_getCurrentRawStream")
                .ok()
                .map(Bound::unbind);
            Ok::<_, PyErr>(Torch {
                tensor: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
                dtypes,
                current_stream,
            })
        })
        .map(Some)
}

/// Reads `obj`. `dtype` reinterprets its elements (same element size), for element types
/// the producer cannot name (bf16 held in a numpy `uint16` array). `default_device` is
/// the ordinal for `__cuda_array_interface__` objects, which do not say it; `stream` the
/// CUDA stream for device memory other than torch's (default: the legacy stream, 0).
pub fn read(
    obj: &Bound<'_, PyAny>,
    dtype: Option<DType>,
    default_device: Option<usize>,
    stream: Option<usize>,
) -> PyResult<View> {
    let py = obj.py();
    let mut view = if let Some(torch) =
        torch(py)?.filter(|t| obj.is_instance(t.tensor.bind(py)).unwrap_or(false))
    {
        read_torch(obj, torch, stream)?
    } else if let Some(cai) = attr(obj, intern!(py, "__cuda_array_interface__"))? {
        let device = default_device.unwrap_or(0) as i32;
        read_interface(
            &cai,
            Some((device, stream.unwrap_or(0))),
            dtype,
            "__cuda_array_interface__",
        )?
    } else if let Some(ai) = attr(obj, intern!(py, "__array_interface__"))? {
        read_interface(&ai, None, dtype, "__array_interface__")?
    } else if obj.hasattr(intern!(py, "__dlpack__"))? {
        read_dlpack(obj, dtype, stream)?
    } else {
        return Err(invalid(format!(
            "expected a tensor (torch, numpy, or anything with __cuda_array_interface__, \
             __array_interface__ or __dlpack__), got {}",
            obj.get_type().name()?
        )));
    };
    if let Some(to) = dtype {
        view = reinterpret(view, to)?;
    }
    Ok(view)
}

fn attr<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    match obj.getattr(name) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

fn reinterpret(view: View, to: DType) -> PyResult<View> {
    if view.dtype.size() != to.size() {
        return Err(invalid(format!(
            "dtype {to} has {} bytes per element, the tensor's {} has {}",
            to.size(),
            view.dtype,
            view.dtype.size()
        )));
    }
    Ok(View { dtype: to, ..view })
}

fn read_torch(obj: &Bound<'_, PyAny>, torch: &Torch, stream: Option<usize>) -> PyResult<View> {
    let py = obj.py();
    if !obj
        .call_method0(intern!(py, "is_contiguous"))?
        .extract::<bool>()?
    {
        return Err(invalid("tensor is not contiguous"));
    }
    let addr: u64 = obj.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let len: usize = obj.call_method0(intern!(py, "numel"))?.extract()?;
    let dtype_obj = obj.getattr(intern!(py, "dtype"))?;
    let dtype = torch
        .dtypes
        .iter()
        .find(|(d, _)| d.bind(py).is(&dtype_obj))
        .map(|(_, d)| *d)
        .ok_or_else(|| unsupported_dtype(&dtype_obj))?;
    let ordinal: i64 = obj.call_method0(intern!(py, "get_device"))?.extract()?;
    let device = if ordinal < 0 {
        if !obj.getattr(intern!(py, "is_cpu"))?.extract::<bool>()? {
            return Err(invalid(format!(
                "tensor on device {}: only CPU and CUDA tensors are supported",
                obj.getattr(intern!(py, "device"))?
            )));
        }
        None
    } else {
        let stream = match (stream, &torch.current_stream) {
            (Some(s), _) => s,
            (None, Some(current)) => current.bind(py).call1((ordinal,))?.extract()?,
            (None, None) => 0,
        };
        Some((ordinal as i32, stream))
    };
    Ok(View {
        addr,
        len,
        dtype,
        device,
        readonly: false,
    })
}

fn unsupported_dtype(dtype: &Bound<'_, PyAny>) -> PyErr {
    crate::errors::Unsupported::new_err(format!(
        "unsupported: dtype {dtype} (bf16, f16, f32, f64, int32, int64 and uint8 are)"
    ))
}

/// The `__array_interface__` / `__cuda_array_interface__` dictionary (version 3): `data`
/// as `(address, read_only)`, `shape`, `typestr`, and `strides` that must describe a
/// C-contiguous array.
fn read_interface(
    interface: &Bound<'_, PyAny>,
    device: Option<(i32, usize)>,
    reinterpret_as: Option<DType>,
    what: &str,
) -> PyResult<View> {
    let dict = interface
        .cast::<PyDict>()
        .map_err(|_| invalid(format!("{what} is not a dict")))?;
    let item = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        dict.get_item(key)?
            .ok_or_else(|| invalid(format!("{what} has no `{key}`")))
    };
    let data = item("data")?;
    let (addr, readonly): (u64, bool) = data
        .extract()
        .map_err(|_| invalid(format!("{what}: `data` is not (address, read_only)")))?;
    let shape: Vec<usize> = item("shape")?.extract()?;
    let typestr: String = item("typestr")?.extract()?;
    // A type the protocol cannot name (bf16) arrives as bytes of the same size.
    let dtype = match (
        reinterpret_as,
        typestr.get(2..).and_then(|n| n.parse::<usize>().ok()),
    ) {
        (Some(to), Some(size)) if size == to.size() => to,
        _ => dtype_of_typestr(&typestr)?,
    };
    let len = shape.iter().product();
    if let Some(strides) = dict.get_item("strides")?.filter(|s| !s.is_none()) {
        let strides: Vec<isize> = strides.extract()?;
        if !contiguous(&shape, &strides, dtype.size()) {
            return Err(invalid(format!("{what}: the array is not contiguous")));
        }
    }
    if let Some(offset) = dict.get_item("offset")? {
        if offset.extract::<usize>()? != 0 {
            return Err(invalid(format!("{what}: an offset is not supported")));
        }
    }
    Ok(View {
        addr,
        len,
        dtype,
        device,
        readonly,
    })
}

/// C order with every stride matching, ignoring dimensions of extent 1 (whose stride
/// does not matter); an empty array is contiguous.
fn contiguous(shape: &[usize], strides: &[isize], item: usize) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected = item as isize;
    for (&extent, &stride) in shape.iter().zip(strides).rev() {
        if extent != 1 && stride != expected {
            return false;
        }
        expected *= extent as isize;
    }
    shape.len() == strides.len()
}

/// numpy's type strings: byte order, kind, size.
fn dtype_of_typestr(typestr: &str) -> PyResult<DType> {
    let little = cfg!(target_endian = "little");
    let mut chars = typestr.chars();
    let order = chars.next().unwrap_or('?');
    let native = match order {
        '|' | '=' => true,
        '<' => little,
        '>' => !little,
        _ => false,
    };
    let dtype = match chars.as_str() {
        "f2" => Some(DType::F16),
        "f4" => Some(DType::F32),
        "f8" => Some(DType::F64),
        "i4" => Some(DType::I32),
        "i8" => Some(DType::I64),
        "u1" => Some(DType::U8),
        _ => None,
    };
    match dtype {
        Some(d) if native || d == DType::U8 => Ok(d),
        _ => Err(crate::errors::Unsupported::new_err(format!(
            "unsupported: array type `{typestr}` (f2, f4, f8, i4, i8 and u1 in native byte \
             order are; bf16 arrays: pass dtype=\"bf16\" with a 2-byte array)"
        ))),
    }
}

/// DLPack's `DLTensor` (stable since DLPack 0.2, unchanged in 1.x inside
/// `DLManagedTensor`, which the `dltensor` capsule holds; the tensor comes first).
#[repr(C)]
pub(crate) struct DlTensor {
    pub(crate) data: *mut c_void,
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
    pub(crate) ndim: i32,
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
    pub(crate) shape: *const i64,
    pub(crate) strides: *const i64,
    pub(crate) byte_offset: u64,
}

const DL_CPU: i32 = 1;
pub(crate) const DL_CUDA: i32 = 2;
const DL_CUDA_HOST: i32 = 3;

/// `__dlpack__()`: reads the capsule without consuming it, so that the producer's own
/// capsule destructor frees it when the capsule goes.
fn read_dlpack(
    obj: &Bound<'_, PyAny>,
    reinterpret_as: Option<DType>,
    stream: Option<usize>,
) -> PyResult<View> {
    let py = obj.py();
    let capsule = obj.call_method0(intern!(py, "__dlpack__"))?;
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| invalid("__dlpack__ did not return a capsule"))?;
    let pointer = capsule.pointer_checked(Some(c"dltensor"))?;
    // SAFETY: a `dltensor` capsule holds a `DLManagedTensor`, whose first member is the
    // `DLTensor`; the capsule (alive here) owns it.
    let t = unsafe { &*(pointer.as_ptr() as *const DlTensor) };
    let ndim = usize::try_from(t.ndim).map_err(|_| invalid("__dlpack__: negative ndim"))?;
    // SAFETY: `shape` (and `strides` unless null) hold `ndim` entries, per DLPack.
    let shape: Vec<usize> = (0..ndim)
        .map(|i| unsafe { *t.shape.add(i) } as usize)
        .collect();
    let dtype = match (t.code, t.bits, t.lanes) {
        (_, bits, 1) if reinterpret_as.is_some_and(|d| d.size() * 8 == bits as usize) => {
            reinterpret_as.expect("checked")
        }
        (2, 16, 1) => DType::F16,
        (2, 32, 1) => DType::F32,
        (2, 64, 1) => DType::F64,
        (4, 16, 1) => DType::BF16,
        (0, 32, 1) => DType::I32,
        (0, 64, 1) => DType::I64,
        (1, 8, 1) => DType::U8,
        (code, bits, lanes) => {
            return Err(crate::errors::Unsupported::new_err(format!(
                "unsupported: DLPack type code {code}, {bits} bits, {lanes} lanes"
            )));
        }
    };
    if !t.strides.is_null() {
        // SAFETY: as for `shape`.
        let strides: Vec<isize> = (0..ndim)
            .map(|i| unsafe { *t.strides.add(i) } as isize * dtype.size() as isize)
            .collect();
        if !contiguous(&shape, &strides, dtype.size()) {
            return Err(invalid("__dlpack__: the tensor is not contiguous"));
        }
    }
    let device = match t.device_type {
        DL_CPU | DL_CUDA_HOST => None,
        DL_CUDA => Some((t.device_id, stream.unwrap_or(0))),
        other => {
            return Err(invalid(format!(
                "__dlpack__: device type {other} (only CPU and CUDA are supported)"
            )));
        }
    };
    let view = View {
        addr: t.data as u64 + t.byte_offset,
        len: shape.iter().product(),
        dtype,
        device,
        readonly: false,
    };
    Ok(view)
}

/// The name Python users know a dtype by.
pub fn parse_dtype(name: &str) -> PyResult<DType> {
    let dtype = match name.trim_start_matches("torch.") {
        "bf16" | "bfloat16" => DType::BF16,
        "f16" | "float16" | "half" => DType::F16,
        "f32" | "float32" | "float" => DType::F32,
        "f64" | "float64" | "double" => DType::F64,
        "i32" | "int32" => DType::I32,
        "i64" | "int64" => DType::I64,
        "u8" | "uint8" => DType::U8,
        other => {
            return Err(crate::errors::Unsupported::new_err(format!(
                "unsupported: dtype `{other}` (bf16, f16, f32, f64, int32, int64, uint8)"
            )));
        }
    };
    Ok(dtype)
}
