// norm.cu: LayerNorm and RMSNorm over the last axis of a (rows, n) array.
//   layer_norm: y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps) (biased var)
//   rms_norm:   y = x * rstd * w,               rstd = 1 / sqrt(mean(x^2) + eps)
// Statistics are float32 whatever the element type; w and b may be null.
//
// Bytes that must move: read x once (+ w, b once, which L2 serves to every row), write y
// once. The ladder:
//   layer_norm_twopass  block per row: a pass for the mean, a pass for the variance, a
//                       pass to write. Reads x three times.
//   layer_norm_welford  block per row: mean and M2 in ONE pass (Welford per thread, Chan's
//                       formula across threads), then the write pass. Reads x twice.
//   rms_norm_twopass    block per row: sum of squares, then the write pass. Reads x twice.
//   *_fused             the row lives in registers (warp per short row, block per long),
//                       16-byte loads; statistics from registers (the variance as a second
//                       sweep over registers, exact two-pass numerics at one-pass cost).
//   *_cluster           (sm_90) a row too long for one block spread over a cluster of CL
//                       blocks; per-block (count, mean, M2) or sum of squares swapped
//                       through distributed shared memory.
//   *_staged            rows (or a cluster's chunks) copied to shared memory by cp.async,
//                       so bytes in flight are bounded by shared memory, not registers;
//                       layer_norm's statistics come from ONE sweep of shared memory
//                       (sums of deviations from the chunk's first element), then the write.
//
// add_rms_norm (vLLM's fused_add_rms_norm): s = x + residual, rounded to T, is written out
// and normalised: y = s * rstd * w, rstd from the ROUNDED s (what the PyTorch composition
// r = x + residual; F.rms_norm(r) computes). Bytes: read x and residual, write s and y.
//   add_rms_norm_twopass  block per row: add, write s and sum s^2; then re-read s for the
//                         write pass. Moves 5 rows of bytes for 4.
//   add_rms_norm_fused    both rows in registers (16-byte loads of x and residual issued
//                         together): 4 rows of bytes.
//   add_rms_norm_staged   both rows copied to shared memory by cp.async (blocks of several
//                         short rows), as *_staged; s goes back to shared memory for the write.
#include "common.cuh"

using namespace cuops;

// ------------------------------------------------------------------ helpers
// Butterfly over a warp: lane 0 ends with the combination of all 32 lanes, and the same
// sequence of operations runs in every block, so every block gets the same bits.
__device__ __forceinline__ Welford warp_welford(Welford v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        Welford w = {__shfl_xor_sync(0xffffffffu, v.n, o), __shfl_xor_sync(0xffffffffu, v.mean, o),
                     __shfl_xor_sync(0xffffffffu, v.m2, o)};
        v = combine(v, w);
    }
    return v;
}

// Welford state over the G threads of a row group (G = 32 or blockDim.x); all get lane 0's.
__device__ __forceinline__ Welford group_welford(Welford v, int G, float* scratch) {
    v = warp_welford(v);
    if (G > 32) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = G >> 5;
        __syncthreads();
        if (lane == 0) {
            scratch[warp] = v.n;
            scratch[32 + warp] = v.mean;
            scratch[64 + warp] = v.m2;
        }
        __syncthreads();
        v = lane < nw ? Welford{scratch[lane], scratch[32 + lane], scratch[64 + lane]} : Welford{0.f, 0.f, 0.f};
        v = warp_welford(v);
    }
    return {__shfl_sync(0xffffffffu, v.n, 0), __shfl_sync(0xffffffffu, v.mean, 0),
            __shfl_sync(0xffffffffu, v.m2, 0)};
}

// y = (x - shift) * scale * w + b over the registers; w and b (16-byte vectors, same layout
// as the row) are read while storing: every row reads them, L2 serves them, and they hold
// no registers across the kernel.
template <typename T, int VECS>
__device__ __forceinline__ void affine_store(const RowRegs<T, VECS>& r, T* __restrict__ q,
                                             const T* __restrict__ w, const T* __restrict__ b, int len,
                                             int t, int G, bool aligned, float shift, float scale) {
    constexpr int N = Vec<T>::N;
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        const int e0 = (i * G + t) * N;
        if (aligned && e0 + N <= len) {
            float o[N], wv[N], bv[N];
            if (w) load_vec(w + e0, wv);
            if (b) load_vec(b + e0, bv);
#pragma unroll
            for (int j = 0; j < N; ++j) {
                o[j] = (r.get(i, j) - shift) * scale;
                if (w) o[j] *= wv[j];
                if (b) o[j] += bv[j];
            }
            store_vec(q + e0, o);
        } else {
#pragma unroll
            for (int j = 0; j < N; ++j) {
                if (e0 + j < len) {
                    float v = (r.get(i, j) - shift) * scale;
                    if (w) v *= to_f32(w[e0 + j]);
                    if (b) v += to_f32(b[e0 + j]);
                    q[e0 + j] = from_f32<T>(v);
                }
            }
        }
    }
}

