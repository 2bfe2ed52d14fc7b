// attention.cu: scaled dot-product attention on the CUDA cores (FFMA, no tensor cores),
// under the contract of attention_common.cuh (ATTN_PARAMS: element strides, GQA/MQA, both
// causal alignments, rows that see no key, optional LSE).
//
// Work: 4 * B * Hq * Sq * Skv * D flops (about half of it under a causal mask) and one exp
// per score. Bytes that must move: Q, K, V read once, O written once: O(N) in the sequence
// length, while the score matrix is O(N^2). The ladder is about where that matrix lives:
//   1. attention_naive     three kernels: S = scale Q K^T into a float32 workspace
//                          [B, Hq, Sq, Skv] (a thread per score), a block per row for the
//                          softmax (max, sum, normalise in place into P, and the LSE), then
//                          O = P V (a thread per output). O(N^2) memory and traffic: the
//                          reference rung, easy to check by eye.
//   2. attention_tiled     a block per (batch, head, 16 query rows): the Q tile, 32-key K
//                          and V tiles and the 16x32 score tile in shared memory, so scores
//                          never reach global memory. Two sweeps over the keys: row max and
//                          sum of exp first, then P V with the final statistics, so the
//                          accumulator is never rescaled (K is read twice).
//   3. attention_flash_v1  FlashAttention on the CUDA cores: ONE sweep over K/V tiles with
//                          the online softmax (running max and sum; the accumulator rescaled
//                          when the max grows), 64 query rows x 64 keys a block, register
//                          tiles of 4 rows x 4 keys (scores) and 4 rows x D/16 (output) a
//                          thread so each float read from shared memory feeds 4 FFMAs,
//                          16-byte global loads when the rows allow, P in the K tile's
//                          place, causal tiles past the diagonal skipped, the heaviest
//                          causal tiles scheduled first. Templated on a head_dim tier (32,
//                          64, 128, 256; zero-padded) so the accumulators stay in registers.
//
// Scores are kept in base 2: the tiled and flash rungs fold scale * log2(e) into Q as it is
// staged, use exp2f (one MUFU op), and convert the LSE back to natural log at the end.
// Sliding windows and soft caps (attention_common.cuh): every rung masks the keys outside a
// row's [first_key, key_end) and caps scores where softcap > 0 (a uniform branch); the
// tiled and flash rungs start their sweeps at the tile of the block's first visible key.
//
// Launch geometry (cupyops/ops/_attention_simt.py computes it; "items" loops cover any
// B * Hq * Sq, so no grid dimension limit applies):
//   attention_naive_scores<T>   block 256; grid-stride over B * Hq * Sq * Skv scores.
//   attention_naive_softmax<T>  block 128; a block per row, grid-stride over B * Hq * Sq.
//   attention_naive_pv<T>       block 256; grid-stride over B * Sq * Hq * D outputs.
//       (the three take the workspace S, float32 [B, Hq, Sq, Skv], after ATTN_PARAMS)
//   attention_tiled<T>          block 256; grid min(items, 2^31 - 1), items = B * Hq *
//                               cdiv(Sq, 16); dynamic shared memory tiled_smem(D) bytes.
//   attention_flash_v1<T, DT>   block 256; grid min(items, 2^31 - 1), items = B * Hq *
//                               cdiv(Sq, 64); dynamic shared memory FlashV1<DT>::SMEM bytes;
//                               after ATTN_PARAMS an int of VEC_Q | VEC_K | VEC_V flags.
#include "attention_common.cuh"

using namespace cuops;
using cuops::attn::first_key;
using cuops::attn::key_end;
using cuops::attn::SoftCap;
using cuops::attn::LOG2E;
using cuops::attn::LN2;

