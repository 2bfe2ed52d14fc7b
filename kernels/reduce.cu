// reduce.cu: trace, sum and max.
//
// Row reductions (sum/max over the last axis, and axis=None as one long row) share one
// addressing scheme: R outer rows of n elements, each cut into S segments of L elements;
// "virtual row" v = r * S + s reduces x[r * n + s * L, r * n + min(n, (s + 1) * L)).
// S = 1 is a plain row reduction; S > 1 feeds a second pass over the (R, S) partials,
// which keeps the GPU busy when there are few rows, without atomics (bitwise reproducible).
//
// The ladder, one line of why each:
//   reduce_rows_naive   one thread per virtual row, a scalar loop: the textbook version;
//                       neighbouring threads read addresses n apart, so nothing coalesces.
//   reduce_rows_block   one 256-thread block per virtual row, strided scalar loads and a
//                       shared-memory tree: coalesced, but 4-byte (or 2-byte) loads and a
//                       __syncthreads per tree level.
//   reduce_rows_vector  G threads per virtual row (4 to 512: sized so each thread has a few
//                       batches of loads), 16-byte loads, UNROLL of them in flight per
//                       thread, independent accumulators, shuffles: what it takes to reach
//                       the copy bandwidth.
//   reduce_rows_flat    the vector rung's path for a few long rows (and the whole array):
//                       one resident wave of blocks striding through each row together,
//                       finished by the row's last block in the same launch.
//   reduce_strided      any other single axis: (outer, R, inner), one thread per output,
//                       consecutive threads read consecutive inner elements.
//   trace_naive / trace_block / trace_unrolled: one thread; one block with a tree;
//                       one 1024-thread block with several loads in flight and shuffles.
//                       A diagonal is only min(rows, cols) scattered elements, so a single
//                       block in a single launch beats any multi-block scheme.
#include "common.cuh"

using namespace cuops;

template <typename Tin, typename Tout, typename Op>
__global__ void reduce_rows_naive(const Tin* __restrict__ x, Tout* __restrict__ y, i64 R, i64 n,
                                  int S, i64 L) {
    typedef typename AccOf<Op, Tout>::type A;
    const i64 v = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= R * S) return;
    const i64 r = v / S, s = v % S;
    const i64 begin = s * L, end = min(n, begin + L);
    const Tin* p = x + r * n;
    A acc = Op::template identity<A>();
    for (i64 i = begin; i < end; ++i) acc = Op::apply(acc, to_acc<A>(p[i]));
    y[v] = from_acc<Tout>(acc);
}

template <typename Tin, typename Tout, typename Op>
__global__ void reduce_rows_block(const Tin* __restrict__ x, Tout* __restrict__ y, i64 R, i64 n,
                                  int S, i64 L) {
    typedef typename AccOf<Op, Tout>::type A;
    __shared__ A tree[256];
    const i64 v = blockIdx.x;
    const i64 r = v / S, s = v % S;
    const i64 begin = s * L, end = min(n, begin + L);
    const Tin* p = x + r * n;
    A acc = Op::template identity<A>();
    for (i64 i = begin + threadIdx.x; i < end; i += 256) acc = Op::apply(acc, to_acc<A>(p[i]));
    tree[threadIdx.x] = acc;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) tree[threadIdx.x] = Op::apply(tree[threadIdx.x], tree[threadIdx.x + w]);
        __syncthreads();
    }
    if (threadIdx.x == 0) y[v] = from_acc<Tout>(tree[0]);
}

