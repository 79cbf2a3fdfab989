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

/// `--sizes BYTES,...` (suffixes K, M, G: powers of 1024), each a whole number of bf16
/// elements.
pub fn sizes(parser: &mut lexopt::Parser) -> Result<Vec<usize>, String> {
    bf16_sizes(&value(parser)?)
}

fn bf16_sizes(spec: &str) -> Result<Vec<usize>, String> {
    let sizes = crate::perf::args::parse_sizes(spec, None).map_err(|e| e.to_string())?;
    sizes
        .into_iter()
        .map(|b| match usize::try_from(b) {
            Ok(b) if b % 2 == 0 => Ok(b),
            _ => Err(format!(
                "--sizes: {b} bytes are not a whole number of bf16 elements"
            )),
        })
        .collect()
}

/// `--fused ROWSxHIDDEN,...`: shapes of the fused op (`hidden` a non-zero multiple of 8).
pub fn shapes(parser: &mut lexopt::Parser) -> Result<Vec<(usize, usize)>, String> {
    value(parser)?.split(',').map(shape).collect()
}

fn shape(text: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--fused: `{text}` is not ROWSxHIDDEN (hidden a non-zero multiple of 8)");
    let (rows, hidden) = text.trim().split_once(['x', 'X']).ok_or_else(bad)?;
    let rows: usize = rows.parse().map_err(|_| bad())?;
    let hidden: usize = hidden.parse().map_err(|_| bad())?;
    if rows == 0 || hidden == 0 || hidden % 8 != 0 {
        return Err(bad());
    }
    Ok((rows, hidden))
}

#[cfg(test)]
mod tests {
    use super::{bf16_sizes, shape};

    #[test]
    fn sizes_are_whole_bf16_elements() {
        assert_eq!(bf16_sizes("42K,64M"), Ok(vec![42 * 1024, 64 << 20]));
        assert_eq!(bf16_sizes("96K,8"), Ok(vec![8, 96 * 1024]));
        for bad in ["3", "42K,7", "", "x"] {
            assert!(bf16_sizes(bad).is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn shapes_are_rows_by_a_hidden_of_eights() {
        assert_eq!(shape("3x7168"), Ok((3, 7168)));
        assert_eq!(shape(" 4096X8192 "), Ok((4096, 8192)));
        for bad in ["3", "0x7168", "3x0", "3x7", "ax8", "3x8x8"] {
            assert!(shape(bad).is_err(), "{bad} was taken");
        }
    }
}
