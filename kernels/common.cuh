// common.cuh: the pieces every kernel family shares.
//  - element <-> float conversion for float / __half / __nv_bfloat16 (math is done in fp32)
//  - accumulator types and casts for reductions (double, long long)
//  - 16-byte vector loads/stores: the memory-bound kernels move whole 16-byte sectors
//  - warp / block reductions with shuffles (no float atomics anywhere: results are
//    bitwise reproducible run to run)
//  - the pieces of Hopper thread-block clusters (distributed shared memory) used by the
//    rungs that keep one long row on chip across several SMs
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace cuops {

typedef long long i64;

// NVRTC has no <cmath>: spell +inf through its bit pattern.
#define CUOPS_INF __int_as_float(0x7f800000)

// ---------------------------------------------------------------- conversions
template <typename T> struct is_half_like { static constexpr bool value = false; };
template <> struct is_half_like<__half> { static constexpr bool value = true; };
template <> struct is_half_like<__nv_bfloat16> { static constexpr bool value = true; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Any element type -> accumulator type A (half types go through float).
template <typename A, typename T> __device__ __forceinline__ A to_acc(T x) {
    if constexpr (is_half_like<T>::value) return static_cast<A>(to_f32(x));
    else return static_cast<A>(x);
}
// Accumulator -> output element type.
template <typename T, typename A> __device__ __forceinline__ T from_acc(A a) {
    if constexpr (is_half_like<T>::value) return from_f32<T>(static_cast<float>(a));
    else return static_cast<T>(a);
}

// ---------------------------------------------------------------- reduction ops
struct SumOp {
    template <typename A> __device__ static A identity() { return A(0); }
    template <typename A> __device__ static A apply(A a, A b) { return a + b; }
};

struct MaxOp {
    template <typename A> __device__ static A identity() {
        if constexpr (sizeof(A) == 8 && A(0.5) == A(0)) return (A)(-0x7fffffffffffffffLL - 1);
        else if constexpr (A(0.5) == A(0)) return (A)(-0x7fffffff - 1);
        else return (A)(-CUOPS_INF);
    }
    // NaN-propagating, as numpy.max.
    template <typename A> __device__ static A apply(A a, A b) { return (a > b || a != a) ? a : b; }
};

// Accumulator of a reduction producing Tout.
template <typename Op, typename Tout> struct AccOf { typedef float type; };
template <typename Op> struct AccOf<Op, double> { typedef double type; };
template <> struct AccOf<SumOp, int> { typedef i64 type; };
template <> struct AccOf<SumOp, i64> { typedef i64 type; };
template <> struct AccOf<MaxOp, int> { typedef int type; };
template <> struct AccOf<MaxOp, i64> { typedef i64 type; };

// ---------------------------------------------------------------- 16-byte vectors
template <typename T> struct Vec { static constexpr int N = 16 / sizeof(T); };

// Read 16 bytes (N elements) as floats. p must be 16-byte aligned.
template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[Vec<T>::N]) {
    uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < Vec<T>::N; ++j) out[j] = to_f32(e[j]);
}

// Read 16 bytes as accumulator values (exact for integers, unlike the float path).
template <typename A, typename T>
__device__ __forceinline__ void load_vec_acc(const T* p, A (&out)[Vec<T>::N]) {
    uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < Vec<T>::N; ++j) out[j] = to_acc<A>(e[j]);
}

template <typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[Vec<T>::N]) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < Vec<T>::N; ++j) e[j] = from_f32<T>(in[j]);
    *reinterpret_cast<uint4*>(p) = raw;
}

// ---------------------------------------------------------------- warp / block reductions
template <typename Op, typename A> __device__ __forceinline__ A warp_reduce(A v, int width = 32) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < width) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

struct FSum {
    __device__ static float apply(float a, float b) { return a + b; }
};
struct FMax {
    __device__ static float apply(float a, float b) { return fmaxf(a, b); }
};

