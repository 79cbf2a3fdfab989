//! Test data and references of the GPU checks: fresh random inputs per case, the f64
//! reference with its tolerance, the fused op's reference, and digests for comparing
//! results across ranks.

use comm_core::{DType, ReduceOp, bf16, f16};

/// Every rank's input bytes for a case, from the seed: random values in [-1, 1).
pub fn all_inputs(dtype: DType, count: usize, seed: u64, world: usize) -> Vec<Vec<u8>> {
    (0..world)
        .map(|r| {
            let mut s = seed ^ ((r as u64 + 1) << 48);
            (0..count)
                .flat_map(|_| {
                    s = splitmix(s);
                    let v = ((s >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0;
                    match dtype {
                        DType::BF16 => bf16::from_f64(v).to_le_bytes().to_vec(),
                        DType::F16 => f16::from_f64(v).to_le_bytes().to_vec(),
                        _ => (v as f32).to_le_bytes().to_vec(),
                    }
                })
                .collect()
        })
        .collect()
}

/// Element `i` of `bytes` (bf16, f16 or f32) as f64.
pub fn decode(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
    }
}

/// Elements outside tolerance of the f64 reference: the output's rounding plus f32
/// accumulation over the ranks. NaN, or an unwritten (poisoned) element, fails.
pub fn count_wrong(
    dtype: DType,
    op: ReduceOp,
    inputs: &[Vec<u8>],
    got: &[u8],
    count: usize,
) -> usize {
    let n = inputs.len();
    let eps = match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    };
    (0..count)
        .filter(|&i| {
            let xs: Vec<f64> = inputs.iter().map(|x| decode(dtype, x, i)).collect();
            let sum_abs: f64 = xs.iter().map(|x| x.abs()).sum();
            let reference = match op {
                ReduceOp::Sum => xs.iter().sum(),
                ReduceOp::Avg => xs.iter().sum::<f64>() / n as f64,
                ReduceOp::Max => xs.iter().copied().fold(f64::MIN, f64::max),
                _ => xs.iter().copied().fold(f64::MAX, f64::min),
            };
            let g = decode(dtype, got, i);
            let tol = eps * reference.abs() + n as f64 * 2f64.powi(-23) * sum_abs + 1e-30;
            (g - reference).abs().partial_cmp(&tol) != Some(std::cmp::Ordering::Less)
        })
        .count()
}

/// The fused op in f64, following the kernel's rounding points: the all-reduce's bf16
/// result, the bf16 residual, then the norm of that residual. Returns (residual, out).
pub fn fused_reference(
    xs: &[Vec<u8>],
    res: &[u8],
    w: &[u8],
    rows: usize,
    hidden: usize,
    eps: f32,
) -> (Vec<f64>, Vec<f64>) {
    let mut new_res = vec![0f64; rows * hidden];
    let mut out = vec![0f64; rows * hidden];
    for r in 0..rows {
        let mut sumsq = 0f64;
        for j in 0..hidden {
            let i = r * hidden + j;
            let a: f64 = xs.iter().map(|x| decode(DType::BF16, x, i)).sum();
            let a = bf16::from_f64(a).to_f64();
            let h = bf16::from_f64(a + decode(DType::BF16, res, i)).to_f64();
            new_res[i] = h;
            sumsq += h * h;
        }
        let scale = 1.0 / (sumsq / hidden as f64 + eps as f64).sqrt();
        for j in 0..hidden {
            let i = r * hidden + j;
            out[i] = new_res[i] * scale * decode(DType::BF16, w, j);
        }
    }
    (new_res, out)
}

/// The l2 error of bf16 `got` relative to `want` (infinite for NaN).
pub fn relative_error(got: &[u8], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (i, &r) in want.iter().enumerate() {
        let g = decode(DType::BF16, got, i);
        num += (g - r) * (g - r);
        den += r * r;
    }
    if num.is_nan() {
        f64::INFINITY
    } else {
        (num / den.max(1e-300)).sqrt()
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// FNV-1a of `bytes`, for comparing results across ranks.
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_accepts_exact_sums_and_rejects_poison() {
        let inputs = all_inputs(DType::F32, 5, 7, 3);
        let sum: Vec<u8> = (0..5)
            .flat_map(|i| {
                let s: f64 = inputs.iter().map(|x| decode(DType::F32, x, i)).sum();
                (s as f32).to_le_bytes()
            })
            .collect();
        assert_eq!(count_wrong(DType::F32, ReduceOp::Sum, &inputs, &sum, 5), 0);
        let poison = vec![0xffu8; 20];
        assert_eq!(
            count_wrong(DType::F32, ReduceOp::Sum, &inputs, &poison, 5),
            5
        );
    }
}