namespace attn_simt {

// The dynamic shared memory of the tiled and flash rungs (one name, one type: extern
// shared arrays of one translation unit alias each other).
extern __shared__ __align__(16) float attn_smem[];

// attention_flash_v1's last argument: which of Q, K, V can be read 16 bytes at a time (the
// pointer, every stride and head_dim whole 16-byte vectors; the launcher checks). A kernel
// argument, not a value computed here: it stays in the constant bank instead of taking
// registers for the whole kernel.
constexpr int VEC_Q = 1, VEC_K = 2, VEC_V = 4;

// Work item -> (batch, query head, query tile). The query tile is the slowest index and
// counts down: under a causal mask the last tiles see the most keys, and blocks start
// roughly in blockIdx order, so the long items start first and the short ones fill in.
struct Item {
    int b, h, qt;
};
__device__ __forceinline__ Item item_of(i64 it, int B, int Hq, int nqt) {
    const i64 bh_count = static_cast<i64>(B) * Hq;
    const i64 bh = it % bh_count;
    return {static_cast<int>(bh / Hq), static_cast<int>(bh % Hq), nqt - 1 - static_cast<int>(it / bh_count)};
}

}  // namespace attn_simt

using namespace attn_simt;

// ============================================================================ 1. naive
// S[((b * Hq + h) * Sq + i) * Skv + j] = scale * q_i . k_j (capped), or -inf where row i
// does not see key j.
template <typename T>
__global__ void __launch_bounds__(256) attention_naive_scores(ATTN_PARAMS(T), float* __restrict__ S) {
    const i64 total = static_cast<i64>(B) * Hq * Sq * Skv;
    const int group = Hq / Hkv;
    const SoftCap cap = SoftCap::make(softcap, 1.f);  // (scaled scores: unit 1; used if softcap > 0)
    for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
         e += static_cast<i64>(gridDim.x) * blockDim.x) {
        const int j = static_cast<int>(e % Skv);
        i64 r = e / Skv;
        const int i = static_cast<int>(r % Sq);
        r /= Sq;
        const int h = static_cast<int>(r % Hq), b = static_cast<int>(r / Hq);
        float s = -CUOPS_INF;
        if (j >= first_key(i, win_left, causal_offset) && j < key_end(i, Skv, causal, causal_offset, win_right)) {
            const T* q = Q + b * q_sb + i * q_ss + h * q_sh;
            const T* k = K + b * k_sb + j * k_ss + (h / group) * k_sh;
            float dot = 0.f;
            for (int d = 0; d < D; ++d) dot = fmaf(to_f32(q[d]), to_f32(k[d]), dot);
            s = dot * scale;
            if (softcap > 0.f) s = cap(s);
        }
        S[e] = s;
    }
}

// A block per row of S: max, sum of exp, then P = exp(s - max) / sum written in place, and
// the row's LSE. A row with no visible key (all -inf) becomes all zeros, LSE -inf.
template <typename T>
__global__ void __launch_bounds__(1024) attention_naive_softmax(ATTN_PARAMS(T), float* __restrict__ S) {
    __shared__ float scratch[32];
    const i64 rows = static_cast<i64>(B) * Hq * Sq;
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        float* s = S + row * Skv;
        float m = -CUOPS_INF;
        for (int j = threadIdx.x; j < Skv; j += blockDim.x) m = fmaxf(m, s[j]);
        m = group_reduce<FMax>(m, blockDim.x, scratch);
        const float mu = (m == -CUOPS_INF) ? 0.f : m;  // no -inf - -inf = NaN on empty rows
        float l = 0.f;
        for (int j = threadIdx.x; j < Skv; j += blockDim.x) l += expf(s[j] - mu);
        l = group_reduce<FSum>(l, blockDim.x, scratch);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        for (int j = threadIdx.x; j < Skv; j += blockDim.x) s[j] = expf(s[j] - mu) * inv;
        if (LSE != nullptr && threadIdx.x == 0) LSE[row] = l > 0.f ? m + logf(l) : -CUOPS_INF;
    }
}

