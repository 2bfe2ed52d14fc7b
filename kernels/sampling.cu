// sampling.cu: one token per row of logits [batch, vocab], drawn as a serving engine's
// sampler draws it: temperature, then top-k, then top-p, then one uniform through the
// inverse CDF in vocabulary order. cupyops/ops/sampling.py states the semantics; the float64
// reference (cupyops/_sampling_reference.py) reproduces every step, the uniform bit for bit.
//
// Per row: T = temperature, s = log2(e) / T (float32); greedy (the first index of the
// largest logit, as torch.argmax) where !(T > 0) or s overflows. Otherwise each logit v
// weighs e(v) = exp2((v - max) * s) = exp((v - max) / T). Keys: an unsigned integer per
// logit whose order is the logits' order (NaN read as -inf, +inf as the dtype's largest
// finite value, -0 as +0), so thresholds are exact integers:
//   top-k   keep key >= K_k, K_k the k-th largest key (ties at the k-th value all kept, as
//           vLLM's and Hugging Face's top-k masks keep them).
//   top-p   keep key >= K_p, K_p the largest key whose kept tokens at or above it hold at
//           least p of the top-k set's mass (again ties kept), i.e. the smallest set of
//           largest tokens reaching p, renormalised ("top-k then top-p").
// The uniform: u = (Philox4x32-10(counter = (c, c >> 32, 0, 0), key = (seed, seed >> 32)).x
// >> 8) * 2^-24, c = the row index for one seed a call, 0 for a seed a row. The token: the
// first kept index whose inclusive cumulative weight exceeds u times the kept total.
//
// The ladder:
//   sample_naive_*  three launches. (1) softmax of logits / T into a float32 workspace
//                   [batch, vocab] and the argmax; (2) the thresholds by bisection over the
//                   key range, one pass over the row per key bit (16 or 32 passes for each
//                   threshold), counts and float32 masses from block reductions; (3) the
//                   draw: block-wide float32 scans tile after tile, twice (the total, then
//                   the crossing). Reads the row ~2 x 16-32 times and writes and rereads
//                   4 bytes a logit of workspace.
//   sample_fused    one launch, one block per row, no workspace. The max pass; then each
//                   threshold by radix select, 8 key bits a pass (2 passes for 16-bit types,
//                   4 for float32), a pass filling one shared-memory histogram of 256 bins,
//                   counts for top-k, masses for top-p, each bin with a copy per lane so the
//                   lanes of a warp never add to one address (logits crowd into a few bins
//                   of the top byte: same-address atomics would serialise). Masses are
//                   integers, floor(e * 2^40), so every sum is exact and the token does not
//                   depend on the order of the additions (no float atomics: the same token
//                   run to run). The draw: each warp sums its own contiguous segment of the
//                   row, the target falls in one segment, and the whole block rescans just
//                   that segment with a block scan. exp2 (the SFU, 16 a clock an SM) runs
//                   only where a pass needs a mass: over the top-k survivors, over the
//                   prefix-matching logits after the first top-p pass, over the kept set in
//                   the draw.
//   sample_cluster  (sm_90) the fused rung with each row spread over a cluster of
//                   SAMPLE_CLUSTER blocks on neighbouring SMs, a contiguous chunk each: one
//                   block a row is bound by one SM's instruction issue (measured on an H200:
//                   60-245 us a 128256-token row whatever the batch; float32 rows, twice the
//                   bytes, no slower than bf16 where the passes are the same) and leaves most
//                   SMs idle below a batch of 132. The blocks swap their argmax,
//                   their histogram bins and their segment sums through distributed shared
//                   memory and each sums them in rank order, so every block takes the same
//                   decisions; the block whose segment holds the target writes the token.
#include "common.cuh"

using namespace cuops;

typedef unsigned long long u64;

// 512 threads: at 1024 the fused kernel's 64 registers a thread spill (16-bit types need
// ~90); one block an SM either way (the histogram), so the loads in flight come from the
// unrolled sweep instead.
#define SAMPLE_BLOCK 512
#define SAMPLE_WARPS (SAMPLE_BLOCK / 32)
#define SAMPLE_BINS 256
#define SAMPLE_MASS_BITS 40
#define SAMPLE_NO_INDEX 0x7fffffff
#define SAMPLE_CLUSTER 8  // blocks a row in sample_cluster (the portable cluster maximum)

// ---------------------------------------------------------------- Philox4x32-10
// Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011):
// the generator of Random123, cuRAND's Philox4_32_10 and PyTorch's CUDA generator. Ten
// rounds of two 32 x 32 -> 64-bit multiplies, the key bumped by Weyl constants between them.
struct Philox4 {
    unsigned x, y, z, w;
};

__device__ __forceinline__ Philox4 philox4x32_10(Philox4 c, unsigned k0, unsigned k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const unsigned hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = Philox4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    }
    return c;
}

