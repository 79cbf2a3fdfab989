//! Inputs, references and comparisons.
//!
//! Every rank can generate every rank's input (a pure function of seed, case and rank), so
//! each rank computes its own reference locally, in f64 (floats) or exact i128 integers,
//! without trusting the backend under test for anything.

use half::{bf16, f16};

use crate::dtype::{DType, ReduceOp};

/// splitmix64: tiny, fast, good enough for test data, identical on every rank.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub(crate) fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }
}

/// Element values, widened: floats as f64, integers as i128.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Values {
    Float(Vec<f64>),
    Int(Vec<i128>),
}

/// Deterministic input of `rank` for a case, as raw bytes of `dtype`.
pub(crate) fn input(
    dtype: DType,
    op: Option<ReduceOp>,
    seed: u64,
    rank: usize,
    len: usize,
) -> Vec<u8> {
    let mut rng = SplitMix::new(seed ^ (rank as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f));
    // Products stay in range when every factor is near 1; sums cancel realistically in [-1, 1).
    let (lo, hi) = if op == Some(ReduceOp::Prod) {
        (0.5, 2.0)
    } else {
        (-1.0, 1.0)
    };
    let mut out = Vec::with_capacity(len * dtype.size());
    for _ in 0..len {
        match dtype {
            DType::F32 => out.extend_from_slice(&(rng.uniform(lo, hi) as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&rng.uniform(lo, hi).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f64(rng.uniform(lo, hi)).to_le_bytes()),
            DType::BF16 => {
                out.extend_from_slice(&bf16::from_f64(rng.uniform(lo, hi)).to_le_bytes())
            }
            DType::I32 => out.extend_from_slice(&(rng.next_u64() as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(rng.next_u64() as i64).to_le_bytes()),
            DType::U8 => out.push(rng.next_u64() as u8),
        }
    }
    out
}

/// Decodes raw bytes of `dtype` into wide values.
pub(crate) fn decode(dtype: DType, bytes: &[u8]) -> Values {
    let size = dtype.size();
    let chunks = bytes.chunks_exact(size);
    match dtype {
        DType::F32 => Values::Float(
            chunks
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
        ),
        DType::F64 => Values::Float(
            chunks
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        DType::F16 => Values::Float(
            chunks
                .map(|c| f16::from_le_bytes(c.try_into().unwrap()).to_f64())
                .collect(),
        ),
        DType::BF16 => Values::Float(
            chunks
                .map(|c| bf16::from_le_bytes(c.try_into().unwrap()).to_f64())
                .collect(),
        ),
        DType::I32 => Values::Int(
            chunks
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i128)
                .collect(),
        ),
        DType::I64 => Values::Int(
            chunks
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as i128)
                .collect(),
        ),
        DType::U8 => Values::Int(bytes.iter().map(|&b| b as i128).collect()),
    }
}

/// Wraps an exact integer into the range of `dtype`, as two's-complement arithmetic does.
fn wrap(dtype: DType, v: i128) -> i128 {
    match dtype {
        DType::I32 => v as i32 as i128,
        DType::I64 => v as i64 as i128,
        DType::U8 => v as u8 as i128,
        _ => v,
    }
}

/// The exact reduction of `inputs` (one per rank) with its error scale.
#[derive(Debug)]
pub(crate) struct Reference {
    pub(crate) values: Values,
    /// Per element, the sum of input magnitudes (floats only): the scale of rounding errors.
    pub(crate) magnitude: Vec<f64>,
}

/// Element `i` of raw `dtype` bytes, as f64 (floats) or i128 (integers).
fn float_at(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let size = dtype.size();
    let c = &bytes[i * size..(i + 1) * size];
    match dtype {
        DType::F32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
        DType::F64 => f64::from_le_bytes(c.try_into().unwrap()),
        DType::F16 => f16::from_le_bytes(c.try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_le_bytes(c.try_into().unwrap()).to_f64(),
        _ => unreachable!("float_at on an integer dtype"),
    }
}

fn int_at(dtype: DType, bytes: &[u8], i: usize) -> i128 {
    let size = dtype.size();
    let c = &bytes[i * size..(i + 1) * size];
    match dtype {
        DType::I32 => i32::from_le_bytes(c.try_into().unwrap()) as i128,
        DType::I64 => i64::from_le_bytes(c.try_into().unwrap()) as i128,
        DType::U8 => c[0] as i128,
        _ => unreachable!("int_at on a float dtype"),
    }
}

/// Reduces every rank's input (raw bytes, indexed by rank) over `range` of elements, in
/// f64 or exact integers. Decodes on the fly: large cases hold no widened copies.
pub(crate) fn reduce(
    dtype: DType,
    op: ReduceOp,
    inputs: &[Vec<u8>],
    range: std::ops::Range<usize>,
) -> Reference {
    let n = inputs.len();
    if dtype.is_float() {
        let mut values = Vec::with_capacity(range.len());
        let mut magnitude = Vec::with_capacity(range.len());
        for i in range {
            let xs = inputs.iter().map(|r| float_at(dtype, r, i));
            let v = match op {
                ReduceOp::Sum => xs.sum(),
                ReduceOp::Avg => xs.sum::<f64>() / n as f64,
                ReduceOp::Prod => xs.product(),
                ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
                ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
            };
            values.push(v);
            magnitude.push(inputs.iter().map(|r| float_at(dtype, r, i).abs()).sum());
        }
        return Reference {
            values: Values::Float(values),
            magnitude,
        };
    }
    let values = range
        .map(|i| {
            let xs = inputs.iter().map(|r| int_at(dtype, r, i));
            match op {
                ReduceOp::Sum => wrap(dtype, xs.fold(0i128, i128::wrapping_add)),
                ReduceOp::Prod => {
                    wrap(dtype, xs.fold(1i128, |a, b| wrap(dtype, a.wrapping_mul(b))))
                }
                ReduceOp::Min => xs.min().unwrap(),
                ReduceOp::Max => xs.max().unwrap(),
                ReduceOp::Avg => xs.sum::<i128>() / n as i128,
            }
        })
        .collect();
    Reference {
        values: Values::Int(values),
        magnitude: Vec::new(),
    }
}

/// Unit roundoff of the stored dtype and of its accumulation type.
fn roundoff(dtype: DType) -> (f64, f64) {
    let f32_u = f64::from(f32::EPSILON) / 2.0;
    match dtype {
        DType::F64 => (f64::EPSILON / 2.0, f64::EPSILON / 2.0),
        DType::F32 => (f32_u, f32_u),
        DType::F16 => (f64::from(f16::EPSILON.to_f32()) / 2.0, f32_u),
        DType::BF16 => (f64::from(bf16::EPSILON.to_f32()) / 2.0, f32_u),
        _ => (0.0, 0.0),
    }
}

/// Smallest positive subnormal of `dtype`: the absolute rounding error near zero.
fn tiny(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::from_bits(1),
        DType::F32 => f64::from(f32::from_bits(1)),
        DType::F16 => f16::from_bits(1).to_f64(),
        DType::BF16 => bf16::from_bits(1).to_f64(),
        _ => 0.0,
    }
}

/// The largest error a correct backend may make on one element: accumulation error over
/// `n` terms (any order, in the accumulation type) plus the final rounding to `dtype`.
pub(crate) fn allowed_error(
    dtype: DType,
    op: ReduceOp,
    n: usize,
    reference: f64,
    magnitude: f64,
) -> f64 {
    if matches!(op, ReduceOp::Min | ReduceOp::Max) {
        return 0.0;
    }
    let (u_out, u_acc) = roundoff(dtype);
    let n = n as f64;
    let accumulate = match op {
        ReduceOp::Min | ReduceOp::Max => 0.0,
        ReduceOp::Sum => n * u_acc * magnitude,
        ReduceOp::Avg => (n * u_acc * magnitude + u_acc * reference.abs() * n) / n,
        ReduceOp::Prod => 2.0 * n * u_acc * reference.abs(),
    };
    2.0 * (accumulate + u_out * reference.abs()) + tiny(dtype)
}

/// Counts the elements of `got` that are not within tolerance of `reference`.
/// Integers and min/max must match exactly; NaN never passes.
pub(crate) fn count_wrong(
    dtype: DType,
    op: ReduceOp,
    n: usize,
    got: &Values,
    reference: &Reference,
) -> usize {
    match (got, &reference.values) {
        (Values::Float(got), Values::Float(want)) => got
            .iter()
            .zip(want)
            .zip(&reference.magnitude)
            .filter(|((g, w), m)| !within(**g, **w, allowed_error(dtype, op, n, **w, **m)))
            .count(),
        (Values::Int(got), Values::Int(want)) => {
            got.iter().zip(want).filter(|(g, w)| g != w).count()
        }
        _ => got_len(got).max(1),
    }
}

/// `got` is within `allowed` of `want`; NaN never is.
fn within(got: f64, want: f64, allowed: f64) -> bool {
    (got - want)
        .abs()
        .partial_cmp(&allowed)
        .is_some_and(|o| o.is_le())
}

fn got_len(v: &Values) -> usize {
    match v {
        Values::Float(x) => x.len(),
        Values::Int(x) => x.len(),
    }
}

/// A byte pattern that no correct output holds by chance: NaN for floats, 0xA5.. for integers.
pub(crate) fn poison(dtype: DType, len: usize) -> Vec<u8> {
    let byte = if dtype.is_float() { 0xff } else { 0xa5 };
    vec![byte; len * dtype.size()]
}

/// FNV-1a over bytes: a digest to compare results across ranks.
pub(crate) fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_deterministic_per_rank_and_never_all_zero() {
        let a = input(DType::BF16, Some(ReduceOp::Sum), 7, 1, 100);
        assert_eq!(a, input(DType::BF16, Some(ReduceOp::Sum), 7, 1, 100));
        assert_ne!(a, input(DType::BF16, Some(ReduceOp::Sum), 7, 2, 100));
        assert!(a.iter().any(|&b| b != 0));
    }

    #[test]
    fn tolerance_accepts_rounding_and_rejects_real_errors() {
        let bf16s = |v: [f64; 2]| {
            v.iter()
                .flat_map(|x| bf16::from_f64(*x).to_le_bytes())
                .collect::<Vec<u8>>()
        };
        let inputs = vec![bf16s([0.1, 1.0]), bf16s([0.2, 2.0]), bf16s([0.3, 3.0])];
        let reference = reduce(DType::BF16, ReduceOp::Sum, &inputs, 0..2);
        let rounded = Values::Float(vec![bf16::from_f64(0.6).to_f64(), 6.0]);
        assert_eq!(
            count_wrong(DType::BF16, ReduceOp::Sum, 3, &rounded, &reference),
            0
        );
        let off = Values::Float(vec![0.6 * 1.02, f64::NAN]);
        assert_eq!(
            count_wrong(DType::BF16, ReduceOp::Sum, 3, &off, &reference),
            2
        );
    }

    #[test]
    fn integer_reference_wraps_like_the_dtype() {
        let inputs = vec![vec![250u8, 7], vec![10u8, 8]];
        let sum = reduce(DType::U8, ReduceOp::Sum, &inputs, 0..2);
        assert_eq!(sum.values, Values::Int(vec![4, 15]));
        let avg = reduce(DType::U8, ReduceOp::Avg, &inputs, 0..2);
        assert_eq!(avg.values, Values::Int(vec![130, 7]));
    }
}