// Reduce over the G threads of a row group; every thread of the group gets the result.
// G is a power of two: up to 32 the groups are lane ranges of one warp (shuffles only);
// above, a group is G / 32 consecutive warps and `scratch` needs one slot per warp of the
// block. Every thread of the block must call it (no early exits): it may __syncthreads.
template <typename Op, typename A>
__device__ __forceinline__ A group_reduce(A v, int G, A* scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < G) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (G <= 32) return v;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = G >> 5;
    const int first = warp & ~(nw - 1);  // this group's first warp
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[first + (lane < nw ? lane : 0)];  // lanes >= nw: duplicates lane 0 never mixes in
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < nw) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
    return __shfl_sync(0xffffffffu, v, 0);
}

// ---------------------------------------------------------------- online softmax / Welford
// (max, sum of exp(x - max)) pairs combine associatively; -inf maxima contribute nothing.
struct MaxSum {
    float m, s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
    float m = fmaxf(a.m, b.m);
    float sa = (a.m == -CUOPS_INF) ? 0.f : a.s * __expf(a.m - m);
    float sb = (b.m == -CUOPS_INF) ? 0.f : b.s * __expf(b.m - m);
    return {m, sa + sb};
}

// (count, mean, M2) of Welford; combined with Chan's formula.
struct Welford {
    float n, mean, m2;
};
__device__ __forceinline__ Welford combine(Welford a, Welford b) {
    float n = a.n + b.n;
    if (n == 0.f) return {0.f, 0.f, 0.f};
    float d = b.mean - a.mean, fb = b.n / n;
    return {n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
}

// ---------------------------------------------------------------- a row chunk in registers
// Thread t of a group of G threads holds VECS 16-byte vectors of the chunk [0, len) of row
// pointer p: vector i covers elements ((i * G + t) * N) .. + N - 1, so each load
// instruction of the group reads G * 16 contiguous bytes (coalesced), and all VECS loads
// are issued before the first use. Values are kept widened to float.
template <typename T, int VECS> struct RowRegs {
    static constexpr int N = Vec<T>::N;
    // 32 floats a thread need more than the 64 registers a 1024-thread block allows;
    // such rows use at most 512 threads (the host's plans follow the same rule).
    static constexpr int MAX_THREADS = VECS * N >= 32 ? 512 : 1024;
    float v[VECS][N];

    __device__ __forceinline__ float get(int i, int j) const { return v[i][j]; }
    // Is element j of vector i inside the chunk?
    __device__ __forceinline__ static bool inside(int i, int j, int len, int t, int G) {
        return (i * G + t) * N + j < len;
    }

    __device__ __forceinline__ void load(const T* p, int len, int t, int G, bool aligned, float fill) {
#pragma unroll
        for (int i = 0; i < VECS; ++i) {
            const int e0 = (i * G + t) * N;
            if (aligned && e0 + N <= len) {
                load_vec(p + e0, v[i]);
            } else {
#pragma unroll
                for (int j = 0; j < N; ++j) v[i][j] = (e0 + j < len) ? to_f32(p[e0 + j]) : fill;
            }
        }
    }

    // q[e] = f(x[e]) for every element of the chunk.
    template <typename F>
    __device__ __forceinline__ void store(T* q, int len, int t, int G, bool aligned, F f) const {
#pragma unroll
        for (int i = 0; i < VECS; ++i) {
            const int e0 = (i * G + t) * N;
            if (aligned && e0 + N <= len) {
                float o[N];
#pragma unroll
                for (int j = 0; j < N; ++j) o[j] = f(v[i][j]);
                store_vec(q + e0, o);
            } else {
#pragma unroll
                for (int j = 0; j < N; ++j)
                    if (e0 + j < len) q[e0 + j] = from_f32<T>(f(v[i][j]));
            }
        }
    }
};

// The row a thread's group owns in the register rungs: blockDim.x / G rows a block. A group
// past the last row still joins the reductions (shuffles, barriers), on nothing (len 0).
struct RowSlot {
    i64 row;
    int t, len;
    bool active;
};
__device__ __forceinline__ RowSlot row_slot(i64 rows, int n, int G) {
    const i64 r0 = (i64)blockIdx.x * (blockDim.x / G) + threadIdx.x / G;
    const bool active = r0 < rows;
    return {active ? r0 : 0, static_cast<int>(threadIdx.x % G), active ? n : 0, active};
}

// The share of one row a block of a cluster of CL blocks owns: elements [begin, begin + len)
// of row `row`, `chunk` (a multiple of the vector width) a block, the last block's shorter.
struct ClusterChunk {
    i64 row;
    int rank, begin, len;
};
template <int CL>
__device__ __forceinline__ ClusterChunk cluster_chunk(int n, int chunk) {
    const int rank = blockIdx.x % CL, begin = rank * chunk;
    return {static_cast<i64>(blockIdx.x / CL), rank, begin, max(0, min(n, begin + chunk) - begin)};
}

// ---------------------------------------------------------------- rows staged in shared memory
// cp.async copies 16 bytes global -> shared without passing through registers, so a thread
// can have any number of them in flight: the bytes a block keeps in flight are bounded by
// its shared memory, not by its registers (which is what limits the register rungs for
// 2-byte types). Works from sm_80.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

// Start copying p[0, len) to s with cp.async (16-byte aligned, len a multiple of the vector
// width); the next stage_to_smem commits and waits for these copies too.
template <typename T>
__device__ __forceinline__ void issue_to_smem(T* s, const T* p, int len) {
    constexpr int N = Vec<T>::N;
    for (int e = threadIdx.x * N; e < len; e += blockDim.x * N) cp_async16(s + e, p + e);
}

// Copy p[0, len) to s (all threads of the block), then barrier. `aligned`: both 16-byte
// aligned and len a multiple of the vector width.
template <typename T>
__device__ __forceinline__ void stage_to_smem(T* s, const T* p, int len, bool aligned) {
    constexpr int N = Vec<T>::N;
    if (aligned) {
        for (int e = threadIdx.x * N; e < len; e += blockDim.x * N) cp_async16(s + e, p + e);
        asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
    } else {
        for (int e = threadIdx.x; e < len; e += blockDim.x) s[e] = p[e];
    }
    __syncthreads();
}

// What a group of the staged rungs works on after staging. CL == 1: the block stages
// blockDim.x / G whole rows, one per group of G threads. CL > 1: the block is one of a
// cluster of CL blocks sharing a row and stages its chunk [begin, begin + len).
template <typename T>
struct StagedRow {
    const T* s;  // this group's elements in shared memory
    i64 row;
    int begin, len, t, rank;
};

template <typename T, int CL>
__device__ __forceinline__ StagedRow<T> stage_rows(T* buf, const T* x, i64 rows, int n, int chunk, int G,
                                                   bool aligned) {
    StagedRow<T> r;
    r.t = threadIdx.x % G;
    if constexpr (CL == 1) {
        const int rb = blockDim.x / G, g = threadIdx.x / G;
        const i64 row0 = (i64)blockIdx.x * rb;
        const int nrows = (int)min((i64)rb, rows - row0);
        stage_to_smem(buf, x + row0 * n, nrows * n, aligned);
        r.row = row0 + g;
        r.len = g < nrows ? n : 0;
        r.s = buf + g * n;
        r.begin = r.rank = 0;
    } else {
        const ClusterChunk c = cluster_chunk<CL>(n, chunk);
        r.row = c.row;
        r.rank = c.rank;
        r.begin = c.begin;
        r.len = c.len;
        stage_to_smem(buf, x + r.row * n + r.begin, r.len, aligned);
        r.s = buf;
    }
    return r;
}

// f(e, x) for every element e of s[0, len) owned by thread t of a group of G: 16-byte
// shared-memory reads (consecutive threads, consecutive vectors: no bank conflicts).
template <typename T, typename F>
__device__ __forceinline__ void smem_sweep(const T* s, int len, int t, int G, bool aligned, F f) {
    constexpr int N = Vec<T>::N;
    if (aligned) {
        for (int e0 = t * N; e0 < len; e0 += G * N) {
            const uint4 raw = *reinterpret_cast<const uint4*>(s + e0);
            const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int j = 0; j < N; ++j) f(e0 + j, to_f32(e[j]));
        }
    } else {
        for (int e = t; e < len; e += G) f(e, to_f32(s[e]));
    }
}

