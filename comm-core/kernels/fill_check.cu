// fill_check.cu: device-side test data, as nccl-tests makes it.
//
// comm_fill_<T> writes the pattern value of (seed, rank, index) into every element, and
// comm_check_all_reduce_<T> recomputes every rank's values of an element, reduces them
// in double (wrapping integers, as NCCL and MPI do) and counts the elements that miss
// the reference, so that a sweep up to gigabytes is checked without host copies.
// The pattern is mirrored on the host by comm_core::cuda::pattern: keep the two in step.
#include "comm_dtypes.cuh"

__device__ __forceinline__ uint64_t comm_splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ uint64_t comm_pattern_hash(uint64_t seed, uint32_t rank, uint64_t index) {
    return comm_splitmix64(seed ^ comm_splitmix64((((uint64_t)rank) << 40) ^ index));
}

// Floats: a 24-bit fraction in [-1, 1), rounded once to T. Integers: small values, so that
// products and averages stay meaningful. u8: any byte.
template <typename T> __device__ __forceinline__ T comm_pattern_value(uint64_t h);
#define COMM_FLOAT_PATTERN(T)                                                          \
    template <> __device__ __forceinline__ T comm_pattern_value<T>(uint64_t h) {       \
        double v = (double)((int64_t)(h >> 40) - (1ll << 23)) / 8388608.0;              \
        return comm_elem<T>::from_double(v);                                           \
    }
COMM_FLOAT_PATTERN(float)
COMM_FLOAT_PATTERN(double)
COMM_FLOAT_PATTERN(comm_f16)
COMM_FLOAT_PATTERN(comm_bf16)
template <> __device__ __forceinline__ int32_t comm_pattern_value<int32_t>(uint64_t h) {
    return (int32_t)((int64_t)((h >> 33) % 201) - 100);
}
template <> __device__ __forceinline__ int64_t comm_pattern_value<int64_t>(uint64_t h) {
    return (int64_t)((h >> 33) % 201) - 100;
}
template <> __device__ __forceinline__ uint8_t comm_pattern_value<uint8_t>(uint64_t h) {
    return (uint8_t)((h >> 33) & 0xff);
}

template <typename T>
__device__ void comm_fill(T* out, uint64_t count, uint64_t seed, uint32_t rank) {
    uint64_t stride = (uint64_t)blockDim.x * gridDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        out[i] = comm_pattern_value<T>(comm_pattern_hash(seed, rank, i));
    }
}

// Integer reference: wrapping sum and product in 64 bits (their low bits are T's wrapping
// result), exact mean rounded toward zero, as comm_core::reduce defines them.
template <typename T>
__device__ __forceinline__ bool comm_int_ok(T got, uint64_t seed, uint32_t world, uint64_t i, uint32_t op) {
    int64_t acc = 0;
    for (uint32_t r = 0; r < world; ++r) {
        int64_t x = (int64_t)comm_pattern_value<T>(comm_pattern_hash(seed, r, i));
        if (r == 0) { acc = x; continue; }
        switch (op) {
            case COMM_SUM: case COMM_AVG: acc = (int64_t)((uint64_t)acc + (uint64_t)x); break;
            case COMM_PROD: acc = (int64_t)((uint64_t)acc * (uint64_t)x); break;
            case COMM_MIN: acc = x < acc ? x : acc; break;
            case COMM_MAX: acc = x > acc ? x : acc; break;
        }
    }
    if (op == COMM_AVG) acc = acc / (int64_t)world;
    return got == (T)acc;
}

// Float reference in double, from the values as rounded to T. Sums may be off by one
// rounding per hop of the algorithm, so they get (world + 1) ulps of the sum of
// magnitudes; min and max must be exact; NaN never passes.
template <typename T>
__device__ __forceinline__ bool comm_float_ok(T got, uint64_t seed, uint32_t world, uint64_t i, uint32_t op) {
    double acc = 0.0, mag = 0.0;
    for (uint32_t r = 0; r < world; ++r) {
        double x = comm_elem<T>::to_double(comm_pattern_value<T>(comm_pattern_hash(seed, r, i)));
        mag += fabs(x);
        if (r == 0) { acc = x; continue; }
        switch (op) {
            case COMM_SUM: case COMM_AVG: acc += x; break;
            case COMM_PROD: acc *= x; break;
            case COMM_MIN: acc = fmin(acc, x); break;
            case COMM_MAX: acc = fmax(acc, x); break;
        }
    }
    double g = comm_elem<T>::to_double(got);
    double tol;
    switch (op) {
        case COMM_MIN: case COMM_MAX: tol = 0.0; break;
        case COMM_PROD: tol = comm_elem<T>::eps * (world + 1) * fabs(acc); break;
        case COMM_AVG: acc /= world; mag /= world; tol = comm_elem<T>::eps * (world + 1) * mag; break;
        default: tol = comm_elem<T>::eps * (world + 1) * mag; break;
    }
    return fabs(g - acc) <= tol;
}

template <typename T>
__device__ void comm_check_all_reduce(const T* got, uint64_t count, uint64_t seed, uint32_t world,
                                      uint32_t op, uint64_t* wrong) {
    uint64_t stride = (uint64_t)blockDim.x * gridDim.x;
    uint64_t mine = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        bool ok;
        if constexpr (comm_elem<T>::is_float) ok = comm_float_ok<T>(got[i], seed, world, i, op);
        else ok = comm_int_ok<T>(got[i], seed, world, i, op);
        mine += ok ? 0 : 1;
    }
    if (mine) atomicAdd((unsigned long long*)wrong, (unsigned long long)mine);
}

#define COMM_INSTANTIATE(T, NAME)                                                              \
    extern "C" __global__ void comm_fill_##NAME(T* out, uint64_t count, uint64_t seed,         \
                                                uint32_t rank) {                               \
        comm_fill<T>(out, count, seed, rank);                                                  \
    }                                                                                          \
    extern "C" __global__ void comm_check_all_reduce_##NAME(const T* got, uint64_t count,      \
                                                            uint64_t seed, uint32_t world,     \
                                                            uint32_t op, uint64_t* wrong) {    \
        comm_check_all_reduce<T>(got, count, seed, world, op, wrong);                          \
    }

COMM_INSTANTIATE(float, f32)
COMM_INSTANTIATE(double, f64)
COMM_INSTANTIATE(comm_f16, f16)
COMM_INSTANTIATE(comm_bf16, bf16)
COMM_INSTANTIATE(int32_t, i32)
COMM_INSTANTIATE(int64_t, i64)
COMM_INSTANTIATE(uint8_t, u8)
