//! Test data and the reference check: random inputs, poison, tolerances, fingerprints.
//!
//! Inputs are counter-based: element `i` of rank `r` is a pure function of
//! `(seed, r, i)` (a splitmix64 hash), so any rank can recompute every rank's input for
//! the element it checks without storing or exchanging them. Values are never zero and
//! are chosen per dtype and op so that the f64 reference is exact where it must be:
//! integer results (with the wrapping that comm-core documents for `Sum`/`Prod`) stay
//! below 2^53, so they are compared bit for bit; floating-point sums and means are
//! compared within a bound from the accumulation and output precision; min and max must
//! be exact.

use comm_core::{Element, ReduceOp, bf16, f16};

/// A dtype the sweep knows how to generate, poison and check.
pub trait Value: Element + Copy {
    /// The numbers this type holds.
    const DOMAIN: Domain;
    /// Rounds `v` to this type (integers: `v` is always a whole number in range).
    fn from_f64(v: f64) -> Self;
    /// Widens to f64 (exactly, for every value the sweep generates).
    fn to_f64(self) -> f64;
    /// Wraps an exact integer result to this type; floats just round it.
    fn wrap(v: i128) -> Self;
    /// What an output holds before a checked run: NaN, or an unlikely integer.
    fn poison() -> Self;
}

/// The values of a [`Value`] type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Domain {
    /// Floating point: `output` is the unit roundoff of the type, `acc` of the type that
    /// reductions accumulate in (f32 for f16/bf16).
    Float {
        /// Unit roundoff of the element type.
        output: f64,
        /// Unit roundoff of the accumulation type.
        acc: f64,
    },
    /// Integers with this largest magnitude; `signed` says whether negatives exist.
    Int {
        /// Largest value.
        max: u64,
        /// Whether negative values exist.
        signed: bool,
    },
}

macro_rules! float_value {
    ($t:ty, $output:expr, $acc:expr, $from:expr, $to:expr) => {
        impl Value for $t {
            const DOMAIN: Domain = Domain::Float {
                output: $output,
                acc: $acc,
            };
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn wrap(v: i128) -> Self {
                $from(v as f64)
            }
            fn poison() -> Self {
                $from(f64::NAN)
            }
        }
    };
}

const F32_U: f64 = f32::EPSILON as f64 / 2.0;
float_value!(f32, F32_U, F32_U, |v| v as f32, |x: f32| x as f64);
float_value!(f64, f64::EPSILON / 2.0, f64::EPSILON / 2.0, |v| v, |x| x);
float_value!(f16, 1.0 / 2048.0, F32_U, f16::from_f64, |x: f16| x.to_f64());
float_value!(bf16, 1.0 / 256.0, F32_U, bf16::from_f64, |x: bf16| x
    .to_f64());

macro_rules! int_value {
    ($t:ty, $signed:expr) => {
        impl Value for $t {
            const DOMAIN: Domain = Domain::Int {
                max: <$t>::MAX as u64,
                signed: $signed,
            };
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn wrap(v: i128) -> Self {
                v as $t
            }
            fn poison() -> Self {
                0x5a5a_5a5a_5a5a_5a5a_u64 as $t
            }
        }
    };
}

int_value!(i32, true);
int_value!(i64, true);
int_value!(u8, false);

/// The splitmix64 finaliser: a bijective 64-bit mix.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// How to draw the inputs of one (dtype, op, world size) run.
#[derive(Debug, Clone, Copy)]
pub struct Inputs {
    seed: u64,
    op: ReduceOp,
    ranks: usize,
    /// Largest integer magnitude drawn (integers only).
    int_bound: u64,
}

impl Inputs {
    /// Inputs for `T`, `op` over `ranks` ranks, from `seed`.
    pub fn new<T: Value>(seed: u64, op: ReduceOp, ranks: usize) -> Self {
        let int_bound = match T::DOMAIN {
            Domain::Float { .. } => 0,
            Domain::Int { max, .. } => {
                let exact = match op {
                    // n values of magnitude <= 2^40 sum exactly in f64 for n < 2^12.
                    ReduceOp::Sum | ReduceOp::Avg => 1u64 << 40,
                    // Keep |product| <= 2^50 so that f64 holds it exactly.
                    ReduceOp::Prod => (50.0 / ranks as f64).exp2().floor().max(1.0) as u64,
                    _ => 1u64 << 52,
                };
                exact.min(max)
            }
        };
        Inputs {
            seed,
            op,
            ranks,
            int_bound,
        }
    }

    /// The key of rank `rank`'s stream.
    fn key(&self, rank: usize) -> u64 {
        mix64(self.seed ^ (rank as u64 + 1).wrapping_mul(GOLDEN))
    }

    fn draw<T: Value>(&self, key: u64, index: usize) -> T {
        let bits = mix64(key.wrapping_add((index as u64).wrapping_mul(GOLDEN)));
        match T::DOMAIN {
            Domain::Float { .. } => {
                let unit = (bits >> 11) as f64 / (1u64 << 53) as f64;
                // Magnitudes stay away from 0 (relative checks) and near 1 (products of
                // many ranks neither overflow nor underflow, even in f16).
                let magnitude = match self.op {
                    ReduceOp::Prod => 0.75 + 0.5 * unit,
                    _ => 0.5 + unit,
                };
                let sign = if bits & 1 == 0 { 1.0 } else { -1.0 };
                T::from_f64(sign * magnitude)
            }
            Domain::Int { signed, .. } => {
                let magnitude = 1 + (bits >> 1) % self.int_bound;
                let negative = signed && bits & 1 == 1;
                T::from_f64(if negative {
                    -(magnitude as f64)
                } else {
                    magnitude as f64
                })
            }
        }
    }