// ---------------------------------------------------------------- Hopper clusters
// A cluster's blocks run at the same time on neighbouring SMs and can read each other's
// shared memory (DSMEM). The cluster rungs split one long row over CL blocks, keep each
// block's chunk in registers, and swap only the per-block statistics through DSMEM.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CUOPS_HAS_CLUSTERS 1
#define CUOPS_CLUSTER_DIMS(cl) __cluster_dims__(cl, 1, 1)
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// cluster_sync in two halves: every thread of the cluster arrives, and waits (acquire)
// before it next depends on the other blocks; each thread arrives, then waits, once a
// phase. The arrival is relaxed: with release semantics ptxas puts a fence of the whole
// GPU before it (MEMBAR.ALL.GPU, ~1k cycles on an H100), so what this thread wrote before
// is not ordered by it, except mbarrier inits after fence.mbarrier_init.release.cluster,
// the fence made for this arrival. cluster_arrive_relaxed / cluster_wait: a whole warp at
// once; cluster_wait_thread: one thread alone (a diverged producer thread).
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait_thread() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
// Read a float from the shared memory of block `rank` of this cluster, at the address
// where `local` sits in ours.
// The address of `local`'s counterpart in the shared memory of cluster block `rank`.
__device__ __forceinline__ unsigned dsmem_address(const void* local, unsigned rank) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(local));
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ float ld_dsmem(const float* local, unsigned rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(dsmem_address(local, rank)) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long ld_dsmem_u64(const unsigned long long* local, unsigned rank) {
    unsigned long long v;
    asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(dsmem_address(local, rank)) : "memory");
    return v;
}
__device__ __forceinline__ int ld_dsmem_s32(const int* local, unsigned rank) {
    int v;
    asm volatile("ld.shared::cluster.s32 %0, [%1];" : "=r"(v) : "r"(dsmem_address(local, rank)) : "memory");
    return v;
}

