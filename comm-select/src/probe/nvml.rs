//! The few NVML calls topology needs, loaded with `dlopen` at run time.
//!
//! NVML tells what CUDA does not: whether two GPUs talk over NVLink (directly or through
//! NVSwitch), how many links a GPU has up, and the PCIe path between two GPUs (the classes
//! of `nvidia-smi topo -m`). A missing `libnvidia-ml.so.1` or a failing call only means
//! "unknown": probing never fails because of NVML.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::topology::PciePath;

type Device = *mut c_void;
type Ret = c_int;
const SUCCESS: Ret = 0;
const P2P_CAPS_INDEX_NVLINK: c_int = 2;
const P2P_STATUS_OK: c_int = 0;
const MAX_LINKS: c_uint = 18;

struct Api {
    by_bus_id: unsafe extern "C" fn(*const c_char, *mut Device) -> Ret,
    common_ancestor: unsafe extern "C" fn(Device, Device, *mut c_int) -> Ret,
    p2p_status: unsafe extern "C" fn(Device, Device, c_int, *mut c_int) -> Ret,
    nvlink_state: unsafe extern "C" fn(Device, c_uint, *mut c_int) -> Ret,
}

// SAFETY: the table holds plain function pointers into a library that stays loaded.
unsafe impl Send for Api {}
// SAFETY: as above; NVML's functions are thread-safe after nvmlInit.
unsafe impl Sync for Api {}

fn api() -> Option<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(load).as_ref()
}

fn load() -> Option<Api> {
    let name = CString::new("libnvidia-ml.so.1").ok()?;
    // SAFETY: dlopen of a library name; a null result is handled.
    let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return None;
    }
    let symbol = |s: &CStr| {
        // SAFETY: `lib` is a live handle; a null result is handled by the caller.
        let p = unsafe { libc::dlsym(lib, s.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    let init = symbol(c"nvmlInit_v2")?;
    // SAFETY: nvmlInit_v2 has the signature `nvmlReturn_t (void)`.
    let init = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> Ret>(init) };
    // SAFETY: a plain call into the loaded library.
    if unsafe { init() } != SUCCESS {
        return None;
    }
    let by_bus_id = symbol(c"nvmlDeviceGetHandleByPciBusId_v2")?;
    let common_ancestor = symbol(c"nvmlDeviceGetTopologyCommonAncestor")?;
    let p2p_status = symbol(c"nvmlDeviceGetP2PStatus")?;
    let nvlink_state = symbol(c"nvmlDeviceGetNvLinkState")?;
    // SAFETY: each symbol has the C signature of the field it fills, as declared in nvml.h.
    let api = unsafe {
        Api {
            by_bus_id: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*const c_char, *mut Device) -> Ret,
            >(by_bus_id),
            common_ancestor: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(Device, Device, *mut c_int) -> Ret,
            >(common_ancestor),
            p2p_status: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(Device, Device, c_int, *mut c_int) -> Ret,
            >(p2p_status),
            nvlink_state: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(Device, c_uint, *mut c_int) -> Ret,
            >(nvlink_state),
        }
    };
    Some(api)
}

fn device(api: &Api, bus_id: &str) -> Option<Device> {
    let id = CString::new(bus_id).ok()?;
    let mut dev: Device = std::ptr::null_mut();
    // SAFETY: valid C string and out-pointer.
    let r = unsafe { (api.by_bus_id)(id.as_ptr(), &mut dev) };
    (r == SUCCESS).then_some(dev)
}

/// What NVML says about the pair of GPUs with these PCI bus ids; `None` without NVML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairInfo {
    /// Active NVLinks of the first GPU when the pair can use NVLink P2P (through NVSwitch
    /// every link of the GPU serves every peer), else 0.
    pub nvlinks: u32,
    /// The PCIe path class.
    pub pcie: PciePath,
}

/// Queries NVML about two GPUs given by PCI bus id (`0000:18:00.0`).
pub fn pair(bus_a: &str, bus_b: &str) -> Option<PairInfo> {
    let api = api()?;
    let (a, b) = (device(api, bus_a)?, device(api, bus_b)?);
    let mut level: c_int = -1;
    // SAFETY: handles from NVML, valid out-pointer.
    let r = unsafe { (api.common_ancestor)(a, b, &mut level) };
    let pcie = if r == SUCCESS {
        match level {
            0 | 10 => PciePath::Pix,
            20 => PciePath::Pxb,
            30 => PciePath::Phb,
            40 => PciePath::Node,
            50 => PciePath::Sys,
            _ => PciePath::Unknown,
        }
    } else {
        PciePath::Unknown
    };
    let mut status: c_int = -1;
    // SAFETY: as above.
    let r = unsafe { (api.p2p_status)(a, b, P2P_CAPS_INDEX_NVLINK, &mut status) };
    let nvlink_p2p = r == SUCCESS && status == P2P_STATUS_OK;
    let nvlinks = if nvlink_p2p {
        (0..MAX_LINKS)
            .filter(|&link| {
                let mut active: c_int = 0;
                // SAFETY: as above; links beyond the GPU's count return an error.
                let r = unsafe { (api.nvlink_state)(a, link, &mut active) };
                r == SUCCESS && active == 1
            })
            .count() as u32
    } else {
        0
    };
    Some(PairInfo { nvlinks, pcie })
}
