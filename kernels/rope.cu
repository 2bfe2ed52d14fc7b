// rope.cu: rotary position embedding of q [tokens, q_heads, D] and k [tokens, kv_heads, D]
// in one launch (vLLM's rotary_embedding). Token t at position p, frequency i < R/2
// (R = rotary_dim <= D):
//   cos/sin of p * inv_freq[i], inv_freq[i] = base^(-2i/R) in float32, or a row of
//   cos_sin_cache [max_pos, R] (cos in its first R/2 columns, sin in the last R/2)
//   neox: the pair (x[i], x[i + R/2]);  gptj: the pair (x[2i], x[2i + 1])
//   (a, b) -> (a cos - b sin, b cos + a sin)
// Dims [R, D) pass through: copied to a separate output, untouched in place.
//
// Bytes that must move: q and k read once and written once (+ positions, + the cache rows
// used). The ladder:
//   rope_naive  one thread per rotated pair (or passed-through element): each computes its
//               own cos/sin (a double pow and a sincospif per element) and moves 2 or 4
//               bytes at a time.
//   rope_fused  block per token: the token's R/2 (cos, sin) pairs computed once (or read
//               from the cache row once) into shared memory for every head of q and k;
//               16-byte vectors of q and k where their layout allows, each thread's loads
//               issued before the table is made.
//
// Outputs: qo and ko with their own strides. In place, qo is q and ko is k: each element is
// read, by the thread that writes it, before it is written, so nothing here is __restrict__
// or read through the non-coherent cache. ko == nullptr: ko follows qo in one allocation,
// ko = qo + tokens * hq * D (the host's default, one output for its memoized fast path).
#include "common.cuh"

using namespace cuops;

#define CUOPS_NAN __int_as_float(0x7fc00000)

// cos and sin of frequency i at position pos. A position outside the cache's rows gives NaN
// (the host cannot check device positions without waiting for the GPU).
template <typename C, typename P>
__device__ __forceinline__ void rope_cos_sin(P pos, int i, int R, const C* __restrict__ cache, i64 cache_rows,
                                             double base, float& c, float& s) {
    if (cache) {
        if (pos < 0 || (i64)pos >= cache_rows) {
            c = s = CUOPS_NAN;
            return;
        }
        const C* row = cache + (i64)pos * R;
        c = to_f32(row[i]);
        s = to_f32(row[R / 2 + i]);
        return;
    }
    // inv_freq: base^(-2i/R) computed in double and rounded once (the reference's value);
    // the angle is the float32 product, as vLLM's float32 cache holds it.
    const float inv_freq = (float)pow(base, -2.0 * i / R);
    const float angle = (float)pos * inv_freq;
    // sincosf would reduce a large angle through local memory (Payne-Hanek): reduce it to
    // a fraction of a turn in double instead (exact enough for angles up to 2^31), then
    // sincospif, which needs no reduction.
    const double turns = (double)angle * 0.15915494309189535;  // 1 / (2 pi)
    sincospif((float)(2.0 * (turns - rint(turns))), &s, &c);
}

// The row (token, head) of q or k and where it goes: heads [0, hq) are q's, the rest k's.
template <typename T>
struct RopeRow {
    const T* src;
    T* dst;
};

template <typename T>
__device__ __forceinline__ RopeRow<T> rope_row(const T* q, const T* k, T* qo, T* ko, i64 tok, int h, int hq,
                                               i64 q_ts, i64 q_hs, i64 k_ts, i64 k_hs, i64 qo_ts, i64 qo_hs,
                                               i64 ko_ts, i64 ko_hs) {
    if (h < hq) return {q + tok * q_ts + h * q_hs, qo + tok * qo_ts + h * qo_hs};
    h -= hq;
    return {k + tok * k_ts + h * k_hs, ko + tok * ko_ts + h * ko_hs};
}

// Rotate one pair in place of (a, b) by (c, s).
__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
    const float x = a, y = b;
    a = x * c - y * s;
    b = y * c + x * s;
}