// Every block of a cluster of CL (a power of two) contributes one S (a struct of floats);
// every block gets the combination of all CL. The same butterfly runs in every block on
// the same values, so all blocks get the same bits, whatever `combine`'s symmetry.
template <int CL, typename S, typename Combine>
__device__ __forceinline__ S cluster_allreduce(S mine, Combine combine) {
    constexpr int K = sizeof(S) / sizeof(float);
    __shared__ float slot[K], total[K];
    if (threadIdx.x == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) slot[k] = reinterpret_cast<const float*>(&mine)[k];
    }
    cluster_sync();
    if (threadIdx.x < 32) {
        S v;
#pragma unroll
        for (int k = 0; k < K; ++k) reinterpret_cast<float*>(&v)[k] = ld_dsmem(&slot[k], threadIdx.x % CL);
#pragma unroll
        for (int o = CL / 2; o > 0; o >>= 1) {
            S w;
#pragma unroll
            for (int k = 0; k < K; ++k)
                reinterpret_cast<float*>(&w)[k] = __shfl_xor_sync(0xffffffffu, reinterpret_cast<float*>(&v)[k], o);
            v = combine(v, w);
        }
        if (threadIdx.x == 0) {
#pragma unroll
            for (int k = 0; k < K; ++k) total[k] = reinterpret_cast<const float*>(&v)[k];
        }
    }
    cluster_sync();  // also keeps every block's `slot` alive until all have read it
    S out;
#pragma unroll
    for (int k = 0; k < K; ++k) reinterpret_cast<float*>(&out)[k] = total[k];
    return out;
}
#else
#define CUOPS_HAS_CLUSTERS 0
#define CUOPS_CLUSTER_DIMS(cl)
#endif

}  // namespace cuops