// The row's uniform as 24 bits (u = u24 * 2^-24 in [0, 1), exact in float32 and float64).
__device__ __forceinline__ unsigned sample_u24(u64 seed, u64 counter) {
    const Philox4 ctr = {(unsigned)counter, (unsigned)(counter >> 32), 0u, 0u};
    return philox4x32_10(ctr, (unsigned)seed, (unsigned)(seed >> 32)).x >> 8;
}

// ---------------------------------------------------------------- logits as keys
// A logit as the sampler reads it: its value and its order key.
struct Logit {
    float v;
    unsigned key;
};

// Sign-magnitude bits to an unsigned key of the same order: negatives flipped whole,
// positives above them.
__device__ __forceinline__ unsigned order_key16(unsigned b) { return (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u); }

// NaN -> -inf, +inf -> the largest finite value, -0 -> +0, on 16-bit patterns whose +inf
// is INF (NaN sorting above +inf would make it the argmax and a top-k survivor).
// (Selects, not branches: every pass runs this on every logit, and the early-return form
// compiled to a branch and a reconvergence point each.)
template <unsigned INF>
__device__ __forceinline__ unsigned sanitize16(unsigned b) {
    unsigned r = (b & 0x7fffu) > INF ? (INF | 0x8000u) : b;
    r = r == INF ? INF - 1u : r;
    return r == 0x8000u ? 0u : r;
}

template <typename T> struct SampleTraits;
template <> struct SampleTraits<float> {
    static constexpr int KEY_BITS = 32;
    static constexpr unsigned NEG_INF = 0xff800000u;
    typedef unsigned Bits;
    __device__ static __forceinline__ Logit read(unsigned b) {
        b = (b & 0x7fffffffu) > 0x7f800000u ? 0xff800000u : b;
        b = b == 0x7f800000u ? 0x7f7fffffu : b;
        b = b == 0x80000000u ? 0u : b;
        return {__uint_as_float(b), (b & 0x80000000u) ? ~b : (b | 0x80000000u)};
    }
};
// The 16-bit types: their bits to float, and their traits (INF: the +inf bit pattern).
template <typename H> __device__ __forceinline__ float bits16_to_f32(unsigned b);
template <> __device__ __forceinline__ float bits16_to_f32<__half>(unsigned b) {
    return __half2float(__ushort_as_half((unsigned short)b));
}
template <> __device__ __forceinline__ float bits16_to_f32<__nv_bfloat16>(unsigned b) { return __uint_as_float(b << 16); }
template <typename H, unsigned INF> struct SampleTraits16 {
    static constexpr int KEY_BITS = 16;
    static constexpr unsigned NEG_INF = INF | 0x8000u;
    typedef unsigned short Bits;
    __device__ static __forceinline__ Logit read(unsigned b) {
        b = sanitize16<INF>(b);
        return {bits16_to_f32<H>(b), order_key16(b)};
    }
};
template <> struct SampleTraits<__half> : SampleTraits16<__half, 0x7c00u> {};
template <> struct SampleTraits<__nv_bfloat16> : SampleTraits16<__nv_bfloat16, 0x7f80u> {};

// e(v) = exp2((v - m) * s) in [0, 1]; -inf weighs nothing. The clamp keeps a v - m that
// overflows finite (|logits| near 3.4e38) from making 0 * -inf = NaN where s == 0 (an
// infinite temperature: every finite logit weighs 1); elsewhere it changes nothing.
__device__ __forceinline__ float logit_weight(float v, float m, float s) {
    return v == -CUOPS_INF ? 0.f : exp2f(fmaxf(v - m, -3.402823466e38f) * s);
}

// floor(e * 2^40) for e in [0, 1], from the float's bits (a power-of-two scale: exact).
__device__ __forceinline__ u64 fixed_mass(float e) {
    const unsigned b = __float_as_uint(e);
    const int E = (int)(b >> 23);  // e >= 0: no sign bit; E == 0: e == 0 (flushed)
    const u64 mant = (b & 0x7fffffu) | 0x800000u;
    const int sh = E - (127 + 23 - SAMPLE_MASS_BITS);  // <= 17: e <= 1 gives at most 2^40
    const u64 v = sh >= 0 ? mant << sh : (sh > -24 ? mant >> -sh : 0ull);
    return E ? v : 0ull;
}

// A 64-bit add to shared memory as 32-bit atomics: shared memory has no 64-bit atomic add
// (atomicAdd on 64 bits compiles to a compare-and-swap loop). The low word's carry goes to
// the high word; each add is applied once, so after a barrier the 64 bits are the exact sum.
__device__ __forceinline__ void shared_add_u64(u64* p, u64 v) {
    unsigned* w = reinterpret_cast<unsigned*>(p);  // little-endian: low word first
    const unsigned lo = (unsigned)v, old = atomicAdd(w, lo);
    const unsigned hi = (unsigned)(v >> 32) + (old + lo < old ? 1u : 0u);
    if (hi) atomicAdd(w + 1, hi);
}

