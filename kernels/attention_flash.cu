// attention_flash.cu: FlashAttention-2 on the tensor cores (float16 / bfloat16), under the
// contract of attention_common.cuh (ATTN_PARAMS: strided Q/K/V/O, GQA, both causal
// alignments, optional LSE).
//
// Work: 4 * Sq * Skv * D flops per (batch, head) (half of it under a causal mask), against
// 2 * (Sq + 2 Skv) * D bytes: compute-bound for any sequence worth tiling. The rung after
// flash_v1 (attention.cu) moves both products onto mma.sync and keeps everything between
// them in registers:
//   - one block per (tile of BR query rows, query head, batch); WARPS warps, each owning
//     16 * MT query rows for the whole KV sweep (no cross-warp reduction, ever).
//   - S = Q K^T: m16n8k16 with Q fragments from shared memory (ldmatrix) and K fragments
//     from a shared K tile (ldmatrix, K rows are the mma's "col" operand as stored).
//   - the online softmax runs on the S accumulators in registers (scale * log2(e) folded
//     into one FFMA before ex2), each row's max reduced over the 4 lanes that hold it; the
//     row sum stays a per-lane partial until the end; the base of the exponentials moves
//     (rescaling O) only when a row's max climbs by more than 2^8, which after the first
//     tiles is rare, so the O rescale is mostly skipped.
//   - O += P V: the S accumulator layout of two n8 tiles is exactly the m16n8k16 A fragment
//     of P (rounded to T), so P never leaves registers; V fragments come from the shared
//     V tile through ldmatrix.trans (V is stored key-major, the mma wants key pairs).
//   - K and V tiles stream through a STAGES-deep cp.async ring: one barrier per tile both
//     publishes tile j and frees the stage of tile j-1, refilled at once with tile
//     j + STAGES - 1; whole tiles take unpredicated copies, the last one zero-fills.
//   - S is computed SUB keys at a time (SUB <= BC) when registers are short; Q fragments
//     stay in registers for the whole sweep when they fit (QREG: head_dim 64), otherwise
//     they are re-read from shared memory for every tile.
//   - shared tiles are XOR-swizzled by 16-byte chunk (chunk c of row r at c ^ (r & 7)), so
//     the ldmatrix reads of 8 rows and the cp.async writes hit 8 distinct bank groups.
//   - causal: tiles past the block's last visible key are never loaded, tiles past a
//     warp's last visible key are skipped by that warp, and only tiles that cross the
//     diagonal (or the end of K) pay for the mask. Causal grids run the longest query
//     tiles first, so the short ones fill the tail. A sliding window cuts the sweep the
//     same way from below: it starts at the tile of the block's first visible key, a warp
//     skips tiles before its own, and tiles that cross a row's first key pay for the mask.
//   - soft caps (softcap > 0) are applied to the raw scores as they leave the mma (a
//     uniform branch; attn::SoftCap in raw units, so the max and mask steps are unchanged).
//   - the epilogue divides by the row sum, stages O through the warp's own Q rows in
//     shared memory and writes 16-byte rows; the LSE is (m + log2(l)) * ln 2.
//
// Launch geometry (cupyops/ops/_attention_flash.py computes the same numbers):
//   attention_flash<T, HD, MT, BC, WARPS, STAGES, QREG> (HD = head_dim): block 32 * WARPS, BR =
//   16 * MT * WARPS query rows; grid (cdiv(Sq, BR), Hq, B) (B <= 65535);
//   dynamic shared memory BR * HD * 2 (Q) + STAGES * 2 * BC * HD * 2 (the K and V ring).
//   Needs HD in {64, 128, 256} (whole 128-byte swizzle groups per row) and every row of Q, K,
//   V, O 16-byte aligned (the launcher checks; auto falls back to flash_v1 otherwise).
#include "attention_common.cuh"
#include "ptx.cuh"