// Sum of (x - mean)^2 over this thread's elements of the chunk (padding excluded).
template <typename T, int VECS>
__device__ __forceinline__ float sq_dev_sum(const RowRegs<T, VECS>& r, int len, int t, int G, float mean) {
    float m2 = 0.f;
#pragma unroll
    for (int i = 0; i < VECS; ++i)
#pragma unroll
        for (int j = 0; j < RowRegs<T, VECS>::N; ++j) {
            const float d = r.get(i, j) - mean;
            if (RowRegs<T, VECS>::inside(i, j, len, t, G)) m2 += d * d;
        }
    return m2;
}

// Sum of x (or x^2) over this thread's elements; padding holds 0 and adds nothing.
template <typename T, int VECS>
__device__ __forceinline__ float regs_sum(const RowRegs<T, VECS>& r, bool squares) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < VECS; ++i)
#pragma unroll
        for (int j = 0; j < RowRegs<T, VECS>::N; ++j) {
            const float v = r.get(i, j);
            s += squares ? v * v : v;
        }
    return s;
}

// ------------------------------------------------------------------ layer norm
// The textbook rungs' last pass: a block re-reads its row from global memory and writes
// y, and thread 0 the row's statistics.
template <typename T>
__device__ __forceinline__ void layer_norm_write_row(const T* __restrict__ p, T* __restrict__ q,
                                                     const T* __restrict__ w, const T* __restrict__ b, int n,
                                                     float mean, float rstd, float* __restrict__ mean_out,
                                                     float* __restrict__ rstd_out) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = (to_f32(p[i]) - mean) * rstd;
        if (w) v *= to_f32(w[i]);
        if (b) v += to_f32(b[i]);
        q[i] = from_f32<T>(v);
    }
    if (threadIdx.x == 0 && mean_out) {
        mean_out[blockIdx.x] = mean;
        rstd_out[blockIdx.x] = rstd;
    }
}

template <typename T>
__global__ void layer_norm_twopass(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                   T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                   i64 rows, int n, float eps) {
    __shared__ float scratch[32];
    const T* p = x + (i64)blockIdx.x * n;
    T* q = y + (i64)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += to_f32(p[i]);
    const float mean = group_reduce<FSum>(s, blockDim.x, scratch) / n;
    float m2 = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float d = to_f32(p[i]) - mean;
        m2 += d * d;
    }
    const float rstd = rsqrtf(group_reduce<FSum>(m2, blockDim.x, scratch) / n + eps);
    layer_norm_write_row(p, q, w, b, n, mean, rstd, mean_out, rstd_out);
}

template <typename T>
__global__ void layer_norm_welford(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                   T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                   i64 rows, int n, float eps) {
    __shared__ float scratch[96];
    const T* p = x + (i64)blockIdx.x * n;
    T* q = y + (i64)blockIdx.x * n;
    Welford st = {0.f, 0.f, 0.f};
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = to_f32(p[i]);
        st.n += 1.f;
        const float d = v - st.mean;
        st.mean += d / st.n;
        st.m2 += d * (v - st.mean);
    }
    st = group_welford(st, blockDim.x, scratch);
    const float mean = st.mean, rstd = rsqrtf(st.m2 / n + eps);
    layer_norm_write_row(p, q, w, b, n, mean, rstd, mean_out, rstd_out);
}

// The combination of the blocks' Welford states of a cluster.
template <int CL>
__device__ __forceinline__ Welford cluster_welford(Welford mine) {
    return cluster_allreduce<CL>(mine, [](Welford a, Welford b) { return combine(a, b); });
}