__device__ __forceinline__ u64 logit_mass(float v, float m, float s) { return fixed_mass(logit_weight(v, m, s)); }

// ---------------------------------------------------------------- per-row parameters
struct RowParams {
    float s;  // log2(e) / temperature
    int top_k;  // active where 0 < top_k < vocab
    float top_p;  // active where top_p < 1 (NaN: inactive)
    bool greedy;
};

__device__ __forceinline__ RowParams row_params(i64 r, const float* temperatures, float temperature, const int* top_ks,
                                                int top_k, const float* top_ps, float top_p) {
    RowParams p;
    const float T = temperatures ? temperatures[r] : temperature;
    p.s = 1.4426950408889634f / T;
    p.greedy = !(T > 0.f) || !(p.s < CUOPS_INF);
    p.top_k = top_ks ? top_ks[r] : top_k;
    p.top_p = top_ps ? top_ps[r] : top_p;
    return p;
}

// The row's uniform: per-row seeds draw from counter 0 (a request keeps its draw wherever it
// sits in the batch), one seed a call from counter = the row.
__device__ __forceinline__ unsigned row_u24(i64 r, const u64* seeds, int seed_per_row, u64 seed) {
    if (seeds) return seed_per_row ? sample_u24(seeds[r], 0ull) : sample_u24(seeds[0], (u64)r);
    return sample_u24(seed, (u64)r);
}

// ---------------------------------------------------------------- block-wide pieces
struct ArgMax {
    float v;
    int i;
};
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) { return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }

struct SampleShared {
    u64 bins[SAMPLE_BINS];  // a histogram's bins summed over their lane copies
    u64 cl_bins[SAMPLE_BINS];  // ... and over the cluster's blocks (sample_cluster)
    u64 warp_u64[SAMPLE_WARPS];
    u64 scan_u64[SAMPLE_BINS / 32];
    float warp_f[SAMPLE_WARPS];
    int warp_i[SAMPLE_WARPS];
    u64 sel_above, sel_ge, need, rest;
    unsigned sel_digit;
    int segment, segment_rank, token;
    float cl_v;  // this block's argmax, for the other blocks of its cluster
    int cl_i;
};

#if CUOPS_HAS_CLUSTERS
// ---------------------------------------------------------------- cluster pieces (sm_90)
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
#endif

// Every thread of the block calls these (they __syncthreads) and gets the block's result.
__device__ __forceinline__ ArgMax block_argmax(ArgMax a, SampleShared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = better(a, ArgMax{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)});
    __syncthreads();  // the scratch may still be read by a previous reduction
    if (lane == 0) {
        sh.warp_f[warp] = a.v;
        sh.warp_i[warp] = a.i;
    }
    __syncthreads();
    a = lane < SAMPLE_WARPS ? ArgMax{sh.warp_f[lane], sh.warp_i[lane]} : ArgMax{-CUOPS_INF, SAMPLE_NO_INDEX};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = better(a, ArgMax{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)});
    return a;
}

template <typename A, typename Op>
__device__ __forceinline__ A block_reduce(A v, A* scratch, Op op, A identity) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < SAMPLE_WARPS ? scratch[lane] : identity;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Inclusive scan over the block in thread order (warp scans, then the warps' totals);
// *total gets the block's total, which is the last thread's inclusive value.
template <typename A>
__device__ __forceinline__ A block_inclusive_scan(A v, A* scratch, A* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const A t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v = v + t;
    }
    __syncthreads();
    if (lane == 31) scratch[warp] = v;
    __syncthreads();
    A w = lane < SAMPLE_WARPS ? scratch[lane] : A(0);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const A t = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w = w + t;
    }
    const A ahead = __shfl_up_sync(0xffffffffu, w, 1);  // lane l: the warps before warp l
    const A before = __shfl_sync(0xffffffffu, ahead, warp);
    *total = __shfl_sync(0xffffffffu, w, SAMPLE_WARPS - 1);
    return warp ? before + v : v;
}

// ---------------------------------------------------------------- the fused rung
// The row is cut into one contiguous chunk a block of the cluster (the whole row for CL = 1)
// and each chunk into one contiguous segment a warp, both whole numbers of warp steps of 32
// 16-byte vectors (512 contiguous bytes a step; vector-aligned starts). Warp w of block
// `rank` owns [lo + w * seg, min(hi, lo + (w + 1) * seg)): vocabulary order is (rank, warp).
struct BlockRange {
    int lo, hi, seg;
    __device__ __forceinline__ int begin(int w) const { return min(hi, lo + w * seg); }
    __device__ __forceinline__ int end(int w) const { return min(hi, lo + (w + 1) * seg); }
};