// G threads (a power of two) per virtual row, blockDim.x / G rows per block.
// `aligned`: x is 16-byte aligned and every segment starts on a 16-byte boundary.
// One 16-byte vector of Tin reduced to an accumulator value. For the max of 2-byte types
// the vector is first reduced in its own type with packed NaN-propagating max (exact: a
// max never rounds), one instruction per two elements instead of a widen and a compare
// per element.
__device__ __forceinline__ float packed_max(const uint4& raw, __half) {
    const __half2* q = reinterpret_cast<const __half2*>(&raw);
    const __half2 m = __hmax2_nan(__hmax2_nan(q[0], q[1]), __hmax2_nan(q[2], q[3]));
    return MaxOp::apply(__low2float(m), __high2float(m));
}
__device__ __forceinline__ float packed_max(const uint4& raw, __nv_bfloat16) {
    const __nv_bfloat162* q = reinterpret_cast<const __nv_bfloat162*>(&raw);
    const __nv_bfloat162 m = __hmax2_nan(__hmax2_nan(q[0], q[1]), __hmax2_nan(q[2], q[3]));
    return MaxOp::apply(__low2float(m), __high2float(m));
}

template <typename A, typename B> struct same_type { static constexpr bool value = false; };
template <typename A> struct same_type<A, A> { static constexpr bool value = true; };

template <typename Op, typename A, typename Tin>
__device__ __forceinline__ A vec_reduce(const uint4& raw) {
    if constexpr (is_half_like<Tin>::value && same_type<Op, MaxOp>::value) {
        return static_cast<A>(packed_max(raw, Tin()));
    } else {
        const Tin* e = reinterpret_cast<const Tin*>(&raw);
        A a = to_acc<A>(e[0]);
#pragma unroll
        for (int j = 1; j < Vec<Tin>::N; ++j) a = Op::apply(a, to_acc<A>(e[j]));
        return a;
    }
}

// The i-th 16-byte vector of p (16-byte aligned).
template <typename Tin>
__device__ __forceinline__ uint4 ldg_vec(const Tin* p, i64 i) {
    return __ldg(reinterpret_cast<const uint4*>(p + i * Vec<Tin>::N));
}

// Stream 16-byte vectors i, i + stride, ... of p (i < nvec) into UNROLL accumulators.
// UNROLL independent loads are in flight before any is used, and the loop is
// software-pipelined by hand: the next batch is issued before the current one is widened
// and added. ptxas pipelines this loop by itself for float32 but not for 2-byte types,
// whose SASS otherwise waits for each batch. Independent accumulators: one chain of
// dependent adds would wait on the adder, not on memory.
template <typename Op, typename A, typename Tin, int UNROLL>
__device__ __forceinline__ void stream_vectors(const Tin* __restrict__ p, i64 i, int stride,
                                              i64 nvec, A (&acc)[UNROLL]) {
    if (i + (UNROLL - 1) * stride < nvec) {
        uint4 cur[UNROLL], nxt[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) cur[u] = ldg_vec(p, i + u * stride);
        while (true) {
            const i64 in = i + UNROLL * stride;
            const bool more = in + (UNROLL - 1) * stride < nvec;
            if (more) {
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) nxt[u] = ldg_vec(p, in + u * stride);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) acc[u] = Op::apply(acc[u], vec_reduce<Op, A, Tin>(cur[u]));
            i = in;
            if (!more) break;
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) cur[u] = nxt[u];
        }
    }
    for (; i < nvec; i += stride) acc[0] = Op::apply(acc[0], vec_reduce<Op, A, Tin>(ldg_vec(p, i)));
}

