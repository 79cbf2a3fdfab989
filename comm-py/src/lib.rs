//! `comm-py`: the comm crates for Python, as the module `comm_rs` (PyO3, stable ABI, built
//! by maturin: `pip install ./comm-py`).
//!
//! A thin layer: `Communicator.from_env(backend, device)` joins the job through the
//! launcher's variables (`EnvBootstrap`: torchrun's or mpirun's) and starts a backend by
//! the name `allreduce-perf --backend` takes (`auto`: `comm_select`'s per-call selector).
//! Tensors are read where they are, with no copy: torch tensors through their cheap
//! accessors (device calls go on `torch.cuda.current_stream()`, so they order with the
//! model's kernels and are captured by `torch.cuda.graph`), everything else through
//! `__cuda_array_interface__`, `__array_interface__` or `__dlpack__` (module `tensor`). The GIL
//! is released while a call runs; `comm_core::Error`'s variants arrive as exceptions of the
//! same names (module `errors`). `Communicator.empty` hands out tensors in memory the
//! backend registered with every rank, which its collectives read where it lies (module
//! `registered`). The module links no libpython, libtorch or CUDA library: the crates open
//! CUDA at run time, so one wheel serves every CPython >= 3.9, PyTorch and CUDA. The Python side (`python/comm_rs`) adds the serving engines' custom all-reduce
//! slot and the type stubs.

mod comm;
mod errors;
mod factory;
mod registered;
mod tensor;

use pyo3::prelude::*;

#[pymodule]
#[pyo3(name = "_comm_rs")]
fn comm_rs_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::PyCommunicator>()?;
    m.add_class::<registered::RegisteredMemory>()?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