template <typename T, int CL>
__device__ __forceinline__ BlockRange block_range(int vocab, int rank) {
    constexpr int STEP = 32 * Vec<T>::N;
    const int chunk = (((vocab + CL - 1) / CL) + STEP - 1) / STEP * STEP;
    const int lo = min(vocab, rank * chunk), hi = min(vocab, lo + chunk);
    const int per_warp = (hi - lo + SAMPLE_WARPS - 1) / SAMPLE_WARPS;
    return {lo, hi, (per_warp + STEP - 1) / STEP * STEP};
}

// Up to 16 bytes of a row as loaded: N elements packed in four words (two a word for 16-bit
// types), unpacked one element at a time where used (unpacked, a 16-bit vector would hold
// eight registers instead of four: the fused kernel lives at 64 registers a thread).
struct Raw {
    unsigned w[4];
};

template <typename T>
__device__ __forceinline__ unsigned raw_bits(const Raw& r, int j) {
    if constexpr (sizeof(T) == 4) return r.w[j];
    else return (r.w[j >> 1] >> ((j & 1) * 16)) & 0xffffu;
}

// Elements [i, i + N) below `end`: one 16-byte load where the row is 16-byte aligned and
// the vector whole, else element by element, -inf past `end` (weightless in every pass:
// -inf ties lose the argmax to a smaller real index, and count as -inf logits in top-k's
// counts, which no threshold above -inf sees, so no per-element bounds test is needed).
template <typename T>
__device__ __forceinline__ Raw load_raw(const T* row, int i, int end, bool aligned) {
    constexpr int N = Vec<T>::N;
    Raw r;
    if (aligned && i + N <= end) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + i));
        r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
    } else {
        const typename SampleTraits<T>::Bits* p = reinterpret_cast<const typename SampleTraits<T>::Bits*>(row);
        r.w[0] = r.w[1] = r.w[2] = r.w[3] = 0u;
#pragma unroll
        for (int j = 0; j < N; ++j) {
            const unsigned b = i + j < end ? (unsigned)__ldg(p + i + j) : SampleTraits<T>::NEG_INF;
            if constexpr (sizeof(T) == 4) r.w[j] = b;
            else r.w[j >> 1] |= b << ((j & 1) * 16);
        }
    }
    return r;
}

// f(index, logit) for this lane's share of [begin, end) (and -inf for indices past it, see
// load_raw): UNROLL warp steps of loads in flight before the first use (16 * UNROLL bytes
// a thread). The first pass, from DRAM, takes
// 4 (32 KB a block); the later ones, from L2 and with heavier bodies, 2 (each step of
// unrolling costs NVRTC seconds: the CPU tier compiles every kernel). f runs under
// divergent lanes: no shuffles in it.
template <int UNROLL = 2, typename T, typename F>
__device__ __forceinline__ void sweep_segment(const T* row, int begin, int end, bool aligned, F f) {
    constexpr int N = Vec<T>::N, STEP = 32 * N;
    for (int c = begin + (threadIdx.x & 31) * N; c < end; c += UNROLL * STEP) {
        Raw r[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) r[u] = load_raw(row, c + u * STEP, end, aligned);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int j = 0; j < N; ++j) f(c + u * STEP + j, SampleTraits<T>::read(raw_bits<T>(r[u], j)));
    }
}

template <bool MASS> struct HistWord { typedef unsigned type; };
template <> struct HistWord<true> { typedef u64 type; };