template <typename T, typename CS>
__device__ __forceinline__ void rope_item(const RopeRow<T>& row, int j, int half, int R, int gptj, CS cos_sin) {
    if (j >= half) {
        const int e = R + j - half;
        row.dst[e] = row.src[e];
        return;
    }
    float c, s;
    cos_sin(j, c, s);
    const int e1 = gptj ? 2 * j : j, e2 = gptj ? 2 * j + 1 : j + half;
    float a = to_f32(row.src[e1]), b = to_f32(row.src[e2]);
    rotate(a, b, c, s);
    row.dst[e1] = from_f32<T>(a);
    row.dst[e2] = from_f32<T>(b);
}
#define ROPE_ARGS                                                                                                 \
    const T *q, const T *k, const P *__restrict__ positions, const C *__restrict__ cache, T *qo, T *ko, i64 tokens, \
        int hq, int hkv, int D, int R, i64 q_ts, i64 q_hs, i64 k_ts, i64 k_hs, i64 qo_ts, i64 qo_hs, i64 ko_ts,     \
        i64 ko_hs, i64 cache_rows, double base, int gptj, int rotate_only

// ------------------------------------------------------------------ naive
template <typename T, typename C, typename P>
__global__ void rope_naive(ROPE_ARGS) {
    if (!ko) ko = qo + tokens * hq * D;
    const int half = R / 2, heads = hq + hkv;
    const int per_head = half + (rotate_only ? 0 : D - R);  // pairs, then passed-through elements
    const i64 slot = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (slot >= tokens * heads * per_head) return;
    const i64 tok = slot / (heads * per_head);
    const int rem = (int)(slot - tok * heads * per_head);
    const int h = rem / per_head, j = rem - h * per_head;
    const RopeRow<T> row = rope_row(q, k, qo, ko, tok, h, hq, q_ts, q_hs, k_ts, k_hs, qo_ts, qo_hs, ko_ts, ko_hs);
    rope_item(row, j, half, R, gptj,
              [&](int i, float& c, float& s) { rope_cos_sin(positions[tok], i, R, cache, cache_rows, base, c, s); });
}

// ------------------------------------------------------------------ fused
// Block per token. Shared memory holds the token's (cos, sin) pairs interleaved,
// cs[2i] = cos_i, cs[2i + 1] = sin_i, so a thread's frequencies are consecutive 16-byte reads.
// Work items of a head: its rotations (aligned: a vector of each half (neox) or a vector of
// N / 2 interleaved pairs (gptj); else one pair), then its passed-through vectors (or
// elements) unless rotating in place.
// With 16-byte access each thread takes up to ROPE_SLOTS items a batch and issues all their
// loads first: the first batch's are in flight while the position is read and the table
// computed (measured: with the loads after the table's barrier, fp16/bf16 ran at 79 % of
// the copy line on an H200, a block's 20 KB arriving only once its table was done).
constexpr int ROPE_MAX_THREADS = 256;
constexpr int ROPE_SLOTS = 4;

template <typename T, typename C, typename P>
__device__ __forceinline__ void rope_table(float* cs, const P* __restrict__ positions, const C* __restrict__ cache,
                                           i64 cache_rows, i64 tok, int R, double base) {
    const P pos = positions[tok];
    for (int i = threadIdx.x; i < R / 2; i += blockDim.x) rope_cos_sin(pos, i, R, cache, cache_rows, base, cs[2 * i], cs[2 * i + 1]);
    __syncthreads();
}

