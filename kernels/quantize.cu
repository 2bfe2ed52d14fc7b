// quantize.cu: float32 / float16 / bfloat16 -> float8 e4m3 bits, q = sat(x / scale), with the
// scale that maps the tensor's (or each row's) largest magnitude to 448, e4m3's largest
// finite value (cupyops/ops/fp8.py quantize_fp8; the scaled_matmul operands).
//
// The conversion is cuda_fp8.h's saturating round-to-nearest-even (cvt.rn.satfinite on
// sm_89 and later, the header's bit-exact emulation before): |x / scale| > 448 gives +-448,
// NaN stays NaN. x / scale is the correctly rounded float32 quotient (__fdiv_rn), not
// x * (1 / scale), so the host reference (ml_dtypes) reproduces every bit. NaN elements do
// not take part in the amax (fmaxf ignores them): one NaN does not turn the whole tensor
// into NaN. An amax of 0 (also a float32 subnormal one, which -ftz flushes) gives scale 1.
//
// Memory-bound: the floor is reading x once and writing q once (3 bytes an element for
// 16-bit x). Each thread converts CHUNK = 16 elements at a time: two (16-bit) or four
// (float32) 16-byte loads in, one 16-byte store of q out.
//
// Kernels:
//   1. quantize_fp8_amax    per-tensor, first pass: a resident wave of blocks strides
//                           through x; each stores its block's amax in partial[block].
//   2. quantize_fp8_tensor  per-tensor, second pass: every block reduces the P partials
//                           itself (a few KB from L2: cheaper than a third launch or a
//                           last-block ticket), block 0 stores the scale, and all convert.
//                           P = 0: the caller's scale, read from *scale.
//   3. quantize_fp8_rows    per-row: G threads a row (4 to 512); an amax pass over the row,
//                           a group reduction, then the conversion pass over the same row,
//                           whose second read mostly hits L1 (the block's rows are a few
//                           KB to a few hundred KB). With the caller's scales the amax pass
//                           is skipped.
// Rows or tensors whose start is not 16-byte aligned (or rows whose length is not a
// multiple of 16) run the same loops one element at a time (`aligned` = 0).
#include <cuda_fp8.h>

#include "common.cuh"

using namespace cuops;

namespace qf8 {

constexpr int CHUNK = 16;  // elements a thread converts at a time: one 16-byte store of q
constexpr int THREADS = 256;  // block of the per-tensor kernels (= _fp8_quantize.THREADS)
// Blocks an SM that the launch bounds keep resident (= _fp8_quantize.*_BLOCKS_PER_SM): the
// per-tensor grids are one such wave, whose threads then stride through the tensor.
constexpr int AMAX_BLOCKS = 8, TENSOR_BLOCKS = 6;
constexpr float E4M3_MAX = 448.f;

// x[0, CHUNK) as floats; x 16-byte aligned.
template <typename T> __device__ __forceinline__ void load_chunk(const T* x, float (&v)[CHUNK]) {
    constexpr int N = Vec<T>::N;
    uint4 raw[CHUNK / N];
#pragma unroll
    for (int i = 0; i < CHUNK / N; ++i) raw[i] = __ldg(reinterpret_cast<const uint4*>(x) + i);
#pragma unroll
    for (int i = 0; i < CHUNK / N; ++i) {
        const T* e = reinterpret_cast<const T*>(&raw[i]);
#pragma unroll
        for (int j = 0; j < N; ++j) v[i * N + j] = to_f32(e[j]);
    }
}

__device__ __forceinline__ float chunk_amax(const float (&v)[CHUNK], float m) {
#pragma unroll
    for (int j = 0; j < CHUNK; ++j) m = fmaxf(m, fabsf(v[j]));
    return m;
}

// The scale of an amax (NaN never reaches here: fmaxf dropped it). Zero (no nonzero
// element, or a quotient flushed to zero) becomes 1: no division by zero.
__device__ __forceinline__ float scale_of(float amax) {
    const float s = __fdiv_rn(amax, E4M3_MAX);
    return s == 0.f ? 1.f : s;
}

__device__ __forceinline__ unsigned char to_e4m3(float v, float s) {
    return __nv_cvt_float_to_fp8(__fdiv_rn(v, s), __NV_SATFINITE, __NV_E4M3);
}

// Two quotients as one e4m3 pair, the first in the low byte (memory order).
__device__ __forceinline__ unsigned e4m3x2(float a, float b, float s) {
    return __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(a, s), __fdiv_rn(b, s)), __NV_SATFINITE, __NV_E4M3);
}