    /// Writes rank `rank`'s input into `buf`.
    pub fn fill<T: Value>(&self, rank: usize, buf: &mut [T]) {
        let key = self.key(rank);
        for (i, x) in buf.iter_mut().enumerate() {
            *x = self.draw(key, i);
        }
    }

    /// Counts the elements of `out` that differ from the reference beyond the dtype's
    /// tolerance (NaN is always wrong).
    pub fn count_wrong<T: Value>(&self, out: &[T]) -> u64 {
        let keys: Vec<u64> = (0..self.ranks).map(|r| self.key(r)).collect();
        let n = self.ranks as f64;
        let mut wrong = 0;
        for (i, &got) in out.iter().enumerate() {
            let mut acc = 0.0;
            let mut abs_sum = 0.0;
            for (r, &key) in keys.iter().enumerate() {
                let x = self.draw::<T>(key, i).to_f64();
                abs_sum += x.abs();
                acc = match (r, self.op) {
                    (0, _) => x,
                    (_, ReduceOp::Sum | ReduceOp::Avg) => acc + x,
                    (_, ReduceOp::Prod) => acc * x,
                    (_, ReduceOp::Min) => f64::min(acc, x),
                    (_, ReduceOp::Max) => f64::max(acc, x),
                    // An operator added to comm-core later: the sweep refuses to check it
                    // (see `checkable`), and NaN would count every element as wrong.
                    (_, _) => f64::NAN,
                };
            }
            let ok = match T::DOMAIN {
                Domain::Int { .. } => {
                    let exact = acc as i128;
                    let expected = match self.op {
                        ReduceOp::Avg => T::wrap(exact / self.ranks as i128),
                        _ => T::wrap(exact),
                    };
                    got == expected
                }
                Domain::Float { output, acc: u } => {
                    let (expected, tolerance) = match self.op {
                        // Each of the n-1 additions rounds in the accumulation type, the
                        // store rounds once more; doubled for margin.
                        ReduceOp::Sum => (acc, 2.0 * (n * u + output) * abs_sum),
                        ReduceOp::Avg => (acc / n, 2.0 * ((n + 1.0) * u + output) * abs_sum / n),
                        ReduceOp::Prod => (acc, 2.0 * (n * u + output) * acc.abs()),
                        _ => (acc, 0.0),
                    };
                    (got.to_f64() - expected).abs() <= tolerance
                }
            };
            wrong += u64::from(!ok);
        }
        wrong
    }
}

/// True for the operators [`Inputs::count_wrong`] knows (`ReduceOp` is non-exhaustive).
pub fn checkable(op: ReduceOp) -> bool {
    matches!(
        op,
        ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max | ReduceOp::Avg
    )
}

/// Fills `buf` with [`Value::poison`].
pub fn poison<T: Value>(buf: &mut [T]) {
    buf.fill(T::poison());
}

/// A 64-bit fingerprint of `bytes`: equal buffers give equal fingerprints, and different
/// ones almost surely differ. Cheap enough to run over every checked output.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    let mut h = (bytes.len() as u64).wrapping_mul(GOLDEN);
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("chunks of 8"));
        h = (h ^ mix64(w)).rotate_left(23).wrapping_mul(GOLDEN);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    mix64(h ^ u64::from_le_bytes(tail))
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::reduce::reduce_host;

    /// Reduces the generated inputs with comm-core's host kernel and checks them: a
    /// correct reduction has no wrong element, for every dtype and op.
    fn roundtrip<T: Value>(op: ReduceOp, ranks: usize) {
        let inputs = Inputs::new::<T>(42, op, ranks);
        let len = 1000;
        let data: Vec<Vec<T>> = (0..ranks)
            .map(|r| {
                let mut v = vec![T::poison(); len];
                inputs.fill(r, &mut v);
                v
            })
            .collect();
        for v in &data {
            assert!(v.iter().all(|x| x.to_f64() != 0.0), "zero input");
        }
        let bytes: Vec<&[u8]> = data.iter().map(|v| bytemuck::cast_slice(v)).collect();
        let mut out = vec![T::poison(); len];
        reduce_host(T::DTYPE, op, &bytes, bytemuck::cast_slice_mut(&mut out));
        assert_eq!(inputs.count_wrong(&out), 0, "{} {op} x{ranks}", T::DTYPE);
        out[7] = T::poison();
        assert_eq!(inputs.count_wrong(&out), 1, "{} {op} poison", T::DTYPE);
    }

    #[test]
    fn correct_reductions_pass_and_poison_fails() {
        for op in ReduceOp::ALL {
            for ranks in [1, 2, 3, 8] {
                roundtrip::<f32>(op, ranks);
                roundtrip::<f64>(op, ranks);
                roundtrip::<f16>(op, ranks);
                roundtrip::<bf16>(op, ranks);
                roundtrip::<i32>(op, ranks);
                roundtrip::<i64>(op, ranks);
                roundtrip::<u8>(op, ranks);
            }
        }
    }

    #[test]
    fn a_small_error_is_caught() {
        let inputs = Inputs::new::<f32>(7, ReduceOp::Sum, 4);
        let mut out = vec![0f32; 64];
        let mut parts = vec![vec![0f32; 64]; 4];
        for (r, p) in parts.iter_mut().enumerate() {
            inputs.fill(r, p);
        }
        for i in 0..64 {
            out[i] = parts.iter().map(|p| p[i]).sum();
        }
        assert_eq!(inputs.count_wrong(&out), 0);
        out[3] += 1e-3;
        assert_eq!(inputs.count_wrong(&out), 1);
    }

    #[test]
    fn fingerprints_tell_buffers_apart() {
        let a = vec![1u8; 33];
        let mut b = a.clone();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        b[32] = 2;
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a[..32]), fingerprint(&a));
    }
}
