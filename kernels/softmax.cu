// softmax.cu: softmax over the last axis of a (rows, n) array, y = exp(x - max) / sum.
//
// Bytes that must move: read x once, write y once (2 * rows * n * sizeof(T)). The ladder:
//   softmax_naive    one block per row, three passes over global memory: max, sum of exp,
//                    write. Reads x three times.
//   softmax_online   one block per row; the max and the sum of exp come from ONE read pass
//                    (a running sum rescaled whenever the max grows, "online softmax"),
//                    then the write pass. Reads x twice; works for rows of any length, so
//                    it is also the fallback of the rungs above it. 16-byte loads.
//   softmax_fused    the row lives in registers: a warp per short row, a block per long
//                    row, 16-byte loads all issued before the first use; max, exp, sum and
//                    the scaled write all from registers. Reads once, writes once.
//   softmax_cluster  (sm_90) a row too long for one block is spread over a cluster of CL
//                    blocks on neighbouring SMs, each holding its chunk in registers; the
//                    blocks swap their (max, sum) through distributed shared memory. Still
//                    one read and one write, for rows up to CL x 1024 threads x registers.
// An all -inf row gives NaN, as NumPy's exp(x - max) / sum does.
#include "common.cuh"

using namespace cuops;

// Exp of x - m where a -inf maximum (an all -inf chunk) must not turn -inf - -inf into NaN
// early: the chunk's values become 0 and its sum 0; the final 0 * (1 / 0) still gives NaN
// for a row with no finite value, as NumPy does.
__device__ __forceinline__ float safe_max(float m) { return m == -CUOPS_INF ? 0.f : m; }

template <typename T>
__global__ void softmax_naive(const T* __restrict__ x, T* __restrict__ y, i64 rows, int n) {
    __shared__ float scratch[32];
    const T* p = x + (i64)blockIdx.x * n;
    T* q = y + (i64)blockIdx.x * n;
    float m = -CUOPS_INF;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, to_f32(p[i]));
    m = group_reduce<FMax>(m, blockDim.x, scratch);
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += expf(to_f32(p[i]) - m);
    s = group_reduce<FSum>(s, blockDim.x, scratch);
    for (int i = threadIdx.x; i < n; i += blockDim.x) q[i] = from_f32<T>(expf(to_f32(p[i]) - m) / s);
}

template <typename T>
__global__ void softmax_online(const T* __restrict__ x, T* __restrict__ y, i64 rows, int n, int aligned) {
    constexpr int N = Vec<T>::N;
    __shared__ float scratch[32];
    const T* p = x + (i64)blockIdx.x * n;
    T* q = y + (i64)blockIdx.x * n;
    const int nvec = aligned ? n / N : 0;
    MaxSum st = {-CUOPS_INF, 0.f};
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
        float f[N];
        load_vec(p + i * N, f);
        float m = f[0];
#pragma unroll
        for (int j = 1; j < N; ++j) m = fmaxf(m, f[j]);
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < N; ++j) s += __expf(f[j] - m);
        st = combine(st, MaxSum{m, s});
    }
    for (int i = nvec * N + threadIdx.x; i < n; i += blockDim.x) st = combine(st, MaxSum{to_f32(p[i]), 1.f});
    // block-wide combine: max first, then each thread rescales its sum to that max
    const float m = group_reduce<FMax>(st.m, blockDim.x, scratch);
    const float mine = (st.m == -CUOPS_INF) ? 0.f : st.s * __expf(st.m - m);
    const float inv = 1.f / group_reduce<FSum>(mine, blockDim.x, scratch);
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
        float f[N];
        load_vec(p + i * N, f);
#pragma unroll
        for (int j = 0; j < N; ++j) f[j] = __expf(f[j] - m) * inv;
        store_vec(q + i * N, f);
    }
    for (int i = nvec * N + threadIdx.x; i < n; i += blockDim.x) q[i] = from_f32<T>(__expf(to_f32(p[i]) - m) * inv);
}

// Local part of the register-resident rungs: this group's (max, sum of exp(x - max)) over
// its chunk. The exponentials are recomputed at the store rather than kept: keeping them
// would double the registers of 2-byte types (see RowRegs).
template <typename T, int VECS>
__device__ __forceinline__ MaxSum softmax_chunk_stats(const RowRegs<T, VECS>& r, int G, float* scratch) {
    float m = -CUOPS_INF;
#pragma unroll
    for (int i = 0; i < VECS; ++i)
#pragma unroll
        for (int j = 0; j < RowRegs<T, VECS>::N; ++j) m = fmaxf(m, r.get(i, j));
    m = group_reduce<FMax>(m, G, scratch);
    const float mu = safe_max(m);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < VECS; ++i)
#pragma unroll
        for (int j = 0; j < RowRegs<T, VECS>::N; ++j) s += __expf(r.get(i, j) - mu);
    s = group_reduce<FSum>(s, G, scratch);
    return {m, s};
}

