//! The test-data pattern of `fill_check.cu`, on the host.
//!
//! Element `i` of rank `r` under seed `s` is a function of `(s, r, i)` alone, so any
//! process can recompute any rank's data: the device fills and checks with it
//! ([`PatternKernels`](super::PatternKernels)), the host verifies those kernels with it.
//! Floats are 24-bit fractions in `[-1, 1)` rounded once to the dtype; `i32`/`i64` are in
//! `-100..=100`; `u8` is any byte. Keep this file and the kernel in step.

use half::{bf16, f16};

use crate::dtype::{DType, ReduceOp};

/// The dtype code the kernels use.
pub const fn dtype_code(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => 0,
        DType::F64 => 1,
        DType::F16 => 2,
        DType::BF16 => 3,
        DType::I32 => 4,
        DType::I64 => 5,
        DType::U8 => 6,
    }
}

/// The op code the kernels use.
pub const fn op_code(op: ReduceOp) -> u32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Min => 2,
        ReduceOp::Max => 3,
        ReduceOp::Avg => 4,
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The hash behind element `index` of `rank`.
pub fn hash(seed: u64, rank: u32, index: u64) -> u64 {
    splitmix64(seed ^ splitmix64((u64::from(rank) << 40) ^ index))
}

/// Element `index` of `rank`, as a value of `dtype` widened to f64 (exact).
pub fn value(dtype: DType, seed: u64, rank: u32, index: u64) -> f64 {
    let h = hash(seed, rank, index);
    let fraction = ((h >> 40) as i64 - (1 << 23)) as f64 / 8_388_608.0;
    let small = ((h >> 33) % 201) as i64 - 100;
    match dtype {
        DType::F32 | DType::F64 => fraction,
        DType::F16 => f16::from_f32(fraction as f32).to_f64(),
        DType::BF16 => bf16::from_f32(fraction as f32).to_f64(),
        DType::I32 | DType::I64 => small as f64,
        DType::U8 => ((h >> 33) & 0xff) as f64,
    }
}

/// Writes `rank`'s elements `0..out.len() / dtype.size()` into `out`, as the fill kernel does.
pub fn fill_host(dtype: DType, seed: u64, rank: u32, out: &mut [u8]) {
    for (i, chunk) in out.chunks_exact_mut(dtype.size()).enumerate() {
        let v = value(dtype, seed, rank, i as u64);
        match dtype {
            DType::F32 => chunk.copy_from_slice(&(v as f32).to_ne_bytes()),
            DType::F64 => chunk.copy_from_slice(&v.to_ne_bytes()),
            DType::F16 => chunk.copy_from_slice(&f16::from_f64(v).to_ne_bytes()),
            DType::BF16 => chunk.copy_from_slice(&bf16::from_f64(v).to_ne_bytes()),
            DType::I32 => chunk.copy_from_slice(&(v as i32).to_ne_bytes()),
            DType::I64 => chunk.copy_from_slice(&(v as i64).to_ne_bytes()),
            DType::U8 => chunk[0] = v as u8,
        }
    }
}

/// The f64 reference of element `index` of an all-reduce over `world` ranks (integers
/// wrapped to the dtype as the check kernel and `comm_core::reduce` define them), and the
/// tolerance the check kernel grants it.
pub fn all_reduce_reference(
    dtype: DType,
    op: ReduceOp,
    seed: u64,
    world: u32,
    index: u64,
) -> (f64, f64) {
    let xs = (0..world).map(|r| value(dtype, seed, r, index));
    if dtype.is_float() {
        let vals: Vec<f64> = xs.collect();
        let mag: f64 = vals.iter().map(|x| x.abs()).sum();
        let eps = match dtype {
            DType::F32 => f64::from(f32::EPSILON),
            DType::F64 => f64::EPSILON,
            DType::F16 => 2f64.powi(-10),
            _ => 2f64.powi(-7),
        };
        let slack = eps * f64::from(world + 1);
        let sum: f64 = vals.iter().sum();
        match op {
            ReduceOp::Sum => (sum, slack * mag),
            ReduceOp::Avg => (sum / f64::from(world), slack * mag / f64::from(world)),
            ReduceOp::Prod => {
                let p: f64 = vals.iter().product();
                (p, slack * p.abs())
            }
            ReduceOp::Min => (vals.iter().copied().fold(f64::INFINITY, f64::min), 0.0),
            ReduceOp::Max => (vals.iter().copied().fold(f64::NEG_INFINITY, f64::max), 0.0),
        }
    } else {
        let vals: Vec<i64> = xs.map(|x| x as i64).collect();
        let acc = match op {
            ReduceOp::Sum => vals.iter().fold(0i64, |a, &x| a.wrapping_add(x)),
            ReduceOp::Prod => vals.iter().fold(1i64, |a, &x| a.wrapping_mul(x)),
            ReduceOp::Min => vals.iter().copied().min().unwrap_or(0),
            ReduceOp::Max => vals.iter().copied().max().unwrap_or(0),
            ReduceOp::Avg => vals.iter().sum::<i64>() / i64::from(world.max(1)),
        };
        let wrapped = match dtype {
            DType::I32 => f64::from(acc as i32),
            DType::U8 => f64::from(acc as u8),
            _ => acc as f64,
        };
        (wrapped, 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_in_range_and_vary() {
        let seed = 0x1234;
        let vals: Vec<f64> = (0..1000).map(|i| value(DType::F32, seed, 1, i)).collect();
        assert!(vals.iter().all(|v| (-1.0..1.0).contains(v)));
        assert!(vals.iter().any(|&v| v != vals[0]));
        assert_ne!(value(DType::F32, seed, 0, 7), value(DType::F32, seed, 1, 7));
        assert!((0..1000).all(|i| value(DType::I32, seed, 2, i).abs() <= 100.0));
        assert!((0..1000).all(|i| value(DType::U8, seed, 2, i) < 256.0));
    }

    #[test]
    fn host_fill_matches_values() {
        let mut out = vec![0u8; 8 * 2];
        fill_host(DType::BF16, 9, 3, &mut out);
        let got: &[bf16] = bytemuck::cast_slice(&out);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g.to_f64(), value(DType::BF16, 9, 3, i as u64));
        }
    }

    #[test]
    fn integer_references_wrap_like_the_dtype() {
        let (r, tol) = all_reduce_reference(DType::U8, ReduceOp::Sum, 5, 4, 0);
        let manual: u32 = (0..4).map(|k| value(DType::U8, 5, k, 0) as u32).sum();
        assert_eq!(r, f64::from((manual % 256) as u8));
        assert_eq!(tol, 0.0);
    }
}