template <typename T, int VECS>
__global__ void __launch_bounds__(RowRegs<T, VECS>::MAX_THREADS)
    layer_norm_fused(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                     float* __restrict__ mean_out, float* __restrict__ rstd_out, i64 rows, int n, float eps,
                     int G, int aligned) {
    __shared__ float scratch[32];
    const RowSlot rs = row_slot(rows, n, G);
    RowRegs<T, VECS> r;
    r.load(x + rs.row * n, rs.len, rs.t, G, aligned, 0.f);
    const float mean = group_reduce<FSum>(regs_sum(r, false), G, scratch) / n;
    const float rstd = rsqrtf(group_reduce<FSum>(sq_dev_sum(r, rs.len, rs.t, G, mean), G, scratch) / n + eps);
    affine_store(r, y + rs.row * n, w, b, rs.len, rs.t, G, aligned, mean, rstd);
    if (rs.active && rs.t == 0 && mean_out) {
        mean_out[rs.row] = mean;
        rstd_out[rs.row] = rstd;
    }
}

template <typename T, int VECS, int CL>
__global__ void CUOPS_CLUSTER_DIMS(CL) __launch_bounds__(RowRegs<T, VECS>::MAX_THREADS)
    layer_norm_cluster(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                       float* __restrict__ mean_out, float* __restrict__ rstd_out, i64 rows, int n, float eps,
                       int chunk, int aligned) {
#if CUOPS_HAS_CLUSTERS
    __shared__ float scratch[32];
    const ClusterChunk c = cluster_chunk<CL>(n, chunk);
    const int G = blockDim.x;
    RowRegs<T, VECS> r;
    r.load(x + c.row * n + c.begin, c.len, threadIdx.x, G, aligned, 0.f);
    const float sum = group_reduce<FSum>(regs_sum(r, false), G, scratch);
    const float mean_b = c.len ? sum / c.len : 0.f;
    const float m2_b = group_reduce<FSum>(sq_dev_sum(r, c.len, threadIdx.x, G, mean_b), G, scratch);
    const Welford all = cluster_welford<CL>(Welford{(float)c.len, mean_b, m2_b});
    const float rstd = rsqrtf(all.m2 / n + eps);
    affine_store(r, y + c.row * n + c.begin, w ? w + c.begin : w, b ? b + c.begin : b, c.len, threadIdx.x, G,
                 aligned, all.mean, rstd);
    if (c.rank == 0 && threadIdx.x == 0 && mean_out) {
        mean_out[c.row] = all.mean;
        rstd_out[c.row] = rstd;
    }
#else
    __trap();  // launched only on sm_90 and newer
#endif
}

// ------------------------------------------------------------------ RMS norm
template <typename T>
__global__ void rms_norm_twopass(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, i64 rows,
                                 int n, float eps) {
    __shared__ float scratch[32];
    const T* p = x + (i64)blockIdx.x * n;
    T* q = y + (i64)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = to_f32(p[i]);
        s += v * v;
    }
    const float rstd = rsqrtf(group_reduce<FSum>(s, blockDim.x, scratch) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = to_f32(p[i]) * rstd;
        if (w) v *= to_f32(w[i]);
        q[i] = from_f32<T>(v);
    }
}

template <typename T, int VECS>
__global__ void __launch_bounds__(RowRegs<T, VECS>::MAX_THREADS) rms_norm_fused(const T* __restrict__ x, const T* __restrict__ w,
                                                       T* __restrict__ y, i64 rows, int n, float eps, int G,
                                                       int aligned) {
    __shared__ float scratch[32];
    const RowSlot rs = row_slot(rows, n, G);
    RowRegs<T, VECS> r;
    r.load(x + rs.row * n, rs.len, rs.t, G, aligned, 0.f);
    const float rstd = rsqrtf(group_reduce<FSum>(regs_sum(r, true), G, scratch) / n + eps);
    affine_store(r, y + rs.row * n, w, (const T*)nullptr, rs.len, rs.t, G, aligned, 0.f, rstd);
}

template <typename T, int VECS, int CL>
__global__ void CUOPS_CLUSTER_DIMS(CL) __launch_bounds__(RowRegs<T, VECS>::MAX_THREADS)
    rms_norm_cluster(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, i64 rows, int n,
                     float eps, int chunk, int aligned) {
#if CUOPS_HAS_CLUSTERS
    __shared__ float scratch[32];
    const ClusterChunk c = cluster_chunk<CL>(n, chunk);
    const int G = blockDim.x;
    RowRegs<T, VECS> r;
    r.load(x + c.row * n + c.begin, c.len, threadIdx.x, G, aligned, 0.f);
    const float ss = group_reduce<FSum>(regs_sum(r, true), G, scratch);
    const float all = cluster_allreduce<CL>(ss, [](float a, float b) { return a + b; });
    affine_store(r, y + c.row * n + c.begin, w ? w + c.begin : w, (const T*)nullptr, c.len, threadIdx.x, G, aligned,
                 0.f, rsqrtf(all / n + eps));
#else
    __trap();  // launched only on sm_90 and newer
#endif
}

