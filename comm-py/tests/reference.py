"""Host references: what every backend must return, bit for bit where it promises to.

Sources combine in rank order; f16 and bf16 accumulate in f32 and round once at the end
(bf16 to nearest even), integer sum and prod wrap, integer avg is the exact mean rounded
toward zero: the rules of comm_core::reduce. bf16 travels in numpy as its bits
(``uint16``).
"""

import numpy as np

DTYPES = ["bf16", "f16", "f32", "f64", "i32", "i64", "u8"]
OPS = ["sum", "prod", "min", "max", "avg"]
NUMPY = {
    "bf16": np.uint16,
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
}


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def data(dtype, rank, n, op, seed=0):
    """Rank ``rank``'s input: values whose products and sums stay in range."""
    rng = np.random.default_rng([seed, rank, n, DTYPES.index(dtype), OPS.index(op)])
    if dtype in ("i32", "i64"):
        lo, hi = (-3, 4) if op == "prod" else (-1000, 1000)
        return rng.integers(lo, hi, n).astype(NUMPY[dtype])
    if dtype == "u8":
        hi = 3 if op == "prod" else 60
        return rng.integers(0, hi, n).astype(np.uint8)
    x = rng.uniform(0.5, 1.5, n) if op == "prod" else rng.uniform(-4, 4, n)
    if dtype == "bf16":
        return f32_to_bf16(x.astype(np.float32))
    return x.astype(NUMPY[dtype])


def reduce(inputs, op, dtype):
    """The reduction of ``inputs`` (one array per rank) in rank order."""
    n = len(inputs)
    if dtype in ("bf16", "f16"):
        xs = [bf16_to_f32(x) if dtype == "bf16" else x.astype(np.float32) for x in inputs]
        acc = _combine(xs, op)
        if op == "avg":
            acc = acc / np.float32(n)
        return f32_to_bf16(acc) if dtype == "bf16" else acc.astype(np.float16)
    if dtype in ("f32", "f64"):
        acc = _combine(inputs, op)
        return acc / NUMPY[dtype](n) if op == "avg" else acc
    if op == "avg":
        total = sum(x.astype(object) for x in inputs)
        mean = [int(abs(t) // n) * (1 if t >= 0 else -1) for t in total]
        return np.array(mean, dtype=object).astype(NUMPY[dtype])
    with np.errstate(over="ignore"):
        return _combine(inputs, op)


def _combine(xs, op):
    acc = xs[0].copy()
    with np.errstate(over="ignore"):
        for x in xs[1:]:
            if op in ("sum", "avg"):
                acc = acc + x
            elif op == "prod":
                acc = acc * x
            elif op == "min":
                acc = np.minimum(acc, x)
            else:
                acc = np.maximum(acc, x)
    return acc.astype(xs[0].dtype)
