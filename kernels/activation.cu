// activation.cu: the gated activations of an LLM's MLP, fused with their multiply (vLLM's
// SiluAndMul and GeluAndMul). x holds rows of 2d elements, [a | b]; y holds rows of d:
//   silu_and_mul:  y = silu(a) * b,  silu(a) = a / (1 + exp(-a))
//   gelu_and_mul:  y = gelu(a) * b,  gelu(a) = a/2 (1 + erf(a / sqrt 2)), or with TANH the
//                  approximation a/2 (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))
//                  (each computed in a form that does not cancel for a << 0, see activation)
// The math is float32, rounded once to T (PyTorch's F.silu(a) * b rounds silu(a) to T first).
//
// Bytes that must move: read x once, write y once: 3d elements a row. The PyTorch composition
// writes act(a) and reads it back: 5d. The ladder:
//   *_naive   block per row, each thread striding over the row one element at a time (vLLM's
//             original kernel): 2- or 4-byte accesses, one pair of loads in flight a thread.
//   *_vector  16-byte vectors; each thread takes one vector column of UNROLL rows and issues
//             all 2 * UNROLL loads before its first multiply. Rows whose halves are not on
//             16-byte boundaries (d not a multiple of the vector width, a misaligned array)
//             take the same loop element by element.
#include "common.cuh"

using namespace cuops;

enum Activation { SILU = 0, GELU_ERF = 1, GELU_TANH = 2 };

// erfc for the 2-byte types' GELU: Numerical Recipes' erfcc, a Chebyshev fit of
// log(erfc(z) / t) (fractional error 1.2e-7; at most 7.7e-6 in float32 arithmetic over
// a in [-18, 18], 60x below fp16's rounding), a third of erfcf's instructions: with erfcf
// the fp16/bf16 rung was compute-bound at 64 % of the copy line (H200).
__device__ __forceinline__ float erfc_chebyshev(float x) {
    const float z = fabsf(x);
    const float t = __fdividef(1.f, 1.f + 0.5f * z);
    float p = 0.17087277f;
    p = fmaf(p, t, -0.82215223f);
    p = fmaf(p, t, 1.48851587f);
    p = fmaf(p, t, -1.13520398f);
    p = fmaf(p, t, 0.27886807f);
    p = fmaf(p, t, -0.18628806f);
    p = fmaf(p, t, 0.09678418f);
    p = fmaf(p, t, 0.37409196f);
    p = fmaf(p, t, 1.00002368f);
    p = fmaf(p, t, -1.26551223f);
    const float e = t * expf(fmaf(-z, z, p));
    return x >= 0.f ? e : 2.f - e;
}

template <int ACT, typename T>
__device__ __forceinline__ float activation(float a) {
    if constexpr (ACT == SILU) {
        // __fdividef (2 ulp): the IEEE division's slow-path sequence made the bf16 vector
        // rung spill at 64 registers (ptxas, sm_90). For a < -87.3 the divisor passes 2^126,
        // where __fdividef gives 0 (and expf overflows below -88.7): the quotient is -0, the
        // limit, where the exact value is below 1e-35 in magnitude.
        return __fdividef(a, 1.f + expf(-a));
    } else if constexpr (ACT == GELU_ERF) {
        // 1 + erf(a / sqrt 2) as erfc(-a / sqrt 2): the sum cancels for a << 0 (a = -8
        // keeps no correct digit of 1 + erf in float32), erfc does not
        const float z = a * -0.70710678118654752f;
        return 0.5f * a * (is_half_like<T>::value ? erfc_chebyshev(z) : erfcf(z));
    } else {
        // (1 + tanh(u)) / 2 = 1 / (1 + exp(-2u)): the same function without tanh's
        // cancellation for u << 0; u = sqrt(2/pi) (a + 0.044715 a^3)
        const float u = 0.79788456080286536f * (a + 0.044715f * a * a * a);
        return __fdividef(a, 1.f + expf(-2.f * u));
    }
}

