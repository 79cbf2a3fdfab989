//! Element types and reduction operators.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::error::{Error, Result};

/// The element type of a buffer taking part in a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary16 ([`half::f16`]); reductions accumulate in f32.
    F16,
    /// bfloat16 ([`half::bf16`]); reductions accumulate in f32.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
}

impl DType {
    /// Every dtype, in a stable order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// Short lower-case name, as accepted by [`FromStr`] (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
        }
    }

    /// True for the floating-point dtypes.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Stable numeric code, used when ranks compare call descriptors.
    pub(crate) const fn code(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F64 => 1,
            DType::F16 => 2,
            DType::BF16 => 3,
            DType::I32 => 4,
            DType::I64 => 5,
            DType::U8 => 6,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        let found = match lower.as_str() {
            "float" | "float32" => Some(DType::F32),
            "double" | "float64" => Some(DType::F64),
            "half" | "float16" | "fp16" => Some(DType::F16),
            "bfloat16" => Some(DType::BF16),
            "int" | "int32" => Some(DType::I32),
            "int64" => Some(DType::I64),
            "uint8" => Some(DType::U8),
            other => DType::ALL.into_iter().find(|d| d.name() == other),
        };
        found.ok_or_else(|| Error::InvalidArgument(format!("unknown dtype `{s}`")))
    }
}

/// A reduction operator.
///
/// `Avg` divides the sum by the world size. On floating-point dtypes the division happens
/// in the accumulation type (f32 for f16/bf16). On integer dtypes `Avg` is the exact mean
/// rounded toward zero: the sum is formed in a wider integer (i128), so it never wraps.
/// `Sum` and `Prod` on integers wrap (two's complement), as NCCL and MPI do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Mean over the ranks (see the type's docs for integers).
    Avg,
}

impl ReduceOp {
    /// Every operator, in a stable order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// Short lower-case name, as accepted by [`FromStr`].
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    pub(crate) const fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Avg => 4,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        let alias = match lower.as_str() {
            "mean" => "avg",
            "product" => "prod",
            other => other,
        };
        ReduceOp::ALL
            .into_iter()
            .find(|op| op.name() == alias)
            .ok_or_else(|| Error::InvalidArgument(format!("unknown reduce op `{s}`")))
    }
}

/// A Rust type that maps to a [`DType`]. Implemented for `f32`, `f64`, [`struct@f16`], [`struct@bf16`],
/// `i32`, `i64` and `u8`; sealed, because backends rely on the mapping being exact.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + sealed::Sealed {
    /// The dtype this type is.
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i32 => I32, i64 => I64, u8 => U8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        for op in ReduceOp::ALL {
            assert_eq!(op.name().parse::<ReduceOp>().unwrap(), op);
        }
        assert_eq!("BFloat16".parse::<DType>().unwrap(), DType::BF16);
        assert!("f8".parse::<DType>().is_err());
        assert!("xor".parse::<ReduceOp>().is_err());
    }

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F16.size(), size_of::<f16>());
        assert_eq!(DType::BF16.size(), size_of::<bf16>());
        assert_eq!(DType::I64.size(), size_of::<i64>());
        assert_eq!(<u8 as Element>::DTYPE, DType::U8);
    }
}
