//! The dataset of a step and what the chain of all-reduces must turn it into.
//!
//! Rank `r` starts with `x[i] = v(i) + d(r)`, where `v(i) = i % 32` and the offsets
//! `d(r)` sum to zero over the ranks, so that the first all-reduce already mixes every
//! rank's data. Call `k` all-reduces (sum) `x` into `y`, then the dependent op writes
//! `x = y / world + add(k)`, with `add(k)` cycling through 1, 0, -1. Every value on the
//! way is a small integer (at most `33 * world`), exact in bf16 for worlds of up to 8, so
//! the f64 reference is the exact answer and a correct run must match it bit for bit.

/// Values of `v(i)` cycle through `0 .. PERIOD`.
const PERIOD: usize = 32;

/// The offset of rank `rank` in a world of `world`: `0, 1, .., world - 2`, and the last
/// rank takes minus their sum.
pub fn offset(rank: usize, world: usize) -> f64 {
    if rank + 1 < world {
        rank as f64
    } else {
        -(((world - 1) * world.saturating_sub(2) / 2) as f64)
    }
}

/// Rank `rank`'s input, as f64.
pub fn input(rank: usize, world: usize, count: usize) -> Vec<f64> {
    (0..count)
        .map(|i| (i % PERIOD) as f64 + offset(rank, world))
        .collect()
}

/// What the dependent op adds after call `k`.
pub fn add(k: usize) -> f32 {
    [1.0, 0.0, -1.0][k % 3]
}

/// The step's result (the same on every rank), computed the long way in f64: every
/// rank's input summed, then the op, `calls` times.
pub fn reference(world: usize, count: usize, calls: usize) -> Vec<f64> {
    let mut xs: Vec<Vec<f64>> = (0..world).map(|r| input(r, world, count)).collect();
    for k in 0..calls {
        let y: Vec<f64> = (0..count).map(|i| xs.iter().map(|x| x[i]).sum()).collect();
        let next: Vec<f64> = y
            .iter()
            .map(|v| v / world as f64 + f64::from(add(k)))
            .collect();
        xs = vec![next; world];
    }
    xs.swap_remove(0)
}

/// Elements of `got` that differ from `want`.
pub fn count_wrong(got: &[f64], want: &[f64]) -> usize {
    got.len().abs_diff(want.len())
        + got
            .iter()
            .zip(want)
            .filter(|(g, w)| g.to_bits() != w.to_bits())
            .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_cancel_and_the_chain_ends_at_v_plus_the_adds() {
        for world in 1..=8 {
            let total: f64 = (0..world).map(|r| offset(r, world)).sum();
            assert_eq!(total, 0.0, "world {world}");
        }
        // 122 calls: 40 cycles of (1, 0, -1) add nothing, then 1 + 0.
        let r = reference(3, 40, 122);
        assert_eq!(r[0], 1.0);
        assert_eq!(r[33], 2.0);
        assert_eq!(count_wrong(&r, &reference(3, 40, 122)), 0);
        assert_eq!(count_wrong(&r, &reference(3, 40, 123)), 40);
    }
}