// q[0, CHUNK) = e4m3(v / s); q 16-byte aligned.
__device__ __forceinline__ void store_chunk(unsigned char* q, const float (&v)[CHUNK], float s) {
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        w[i] = e4m3x2(v[4 * i], v[4 * i + 1], s) | e4m3x2(v[4 * i + 2], v[4 * i + 3], s) << 16;
    *reinterpret_cast<uint4*>(q) = make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace qf8

// ------------------------------------------------------------------ 1. quantize_fp8_amax
template <typename T>
__global__ void __launch_bounds__(qf8::THREADS, qf8::AMAX_BLOCKS)
    quantize_fp8_amax(const T* __restrict__ x, i64 n, int aligned, float* __restrict__ partial) {
    using namespace qf8;
    __shared__ float scratch[32];
    const i64 stride = static_cast<i64>(gridDim.x) * THREADS;
    const i64 g = static_cast<i64>(blockIdx.x) * THREADS + threadIdx.x;
    const i64 chunks = aligned ? n / CHUNK : 0;
    float m = 0.f;
    for (i64 c = g; c < chunks; c += stride) {
        float v[CHUNK];
        load_chunk(x + c * CHUNK, v);
        m = chunk_amax(v, m);
    }
    for (i64 i = chunks * CHUNK + g; i < n; i += stride) m = fmaxf(m, fabsf(to_f32(x[i])));
    m = group_reduce<FMax>(m, THREADS, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

// ---------------------------------------------------------------- 2. quantize_fp8_tensor
template <typename T>
__global__ void __launch_bounds__(qf8::THREADS, qf8::TENSOR_BLOCKS)
    quantize_fp8_tensor(const T* __restrict__ x, unsigned char* __restrict__ q, i64 n, int aligned,
                        const float* __restrict__ partial, int P, float* __restrict__ scale) {
    using namespace qf8;
    __shared__ float scratch[32];
    float s;
    if (P > 0) {
        float m = 0.f;
        for (int i = threadIdx.x; i < P; i += THREADS) m = fmaxf(m, partial[i]);
        s = scale_of(group_reduce<FMax>(m, THREADS, scratch));
        if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
    } else {
        s = __ldg(scale);
    }
    const i64 stride = static_cast<i64>(gridDim.x) * THREADS;
    const i64 g = static_cast<i64>(blockIdx.x) * THREADS + threadIdx.x;
    const i64 chunks = aligned ? n / CHUNK : 0;
    for (i64 c = g; c < chunks; c += stride) {
        float v[CHUNK];
        load_chunk(x + c * CHUNK, v);
        store_chunk(q + c * CHUNK, v, s);
    }
    for (i64 i = chunks * CHUNK + g; i < n; i += stride) q[i] = to_e4m3(to_f32(x[i]), s);
}

// ------------------------------------------------------------------ 3. quantize_fp8_rows
// Block of blockDim.x threads = blockDim.x / G rows. compute: 1 finds each row's amax and
// stores its scale in scale[row]; 0 reads the caller's scale[row].
template <typename T>
__global__ void __launch_bounds__(512)
    quantize_fp8_rows(const T* __restrict__ x, unsigned char* __restrict__ q, i64 rows, i64 n, int G,
                      int aligned, float* __restrict__ scale, int compute) {
    using namespace qf8;
    __shared__ float scratch[32];
    const int t = threadIdx.x % G;
    const i64 r = static_cast<i64>(blockIdx.x) * (blockDim.x / G) + threadIdx.x / G;
    const bool active = r < rows;
    const T* xr = x + (active ? r : 0) * n;
    unsigned char* qr = q + (active ? r : 0) * n;
    const i64 chunks = aligned ? n / CHUNK : 0;
    float s;
    if (compute) {  // (uniform: every thread reaches the group reduction)
        float m = 0.f;
        if (active) {
            for (i64 c = t; c < chunks; c += G) {
                float v[CHUNK];
                load_chunk(xr + c * CHUNK, v);
                m = chunk_amax(v, m);
            }
            for (i64 i = chunks * CHUNK + t; i < n; i += G) m = fmaxf(m, fabsf(to_f32(xr[i])));
        }
        s = scale_of(group_reduce<FMax>(m, G, scratch));
        if (active && t == 0) scale[r] = s;
    } else {
        s = active ? __ldg(scale + r) : 1.f;
    }
    if (!active) return;
    for (i64 c = t; c < chunks; c += G) {
        float v[CHUNK];
        load_chunk(xr + c * CHUNK, v);
        store_chunk(qr + c * CHUNK, v, s);
    }
    for (i64 i = chunks * CHUNK + t; i < n; i += G) qr[i] = to_e4m3(to_f32(xr[i]), s);
}