// A thread per output element, d fastest (coalesced reads of V's rows and writes of O's).
template <typename T>
__global__ void __launch_bounds__(256) attention_naive_pv(ATTN_PARAMS(T), float* __restrict__ S) {
    const i64 total = static_cast<i64>(B) * Sq * Hq * D;
    const int group = Hq / Hkv;
    for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
         e += static_cast<i64>(gridDim.x) * blockDim.x) {
        const int d = static_cast<int>(e % D);
        i64 r = e / D;
        const int h = static_cast<int>(r % Hq);
        r /= Hq;
        const int i = static_cast<int>(r % Sq), b = static_cast<int>(r / Sq);
        const float* p = S + ((static_cast<i64>(b) * Hq + h) * Sq + i) * Skv;
        const T* vcol = V + b * v_sb + (h / group) * v_sh + d;
        // P is 0 outside the keys the row sees
        const int end = key_end(i, Skv, causal, causal_offset, win_right);
        float acc = 0.f;
        for (int j = first_key(i, win_left, causal_offset); j < end; ++j) acc = fmaf(p[j], to_f32(vcol[j * v_ss]), acc);
        O[b * o_sb + i * o_ss + h * o_sh + d] = from_f32<T>(acc);
    }
}

// ============================================================================ 2. tiled
namespace tiled {
constexpr int BQ = 16, BK = 32, THREADS = 256;
constexpr int OUTS = BQ * 256 / THREADS;  // outputs a thread (BQ x D <= BQ x 256)
constexpr int SS = BK + 1;                // score tile row stride (odd: no bank conflicts)
static_assert(BK == 32, "a warp's lanes are the keys of a score-tile row");
}  // namespace tiled

// Stage rows [0, R) of (row r at p + r * rs, D columns) into dst[r * DP + d] as float times
// mul; rows past `rows` are zero.
template <typename T>
__device__ __forceinline__ void stage_rows_simple(float* dst, int DP, const T* p, i64 rs, int R, int rows, int D,
                                                  float mul) {
    for (int e = threadIdx.x; e < R * D; e += blockDim.x) {
        const int r = e / D, d = e - r * D;
        dst[r * DP + d] = r < rows ? to_f32(p[r * rs + d]) * mul : 0.f;
    }
}

template <typename T>
__global__ void __launch_bounds__(tiled::THREADS) attention_tiled(ATTN_PARAMS(T)) {
    using namespace tiled;
    const int DP = D | 1;  // odd row stride: a warp reading 32 rows at one column is conflict-free
    float* Qs = attn_smem;       // [BQ][DP], scaled by scale * log2(e)
    float* Ks = Qs + BQ * DP;    // [BK][DP]
    float* Vs = Ks + BK * DP;    // [BK][DP]
    float* Ss = Vs + BK * DP;    // [BQ][SS] scores, then P
    float* row_m = Ss + BQ * SS; // [BQ] final row max (0 for rows that see nothing)
    float* row_inv = row_m + BQ; // [BQ] 1 / row sum (0 for rows that see nothing)
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int group = Hq / Hkv, nqt = (Sq + BQ - 1) / BQ;
    const i64 items = static_cast<i64>(B) * Hq * nqt;
    const float qmul = scale * LOG2E;
    const SoftCap cap = SoftCap::make(softcap, 1.f / LOG2E);  // (base-2 scaled scores; used if softcap > 0)

    for (i64 it = blockIdx.x; it < items; it += gridDim.x) {
        const Item w = item_of(it, B, Hq, nqt);
        const int hk = w.h / group, i0 = w.qt * BQ, nq = min(BQ, Sq - i0);
        // the keys any row sees: from the first row's first (first_key and key_end grow with
        // the row) to the last row's end, in whole tiles
        const int kv_end = key_end(i0 + nq - 1, Skv, causal, causal_offset, win_right);
        const int kv_begin = first_key(i0, win_left, causal_offset) / BK * BK;
        const T* kbase = K + w.b * k_sb + hk * k_sh;
        const T* vbase = V + w.b * v_sb + hk * v_sh;
        stage_rows_simple(Qs, DP, Q + w.b * q_sb + w.h * q_sh + i0 * q_ss, q_ss, BQ, nq, D, qmul);

        // S tile into Ss: thread tid computes entries tid and tid + 256, i.e. warp w rows w and
        // w + 8, lane = key.
        auto score_tile = [&](int j0) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int i = warp + 8 * c, j = lane;
                float s = -CUOPS_INF;
                if (j0 + j >= first_key(i0 + i, win_left, causal_offset) &&
                    j0 + j < key_end(i0 + i, Skv, causal, causal_offset, win_right)) {
                    s = 0.f;
                    for (int d = 0; d < D; ++d) s = fmaf(Qs[i * DP + d], Ks[j * DP + d], s);
                    if (softcap > 0.f) s = cap(s);
                }
                Ss[i * SS + j] = s;
            }
        };

        // sweep 1: the row statistics; warp w owns rows w and w + 8 (every lane a copy)
        float m[2] = {-CUOPS_INF, -CUOPS_INF}, l[2] = {0.f, 0.f};
        for (int j0 = kv_begin; j0 < kv_end; j0 += BK) {
            __syncthreads();  // the previous tile's readers of Ks / Ss are done
            stage_rows_simple(Ks, DP, kbase + j0 * k_ss, k_ss, BK, min(BK, kv_end - j0), D, 1.f);
            __syncthreads();
            score_tile(j0);
            __syncthreads();
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float s = Ss[(warp + 8 * c) * SS + lane];
                const float mn = fmaxf(m[c], warp_reduce<FMax>(s));
                const float mu = (mn == -CUOPS_INF) ? 0.f : mn;
                l[c] = l[c] * exp2f(m[c] - mu) + warp_reduce<FSum>(exp2f(s - mu));
                m[c] = mn;
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int i = warp + 8 * c;
                row_m[i] = (m[c] == -CUOPS_INF) ? 0.f : m[c];
                row_inv[i] = l[c] > 0.f ? 1.f / l[c] : 0.f;
                if (LSE != nullptr && i < nq)
                    LSE[(static_cast<i64>(w.b) * Hq + w.h) * Sq + i0 + i] = l[c] > 0.f ? (m[c] + log2f(l[c])) * LN2 : -CUOPS_INF;
            }
        }

        // sweep 2: O = P V with the final statistics; thread tid owns outputs tid + 256 k
        float acc[OUTS];