// ------------------------------------------------------------------ staged rung
// The block copies its rows (CL == 1: blockDim.x / G whole rows, a group of G threads per
// row) or its chunk of one row (CL > 1: a cluster of CL blocks per row) into shared memory
// with cp.async (stage_rows); the statistics sweeps and the write read shared memory.
// A 16-byte vector from global or shared memory (a generic load: w and b may be staged).
template <typename T>
__device__ __forceinline__ void load_vec_any(const T* p, float (&out)[Vec<T>::N]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < Vec<T>::N; ++j) out[j] = to_f32(e[j]);
}

// When the host asks for it (`staged`: a block of CL == 1 stages several short rows), the
// block stages weight (and bias) once too, right after its rows: every row of the block
// then reads them from shared memory instead of each fetching them again through L2.
// Returns the pointer the block should read p from (p itself when not staged).
// `slot`: 0 weight, 1 bias.
template <typename T, int CL>
__device__ __forceinline__ const T* stage_param(T* buf, const T* p, int n, int G, int slot, int staged,
                                                bool aligned) {
    if (CL > 1 || p == nullptr || !staged) return p;
    T* s = buf + (blockDim.x / G + slot) * n;
    if (aligned) {
        issue_to_smem(s, p, n);  // completed by stage_rows' wait and barrier
    } else {
        for (int e = threadIdx.x; e < n; e += blockDim.x) s[e] = p[e];
    }
    return s;
}

// y = (x - shift) * scale * w + b from shared memory; w, b as 16-byte vectors when aligned.
template <typename T>
__device__ __forceinline__ void smem_affine_store(const T* s, T* __restrict__ q, const T* __restrict__ w,
                                                  const T* __restrict__ b, int len, int t, int G, bool aligned,
                                                  float shift, float scale) {
    constexpr int N = Vec<T>::N;
    if (aligned) {
        for (int e0 = t * N; e0 < len; e0 += G * N) {
            const uint4 raw = *reinterpret_cast<const uint4*>(s + e0);
            const T* e = reinterpret_cast<const T*>(&raw);
            float o[N], wv[N], bv[N];
            if (w) load_vec_any(w + e0, wv);
            if (b) load_vec_any(b + e0, bv);
#pragma unroll
            for (int j = 0; j < N; ++j) {
                o[j] = (to_f32(e[j]) - shift) * scale;
                if (w) o[j] *= wv[j];
                if (b) o[j] += bv[j];
            }
            store_vec(q + e0, o);
        }
    } else {
        for (int e = t; e < len; e += G) {
            float v = (to_f32(s[e]) - shift) * scale;
            if (w) v *= to_f32(w[e]);
            if (b) v += to_f32(b[e]);
            q[e] = from_f32<T>(v);
        }
    }
}