// Radix select: the largest key K with W(K) >= need, W(K) the weight of the row's logits
// with key >= K and key >= floor_key: 1 each (MASS false: top-k, need = k) or the fixed-point
// mass (MASS true: top-p; need = ceil(p * W(floor_key)), at least 1, set once the first
// pass has W(floor_key) as its histogram's total). A pass per 8 key bits, top bits first:
// the histogram of the next digit over the logits matching the digits chosen so far, then
// the largest digit d whose bins from d up, with what lies above the prefix, reach need.
// Returns K; *ge gets W(K) (the kept mass, for top-p).
template <typename T, int CL, bool MASS>
__device__ unsigned radix_select(const T* row, BlockRange br, bool aligned, unsigned floor_key, u64 need, float p,
                                 float m, float s, unsigned char* smem, SampleShared& sh, u64* ge) {
    typedef typename HistWord<MASS>::type W;
    constexpr int BITS = SampleTraits<T>::KEY_BITS;
    constexpr int HIST_VECS = SAMPLE_BINS * 32 * (int)sizeof(W) / 16;
    W* hist = reinterpret_cast<W*>(smem);  // [bin][lane]
    const u64* bins = CL > 1 ? sh.cl_bins : sh.bins;  // the row's bins
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int begin = br.begin(warp), end = br.end(warp);
    unsigned prefix = 0, fixed = 0;
    u64 above = 0, ge_k = 0;
#pragma unroll 1
    for (int shift = BITS - 8; shift >= 0; shift -= 8) {
        __syncthreads();  // the previous pass's bins have been read
        for (int i = threadIdx.x; i < HIST_VECS; i += SAMPLE_BLOCK) reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
        __syncthreads();
        sweep_segment(row, begin, end, aligned, [&](int, Logit x) {
            if (x.key < floor_key || (x.key & fixed) != prefix) return;
            W* slot = hist + ((x.key >> shift) & 255u) * 32 + lane;
            if constexpr (MASS) shared_add_u64(slot, logit_mass(x.v, m, s));
            else atomicAdd(slot, 1u);
        });
        __syncthreads();
        for (int d = warp; d < SAMPLE_BINS; d += SAMPLE_WARPS) {  // a warp a bin: its 32 copies
            u64 c = hist[d * 32 + lane];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
            if (lane == 0) sh.bins[d] = c;
        }
        __syncthreads();
        if constexpr (CL > 1) {
#if CUOPS_HAS_CLUSTERS
            cluster_sync();  // every block's bins are in
            if (threadIdx.x < SAMPLE_BINS) {
                u64 c = 0;
                for (int q = 0; q < CL; ++q) c += ld_dsmem_u64(&sh.bins[threadIdx.x], q);
                sh.cl_bins[threadIdx.x] = c;
            }
            cluster_sync();  // ... and read: the next pass may overwrite them
#endif
        }
        if constexpr (MASS) {
            if (shift == BITS - 8) {
                if (warp == 0) {
                    u64 total = 0;
                    for (int d = lane; d < SAMPLE_BINS; d += 32) total += bins[d];
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
                    if (lane == 0) {
                        const double want = ceil((double)p * (double)total);  // p <= 0: the top group
                        sh.need = want < 1.0 ? 1ull : (want >= (double)total ? total : (u64)want);
                    }
                }
                __syncthreads();
                need = sh.need;
            }
        }
        // Threads 0..255 scan the bins from the top (thread t holds bin 255 - t): the chosen
        // digit is where above + (bins from it up) first reaches need.
        u64 own = 0, incl = 0;
        if (threadIdx.x < SAMPLE_BINS) {
            own = incl = bins[SAMPLE_BINS - 1 - threadIdx.x];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u64 t = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += t;
            }
            if (lane == 31) sh.scan_u64[warp] = incl;
        }
        __syncthreads();
        if (threadIdx.x < SAMPLE_BINS) {
            u64 before = above;
            for (int w = 0; w < warp; ++w) before += sh.scan_u64[w];
            const u64 at = before + incl;  // W of the prefix with this digit
            if (at >= need && at - own < need) {
                sh.sel_digit = SAMPLE_BINS - 1 - threadIdx.x;
                sh.sel_above = at - own;
                sh.sel_ge = at;
            }
        }
        __syncthreads();
        prefix |= sh.sel_digit << shift;
        fixed |= 255u << shift;
        above = sh.sel_above;
        ge_k = sh.sel_ge;
    }
    *ge = ge_k;
    return prefix;
}

// The segment sum of warp w of block q (CL > 1: read from q's shared memory).
template <int CL>
__device__ __forceinline__ u64 segment_sum(SampleShared& sh, int q, int w) {
    if constexpr (CL > 1) {
#if CUOPS_HAS_CLUSTERS
        return ld_dsmem_u64(&sh.warp_u64[w], q);
#endif
    }
    return sh.warp_u64[w];
}