#pragma unroll
        for (int k = 0; k < OUTS; ++k) acc[k] = 0.f;
        for (int j0 = kv_begin; j0 < kv_end; j0 += BK) {
            __syncthreads();  // row stats written; the previous tile's readers are done
            const int nk = min(BK, kv_end - j0);
            stage_rows_simple(Ks, DP, kbase + j0 * k_ss, k_ss, BK, nk, D, 1.f);
            stage_rows_simple(Vs, DP, vbase + j0 * v_ss, v_ss, BK, nk, D, 1.f);  // zero rows: P 0 x finite
            __syncthreads();
            score_tile(j0);
#pragma unroll
            for (int c = 0; c < 2; ++c) {  // each thread turns its own two scores into P
                const int i = warp + 8 * c;
                Ss[i * SS + lane] = exp2f(Ss[i * SS + lane] - row_m[i]) * row_inv[i];
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < OUTS; ++k) {
                const int e = tid + k * THREADS;
                if (e < BQ * D) {
                    const int i = e / D, d = e - i * D;
                    float a = acc[k];
                    for (int j = 0; j < BK; ++j) a = fmaf(Ss[i * SS + j], Vs[j * DP + d], a);
                    acc[k] = a;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < OUTS; ++k) {
            const int e = tid + k * THREADS;
            if (e < BQ * D) {
                const int i = e / D, d = e - i * D;
                if (i < nq) O[w.b * o_sb + (i0 + i) * o_ss + w.h * o_sh + d] = from_f32<T>(acc[k]);
            }
        }
        __syncthreads();  // before the next item overwrites Qs and the row statistics
    }
}

