//! Host reduction kernels: reduce element ranges of several sources in a fixed order.
//!
//! Sources are always combined in rank order `0, 1, .., n-1`, so every rank that computes
//! an element gets the same bits. f16/bf16 accumulate in f32; integer `Sum`/`Prod` wrap;
//! integer `Avg` is the exact mean rounded toward zero (see [`ReduceOp`]).

use half::{bf16, f16};

use crate::dtype::{DType, ReduceOp};

/// Elements reduced per block: the accumulator block stays in L1 and the loops vectorise.
const BLOCK: usize = 512;

/// An element type with its accumulation type.
trait Accumulate: Copy + bytemuck::Pod {
    type Acc: Copy + Default;
    fn load(self) -> Self::Acc;
    fn store(acc: Self::Acc) -> Self;
    fn sum(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn prod(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn divide(acc: Self::Acc, n: usize) -> Self::Acc;
}

macro_rules! float_acc {
    ($t:ty, $acc:ty, $load:expr, $store:expr) => {
        impl Accumulate for $t {
            type Acc = $acc;
            #[inline(always)]
            fn load(self) -> $acc {
                $load(self)
            }
            #[inline(always)]
            fn store(acc: $acc) -> Self {
                $store(acc)
            }
            #[inline(always)]
            fn sum(a: $acc, b: $acc) -> $acc {
                a + b
            }
            #[inline(always)]
            fn prod(a: $acc, b: $acc) -> $acc {
                a * b
            }
            #[inline(always)]
            fn min(a: $acc, b: $acc) -> $acc {
                a.min(b)
            }
            #[inline(always)]
            fn max(a: $acc, b: $acc) -> $acc {
                a.max(b)
            }
            #[inline(always)]
            fn divide(acc: $acc, n: usize) -> $acc {
                acc / n as $acc
            }
        }
    };
}

float_acc!(f32, f32, |x| x, |a| a);
float_acc!(f64, f64, |x| x, |a| a);
float_acc!(f16, f32, f16::to_f32, f16::from_f32);
float_acc!(bf16, f32, bf16::to_f32, bf16::from_f32);

macro_rules! int_acc {
    ($t:ty) => {
        // i128 holds any sum of up to 2^64 values exactly, so Avg is exact; wrapping ops
        // followed by truncation give the same bits as wrapping in the element type.
        impl Accumulate for $t {
            type Acc = i128;
            #[inline(always)]
            fn load(self) -> i128 {
                self as i128
            }
            #[inline(always)]
            fn store(acc: i128) -> Self {
                acc as $t
            }
            #[inline(always)]
            fn sum(a: i128, b: i128) -> i128 {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn prod(a: i128, b: i128) -> i128 {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn min(a: i128, b: i128) -> i128 {
                a.min(b)
            }
            #[inline(always)]
            fn max(a: i128, b: i128) -> i128 {
                a.max(b)
            }
            #[inline(always)]
            fn divide(acc: i128, n: usize) -> i128 {
                acc / n as i128
            }
        }
    };
}

int_acc!(i32);
int_acc!(i64);
int_acc!(u8);

/// Reduces the first `len` elements of every source into every destination.
///
/// # Safety
/// Every source and destination address must point to at least `len` elements of
/// `dtype`, suitably aligned. Destinations may alias sources (in-place), but no other
/// thread may write these elements meanwhile.
pub(crate) unsafe fn reduce_into(
    dtype: DType,
    op: ReduceOp,
    sources: &[usize],
    destinations: &[usize],
    len: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2; the rest is forwarded from the caller's contract.
        return unsafe { reduce_into_avx2(dtype, op, sources, destinations, len) };
    }
    // SAFETY: forwarded from the caller's contract.
    unsafe { reduce_dispatch(dtype, op, sources, destinations, len) }
}

/// The same loops compiled for AVX2: twice the lanes of the baseline SSE2. Only plain
/// adds, multiplies and compares are used (no FMA), so the bits are those of the
/// baseline path.
///
/// # Safety
/// The CPU must support AVX2; otherwise as [`reduce_into`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn reduce_into_avx2(
    dtype: DType,
    op: ReduceOp,
    sources: &[usize],
    destinations: &[usize],
    len: usize,
) {
    // SAFETY: forwarded from the caller's contract.
    unsafe { reduce_dispatch(dtype, op, sources, destinations, len) }
}

#[inline(always)]
unsafe fn reduce_dispatch(
    dtype: DType,
    op: ReduceOp,
    sources: &[usize],
    destinations: &[usize],
    len: usize,
) {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        match dtype {
            DType::F32 => reduce_typed::<f32>(op, sources, destinations, len),
            DType::F64 => reduce_typed::<f64>(op, sources, destinations, len),
            DType::F16 => reduce_typed::<f16>(op, sources, destinations, len),
            DType::BF16 => reduce_typed::<bf16>(op, sources, destinations, len),
            DType::I32 => reduce_typed::<i32>(op, sources, destinations, len),
            DType::I64 => reduce_typed::<i64>(op, sources, destinations, len),
            DType::U8 => reduce_typed::<u8>(op, sources, destinations, len),
        }
    }
}

#[inline(always)]
unsafe fn reduce_typed<T: Accumulate>(
    op: ReduceOp,
    sources: &[usize],
    destinations: &[usize],
    len: usize,
) {
    let n = sources.len();
    // SAFETY: forwarded from `reduce_into` (all arms).
    unsafe {
        match op {
            ReduceOp::Sum => blocks::<T>(sources, destinations, len, T::sum, |a| a),
            ReduceOp::Prod => blocks::<T>(sources, destinations, len, T::prod, |a| a),
            ReduceOp::Min => blocks::<T>(sources, destinations, len, T::min, |a| a),
            ReduceOp::Max => blocks::<T>(sources, destinations, len, T::max, |a| a),
            ReduceOp::Avg => blocks::<T>(sources, destinations, len, T::sum, |a| T::divide(a, n)),
        }
    }
}

#[inline(always)]
unsafe fn blocks<T: Accumulate>(
    sources: &[usize],
    destinations: &[usize],
    total: usize,
    combine: impl Fn(T::Acc, T::Acc) -> T::Acc,
    finish: impl Fn(T::Acc) -> T::Acc,
) {
    let mut acc = [T::Acc::default(); BLOCK];
    let mut start = 0;
    while start < total {
        let len = BLOCK.min(total - start);
        let acc = &mut acc[..len];
        for (r, &src) in sources.iter().enumerate() {
            // SAFETY: the caller guarantees `total` elements in bounds of every source; no
            // thread writes them of any buffer but this one, and this block of the
            // destinations is written only after every source block has been read.
            let block = unsafe { std::slice::from_raw_parts((src as *const T).add(start), len) };
            if r == 0 {
                for (a, &x) in acc.iter_mut().zip(block) {
                    *a = x.load();
                }
            } else {
                for (a, &x) in acc.iter_mut().zip(block) {
                    *a = combine(*a, x.load());
                }
            }
        }
        for &dst in destinations {
            // SAFETY: as above.
            let out = unsafe { std::slice::from_raw_parts_mut((dst as *mut T).add(start), len) };
            for (o, &a) in out.iter_mut().zip(acc.iter()) {
                *o = T::store(finish(a));
            }
        }
        start += len;
    }
}

/// Reduces host slices of one dtype (given as bytes) into `out`, in source order.
/// A safe entry point for backends that stage data on the host.
pub fn reduce_host(dtype: DType, op: ReduceOp, sources: &[&[u8]], out: &mut [u8]) {
    let elems = out.len() / dtype.size();
    for s in sources {
        assert_eq!(
            s.len(),
            out.len(),
            "reduce_host: source and output sizes differ"
        );
        assert_eq!(
            s.as_ptr() as usize % dtype.size(),
            0,
            "reduce_host: misaligned source"
        );
    }
    assert_eq!(
        out.as_ptr() as usize % dtype.size(),
        0,
        "reduce_host: misaligned output"
    );
    let sources: Vec<usize> = sources.iter().map(|s| s.as_ptr() as usize).collect();
    // SAFETY: sizes and alignment checked above; `out` is exclusively borrowed and the
    // sources are shared borrows, so nothing else writes them.
    unsafe { reduce_into(dtype, op, &sources, &[out.as_mut_ptr() as usize], elems) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reduce_vecs<T: bytemuck::Pod>(dtype: DType, op: ReduceOp, inputs: &[Vec<T>]) -> Vec<T> {
        let mut out = inputs[0].clone();
        let bytes: Vec<&[u8]> = inputs.iter().map(|v| bytemuck::cast_slice(v)).collect();
        reduce_host(dtype, op, &bytes, bytemuck::cast_slice_mut(&mut out));
        out
    }

    #[test]
    fn integer_sum_wraps_and_avg_is_exact() {
        let a = vec![u8::MAX, 3, 200];
        let b = vec![2u8, 4, 101];
        assert_eq!(
            reduce_vecs(DType::U8, ReduceOp::Sum, &[a.clone(), b.clone()]),
            vec![1, 7, 45]
        );
        assert_eq!(
            reduce_vecs(DType::U8, ReduceOp::Avg, &[a, b]),
            vec![128, 3, 150]
        );
        let big = vec![i64::MAX, -7];
        assert_eq!(
            reduce_vecs(DType::I64, ReduceOp::Avg, &[big.clone(), big.clone()]),
            vec![i64::MAX, -7]
        );
        assert_eq!(
            reduce_vecs(DType::I64, ReduceOp::Sum, &[big.clone(), big]),
            vec![-2, -14]
        );
        assert_eq!(
            reduce_vecs(DType::I32, ReduceOp::Avg, &[vec![-3], vec![0]]),
            vec![-1]
        );
    }

    #[test]
    fn bf16_accumulates_in_f32() {
        // 256 + 1 + 1 in bf16 steps would stay at 256; in f32 it is 258, which bf16 holds.
        let x = |v: f32| vec![bf16::from_f32(v); 1000];
        let out = reduce_vecs(DType::BF16, ReduceOp::Sum, &[x(256.0), x(1.0), x(1.0)]);
        assert!(out.iter().all(|v| v.to_f32() == 258.0));
    }

    #[test]
    fn min_max_prod_over_blocks() {
        let a: Vec<f64> = (0..1500).map(|i| i as f64).collect();
        let b: Vec<f64> = (0..1500).map(|i| 1000.0 - i as f64).collect();
        let min = reduce_vecs(DType::F64, ReduceOp::Min, &[a.clone(), b.clone()]);
        let max = reduce_vecs(DType::F64, ReduceOp::Max, &[a.clone(), b.clone()]);
        let prod = reduce_vecs(DType::F64, ReduceOp::Prod, &[a.clone(), b.clone()]);
        for i in 0..1500 {
            assert_eq!(min[i], a[i].min(b[i]));
            assert_eq!(max[i], a[i].max(b[i]));
            assert_eq!(prod[i], a[i] * b[i]);
        }
    }
}
