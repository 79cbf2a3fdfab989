//! The arguments `gpu-check` and `gpu-bench` share.

use comm_peer::Algorithm;
use comm_symm::cuda::Backing;

use super::Backend;

/// The value of the option just read, as text.
pub fn value(parser: &mut lexopt::Parser) -> Result<String, String> {
    parser
        .value()
        .map_err(|e| e.to_string())?
        .into_string()
        .map_err(|v| format!("not text: {v:?}"))
}

/// `--backend ipc|symm-cuda`.
pub fn backend(parser: &mut lexopt::Parser) -> Result<Backend, String> {
    value(parser)?.parse().map_err(|e| format!("{e}"))
}

/// `--algo NAME,NAME,...`.
pub fn algorithms(parser: &mut lexopt::Parser) -> Result<Vec<Algorithm>, String> {
    value(parser)?
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{e}"))
}

/// `--backing auto|vmm|ipc|host|host-vmm`.
pub fn backing(parser: &mut lexopt::Parser) -> Result<Backing, String> {
    Backing::parse(&value(parser)?).map_err(|e| format!("{e}"))
}

/// A whole number for `what`.
pub fn number(parser: &mut lexopt::Parser, what: &str) -> Result<usize, String> {
    let v = value(parser)?;
    v.parse()
        .map_err(|_| format!("{what}: a number, got `{v}`"))
}
