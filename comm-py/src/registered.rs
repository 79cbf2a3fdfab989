//! `Communicator.empty`: tensors in memory the backend registered with every rank
//! ([`Communicator::alloc_registered`](comm_core::Communicator::alloc_registered)), so that
//! collectives on them take its zero-copy path (the backends know their buffers by address).
//!
//! Backends register only memory they allocate, so the module hands out new tensors rather
//! than registering a caller's. Freeing is collective, while Python frees a tensor whenever
//! its last reference goes, at different moments on different ranks: so the communicator
//! owns every buffer until `close()`, which frees them all on every rank together, in
//! allocation order. Torch gets the memory through DLPack: the tensor keeps the buffer's
//! [`Slot`] (DLPack's manager context, let go by its deleter from any thread), not a Python
//! object, and needs no numpy; bf16 has its name there. Other libraries read
//! [`RegisteredMemory`]'s DLPack or `__cuda_array_interface__`. After `close()` every slot
//! is empty and the exporter refuses to export again.

use std::ffi::{CStr, CString, c_void};
use std::sync::{Arc, Mutex, MutexGuard};

use comm_core::{DType, RegisteredBuffer};
use pyo3::exceptions::PyResourceWarning;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{Aborted, CommError, invalid};
use crate::tensor::{DL_CUDA, DlTensor};

/// One registered buffer, or `None` once the communicator freed it.
pub type Slot = Arc<Mutex<Option<Box<dyn RegisteredBuffer>>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing inside these locks can panic half-way; a poisoned lock still holds a value.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The registered buffers of one communicator, in allocation order.
#[derive(Debug, Default)]
pub struct Buffers(Mutex<Vec<Slot>>);

impl Buffers {
    /// Keeps `buffer` until [`Buffers::free_all`]; returns its slot.
    pub fn keep(&self, buffer: Box<dyn RegisteredBuffer>) -> Slot {
        let slot: Slot = Arc::new(Mutex::new(Some(buffer)));
        lock(&self.0).push(slot.clone());
        slot
    }

    /// How many buffers something besides the communicator still refers to (a tensor, or
    /// an exporter not yet collected).
    pub fn still_referenced(&self) -> usize {
        lock(&self.0)
            .iter()
            .filter(|s| Arc::strong_count(s) > 1)
            .count()
    }

    /// Collective: frees every buffer, in allocation order, after waiting for the work
    /// enqueued on device `device` (dropping a buffer requires its streams to be idle, and
    /// which of the program's streams used it is unknown here).
    pub fn free_all(&self, device: Option<usize>) {
        let slots = std::mem::take(&mut *lock(&self.0));
        if slots.is_empty() {
            return;
        }
        if let Some(ctx) = device.and_then(|d| comm_core::cuda::probe::context(d).ok()) {
            // A failed wait means a faulted context: the drops below still meet the peers.
            let _ = ctx.synchronize();
        }
        for slot in slots {
            drop(lock(&slot).take());
        }
    }
}

/// Warns (`ResourceWarning`) when `close()` frees buffers that tensors still alias.
pub fn warn_still_referenced(py: Python<'_>, count: usize) -> PyResult<()> {
    if count == 0 {
        return Ok(());
    }
    let message = CString::new(format!(
        "close() freed {count} registered buffer(s) that tensors from Communicator.empty \
         still alias; using them now is undefined"
    ))
    .expect("no NUL in the message");
    PyErr::warn(py, &py.get_type::<PyResourceWarning>(), &message, 1)
}

/// Registered device memory, exported through DLPack and `__cuda_array_interface__`.
#[pyclass(module = "comm_rs", name = "RegisteredMemory", frozen)]
#[derive(Debug)]
pub struct RegisteredMemory {
    slot: Slot,
    addr: u64,
    shape: Vec<usize>,
    dtype: DType,
    ordinal: i32,
    backend: String,
}

impl RegisteredMemory {
    /// The elements `shape` of `dtype` at the start of the buffer in `slot`.
    pub fn new(slot: Slot, shape: Vec<usize>, dtype: DType) -> PyResult<Self> {
        let (addr, ordinal, backend) = match lock(&slot).as_ref() {
            Some(b) => (b.device_ptr(), b.ordinal() as i32, b.backend().to_string()),
            None => return Err(Aborted::new_err("registered memory already freed")),
        };
        Ok(RegisteredMemory {
            slot,
            addr,
            shape,
            dtype,
            ordinal,
            backend,
        })
    }

    /// The memory as a torch tensor, through DLPack (no copy: checked).
    pub fn into_torch<'py>(
        self,
        py: Python<'py>,
        torch: &Bound<'py, PyModule>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let addr = self.addr;
        let exported = Bound::new(py, self)?;
        let tensor = torch.call_method1(intern!(py, "from_dlpack"), (exported,))?;
        let aliased: u64 = tensor.call_method0(intern!(py, "data_ptr"))?.extract()?;
        if aliased != addr {
            return Err(CommError::new_err(format!(
                "torch.from_dlpack copied the registered memory ({addr:#x} -> {aliased:#x})"
            )));
        }
        Ok(tensor)
    }

    fn check_alive(&self) -> PyResult<Slot> {
        match lock(&self.slot).is_some() {
            true => Ok(self.slot.clone()),
            false => Err(Aborted::new_err(format!(
                "{}: registered memory freed by close()",
                self.backend
            ))),
        }
    }
}