// ============================================================================ 3. flash_v1
// Thread t of the 256 is (rg, kg) = (t / 16, t % 16): rows 4 rg .. 4 rg + 3 of the query
// tile; in the score tile keys kg + 16 c (c < KC), in the output columns
// cg * CW + 16 CW ch + w (cg = kg, ch < NCH, w < CW). A warp is two row groups by 16: its
// Q reads are two addresses (broadcast), its K and V reads 16 consecutive 16-byte words,
// its P reads two addresses: every shared-memory read is one or two wavefronts for 16 or 32
// FFMAs a lane, and the 16 lanes sharing a row group reduce the row max by 4 shuffles.
template <int DT> struct FlashV1 {
    static constexpr int THREADS = 256, BQ = 64;
    static constexpr int BK = DT <= 128 ? 64 : 32;  // 64 keys x 256 columns x 3 tiles would not fit
    static constexpr int KC = BK / 16;              // keys a thread in the score tile
    static constexpr int DS = DT + 4;               // Q/K/V tile row stride: 16-byte rows, 4 banks apart
    static constexpr int PS = BK + 4;               // P tile row stride
    static constexpr int CW = DT >= 64 ? 4 : 2;     // output columns a chunk (one LDS.128 / .64 of V)
    static constexpr int NCH = DT / (16 * CW);      // chunks a thread
    static constexpr int KP = BK * DS > BQ * PS ? BK * DS : BQ * PS;  // K tile, then P, in one place
    static constexpr int SMEM = (BQ * DS + BK * DS + KP) * 4;  // bytes: Q, V, K/P
    // <= 128 registers for two blocks an SM where shared memory allows it (DT <= 128)
    static constexpr int MIN_BLOCKS = DT <= 128 ? 2 : 1;
    static_assert(NCH * 16 * CW == DT && KC * 16 == BK, "tiles are whole thread tiles");
};

template <int CW> struct VecF;
template <> struct VecF<4> {
    typedef float4 type;
};
template <> struct VecF<2> {
    typedef float2 type;
};
__device__ __forceinline__ float vget(const float4& v, int w) { return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w; }
__device__ __forceinline__ float vget(const float2& v, int w) { return w == 0 ? v.x : v.y; }