// G threads (a power of two) per row, blockDim.x / G rows per block.
template <typename T, int VECS>
__global__ void __launch_bounds__(RowRegs<T, VECS>::MAX_THREADS) softmax_fused(const T* __restrict__ x, T* __restrict__ y,
                                                      i64 rows, int n, int G, int aligned) {
    __shared__ float scratch[32];
    const RowSlot rs = row_slot(rows, n, G);
    RowRegs<T, VECS> r;
    r.load(x + rs.row * n, rs.len, rs.t, G, aligned, -CUOPS_INF);
    const MaxSum st = softmax_chunk_stats(r, G, scratch);
    const float mu = safe_max(st.m), inv = 1.f / st.s;
    r.store(y + rs.row * n, rs.len, rs.t, G, aligned, [=](float v) { return __expf(v - mu) * inv; });
}

// The scale of a cluster block's exp(x - its own max) values once the row's (max, sum) is
// known: an all -inf row is NaN everywhere; an all -inf chunk of a finite row is 0.
__device__ __forceinline__ float cluster_softmax_scale(MaxSum mine, MaxSum row) {
    if (row.m == -CUOPS_INF) return __int_as_float(0x7fc00000);
    return (mine.m == -CUOPS_INF) ? 0.f : __expf(mine.m - row.m) / row.s;
}

// CL blocks per row; block `rank` owns elements [rank * chunk, (rank + 1) * chunk).
template <typename T, int VECS, int CL>
__global__ void CUOPS_CLUSTER_DIMS(CL) __launch_bounds__(RowRegs<T, VECS>::MAX_THREADS)
    softmax_cluster(const T* __restrict__ x, T* __restrict__ y, i64 rows, int n, int chunk, int aligned) {
#if CUOPS_HAS_CLUSTERS
    __shared__ float scratch[32];
    const ClusterChunk c = cluster_chunk<CL>(n, chunk);
    const int G = blockDim.x;
    RowRegs<T, VECS> r;
    r.load(x + c.row * n + c.begin, c.len, threadIdx.x, G, aligned, -CUOPS_INF);
    const MaxSum mine = softmax_chunk_stats(r, G, scratch);
    const MaxSum all = cluster_allreduce<CL>(mine, [](MaxSum a, MaxSum b) { return combine(a, b); });
    const float mu = safe_max(mine.m), a = cluster_softmax_scale(mine, all);
    r.store(y + c.row * n + c.begin, c.len, threadIdx.x, G, aligned, [=](float v) { return __expf(v - mu) * a; });
#else
    __trap();  // launched only on sm_90 and newer
#endif
}

// Staged rung: the block copies its rows (CL == 1: blockDim.x / G whole rows, a group of
// G threads per row) or its chunk of one row (CL > 1: a cluster of CL blocks per row) into
// shared memory with cp.async, then max, sum and the write all read shared memory.
template <typename T, int CL>
__global__ void CUOPS_CLUSTER_DIMS(CL) __launch_bounds__(1024)
    softmax_staged(const T* __restrict__ x, T* __restrict__ y, i64 rows, int n, int chunk, int G, int aligned) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    __shared__ float scratch[32];
    constexpr int N = Vec<T>::N;
    const StagedRow<T> r = stage_rows<T, CL>(reinterpret_cast<T*>(smem_bytes), x, rows, n, chunk, G, aligned);
    float m = -CUOPS_INF;
    smem_sweep(r.s, r.len, r.t, G, aligned, [&](int, float v) { m = fmaxf(m, v); });
    m = group_reduce<FMax>(m, G, scratch);
    const float mu = safe_max(m);
    float sum = 0.f;
    smem_sweep(r.s, r.len, r.t, G, aligned, [&](int, float v) { sum += __expf(v - mu); });
    sum = group_reduce<FSum>(sum, G, scratch);
    float scale = 1.f / sum;
    if constexpr (CL > 1) {
#if CUOPS_HAS_CLUSTERS
        const MaxSum mine = {m, sum};
        scale = cluster_softmax_scale(mine, cluster_allreduce<CL>(mine, [](MaxSum a, MaxSum b) { return combine(a, b); }));
#else
        __trap();  // launched only on sm_90 and newer
#endif
    }
    T* q = y + r.row * n + r.begin;
    if (aligned) {
        for (int e0 = r.t * N; e0 < r.len; e0 += G * N) {
            const uint4 raw = *reinterpret_cast<const uint4*>(r.s + e0);
            const T* e = reinterpret_cast<const T*>(&raw);
            float o[N];
#pragma unroll
            for (int j = 0; j < N; ++j) o[j] = __expf(to_f32(e[j]) - mu) * scale;
            store_vec(q + e0, o);
        }
    } else {
        for (int e = r.t; e < r.len; e += G) q[e] = from_f32<T>(__expf(to_f32(r.s[e]) - mu) * scale);
    }
}