/// DLPack's `DLManagedTensor`: the tensor, what keeps its memory, and how to let go of it.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// What a DLPack consumer holds: the slot (the buffer outlives no communicator, see
/// [`Buffers::free_all`]) and the shape the tensor points at.
struct Held {
    _slot: Slot,
    shape: Vec<i64>,
}

const DLTENSOR: &CStr = c"dltensor";

/// # Safety
/// `t` from [`dlpack_capsule`], deleted once.
unsafe extern "C" fn delete_managed(t: *mut DlManagedTensor) {
    // SAFETY: both boxes were leaked by `dlpack_capsule` for this one call.
    unsafe {
        let t = Box::from_raw(t);
        drop(Box::from_raw(t.manager_ctx as *mut Held));
    }
}

/// A capsule no consumer took still owns its tensor; one taken is renamed
/// (`used_dltensor`) and its consumer calls the deleter.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python on a capsule made by `dlpack_capsule`; `IsValid` sets no
    // error, and `GetPointer` with the name it checked sets none either.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            if !t.is_null() {
                delete_managed(t as *mut DlManagedTensor);
            }
        }
    }
}

/// DLPack's type code and bits of `dtype`.
fn dl_type(dtype: DType) -> (u8, u8) {
    let code = match dtype {
        DType::F16 | DType::F32 | DType::F64 => 2,
        DType::BF16 => 4,
        DType::I32 | DType::I64 => 0,
        _ => 1,
    };
    (code, (dtype.size() * 8) as u8)
}

/// A `dltensor` capsule of `memory` that keeps `slot` until its consumer lets go.
fn dlpack_capsule<'py>(
    py: Python<'py>,
    memory: &RegisteredMemory,
    slot: Slot,
) -> PyResult<Bound<'py, PyAny>> {
    let shape: Vec<i64> = memory.shape.iter().map(|&d| d as i64).collect();
    let held = Box::new(Held { _slot: slot, shape });
    let (code, bits) = dl_type(memory.dtype);
    let managed = Box::new(DlManagedTensor {
        dl_tensor: DlTensor {
            data: memory.addr as usize as *mut c_void,
            device_type: DL_CUDA,
            device_id: memory.ordinal,
            ndim: memory.shape.len() as i32,
            code,
            bits,
            lanes: 1,
            // The Vec's heap buffer does not move when its owner is boxed.
            shape: held.shape.as_ptr(),
            strides: std::ptr::null(),
            byte_offset: 0,
        },
        manager_ctx: Box::into_raw(held) as *mut c_void,
        deleter: Some(delete_managed),
    });
    let managed = Box::into_raw(managed);
    // SAFETY: a valid pointer and a static name; the destructor frees it if unconsumed.
    let capsule = unsafe {
        ffi::PyCapsule_New(
            managed as *mut c_void,
            DLTENSOR.as_ptr(),
            Some(capsule_destructor),
        )
    };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so nothing else owns `managed`.
        unsafe { delete_managed(managed) };
    }
    // SAFETY: a new reference, or null with the error set.
    unsafe { Bound::from_owned_ptr_or_err(py, capsule) }
}

/// numpy's type string of `dtype` in native byte order; bf16 as its raw 16-bit pattern.
fn typestr(dtype: DType) -> String {
    let kind = match dtype {
        DType::F16 | DType::F32 | DType::F64 => 'f',
        DType::I32 | DType::I64 => 'i',
        _ => 'u',
    };
    let order = match (dtype.size(), cfg!(target_endian = "little")) {
        (1, _) => '|',
        (_, true) => '<',
        (_, false) => '>',
    };
    format!("{order}{kind}{}", dtype.size())
}

#[pymethods]
impl RegisteredMemory {
    /// Version 3 of the protocol, C order, no stream to wait for (the memory is new).
    /// Raises `Aborted` once `close()` has freed the memory.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.check_alive()?;
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", typestr(self.dtype))?;
        d.set_item("data", (self.addr, false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    /// A DLPack capsule (legacy, unversioned: what every consumer takes). No stream to
    /// wait for: nothing of this module writes the memory outside a collective call.
    /// Raises `Aborted` once `close()` has freed the memory.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version, dl_device);
        if copy == Some(true) {
            return Err(invalid("registered memory is exported without copying"));
        }
        let slot = self.check_alive()?;
        dlpack_capsule(py, self, slot)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (DL_CUDA, self.ordinal)
    }

    /// The backend that registered it.
    #[getter]
    fn backend(&self) -> &str {
        &self.backend
    }

    /// The element type's name (`__cuda_array_interface__` has no bf16: it shows its 16-bit pattern, `<u2`).
    #[getter]
    fn dtype(&self) -> String {
        self.dtype.to_string()
    }

    /// Whether `close()` has freed it.
    #[getter]
    fn freed(&self) -> bool {
        lock(&self.slot).is_none()
    }

    fn __repr__(&self) -> String {
        format!(
            "RegisteredMemory(backend={:?}, shape={:?}, dtype={}, ptr={:#x}{})",
            self.backend,
            self.shape,
            self.dtype,
            self.addr,
            if self.freed() { ", freed" } else { "" }
        )
    }
}

/// `shape` as `empty` takes it: an int or a sequence of ints (`torch.Size` included).
pub fn parse_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    if let Ok(n) = shape.extract::<usize>() {
        return Ok(vec![n]);
    }
    shape
        .extract::<Vec<usize>>()
        .map_err(|_| invalid(format!("shape {shape} (expected non-negative ints)")))
}