template <typename T, typename C, typename P>
__global__ void __launch_bounds__(ROPE_MAX_THREADS) rope_fused(ROPE_ARGS, int aligned) {
    extern __shared__ __align__(16) float cs[];
    constexpr int N = Vec<T>::N;
    if (!ko) ko = qo + tokens * hq * D;
    const i64 tok = blockIdx.x;
    const int half = R / 2;
    if (!aligned) {  // element by element: one pair, or one passed-through element, an item
        rope_table<T>(cs, positions, cache, cache_rows, tok, R, base);
        const int per_head = half + (rotate_only ? 0 : D - R);
        for (int it = threadIdx.x; it < (hq + hkv) * per_head; it += blockDim.x) {
            const int h = it / per_head, j = it - h * per_head;
            const RopeRow<T> row = rope_row(q, k, qo, ko, tok, h, hq, q_ts, q_hs, k_ts, k_hs, qo_ts, qo_hs, ko_ts, ko_hs);
            rope_item(row, j, half, R, gptj, [&](int i, float& c, float& s) { c = cs[2 * i], s = cs[2 * i + 1]; });
        }
        return;
    }
    const int rot = gptj ? R / N : half / N;  // rotation vectors a head
    const int per_head = rot + (rotate_only ? 0 : (D - R) / N);
    const int items = (hq + hkv) * per_head;
    for (int first = 0; first < items; first += ROPE_SLOTS * blockDim.x) {  // (uniform: barrier below)
        uint4 a[ROPE_SLOTS], b[ROPE_SLOTS];
#pragma unroll
        for (int r = 0; r < ROPE_SLOTS; ++r) {
            const int it = first + r * blockDim.x + threadIdx.x;
            if (it < items) {
                const int h = it / per_head, j = it - h * per_head;
                const T* src = rope_row(q, k, qo, ko, tok, h, hq, q_ts, q_hs, k_ts, k_hs, qo_ts, qo_hs, ko_ts, ko_hs).src;
                const int e = j < rot ? j * N : R + (j - rot) * N;
                a[r] = *reinterpret_cast<const uint4*>(src + e);
                if (j < rot && !gptj) b[r] = *reinterpret_cast<const uint4*>(src + half + e);
            }
        }
        if (first == 0) rope_table<T>(cs, positions, cache, cache_rows, tok, R, base);
#pragma unroll
        for (int r = 0; r < ROPE_SLOTS; ++r) {
            const int it = first + r * blockDim.x + threadIdx.x;
            if (it >= items) continue;
            const int h = it / per_head, j = it - h * per_head;
            T* dst = rope_row(q, k, qo, ko, tok, h, hq, q_ts, q_hs, k_ts, k_hs, qo_ts, qo_hs, ko_ts, ko_hs).dst;
            if (j >= rot) {  // a passed-through vector
                *reinterpret_cast<uint4*>(dst + R + (j - rot) * N) = a[r];
                continue;
            }
            const T* ea = reinterpret_cast<const T*>(&a[r]);
            float x[N];
#pragma unroll
            for (int m = 0; m < N; ++m) x[m] = to_f32(ea[m]);
            if (gptj) {  // N / 2 pairs (x[2i], x[2i + 1]), i from j * N / 2
                float f[N];
#pragma unroll
                for (int m = 0; m < N; m += 4) *reinterpret_cast<float4*>(f + m) = *reinterpret_cast<const float4*>(cs + j * N + m);
#pragma unroll
                for (int m = 0; m < N / 2; ++m) rotate(x[2 * m], x[2 * m + 1], f[2 * m], f[2 * m + 1]);
                store_vec(dst + j * N, x);
            } else {  // N pairs (x[i], x[i + R/2]), i from j * N
                const T* eb = reinterpret_cast<const T*>(&b[r]);
                float y[N], f[2 * N];
#pragma unroll
                for (int m = 0; m < N; ++m) y[m] = to_f32(eb[m]);
#pragma unroll
                for (int m = 0; m < 2 * N; m += 4)
                    *reinterpret_cast<float4*>(f + m) = *reinterpret_cast<const float4*>(cs + 2 * j * N + m);
#pragma unroll
                for (int m = 0; m < N; ++m) rotate(x[m], y[m], f[2 * m], f[2 * m + 1]);
                store_vec(dst + j * N, x);
                store_vec(dst + half + j * N, y);
            }
        }
    }
}