template <typename T, int CL>
__global__ void CUOPS_CLUSTER_DIMS(CL) __launch_bounds__(1024)
    layer_norm_staged(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                      float* __restrict__ mean_out, float* __restrict__ rstd_out, i64 rows, int n, float eps,
                      int chunk, int G, int params, int aligned) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    __shared__ float scratch[32];
    T* buf = reinterpret_cast<T*>(smem_bytes);
    const T* ws = stage_param<T, CL>(buf, w, n, G, 0, params, aligned);
    const T* bs = stage_param<T, CL>(buf, b, n, G, 1, params, aligned);
    const StagedRow<T> r = stage_rows<T, CL>(buf, x, rows, n, chunk, G, aligned);
    // Mean and M2 in one sweep of shared memory, from sums of deviations from c, the
    // chunk's first element: M2 = S2 - S1^2 / len. Shifting by an element of the data
    // (not by 0) keeps S1 / len = mean - c of the order of the spread, so the subtraction
    // loses little even when |mean| >> std. One sweep instead of two shortens each block's
    // life, and with it the time its shared memory is held (benchmarks/NOTES.md).
    const float c = r.len ? to_f32(r.s[0]) : 0.f;
    float s1 = 0.f, s2 = 0.f;
    smem_sweep(r.s, r.len, r.t, G, aligned, [&](int, float v) {
        const float d = v - c;
        s1 += d;
        s2 = fmaf(d, d, s2);
    });
    s1 = group_reduce<FSum>(s1, G, scratch);  // every thread: it may __syncthreads
    s2 = group_reduce<FSum>(s2, G, scratch);
    const float mean_b = r.len ? c + s1 / r.len : 0.f;
    const float m2 = r.len ? fmaxf(s2 - s1 * (s1 / r.len), 0.f) : 0.f;
    float mean = mean_b, rstd = rsqrtf(m2 / n + eps);
    if constexpr (CL > 1) {
#if CUOPS_HAS_CLUSTERS
        const Welford all = cluster_welford<CL>(Welford{(float)r.len, mean_b, m2});
        mean = all.mean;
        rstd = rsqrtf(all.m2 / n + eps);
#else
        __trap();  // launched only on sm_90 and newer
#endif
    }
    smem_affine_store(r.s, y + r.row * n + r.begin, ws ? ws + r.begin : ws, bs ? bs + r.begin : bs, r.len, r.t,
                      G, aligned, mean, rstd);
    if (mean_out && r.len && r.t == 0 && r.rank == 0) {
        mean_out[r.row] = mean;
        rstd_out[r.row] = rstd;
    }
}

template <typename T, int CL>
__global__ void CUOPS_CLUSTER_DIMS(CL) __launch_bounds__(1024)
    rms_norm_staged(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, i64 rows, int n, float eps,
                    int chunk, int G, int params, int aligned) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    __shared__ float scratch[32];
    T* buf = reinterpret_cast<T*>(smem_bytes);
    const T* ws = stage_param<T, CL>(buf, w, n, G, 0, params, aligned);
    const StagedRow<T> r = stage_rows<T, CL>(buf, x, rows, n, chunk, G, aligned);
    float ss = 0.f;
    smem_sweep(r.s, r.len, r.t, G, aligned, [&](int, float v) { ss += v * v; });
    ss = group_reduce<FSum>(ss, G, scratch);
    if constexpr (CL > 1) {
#if CUOPS_HAS_CLUSTERS
        ss = cluster_allreduce<CL>(ss, [](float a, float b) { return a + b; });
#else
        __trap();  // launched only on sm_90 and newer
#endif
    }
    smem_affine_store(r.s, y + r.row * n + r.begin, ws ? ws + r.begin : ws, (const T*)nullptr, r.len, r.t, G,
                      aligned, 0.f, rsqrtf(ss / n + eps));
}

// ------------------------------------------------------------------ add + RMS norm
// Outputs: y (normed) and s (the sum). s == nullptr: s follows y in one allocation,
// s = y + rows * n (the host's default, so that its memoized fast path has one output to
// allocate, cupyops/_fast.py). In place (vLLM's contract), y is x and s is residual: every
// element is read, by the thread that writes it, before it is written (the staged rung reads
// the block's rows before its barrier), and nothing here is __restrict__ or read through
// the non-coherent cache, since x and y (residual and s) may be one array.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
    return to_f32(from_f32<T>(v));
}

template <typename T>
__device__ __forceinline__ T* sum_dst(T* y, T* s, i64 rows, int n) {
    return s ? s : y + rows * n;
}

template <typename T>
__global__ void add_rms_norm_twopass(const T* x, const T* residual, const T* __restrict__ w, T* y, T* s, i64 rows,
                                     int n, float eps) {
    __shared__ float scratch[32];
    s = sum_dst(y, s, rows, n);
    const i64 base = (i64)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = round_to<T>(to_f32(x[base + i]) + to_f32(residual[base + i]));
        s[base + i] = from_f32<T>(v);
        ss += v * v;
    }
    const float rstd = rsqrtf(group_reduce<FSum>(ss, blockDim.x, scratch) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {  // reads back what this thread wrote
        float v = to_f32(s[base + i]) * rstd;
        if (w) v *= to_f32(w[i]);
        y[base + i] = from_f32<T>(v);
    }
}