// Stage a tile of R rows (row r at p + r * rs; rows past `rows` and columns past D are zero)
// into dst[r * DS + c], c < DT, as float times mul. With `vec` every 16-byte piece is one
// load, up to BATCH of a thread's issued before the first is converted (bytes in flight; 4
// x 16 bytes x 256 threads x 2 blocks = 128 KB an SM is plenty, and more would cost the
// registers the accumulators need); otherwise element loads.
template <typename T, int R, int DT, int THREADS>
__device__ __forceinline__ void stage_tile(float* dst, int DS, const T* p, i64 rs, int rows, int D, bool vec,
                                           float mul) {
    constexpr int N = Vec<T>::N, CPR = DT / N, ITER = R * CPR / THREADS, BATCH = ITER < 4 ? ITER : 4;
    constexpr int RSTEP = THREADS / CPR;  // rows between a thread's pieces
    static_assert(THREADS % CPR == 0 && ITER * RSTEP == R && ITER % BATCH == 0, "whole passes of the block");
    // a thread's pieces: rows r0 + k RSTEP, columns c0 .. c0 + N - 1
    const int r0 = threadIdx.x / CPR, c0 = (threadIdx.x % CPR) * N;
    const T* src = p + r0 * rs + c0;
    float* out = dst + r0 * DS + c0;
    const bool cols = c0 < D;
    if (vec) {
#pragma unroll
        for (int k0 = 0; k0 < ITER; k0 += BATCH) {
            uint4 raw[BATCH];
#pragma unroll
            for (int k = 0; k < BATCH; ++k) {
                const int r = r0 + (k0 + k) * RSTEP;
                raw[k] = (cols && r < rows) ? __ldg(reinterpret_cast<const uint4*>(src + (k0 + k) * RSTEP * rs))
                                            : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int k = 0; k < BATCH; ++k) {
                const T* x = reinterpret_cast<const T*>(&raw[k]);
                float* o = out + (k0 + k) * RSTEP * DS;
#pragma unroll
                for (int j = 0; j < N; j += 4)
                    *reinterpret_cast<float4*>(o + j) =
                        make_float4(to_f32(x[j]) * mul, to_f32(x[j + 1]) * mul, to_f32(x[j + 2]) * mul, to_f32(x[j + 3]) * mul);
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < ITER; ++k) {
            const bool row = r0 + k * RSTEP < rows;
            const T* x = src + k * RSTEP * rs;
            float f[N];
#pragma unroll
            for (int j = 0; j < N; ++j) f[j] = (row && c0 + j < D) ? to_f32(x[j]) * mul : 0.f;
            float* o = out + k * RSTEP * DS;
#pragma unroll
            for (int j = 0; j < N; j += 4) *reinterpret_cast<float4*>(o + j) = make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
        }
    }
}

template <typename T, int DT>
__global__ void __launch_bounds__(FlashV1<DT>::THREADS, FlashV1<DT>::MIN_BLOCKS) attention_flash_v1(ATTN_PARAMS(T), int vec) {
    using C = FlashV1<DT>;
    constexpr int BQ = C::BQ, BK = C::BK, KC = C::KC, DS = C::DS, PS = C::PS, CW = C::CW, NCH = C::NCH;
    typedef typename VecF<CW>::type vf;
    float* Qs = attn_smem;       // [BQ][DS], scaled by scale * log2(e)
    float* Vs = Qs + BQ * DS;    // [BK][DS]
    float* KPs = Vs + BK * DS;   // [BK][DS] K tile, then [BQ][PS] P tile
    const int tid = threadIdx.x, rg = tid >> 4, kg = tid & 15;
    const int group = Hq / Hkv, nqt = (Sq + BQ - 1) / BQ;
    const i64 items = static_cast<i64>(B) * Hq * nqt;
    const float qmul = scale * LOG2E;
    const int Dr = (D + 3) & ~3;  // columns past D are zero in every tile: skip whole float4s of them

    for (i64 it = blockIdx.x; it < items; it += gridDim.x) {
        const Item w = item_of(it, B, Hq, nqt);
        const int hk = w.h / group, i0 = w.qt * BQ, nq = min(BQ, Sq - i0);
        // the keys any row sees, in whole tiles: from the first row's first to the last row's end
        const int kv_end = key_end(i0 + nq - 1, Skv, causal, causal_offset, win_right);
        const int kv_begin = first_key(i0, win_left, causal_offset) / BK * BK;
        const T* kbase = K + w.b * k_sb + hk * k_sh;
        const T* vbase = V + w.b * v_sb + hk * v_sh;
        stage_tile<T, BQ, DT, C::THREADS>(Qs, DS, Q + w.b * q_sb + w.h * q_sh + i0 * q_ss, q_ss, nq, D, vec & VEC_Q, qmul);

        float m[4], l[4], acc[4][NCH][CW];
        int lim[4];  // one past the last key row r sees (0 for rows past Sq)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = 4 * rg + r;
            lim[r] = i < nq ? key_end(i0 + i, Skv, causal, causal_offset, win_right) : 0;
            m[r] = -CUOPS_INF;
            l[r] = 0.f;
#pragma unroll
            for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
                for (int x = 0; x < CW; ++x) acc[r][ch][x] = 0.f;
        }

        for (int j0 = kv_begin; j0 < kv_end; j0 += BK) {
            const int nk = min(BK, kv_end - j0);
            stage_tile<T, BK, DT, C::THREADS>(KPs, DS, kbase + j0 * k_ss, k_ss, nk, D, vec & VEC_K, 1.f);
            __syncthreads();
            // V is not read before the next barrier. Staged after this one, its loads cannot be
            // hoisted above K's stores: one tile in flight, not two (registers: no spills with
            // two blocks an SM). Rows past nk must be zero, not stale: their P is 0, and 0 x
            // NaN would not be.
            stage_tile<T, BK, DT, C::THREADS>(Vs, DS, vbase + j0 * v_ss, v_ss, nk, D, vec & VEC_V, 1.f);

            // S = Q K^T for 4 rows x KC keys, in base-2 units
            float s[4][KC];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < KC; ++c) s[r][c] = 0.f;
#pragma unroll 1
            for (int d = 0; d < Dr; d += 4) {
                float4 q[4], k[KC];
#pragma unroll
                for (int r = 0; r < 4; ++r) q[r] = *reinterpret_cast<const float4*>(Qs + (4 * rg + r) * DS + d);
#pragma unroll
                for (int c = 0; c < KC; ++c) k[c] = *reinterpret_cast<const float4*>(KPs + (kg + 16 * c) * DS + d);
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int c = 0; c < KC; ++c) {
                        float a = s[r][c];
                        a = fmaf(q[r].x, k[c].x, a);
                        a = fmaf(q[r].y, k[c].y, a);
                        a = fmaf(q[r].z, k[c].z, a);
                        s[r][c] = fmaf(q[r].w, k[c].w, a);
                    }
            }
            __syncthreads();  // every read of the K tile is done: P takes its place
            if (softcap > 0.f) {  // (base-2 scaled scores)
                const SoftCap cap = SoftCap::make(softcap, 1.f / LOG2E);
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int c = 0; c < KC; ++c) s[r][c] = cap(s[r][c]);
            }

            // Left of a row's window: key j0 + kg + 16 c < (i0 + 4 rg + r) + causal_offset -
            // win_left, i.e. d + 16 c < r with one d a tile (registers: no first key kept
            // a row); without a window d = 4 > r tests false everywhere.
            const int d = win_left < 0 ? 4 : j0 + kg + win_left - i0 - 4 * rg - causal_offset;

            // online softmax: new row max, rescale what is accumulated, P = exp2(s - max)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                float tmax = -CUOPS_INF;
