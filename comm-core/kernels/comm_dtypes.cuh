// comm_dtypes.cuh: element types and conversions shared by every kernel of the workspace.
//
// NVRTC ships no cuda_fp16.h / cuda_bf16.h, and we want kernels to build with nothing but
// libnvrtc (CI has no toolkit), so f16 and bf16 travel as their bits (uint16_t) and are
// converted here: bf16 by bit arithmetic, f16 by the PTX cvt instructions (sm_53+).
// The kernel loader hands this file to NVRTC as an in-memory header.
#pragma once

typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;

// Dtype codes: must match comm_core::cuda::pattern::dtype_code.
#define COMM_F32 0
#define COMM_F64 1
#define COMM_F16 2
#define COMM_BF16 3
#define COMM_I32 4
#define COMM_I64 5
#define COMM_U8 6

// Op codes: must match comm_core::cuda::pattern::op_code.
#define COMM_SUM 0
#define COMM_PROD 1
#define COMM_MIN 2
#define COMM_MAX 3
#define COMM_AVG 4

struct comm_bf16 { uint16_t bits; };
struct comm_f16 { uint16_t bits; };

__device__ __forceinline__ float comm_bf16_to_float(uint16_t b) {
    return __uint_as_float(((uint32_t)b) << 16);
}

// Round to nearest even, as half::bf16::from_f32 does; NaN stays a quiet NaN.
__device__ __forceinline__ uint16_t comm_float_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float comm_f16_to_float(uint16_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ uint16_t comm_float_to_f16(float f) {
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Conversions between an element type and double, for references and fills.
template <typename T> struct comm_elem;
template <> struct comm_elem<float> {
    static __device__ __forceinline__ double to_double(float v) { return (double)v; }
    static __device__ __forceinline__ float from_double(double v) { return (float)v; }
    static constexpr bool is_float = true;
    static constexpr double eps = 1.1920928955078125e-07;  // 2^-23
};
template <> struct comm_elem<double> {
    static __device__ __forceinline__ double to_double(double v) { return v; }
    static __device__ __forceinline__ double from_double(double v) { return v; }
    static constexpr bool is_float = true;
    static constexpr double eps = 2.220446049250313e-16;  // 2^-52
};
template <> struct comm_elem<comm_f16> {
    static __device__ __forceinline__ double to_double(comm_f16 v) { return (double)comm_f16_to_float(v.bits); }
    // Through f32: exact for the values the fill kernel makes (24-bit mantissas at most).
    static __device__ __forceinline__ comm_f16 from_double(double v) { comm_f16 r; r.bits = comm_float_to_f16((float)v); return r; }
    static constexpr bool is_float = true;
    static constexpr double eps = 9.765625e-04;  // 2^-10
};
template <> struct comm_elem<comm_bf16> {
    static __device__ __forceinline__ double to_double(comm_bf16 v) { return (double)comm_bf16_to_float(v.bits); }
    static __device__ __forceinline__ comm_bf16 from_double(double v) { comm_bf16 r; r.bits = comm_float_to_bf16((float)v); return r; }
    static constexpr bool is_float = true;
    static constexpr double eps = 7.8125e-03;  // 2^-7
};
template <> struct comm_elem<int32_t> {
    static __device__ __forceinline__ double to_double(int32_t v) { return (double)v; }
    static __device__ __forceinline__ int32_t from_double(double v) { return (int32_t)v; }
    static constexpr bool is_float = false;
    static constexpr double eps = 0.0;
};
template <> struct comm_elem<int64_t> {
    static __device__ __forceinline__ double to_double(int64_t v) { return (double)v; }
    static __device__ __forceinline__ int64_t from_double(double v) { return (int64_t)v; }
    static constexpr bool is_float = false;
    static constexpr double eps = 0.0;
};
template <> struct comm_elem<uint8_t> {
    static __device__ __forceinline__ double to_double(uint8_t v) { return (double)v; }
    static __device__ __forceinline__ uint8_t from_double(double v) { return (uint8_t)v; }
    static constexpr bool is_float = false;
    static constexpr double eps = 0.0;
};
