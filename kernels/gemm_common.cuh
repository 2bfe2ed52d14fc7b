// gemm_common.cuh: the contract every GEMM kernel (gemm_simt.cu, gemm_mma.cu,
// gemm_skinny.cu) follows, and the pieces they share.
//
// One launch computes a stack of `batch` independent products, all row-major:
//     D[z] = alpha * op(A[z]) @ op(B[z]) + beta * C[z]        (z < batch)
// op(A) is M x K: A(m, k) = A[m * lda + k] when !TA, A[k * lda + m] when TA (A stored K x M).
// op(B) is K x N: B(k, n) = B[k * ldb + n] when !TB, B[n * ldb + k] when TB (B stored N x K).
// C and D are M x N with row strides ldc and ldd; operand z starts at X + z * sX (a batch
// stride of 0 broadcasts one operand over the stack). C may alias D (gemm(c=..., out=c)):
// each element of C is read by the thread that then writes the same element of D, so C and
// D are never __restrict__. When beta == 0, C is never read (it may be null, and NaN in C
// does not propagate), as in BLAS.
//
// Every kernel has exactly this parameter list (GEMM_PARAMS), is templated as
// <T, TA, TB> (plus tile parameters where a rung has them), and loops over the batch with
// z = blockIdx.z; z < batch; z += gridDim.z (gridDim.z is capped at 65535).
// Any M, N, K >= 0 works; K == 0 gives beta * C. Index arithmetic is 64-bit: one operand
// may exceed 2^31 elements. Leading dimensions and pointers need no alignment: the rungs
// with 16-byte loads check alignment at run time (uniform per block) and fall back to
// element loads.
#pragma once
#include "common.cuh"
#include "ptx.cuh"

namespace cuops {

// Element type -> (output type, accumulator, alpha/beta type).
// float16/bfloat16 accumulate in float32 and store their own type; int8 accumulates and
// stores int32 exactly (alpha, beta are integers; arithmetic wraps as two's complement).
template <typename T> struct GemmTypes {
    typedef T Out;
    typedef float Acc;
    typedef float Scalar;
};
template <> struct GemmTypes<signed char> {
    typedef int Out;
    typedef int Acc;
    typedef int Scalar;
};

#define GEMM_PARAMS(T)                                                                         \
    const T* __restrict__ A, const T* __restrict__ B,                                          \
        const typename cuops::GemmTypes<T>::Out* C, typename cuops::GemmTypes<T>::Out* D,      \
        int M, int N, int K, cuops::i64 lda, cuops::i64 ldb, cuops::i64 ldc, cuops::i64 ldd,  \
        cuops::i64 sA, cuops::i64 sB, cuops::i64 sC, cuops::i64 sD, int batch,                 \
        typename cuops::GemmTypes<T>::Scalar alpha, typename cuops::GemmTypes<T>::Scalar beta

// Offsets of op(A)(m, k) and op(B)(k, n) in their (row-major) storage.
template <bool TA> __device__ __forceinline__ i64 a_offset(i64 m, i64 k, i64 lda) {
    return TA ? k * lda + m : m * lda + k;
}
template <bool TB> __device__ __forceinline__ i64 b_offset(i64 k, i64 n, i64 ldb) {
    return TB ? n * ldb + k : k * ldb + n;
}

// Element -> accumulator (half types through float; int8 to int).
template <typename T> __device__ __forceinline__ typename GemmTypes<T>::Acc gemm_in(T x) {
    if constexpr (is_half_like<T>::value) return to_f32(x);
    else return static_cast<typename GemmTypes<T>::Acc>(x);
}

// The epilogue of one element: D[i] = alpha * acc + beta * C[j].
// C is read only when beta != 0 (BLAS semantics).
template <typename T>
__device__ __forceinline__ typename GemmTypes<T>::Out gemm_epilogue(
    typename GemmTypes<T>::Acc acc, const typename GemmTypes<T>::Out* c,
    typename GemmTypes<T>::Scalar alpha, typename GemmTypes<T>::Scalar beta) {
    typedef typename GemmTypes<T>::Out Out;
    if constexpr (static_cast<typename GemmTypes<T>::Scalar>(0.5) == 0) {  // integers: wrap, no UB
        unsigned v = (unsigned)alpha * (unsigned)acc;
        if (beta != 0) v += (unsigned)beta * (unsigned)(*c);
        return (Out)v;
    } else {
        float v = alpha * acc;
        if (beta != 0.f) v = fmaf(beta, to_f32(*c), v);
        return from_f32<Out>(v);
    }
}

// Is p 16-byte aligned (every operand start of the stack, every row start)?
template <typename T>
__device__ __forceinline__ bool gemm_vec_ok(const T* p, i64 ld, i64 stride) {
    constexpr int V = 16 / sizeof(T);
    return (reinterpret_cast<unsigned long long>(p) % 16 == 0) && ld % V == 0 && stride % V == 0;
}

// (cp.async, ldmatrix and mma wrappers: ptx.cuh)

}  // namespace cuops