// The inverse-CDF draw over the kept logits (key >= keep_key), in vocabulary order: each warp
// sums its segment's masses; the target floor(u * total) falls in one segment (of one block
// of the cluster), which its whole block rescans a tile of SAMPLE_BLOCK vectors at a time,
// with a block scan. Integer sums: the segment totals, the scan and the total agree
// exactly. Returns the token in the block that found it, -1 in the others.
template <typename T, int CL>
__device__ int draw(const T* row, BlockRange br, int rank, bool aligned, unsigned keep_key, float m, float s,
                    unsigned u24, int fallback, SampleShared& sh) {
    constexpr int N = Vec<T>::N;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 mine = 0;
    sweep_segment(row, br.begin(warp), br.end(warp), aligned, [&](int, Logit x) {
        if (x.key >= keep_key) mine += logit_mass(x.v, m, s);
    });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
    __syncthreads();
    if (lane == 0) sh.warp_u64[warp] = mine;
    __syncthreads();
    if constexpr (CL > 1) {
#if CUOPS_HAS_CLUSTERS
        cluster_sync();  // every block's segment sums are in
#endif
    }
    if (threadIdx.x == 0) {  // (the same sums in the same order in every block: the same answer)
        u64 total = 0;
        for (int q = 0; q < CL; ++q)
            for (int w = 0; w < SAMPLE_WARPS; ++w) total += segment_sum<CL>(sh, q, w);
        const u64 target = __umul64hi((u64)u24 << (64 - 24), total);  // floor(u * total) < total
        u64 before = 0;
        int q = 0, w = 0;  // (no mass at all, not reached while the row has a finite logit: the last)
        for (int k = 0; k < CL * SAMPLE_WARPS; ++k) {
            q = k / SAMPLE_WARPS, w = k % SAMPLE_WARPS;
            const u64 here = segment_sum<CL>(sh, q, w);
            if (target < before + here) break;
            if (k < CL * SAMPLE_WARPS - 1) before += here;
        }
        sh.segment_rank = q;
        sh.segment = w;
        sh.rest = target - before;
        sh.token = fallback;
    }
    if constexpr (CL > 1) {
#if CUOPS_HAS_CLUSTERS
        cluster_sync();  // ... and read everywhere: the scans below reuse warp_u64
#endif
    } else {
        __syncthreads();
    }
    if (sh.segment_rank != rank) return -1;
    const int sb = br.begin(sh.segment), se = br.end(sh.segment);
    const u64 rest = sh.rest;
    u64 running = 0;
    for (int tile = sb; tile < se; tile += SAMPLE_BLOCK * N) {
        const int i = tile + threadIdx.x * N;
        const Raw raw = load_raw(row, i, se, aligned);
        auto mass = [&](int j) {
            const Logit x = SampleTraits<T>::read(raw_bits<T>(raw, j));
            return (i + j < se && x.key >= keep_key) ? logit_mass(x.v, m, s) : 0ull;
        };
        u64 own = 0;
#pragma unroll
        for (int j = 0; j < N; ++j) own += mass(j);
        u64 total;
        const u64 incl = running + block_inclusive_scan(own, sh.warp_u64, &total);
        if (incl - own <= rest && rest < incl) {  // the one thread whose elements hold the target
            u64 acc = incl - own;
            for (int j = 0; j < N; ++j) {  // (its masses again: exp2 is deterministic)
                acc += mass(j);
                if (rest < acc) {
                    sh.token = i + j;
                    break;
                }
            }
        }
        running += total;
        __syncthreads();
        if (running > rest) break;  // the same on every thread
    }
    return sh.token;
}

// The cluster's combined argmax: each block's, in rank order (better() is exact, so the
// order only has to be the same everywhere).
template <int CL>
__device__ __forceinline__ ArgMax cluster_argmax(ArgMax a, SampleShared& sh) {
    if constexpr (CL > 1) {
#if CUOPS_HAS_CLUSTERS
        if (threadIdx.x == 0) {
            sh.cl_v = a.v;
            sh.cl_i = a.i;
        }
        cluster_sync();
        a = ArgMax{-CUOPS_INF, SAMPLE_NO_INDEX};
        for (int q = 0; q < CL; ++q) a = better(a, ArgMax{ld_dsmem(&sh.cl_v, q), ld_dsmem_s32(&sh.cl_i, q)});
        cluster_sync();  // (every block has read every other's before any moves on)
#endif
    }
    return a;
}

// One row (blockIdx / CL) by one block (CL = 1) or by the CL blocks of a cluster, this one
// of rank `rank`. Arguments: logits [batch, ld] (rows of vocab), out int64 [batch]; the
// per-row arrays (temperatures, top_ks, top_ps, seeds) where given, else the scalars; a
// single seed in seeds[0] when !seed_per_row; aligned: rows start on 16 bytes.
template <typename T, int CL>
__device__ __forceinline__ void sample_row(const T* __restrict__ logits, i64 ld, int vocab, i64* __restrict__ out,
                                           const float* temperatures, float temperature, const int* top_ks, int top_k,
                                           const float* top_ps, float top_p, const u64* seeds, int seed_per_row,
                                           u64 seed, int aligned, int rank, unsigned char* hist_smem,
                                           SampleShared& sh) {
    const i64 r = blockIdx.x / CL;
    const T* row = logits + r * ld;
    const RowParams prm = row_params(r, temperatures, temperature, top_ks, top_k, top_ps, top_p);
    const BlockRange br = block_range<T, CL>(vocab, rank);
    const int warp = threadIdx.x >> 5;
    ArgMax best = {-CUOPS_INF, SAMPLE_NO_INDEX};
    sweep_segment<4>(row, br.begin(warp), br.end(warp), aligned,
                     [&](int i, Logit x) { best = better(best, ArgMax{x.v, i}); });
    best = cluster_argmax<CL>(block_argmax(best, sh), sh);
    if (prm.greedy || best.v == -CUOPS_INF) {  // (no finite logit: the first index, as argmax)
        if (threadIdx.x == 0 && rank == 0) out[r] = best.i;
        return;
    }
    unsigned keep = 0;
    u64 ge;
    if (prm.top_k > 0 && prm.top_k < vocab)
        keep = radix_select<T, CL, false>(row, br, aligned, 0u, (u64)prm.top_k, 1.f, best.v, prm.s, hist_smem, sh, &ge);
    if (prm.top_p < 1.f)
        keep = radix_select<T, CL, true>(row, br, aligned, keep, 0ull, prm.top_p, best.v, prm.s, hist_smem, sh, &ge);
    const unsigned u24 = row_u24(r, seeds, seed_per_row, seed);
    const int token = draw<T, CL>(row, br, rank, aligned, keep, best.v, prm.s, u24, best.i, sh);
    if (threadIdx.x == 0 && token >= 0) out[r] = token;
}