namespace cuops {
namespace aflash {

// Byte offset of 16-byte chunk c of row r in a swizzled tile of D-element rows.
template <int D> __device__ __forceinline__ unsigned tile_off(int r, int c) { return swizzle16(r, c, D * 2); }

// cp.async rows [r0, r0 + ROWS) of x (row stride ss) into the tile at s; rows at or past
// nvalid are zero-filled (so masked keys meet zeros in V, never stale NaN). Thread tid
// always copies chunk tid % CH of rows tid / CH + q * RSTEP: one pointer, one stride and
// one shared offset (RSTEP rows apart share the swizzle) instead of per-chunk addresses.
template <int D, int ROWS, int THREADS, typename T>
__device__ __forceinline__ void load_tile(unsigned s, const T* x, i64 ss, int r0, int nvalid, int tid) {
    constexpr int CH = D / 8, RSTEP = THREADS / CH, N = ROWS / RSTEP;
    static_assert(THREADS % CH == 0 && RSTEP % 8 == 0 && ROWS % RSTEP == 0, "chunks split evenly, one swizzle");
    const int r = tid / CH, c = tid % CH;
    const unsigned dst = s + tile_off<D>(r, c);
    const T* src = x + (i64)(r0 + r) * ss + c * 8;
    const i64 step = (i64)RSTEP * ss;
    if (r0 + ROWS <= nvalid) {  // a whole tile (all but the last): no per-chunk test
#pragma unroll
        for (int q = 0; q < N; ++q) cp16(dst + q * RSTEP * D * 2, src + q * step);
    } else {
#pragma unroll
        for (int q = 0; q < N; ++q) {
            const bool ok = r0 + r + q * RSTEP < nvalid;
            cp16_zfill(dst + q * RSTEP * D * 2, ok ? (const void*)(src + q * step) : (const void*)x, ok ? 16 : 0);
        }
    }
}

// 2^x in one MUFU op (2^-inf = +0); the accuracy (2 ulp) is far inside the tolerance of
// P rounded to fp16 / bf16.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// How far (in log2 units) a row's max may climb above the base of its exponentials before
// the base moves: P stays <= 2^8, well inside fp16 / bf16 and float32 sums.
constexpr float RESCALE_SLACK = 8.f;

// The two T of register w, times a (the lazy rescale of P already packed).
template <typename T> __device__ __forceinline__ unsigned scale2(unsigned w, float a);
template <> __device__ __forceinline__ unsigned scale2<__half>(unsigned w, float a) {
    __half2 h = *reinterpret_cast<const __half2*>(&w);
    h = __hmul2(h, __float2half2_rn(a));
    return *reinterpret_cast<const unsigned*>(&h);
}
template <> __device__ __forceinline__ unsigned scale2<__nv_bfloat16>(unsigned w, float a) {
    __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&w);
    h = __hmul2(h, __float2bfloat162_rn(a));
    return *reinterpret_cast<const unsigned*>(&h);
}

template <typename T, int HD, int MT, int BC, int SUB, int WARPS, int STAGES, bool QREG>
__device__ __forceinline__ void flash_body(ATTN_PARAMS(T)) {
    constexpr int THREADS = 32 * WARPS, RW = 16 * MT, BR = RW * WARPS;
    constexpr int KS = HD / 16;  // k-steps of S = Q K^T
    constexpr int NSS = SUB / 8;  // n8 tiles of S per sub-tile (keys)
    constexpr int KP = BC / 16;  // k-steps of O += P V (keys)
    constexpr int NO = HD / 8;   // n8 tiles of O (head dim)
    constexpr int Q_BYTES = BR * HD * 2, KV_BYTES = BC * HD * 2;
    static_assert(HD % 64 == 0 && SUB % 16 == 0 && BC % SUB == 0, "whole swizzle groups per row, whole k-steps");
    static_assert(STAGES >= 2, "K/V ring");

    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned sq = smem_u32(smem);
    const unsigned sk = sq + Q_BYTES;  // stage st: K at sk + st * 2 * KV_BYTES, V after it
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int group = Hq / Hkv;
    const int h = blockIdx.y, hk = h / group;
    // causal: longest query tiles first (they see the most keys)
    const int qt = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int q0 = qt * BR, wq0 = q0 + warp * RW;
    const float sl2 = scale * attn::LOG2E;

    // The keys the block's first and last rows see bound the KV sweep: tiles [jt0, ntiles).
    const int kv_end = attn::key_end(min(q0 + BR, Sq) - 1, Skv, causal, causal_offset, win_right);
    const int ntiles = (kv_end + BC - 1) / BC;
    const int jt0 = attn::first_key(q0, win_left, causal_offset) / BC;
    // The last key any row of this warp sees, and the end of the keys its first row sees
    // (every row sees those up to its own first key: sub-tiles within both skip the mask).
    const int warp_last = attn::key_end(wq0 + RW - 1, Skv, causal, causal_offset, win_right) - 1;
    const int warp_full = attn::key_end(wq0, Skv, causal, causal_offset, win_right);

    // ldmatrix lane addressing:
    //   Q (A operand, row-major): row l & 15, chunk 2 ks + (l >> 4)
    //   K (B operand, key rows):  key (l & 7) + 8 (l >> 4), chunk 2 ks + ((l >> 3) & 1)
    //   V (B operand, .trans):    key (l & 7) + 8 ((l >> 3) & 1), chunk 2 p + (l >> 4)
    // Each address is a per-lane base (k-step 0, pair 0) with the k-step / pair terms
    // folded in as (base ^ (2 ks << 4)) + 16 p * row bytes: the chunk index 2 ks + c and
    // the row 16 p + r only touch bits the base leaves clear (c < 2, 2 ks < HD / 8; rows 16
    // apart keep r & 7), so no per-(ks, p) address stays live across the KV loop.
    const unsigned q_base = tile_off<HD>(warp * RW + (lane & 15), lane >> 4);
    const unsigned k_base = tile_off<HD>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    const unsigned v_base = tile_off<HD>((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
    constexpr unsigned ROW16 = 16 * HD * 2;  // 16 rows of a tile, in bytes

    {
        const int b = blockIdx.z;  // the launcher keeps B <= 65535
        const T* Qb = Q + b * q_sb + h * q_sh;
        const T* Kb = K + b * k_sb + hk * k_sh;
        const T* Vb = V + b * v_sb + hk * v_sh;
        T* Ob = O + b * o_sb + h * o_sh;

        // Prologue: Q, then K and V of tiles 0 .. STAGES-2, one commit group per tile
        // (empty past the last tile, so that wait_group counts stay uniform).
        load_tile<HD, BR, THREADS>(sq, Qb, q_ss, q0, Sq, tid);
        cp_commit();
#pragma unroll
        for (int st = 0; st < STAGES - 1; ++st) {
            const unsigned kb = sk + st * 2 * KV_BYTES;
            if (jt0 + st < ntiles) {
                load_tile<HD, BC, THREADS>(kb, Kb, k_ss, (jt0 + st) * BC, Skv, tid);
                load_tile<HD, BC, THREADS>(kb + KV_BYTES, Vb, v_ss, (jt0 + st) * BC, Skv, tid);
            }
            cp_commit();
        }

        float o[MT][NO][4];
        float m[MT][2], l[MT][2];  // rows g and g + 8 of each m16 tile: max (scaled, log2), partial sum
#pragma unroll
        for (int i = 0; i < MT; ++i) {
#pragma unroll
            for (int j = 0; j < NO; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[i][j][e] = 0.f;
            m[i][0] = m[i][1] = -CUOPS_INF;
            l[i][0] = l[i][1] = 0.f;
        }
        // QREG: the warp's Q fragments live in registers for the whole sweep (small head
        // dims); otherwise they are re-read from shared memory for every KV tile.
        unsigned qf[QREG ? MT : 1][QREG ? KS : 1][4];
        if constexpr (QREG) {
            cp_wait<STAGES - 1>();  // Q has landed
            __syncthreads();
#pragma unroll
            for (int ks = 0; ks < KS; ++ks)
#pragma unroll
                for (int i = 0; i < MT; ++i) ldsm4<false>(sq + ((q_base ^ (2 * ks << 4)) + i * ROW16), qf[i][ks]);
        }

        int rs = 0, ws = STAGES - 1;  // stage read this iteration, stage refilled
        for (int jt = jt0; jt < ntiles; ++jt) {
            const int kv0 = jt * BC;
            const unsigned kbuf = sk + rs * 2 * KV_BYTES, vbuf = kbuf + KV_BYTES;
            cp_wait<STAGES - 2>();  // tile jt has landed (groups retire in order)
            // One barrier per tile: it publishes tile jt to every warp and proves that
            // every warp is done with tile jt - 1, whose stage is refilled right away with
            // tile jt + STAGES - 1 (in flight under this tile's math).
            __syncthreads();
            {
                const int nt = jt + STAGES - 1;
                const unsigned nb = sk + ws * 2 * KV_BYTES;
                if (nt < ntiles) {
                    load_tile<HD, BC, THREADS>(nb, Kb, k_ss, nt * BC, Skv, tid);
                    load_tile<HD, BC, THREADS>(nb + KV_BYTES, Vb, v_ss, nt * BC, Skv, tid);
                }
                cp_commit();
            }

            // some row of this warp sees this tile (the first row's first key is the warp's least)
            const bool active = kv0 <= warp_last && kv0 + BC > attn::first_key(wq0, win_left, causal_offset);
            // P of the whole tile as m16n8k16 A fragments: pa[i][kk] covers keys 16 kk ..
            // 16 kk + 15 of m16 tile i (the S accumulators of two n8 tiles, rounded to T).
            unsigned pa[MT][KP][4];
            if (active) {
                // S is computed, masked and exponentiated SUB keys at a time, so that only
                // SUB / 8 accumulator tiles per m16 tile are live next to O (the lazy max
                // below makes a sub-tile's bookkeeping as cheap as a tile's).
#pragma unroll
                for (int sub = 0; sub < BC / SUB; ++sub) {
                    const int ks0 = kv0 + sub * SUB;  // first key of the sub-tile
                    float s[MT][NSS][4];
#pragma unroll
                    for (int i = 0; i < MT; ++i)
#pragma unroll
                        for (int j = 0; j < NSS; ++j)
#pragma unroll
                            for (int e = 0; e < 4; ++e) s[i][j][e] = 0.f;
#pragma unroll
                    for (int ks = 0; ks < KS; ++ks) {
                        unsigned qa[MT][4];
                        if constexpr (!QREG) {
#pragma unroll
                            for (int i = 0; i < MT; ++i)
                                ldsm4<false>(sq + ((q_base ^ (2 * ks << 4)) + i * ROW16), qa[i]);
                        }
#pragma unroll
                        for (int p = 0; p < NSS / 2; ++p) {
                            unsigned kb[4];
                            ldsm4<false>(kbuf + ((k_base ^ (2 * ks << 4)) + (sub * SUB / 16 + p) * ROW16), kb);
#pragma unroll
                            for (int i = 0; i < MT; ++i) {
                                const unsigned(&a)[4] = QREG ? qf[QREG ? i : 0][QREG ? ks : 0] : qa[i];
                                mma_tile<T>(s[i][2 * p], a, kb[0], kb[1]);
                                mma_tile<T>(s[i][2 * p + 1], a, kb[2], kb[3]);
                            }
                        }
                    }
                    if (softcap > 0.f) {
                        const attn::SoftCap cap = attn::SoftCap::make(softcap, scale);  // (raw scores)
#pragma unroll
                        for (int i = 0; i < MT; ++i)
#pragma unroll
                            for (int j = 0; j < NSS; ++j)
#pragma unroll
                                for (int e = 0; e < 4; ++e) s[i][j][e] = cap(s[i][j][e]);
                    }
                    // Mask keys past the end of K or past a row's causal (or window) limit,
                    // or before a row's first key in a window (only sub-tiles that reach
                    // that far pay for the test).
                    if (ks0 + SUB > warp_full || ks0 < attn::first_key(wq0 + RW - 1, win_left, causal_offset)) {
#pragma unroll
                        for (int i = 0; i < MT; ++i)
#pragma unroll
                            for (int j = 0; j < NSS; ++j)
#pragma unroll
                                for (int e = 0; e < 4; ++e) {
                                    const int key = ks0 + 8 * j + 2 * t + (e & 1);
                                    const int row = wq0 + 16 * i + g + 8 * (e >> 1);
                                    if (key >= attn::key_end(row, Skv, causal, causal_offset, win_right) ||
                                        key < attn::first_key(row, win_left, causal_offset))
                                        s[i][j][e] = -CUOPS_INF;
                                }
                    }
                    // Online softmax on raw scores, with a lazy running max: the base a
                    // row's exponentials are taken against moves (and what was accumulated
                    // under the old base is rescaled) only when the sub-tile's max exceeds it
                    // by more than 2^RESCALE_SLACK, so past the first tiles the O rescale is
                    // mostly skipped; in between, p = 2^(s * sl2 - base) <= 2^RESCALE_SLACK,
                    // safe in fp16/bf16. The scale is folded in: one FFMA + one MUFU per
                    // score. 4 lanes hold a row.
#pragma unroll
                    for (int i = 0; i < MT; ++i)
#pragma unroll
                        for (int hr = 0; hr < 2; ++hr) {
                            float mx = -CUOPS_INF;
#pragma unroll
                            for (int j = 0; j < NSS; ++j) mx = fmaxf(mx, fmaxf(s[i][j][2 * hr], s[i][j][2 * hr + 1]));
                            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                            const float mt = mx * sl2;
                            if (mt > m[i][hr] + RESCALE_SLACK) {  // also the first key a row sees
                                const float alpha = fast_exp2(m[i][hr] - mt);  // 0 when m was -inf
                                m[i][hr] = mt;
                                l[i][hr] *= alpha;
#pragma unroll
                                for (int j = 0; j < NO; ++j) {
                                    o[i][j][2 * hr] *= alpha;
                                    o[i][j][2 * hr + 1] *= alpha;
                                }
                                // (P of earlier sub-tiles of this tile is already in pa
                                // under the old base: rescale it too.)
#pragma unroll
                                for (int q = 0; q < sub * SUB / 16; ++q) {
                                    pa[i][q][hr] = scale2<T>(pa[i][q][hr], alpha);
                                    pa[i][q][2 + hr] = scale2<T>(pa[i][q][2 + hr], alpha);
                                }
                            }
                            // A row that has seen no key keeps base -inf: subtract 0
                            // instead (2^-inf = 0 everywhere, no -inf - -inf = NaN).
                            const float base = m[i][hr] == -CUOPS_INF ? 0.f : m[i][hr];
                            float sum = 0.f;
#pragma unroll
                            for (int j = 0; j < NSS; ++j) {
                                s[i][j][2 * hr] = fast_exp2(fmaf(s[i][j][2 * hr], sl2, -base));
                                s[i][j][2 * hr + 1] = fast_exp2(fmaf(s[i][j][2 * hr + 1], sl2, -base));
                                sum += s[i][j][2 * hr] + s[i][j][2 * hr + 1];
                            }
                            l[i][hr] += sum;
                        }
#pragma unroll
                    for (int i = 0; i < MT; ++i)
#pragma unroll
                        for (int q = 0; q < NSS / 2; ++q) {
                            unsigned(&f)[4] = pa[i][sub * SUB / 16 + q];
                            f[0] = pack2<T>(s[i][2 * q][0], s[i][2 * q][1]);
                            f[1] = pack2<T>(s[i][2 * q][2], s[i][2 * q][3]);
                            f[2] = pack2<T>(s[i][2 * q + 1][0], s[i][2 * q + 1][1]);
                            f[3] = pack2<T>(s[i][2 * q + 1][2], s[i][2 * q + 1][3]);
                        }
                }
            }
            if (active) {
#pragma unroll
                for (int kk = 0; kk < KP; ++kk) {
                    for (int p = 0; p < NO / 2; ++p) {
                        unsigned vb[4];
                        ldsm4<true>(vbuf + ((v_base ^ (2 * p << 4)) + kk * ROW16), vb);
#pragma unroll
                        for (int i = 0; i < MT; ++i) {
                            mma_tile<T>(o[i][2 * p], pa[i][kk], vb[0], vb[1]);
                            mma_tile<T>(o[i][2 * p + 1], pa[i][kk], vb[2], vb[3]);
                        }
                    }
                }
            }
            rs = rs + 1 == STAGES ? 0 : rs + 1;
            ws = ws + 1 == STAGES ? 0 : ws + 1;
        }
        cp_wait<0>();  // (only empty groups remain, or Q when there was no tile)
        __syncthreads();  // every warp is done with the last tile and with its Q fragments

        // Epilogue: O / l into the warp's own Q rows (swizzled), then 16-byte rows out.
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                float lt = l[i][hr];
                lt += __shfl_xor_sync(0xffffffffu, lt, 1);
                lt += __shfl_xor_sync(0xffffffffu, lt, 2);
                const float inv = lt > 0.f ? 1.f / lt : 0.f;  // no visible key: zeros
                const int rl = warp * RW + 16 * i + g + 8 * hr;
#pragma unroll
                for (int j = 0; j < NO; ++j) {
                    const unsigned w = pack2<T>(o[i][j][2 * hr] * inv, o[i][j][2 * hr + 1] * inv);
                    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(sq + tile_off<HD>(rl, j) + 4 * t), "r"(w) : "memory");
                }
                const int row = q0 + rl;
                if (LSE != nullptr && t == 0 && row < Sq)
                    LSE[((i64)b * Hq + h) * Sq + row] = lt > 0.f ? (m[i][hr] + __log2f(lt)) * attn::LN2 : -CUOPS_INF;
            }
        __syncwarp();
        constexpr int CH = HD / 8;
#pragma unroll
        for (int q = 0; q < RW * CH / 32; ++q) {
            const int idx = lane + 32 * q, r = idx / CH, c = idx % CH;
            const int rl = warp * RW + r, row = q0 + rl;
            uint4 v;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(sq + tile_off<HD>(rl, c)));
            if (row < Sq) *reinterpret_cast<uint4*>(Ob + (i64)row * o_ss + c * 8) = v;
        }
    }
}

}  // namespace aflash
}  // namespace cuops

template <typename T, int HD, int MT, int BC, int SUB, int WARPS, int STAGES, bool QREG>
__global__ void __launch_bounds__(32 * WARPS, WARPS >= 8 ? 1 : 2) attention_flash(ATTN_PARAMS(T)) {
    cuops::aflash::flash_body<T, HD, MT, BC, SUB, WARPS, STAGES, QREG>(ATTN_ARGS);
}