#pragma unroll
                for (int c = 0; c < KC; ++c) {
                    if (j0 + kg + 16 * c >= lim[r] || d + 16 * c < r) s[r][c] = -CUOPS_INF;
                    tmax = fmaxf(tmax, s[r][c]);
                }
                const float mn = fmaxf(m[r], warp_reduce<FMax>(tmax, 16));  // over the row's 16 lanes
                const float mu = (mn == -CUOPS_INF) ? 0.f : mn;  // a row with nothing seen yet stays at 0
                const float alpha = exp2f(m[r] - mu);           // 0 when m was -inf
                m[r] = mn;
                float ps = 0.f;
#pragma unroll
                for (int c = 0; c < KC; ++c) {
                    const float p = exp2f(s[r][c] - mu);
                    ps += p;
                    KPs[(4 * rg + r) * PS + kg + 16 * c] = p;
                }
                l[r] = l[r] * alpha + ps;  // this thread's keys only; summed over the row group at the end
#pragma unroll
                for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
                    for (int x = 0; x < CW; ++x) acc[r][ch][x] *= alpha;
            }
            __syncthreads();

            // O += P V
#pragma unroll 1
            for (int j = 0; j < BK; j += 4) {
                float4 p[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) p[r] = *reinterpret_cast<const float4*>(KPs + (4 * rg + r) * PS + j);
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
                    for (int ch = 0; ch < NCH; ++ch) {
                        const vf v = *reinterpret_cast<const vf*>(Vs + (j + jj) * DS + kg * CW + 16 * CW * ch);
#pragma unroll
                        for (int r = 0; r < 4; ++r) {
                            const float pr = vget(p[r], jj);
#pragma unroll
                            for (int x = 0; x < CW; ++x) acc[r][ch][x] = fmaf(pr, vget(v, x), acc[r][ch][x]);
                        }
                    }
                }
            }
            __syncthreads();  // P and V are read: the next tile may overwrite them
        }

        // O = acc / l; LSE = ln 2 * (max + log2 l)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const float lt = warp_reduce<FSum>(l[r], 16);  // over the row's 16 lanes
            const int i = 4 * rg + r;
            if (i >= nq) continue;
            const float inv = lt > 0.f ? 1.f / lt : 0.f;
            T* o = O + w.b * o_sb + (i0 + i) * o_ss + w.h * o_sh;
#pragma unroll
            for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
                for (int x = 0; x < CW; ++x) {
                    const int col = kg * CW + 16 * CW * ch + x;
                    if (col < D) o[col] = from_f32<T>(acc[r][ch][x] * inv);
                }
            if (LSE != nullptr && kg == 0)
                LSE[(static_cast<i64>(w.b) * Hq + w.h) * Sq + i0 + i] = lt > 0.f ? (m[r] + log2f(lt)) * LN2 : -CUOPS_INF;
        }
    }
}