template <typename T>
__global__ void __launch_bounds__(SAMPLE_BLOCK, 1)
    sample_fused(const T* __restrict__ logits, i64 ld, int vocab, i64* __restrict__ out,
                 const float* __restrict__ temperatures, float temperature, const int* __restrict__ top_ks, int top_k,
                 const float* __restrict__ top_ps, float top_p, const u64* __restrict__ seeds, int seed_per_row,
                 u64 seed, int aligned) {
    extern __shared__ __align__(16) unsigned char hist_smem[];
    __shared__ SampleShared sh;
    sample_row<T, 1>(logits, ld, vocab, out, temperatures, temperature, top_ks, top_k, top_ps, top_p, seeds,
                     seed_per_row, seed, aligned, 0, hist_smem, sh);
}

// SAMPLE_CLUSTER blocks a row: the grid is batch * SAMPLE_CLUSTER blocks.
template <typename T>
__global__ void CUOPS_CLUSTER_DIMS(SAMPLE_CLUSTER) __launch_bounds__(SAMPLE_BLOCK, 1)
    sample_cluster(const T* __restrict__ logits, i64 ld, int vocab, i64* __restrict__ out,
                   const float* __restrict__ temperatures, float temperature, const int* __restrict__ top_ks,
                   int top_k, const float* __restrict__ top_ps, float top_p, const u64* __restrict__ seeds,
                   int seed_per_row, u64 seed, int aligned) {
#if CUOPS_HAS_CLUSTERS
    extern __shared__ __align__(16) unsigned char hist_smem[];
    __shared__ SampleShared sh;
    sample_row<T, SAMPLE_CLUSTER>(logits, ld, vocab, out, temperatures, temperature, top_ks, top_k, top_ps, top_p,
                                  seeds, seed_per_row, seed, aligned, (int)cluster_rank(), hist_smem, sh);
#else
    __trap();  // launched only on sm_90 and newer
#endif
}

// ---------------------------------------------------------------- the naive rung
// The textbook shape: a thread per element, striding over the row, scalar loads.
template <typename T, typename F>
__device__ __forceinline__ void naive_sweep(const T* row, int vocab, F f) {
    const typename SampleTraits<T>::Bits* p = reinterpret_cast<const typename SampleTraits<T>::Bits*>(row);
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_BLOCK) f(i, SampleTraits<T>::read(p[i]));
}

// Whether row r takes the draw (else its token is the argmax): not greedy, a finite logit.
template <typename T>
__device__ __forceinline__ bool naive_draws(const T* row, const int* argmax, i64 r, const RowParams& prm) {
    return !prm.greedy && SampleTraits<T>::read(reinterpret_cast<const typename SampleTraits<T>::Bits*>(row)[argmax[r]]).v != -CUOPS_INF;
}

// (1) probs[r] = softmax(logits[r] / T) in float32 and argmax[r] = the first largest index.
template <typename T>
__global__ void __launch_bounds__(SAMPLE_BLOCK)
    sample_naive_softmax(const T* __restrict__ logits, i64 ld, int vocab, const float* __restrict__ temperatures,
                         float temperature, float* __restrict__ probs, int* __restrict__ argmax) {
    __shared__ SampleShared sh;
    const i64 r = blockIdx.x;
    const T* row = logits + r * ld;
    const RowParams prm = row_params(r, temperatures, temperature, nullptr, 0, nullptr, 1.f);
    ArgMax best = {-CUOPS_INF, SAMPLE_NO_INDEX};
    naive_sweep(row, vocab, [&](int i, Logit x) { best = better(best, ArgMax{x.v, i}); });
    best = block_argmax(best, sh);
    if (threadIdx.x == 0) argmax[r] = best.i;
    if (prm.greedy || best.v == -CUOPS_INF) return;
    float z = 0.f;
    naive_sweep(row, vocab, [&](int, Logit x) { z += logit_weight(x.v, best.v, prm.s); });
    z = block_reduce(z, sh.warp_f, [](float a, float b) { return a + b; }, 0.f);
    const float inv = 1.f / z;
    float* q = probs + r * vocab;
    naive_sweep(row, vocab, [&](int i, Logit x) { q[i] = logit_weight(x.v, best.v, prm.s) * inv; });
}