// The last-block finish shared by the split kernels: every block of row r stores its
// result in its slot of partial (r * S + its index in the row), fences, and draws a
// ticket from tickets[r]; the block drawing the row's last ticket reduces the row's S
// partials in a fixed order (so the result does not depend on which block came last)
// and resets the counter to zero.
// Called by all threads of the block; `total` is valid in every thread.
template <typename Op, typename A, typename Tout>
__device__ __forceinline__ void finish_row(A total, i64 r, i64 slot, int S, A* __restrict__ partial,
                                           unsigned* __restrict__ tickets, Tout* __restrict__ y,
                                           A* scratch) {
    __shared__ bool s_last;
    if (threadIdx.x == 0) {
        partial[slot] = total;
        __threadfence();  // the partial is visible before the ticket that counts it
        const unsigned ticket = atomicAdd(tickets + r, 1u);
        s_last = ticket == static_cast<unsigned>(S - 1);
        if (s_last) tickets[r] = 0u;  // zeroed for the next launch on this stream
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const A* pr = partial + r * S;
    A a = Op::template identity<A>();
    for (int k = threadIdx.x; k < S; k += blockDim.x) a = Op::apply(a, __ldcg(pr + k));
    a = group_reduce<Op>(a, blockDim.x, scratch);
    if (threadIdx.x == 0) y[r] = from_acc<Tout>(a);
}

// `partial`, `tickets` (both null, or both set with S > 1 and G == blockDim.x): the row's
// segments are finished in this launch (finish_row) instead of a second pass.
template <typename Tin, typename Tout, typename Op>
__global__ void reduce_rows_vector(const Tin* __restrict__ x, Tout* __restrict__ y, i64 R, i64 n,
                                   int S, i64 L, int G, int aligned,
                                   typename AccOf<Op, Tout>::type* __restrict__ partial,
                                   unsigned* __restrict__ tickets) {
    typedef typename AccOf<Op, Tout>::type A;
    constexpr int N = Vec<Tin>::N;
    // 4 loads in flight per thread (8 for 2-byte types measured no better)
    constexpr int UNROLL = 4;
    __shared__ A scratch[32];
    const int t = threadIdx.x % G;
    const i64 v = (i64)blockIdx.x * (blockDim.x / G) + threadIdx.x / G;
    const bool active = v < R * S;
    A acc[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc[u] = Op::template identity<A>();
    if (active) {
        const i64 r = v / S, s = v % S;
        const i64 begin = s * L, end = min(n, begin + L);
        const Tin* p = x + r * n + begin;
        const i64 len = end - begin;
        const i64 nvec = aligned ? len / N : 0;
        stream_vectors<Op, A, Tin, UNROLL>(p, t, G, nvec, acc);
        for (i64 k = nvec * N + t; k < len; k += G) acc[0] = Op::apply(acc[0], to_acc<A>(p[k]));
    }
#pragma unroll
    for (int u = 1; u < UNROLL; ++u) acc[0] = Op::apply(acc[0], acc[u]);
    const A total = group_reduce<Op>(acc[0], G, scratch);
    if (tickets == nullptr) {
        if (active && t == 0) y[v] = from_acc<Tout>(total);
        return;
    }
    finish_row<Op>(total, v / S, v, S, partial, tickets, y, scratch);
}

// A few long rows (axis=None is one row): blockIdx.y is the row, and the gridDim.x blocks
// of a row stride through all of it together, FLAT_THREADS x gridDim.x threads apart, so
// every block gets the same share of the row to within one vector. The launch is sized
// to be resident at once (at most FLAT_BLOCKS_PER_SM blocks an SM, which the launch
// bounds guarantee): no second wave, no tail of slow segments, and the row is finished
// in this launch by finish_row. Elements before the row's first 16-byte boundary and after its
// last one are reduced one by one, so any row start is vectorized.
constexpr int FLAT_THREADS = 256;
constexpr int FLAT_BLOCKS_PER_SM = 4;

template <typename Tin, typename Tout, typename Op>
__global__ void __launch_bounds__(FLAT_THREADS, FLAT_BLOCKS_PER_SM)
reduce_rows_flat(const Tin* __restrict__ x, Tout* __restrict__ y, i64 n,
                 typename AccOf<Op, Tout>::type* __restrict__ partial,
                 unsigned* __restrict__ tickets) {
    typedef typename AccOf<Op, Tout>::type A;
    constexpr int N = Vec<Tin>::N;
    // 2-byte types summed into double widen 8 elements a vector into 8-byte registers:
    // two loads in flight keep them inside the 64 registers of 4 blocks an SM (sm_80 spills)
    constexpr int UNROLL = sizeof(A) > 2 * sizeof(Tin) ? 2 : 4;
    __shared__ A scratch[32];
    const i64 r = blockIdx.y;
    const Tin* p = x + r * n;
    const int stride = gridDim.x * FLAT_THREADS;
    const i64 g = (i64)blockIdx.x * FLAT_THREADS + threadIdx.x;
    const i64 head = min(n, (i64)(((16ull - (reinterpret_cast<unsigned long long>(p) & 15ull)) & 15ull) / sizeof(Tin)));
    const i64 nvec = (n - head) / N;
    A acc[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc[u] = Op::template identity<A>();
    if (g < head) acc[0] = Op::apply(acc[0], to_acc<A>(p[g]));
    stream_vectors<Op, A, Tin, UNROLL>(p + head, g, stride, nvec, acc);
    for (i64 k = head + nvec * N + g; k < n; k += stride) acc[1] = Op::apply(acc[1], to_acc<A>(p[k]));
#pragma unroll
    for (int u = 1; u < UNROLL; ++u) acc[0] = Op::apply(acc[0], acc[u]);
    const A total = group_reduce<Op>(acc[0], FLAT_THREADS, scratch);
    finish_row<Op>(total, r, r * gridDim.x + blockIdx.x, gridDim.x, partial, tickets, y, scratch);
}

// Reduce axis 1 of a contiguous (outer, R, inner) array into (outer, inner).
template <typename Tin, typename Tout, typename Op>
__global__ void reduce_strided(const Tin* __restrict__ x, Tout* __restrict__ y, i64 outer, i64 R,
                               i64 inner) {
    typedef typename AccOf<Op, Tout>::type A;
    const i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= outer * inner) return;
    const i64 a = o / inner, b = o % inner;
    const Tin* p = x + a * R * inner + b;
    A acc = Op::template identity<A>();
    for (i64 k = 0; k < R; ++k) acc = Op::apply(acc, to_acc<A>(p[k * inner]));
    y[o] = from_acc<Tout>(acc);
}

// ------------------------------------------------------------------- trace
// Diagonal element i sits at x[i * stride] (stride = row stride + column stride, elements).
template <typename Tin, typename Tout>
__global__ void trace_naive(const Tin* __restrict__ x, Tout* __restrict__ y, i64 n, i64 stride) {
    typedef typename AccOf<SumOp, Tout>::type A;
    A acc = 0;
    for (i64 i = 0; i < n; ++i) acc += to_acc<A>(x[i * stride]);
    *y = from_acc<Tout>(acc);
}

template <typename Tin, typename Tout>
__global__ void trace_block(const Tin* __restrict__ x, Tout* __restrict__ y, i64 n, i64 stride) {
    typedef typename AccOf<SumOp, Tout>::type A;
    __shared__ A tree[256];
    A acc = 0;
    for (i64 i = threadIdx.x; i < n; i += 256) acc += to_acc<A>(x[i * stride]);
    tree[threadIdx.x] = acc;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) tree[threadIdx.x] += tree[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *y = from_acc<Tout>(tree[0]);
}

template <typename Tin, typename Tout>
__global__ void __launch_bounds__(1024) trace_unrolled(const Tin* __restrict__ x, Tout* __restrict__ y,
                                                       i64 n, i64 stride) {
    typedef typename AccOf<SumOp, Tout>::type A;
    constexpr int UNROLL = 8;
    __shared__ A scratch[32];
    A acc = 0;
    i64 i = threadIdx.x;
    for (; i + (UNROLL - 1) * 1024 < n; i += UNROLL * 1024) {
        Tin e[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) e[u] = x[(i + u * 1024) * stride];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc += to_acc<A>(e[u]);
    }
    for (; i < n; i += 1024) acc += to_acc<A>(x[i * stride]);
    acc = group_reduce<SumOp>(acc, 1024, scratch);
    if (threadIdx.x == 0) *y = from_acc<Tout>(acc);
}