// v = round_T(x + r) over this thread's elements of the row (RowRegs' layout); padding 0.
// The 2 * VECS 16-byte loads are independent, so they are all in flight before the adds.
template <typename T, int VECS>
__device__ __forceinline__ void load_sum(RowRegs<T, VECS>& v, const T* x, const T* r, int len, int t, int G,
                                         bool aligned) {
    constexpr int N = Vec<T>::N;
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        const int e0 = (i * G + t) * N;
        if (aligned && e0 + N <= len) {
            float a[N], b[N];
            load_vec_any(x + e0, a);
            load_vec_any(r + e0, b);
#pragma unroll
            for (int j = 0; j < N; ++j) v.v[i][j] = round_to<T>(a[j] + b[j]);
        } else {
#pragma unroll
            for (int j = 0; j < N; ++j)
                v.v[i][j] = (e0 + j < len) ? round_to<T>(to_f32(x[e0 + j]) + to_f32(r[e0 + j])) : 0.f;
        }
    }
}

template <typename T, int VECS>
__global__ void __launch_bounds__(RowRegs<T, VECS>::MAX_THREADS)
    add_rms_norm_fused(const T* x, const T* residual, const T* __restrict__ w, T* y, T* s, i64 rows, int n, float eps,
                       int G, int aligned) {
    __shared__ float scratch[32];
    s = sum_dst(y, s, rows, n);
    const RowSlot rs = row_slot(rows, n, G);
    RowRegs<T, VECS> v;
    load_sum(v, x + rs.row * n, residual + rs.row * n, rs.len, rs.t, G, aligned);
    v.store(s + rs.row * n, rs.len, rs.t, G, aligned, [](float e) { return e; });
    const float rstd = rsqrtf(group_reduce<FSum>(regs_sum(v, true), G, scratch) / n + eps);
    affine_store(v, y + rs.row * n, w, (const T*)nullptr, rs.len, rs.t, G, aligned, 0.f, rstd);
}

// A block of blockDim.x / G rows: the x rows, then the residual rows, then (when the host
// asks, `params`) the weight, staged by cp.async (the host plans a row as the 2n elements
// of both, cupyops/ops/_rows.py). The sum goes to global memory and back over the x rows
// in shared memory, which the write pass then reads.
template <typename T>
__global__ void __launch_bounds__(1024)
    add_rms_norm_staged(const T* x, const T* residual, const T* __restrict__ w, T* y, T* s, i64 rows, int n,
                        float eps, int chunk, int G, int params, int aligned) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    __shared__ float scratch[32];
    constexpr int N = Vec<T>::N;
    s = sum_dst(y, s, rows, n);
    T* xs = reinterpret_cast<T*>(smem_bytes);
    const int rb = blockDim.x / G, g = threadIdx.x / G, t = threadIdx.x % G;
    T* rs = xs + rb * n;
    const i64 row0 = (i64)blockIdx.x * rb;
    const int nrows = (int)min((i64)rb, rows - row0);
    const T* ws = w;
    if (params && w) {
        T* wbuf = rs + rb * n;
        if (aligned) {
            issue_to_smem(wbuf, w, n);
        } else {
            for (int e = threadIdx.x; e < n; e += blockDim.x) wbuf[e] = w[e];
        }
        ws = wbuf;
    }
    if (aligned) {
        issue_to_smem(xs, x + row0 * n, nrows * n);
    } else {
        for (int e = threadIdx.x; e < nrows * n; e += blockDim.x) xs[e] = x[row0 * n + e];
    }
    stage_to_smem(rs, residual + row0 * n, nrows * n, aligned);  // waits for all three, barrier
    const int len = g < nrows ? n : 0;
    T* xr = xs + g * n;
    const T* rr = rs + g * n;
    T* srow = s + (row0 + g) * n;
    float ss = 0.f;
    if (aligned) {
        for (int e0 = t * N; e0 < len; e0 += G * N) {
            float a[N], b[N];
            load_vec_any(xr + e0, a);
            load_vec_any(rr + e0, b);
#pragma unroll
            for (int j = 0; j < N; ++j) {
                a[j] = round_to<T>(a[j] + b[j]);
                ss += a[j] * a[j];
            }
            store_vec(srow + e0, a);
            store_vec(xr + e0, a);  // the same elements smem_affine_store gives this thread
        }
    } else {
        for (int e = t; e < len; e += G) {
            const float v = round_to<T>(to_f32(xr[e]) + to_f32(rr[e]));
            ss += v * v;
            srow[e] = xr[e] = from_f32<T>(v);
        }
    }
    ss = group_reduce<FSum>(ss, G, scratch);
    smem_affine_store(xr, y + (row0 + g) * n, ws, (const T*)nullptr, len, t, G, aligned, 0.f, rsqrtf(ss / n + eps));
}