// (2) keep[r] = the key threshold: bisection over [0, 2^KEY_BITS) for top-k's K_k (the
// count of keys >= mid against k), then over [K_k, 2^KEY_BITS) for top-p's K_p (the float32
// probability mass of keys >= mid against p times the top-k set's mass). A pass a step.
template <typename T>
__global__ void __launch_bounds__(SAMPLE_BLOCK)
    sample_naive_thresholds(const T* __restrict__ logits, i64 ld, int vocab, const float* __restrict__ probs,
                            const int* __restrict__ argmax, const float* __restrict__ temperatures, float temperature,
                            const int* __restrict__ top_ks, int top_k, const float* __restrict__ top_ps, float top_p,
                            unsigned* __restrict__ keep) {
    __shared__ SampleShared sh;
    const i64 r = blockIdx.x;
    const T* row = logits + r * ld;
    const RowParams prm = row_params(r, temperatures, temperature, top_ks, top_k, top_ps, top_p);
    if (!naive_draws(row, argmax, r, prm)) return;
    const float* q = probs + r * vocab;
    u64 lo = 0, hi = 1ull << SampleTraits<T>::KEY_BITS;  // count(lo) >= k > count(hi)
    if (prm.top_k > 0 && prm.top_k < vocab) {
        while (hi - lo > 1) {
            const u64 mid = lo + (hi - lo) / 2;
            u64 c = 0;
            naive_sweep(row, vocab, [&](int, Logit x) { c += x.key >= mid; });
            c = block_reduce(c, sh.warp_u64, [](u64 a, u64 b) { return a + b; }, 0ull);
            (c >= (u64)prm.top_k ? lo : hi) = mid;
        }
    }
    if (prm.top_p < 1.f) {
        auto mass_ge = [&](u64 k) {
            float sum = 0.f;
            naive_sweep(row, vocab, [&](int i, Logit x) { sum += x.key >= k ? q[i] : 0.f; });
            return block_reduce(sum, sh.warp_f, [](float a, float b) { return a + b; }, 0.f);
        };
        const float need = prm.top_p * mass_ge(lo);  // mass(lo) >= need > mass(hi), need > 0 kept
        hi = 1ull << SampleTraits<T>::KEY_BITS;
        while (hi - lo > 1) {
            const u64 mid = lo + (hi - lo) / 2;
            const float m = mass_ge(mid);
            (m > 0.f && m >= need ? lo : hi) = mid;
        }
    }
    if (threadIdx.x == 0) keep[r] = (unsigned)lo;
}

// (3) out[r]: the argmax for greedy rows; else the first index (vocabulary order) whose
// inclusive cumulative kept probability exceeds u times the kept total, both from the same
// tile-by-tile float32 block scans (so the running sums agree bit for bit between the pass
// that totals and the pass that finds), the last kept index with mass should u * total
// round up to the total itself.
template <typename T>
__global__ void __launch_bounds__(SAMPLE_BLOCK)
    sample_naive_draw(const T* __restrict__ logits, i64 ld, int vocab, const float* __restrict__ probs,
                      const int* __restrict__ argmax, const unsigned* __restrict__ keep,
                      const float* __restrict__ temperatures, float temperature, const u64* __restrict__ seeds,
                      int seed_per_row, u64 seed, i64* __restrict__ out) {
    __shared__ SampleShared sh;
    const i64 r = blockIdx.x;
    const T* row = logits + r * ld;
    const RowParams prm = row_params(r, temperatures, temperature, nullptr, 0, nullptr, 1.f);
    if (!naive_draws(row, argmax, r, prm)) {
        if (threadIdx.x == 0) out[r] = argmax[r];
        return;
    }
    const float* q = probs + r * vocab;
    const typename SampleTraits<T>::Bits* p = reinterpret_cast<const typename SampleTraits<T>::Bits*>(row);
    const unsigned k = keep[r];
    auto kept = [&](int i) { return i < vocab && SampleTraits<T>::read(p[i]).key >= k ? q[i] : 0.f; };
    float running = 0.f;
    int last = -1;  // the last kept index with mass
    for (int tile = 0; tile < vocab; tile += SAMPLE_BLOCK) {
        const int i = tile + threadIdx.x;
        const float pr = kept(i);
        float total;
        block_inclusive_scan(pr, sh.warp_f, &total);
        running += total;
        if (pr > 0.f) last = i;
    }
    last = block_reduce(last, sh.warp_i, [](int a, int b) { return max(a, b); }, -1);
    const float target = (float)row_u24(r, seeds, seed_per_row, seed) * 0x1p-24f * running;
    running = 0.f;
    int token = last;
    for (int tile = 0; tile < vocab; tile += SAMPLE_BLOCK) {
        const int i = tile + threadIdx.x;
        const float pr = kept(i);
        float total;
        const float cum = running + block_inclusive_scan(pr, sh.warp_f, &total);
        // (pr > 0: float scans of different trees are not exactly monotone; a massless
        // index must never be the one that crosses)
        const int first = block_reduce(pr > 0.f && cum > target ? i : SAMPLE_NO_INDEX, sh.warp_i,
                                       [](int a, int b) { return min(a, b); }, SAMPLE_NO_INDEX);
        if (first != SAMPLE_NO_INDEX) {
            token = first;
            break;
        }
        running += total;
    }
    if (threadIdx.x == 0) out[r] = token;
}