template <int ACT, typename T>
__device__ __forceinline__ void and_mul_naive(const T* __restrict__ x, T* __restrict__ y, int d) {
    const T* a = x + (i64)blockIdx.x * 2 * d;
    T* q = y + (i64)blockIdx.x * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) q[j] = from_f32<T>(activation<ACT, T>(to_f32(a[j])) * to_f32(a[d + j]));
}

// UNROLL rows a thread: 2 * UNROLL 16-byte loads (128 bytes) in flight.
constexpr int AND_MUL_UNROLL = 4;

// Block b covers column block b % ncb (tx columns) of rows [(b / ncb) * ty * UNROLL, ...):
// thread (c, r) = (tid % tx, tid / tx) takes column c of rows r, r + ty, ... A column is a
// 16-byte vector when `aligned`, else one element. One division a block, none a vector.
template <int ACT, typename T>
__device__ __forceinline__ void and_mul_vector(const T* __restrict__ x, T* __restrict__ y, i64 rows, int d, int tx,
                                               int aligned) {
    constexpr int N = Vec<T>::N, U = AND_MUL_UNROLL;
    const int cols = aligned ? d / N : d;
    const int ncb = (cols + tx - 1) / tx, ty = blockDim.x / tx;
    const int c = (blockIdx.x % ncb) * tx + threadIdx.x % tx;
    const i64 r0 = (i64)(blockIdx.x / ncb) * ty * U + threadIdx.x / tx;
    if (c >= cols) return;  // (no barrier in this kernel)
    if (aligned) {
        // kept packed (4 registers a vector) until used: widened to floats at once they
        // cost 84 registers a thread for 2-byte types (measured with ptxas), and occupancy
        uint4 a[U], b[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const i64 r = r0 + k * ty;
            if (r < rows) {
                a[k] = __ldg(reinterpret_cast<const uint4*>(x + r * 2 * d + c * N));
                b[k] = __ldg(reinterpret_cast<const uint4*>(x + r * 2 * d + d + c * N));
            }
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const i64 r = r0 + k * ty;
            if (r < rows) {
                const T* ea = reinterpret_cast<const T*>(&a[k]);
                const T* eb = reinterpret_cast<const T*>(&b[k]);
                float o[N];
#pragma unroll
                for (int j = 0; j < N; ++j) o[j] = activation<ACT, T>(to_f32(ea[j])) * to_f32(eb[j]);
                store_vec(y + r * d + c * N, o);
            }
        }
    } else {
        float a[U], b[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const i64 r = r0 + k * ty;
            if (r < rows) {
                a[k] = to_f32(x[r * 2 * d + c]);
                b[k] = to_f32(x[r * 2 * d + d + c]);
            }
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const i64 r = r0 + k * ty;
            if (r < rows) y[r * d + c] = from_f32<T>(activation<ACT, T>(a[k]) * b[k]);
        }
    }
}

// ------------------------------------------------------------------ the kernels
template <typename T>
__global__ void silu_and_mul_naive(const T* __restrict__ x, T* __restrict__ y, i64 rows, int d) {
    and_mul_naive<SILU>(x, y, d);
}

template <typename T, int TANH>
__global__ void gelu_and_mul_naive(const T* __restrict__ x, T* __restrict__ y, i64 rows, int d) {
    and_mul_naive<TANH ? GELU_TANH : GELU_ERF>(x, y, d);
}

template <typename T>
__global__ void __launch_bounds__(256, 4)
    silu_and_mul_vector(const T* __restrict__ x, T* __restrict__ y, i64 rows, int d, int tx, int aligned) {
    and_mul_vector<SILU>(x, y, rows, d, tx, aligned);
}

template <typename T, int TANH>
__global__ void __launch_bounds__(256, 4)
    gelu_and_mul_vector(const T* __restrict__ x, T* __restrict__ y, i64 rows, int d, int tx, int aligned) {
    and_mul_vector<TANH ? GELU_TANH : GELU_ERF>(x, y, rows, d, tx, aligned);
}
