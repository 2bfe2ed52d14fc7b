// attention_flash3.cu: FlashAttention on Hopper's warpgroup tensor-core instructions (sm_90a),
// float16 / bfloat16, under the contract of attention_common.cuh (ATTN_PARAMS: strided
// Q/K/V/O, GQA, both causal alignments, optional LSE).
//
// Why a new rung: attention_flash.cu (FlashAttention-2 on mma.sync) brings every K and V
// fragment through registers with ldmatrix; on an H100 it runs at 0.57-0.72x of cuDNN's
// attention, which is built on wgmma (NOTES). Here, as in FlashAttention-3:
//   - one block per (128 query rows, query head, batch element): a producer warpgroup
//     (one thread issuing tensor copies, registers given back with setmaxnreg) and two
//     consumer warpgroups of 64 query rows each (registers taken);
//   - the producer copies the block's Q once, then K and V tiles of BC keys into a
//     STAGES-deep ring of full/empty mbarriers (sm90.cuh Pipeline), by TMA tensor maps of
//     the strided tensors (head_dim, rows, heads, batch): no layout needs a copy, rows
//     past the tensor read as zeros;
//   - S = Q K^T: one m64nBCk16 wgmma per 16 of head_dim, both operands from shared
//     memory, K-major as stored (head_dim contiguous);
//   - the online softmax runs on the S accumulators in registers (scale * log2(e) folded
//     in, exp2), a row's max and sum over the 4 lanes that hold it;
//   - O += P V: P, rounded to 16 bits, is the A operand straight from registers (the
//     accumulator layout of S is the register-A fragment layout: sm90.cuh
//     wgmma_m64nNk16_rs), V from shared memory through the transpose immediate (V is
//     stored key-major, head_dim contiguous);
//   - each consumer waits for its own wgmmas before the softmax and before releasing a
//     stage: the two consumer warpgroups overlap each other's softmax with their
//     wgmmas. (FlashAttention-3 also overlaps the softmax of one tile with the S = Q K^T
//     of the next inside a warpgroup; not here yet.)
//   - causal: tiles past the block's last visible key are never loaded, and only tiles
//     that reach past a row's last visible key (or the end of K) pay for the mask; the
//     grid runs the longest query tiles first;
//   - the epilogue divides by the row sum and writes O straight from the accumulators
//     (two elements a 4-byte store); the LSE is (m + log2(l)) * ln 2.
//
// Shared memory (1024-byte aligned for the 128-byte swizzle): Q as 2 x D/64 pieces of
// 64 rows x 64 head_dim (8 KB each: consumer warpgroup w's rows at piece w * D/64), then
// the ring: a stage is K (D/64 pieces of BC rows x 64 head_dim, K-major) then V (BC/64 x
// D/64 pieces of 64 keys x 64 head_dim, rows of 64 head_dim: the MN-major layout of
// sm90.cuh SwizzledTile16<true>), then the ring's barriers and Q's.
//
// Launch geometry (cupyops/ops/_attention_flash3.py computes the same numbers):
//   attention_flash3<T, HD, BC, STAGES> (HD = head_dim, 64 or 128): block 384; grid
//   (cdiv(Sq, 128), Hq, B); dynamic shared memory 128 * D * 2 + STAGES * 2 * BC * D * 2 +
//   1 KB (alignment) + 16 * STAGES + 8. Tensor maps of Q, K, V: 4-D (D, rows, heads,
//   batch) of 16-bit elements with the 128-byte swizzle, boxes (64, 64, 1, 1) for Q and
//   V, (64, BC, 1, 1) for K. Needs 16-byte aligned tensors with strides that are
//   multiples of 16 bytes (the launcher checks).
#include "attention_common.cuh"
#include "gemm_sm90.cuh"

using namespace cuops;
using namespace cuops::sm90;

namespace fa3 {

constexpr int BR = 128;  // query rows of a block: 64 a consumer warpgroup
constexpr unsigned PIECE = 8192;  // 64 rows x 128 bytes

template <int D, int BC> struct Layout {
    static_assert(D == 64 || D == 128, "attention_flash3: head_dim 64 or 128");
    static_assert(BC % 64 == 0 && BC <= 256, "attention_flash3: key tiles of whole 64-row pieces");
    static constexpr int DP = D / 64;  // 64-wide pieces of head_dim
    static constexpr unsigned Q_BYTES = BR * D * 2, K_BYTES = BC * D * 2, V_BYTES = BC * D * 2;
    static constexpr unsigned STAGE_BYTES = K_BYTES + V_BYTES;
    static constexpr unsigned K_PIECE = BC * 128;  // a 64-wide slice of head_dim of all BC keys
};

// The keys of the block's KV tiles: what its last query row sees (<= 0: none).
__device__ __forceinline__ int block_keys(int q0, int Sq, int Skv, int causal, int causal_offset) {
    const int last_row = min(q0 + BR, Sq) - 1;
    return attn::visible_keys(last_row, Skv, causal, causal_offset);
}

// 2^x in one MUFU op (2^-inf = +0).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace fa3

template <typename T, int HD, int BC, int STAGES>
__global__ void __launch_bounds__(WS_THREADS, 1)
    attention_flash3(ATTN_PARAMS(T), const __grid_constant__ TmaMap mapQ, const __grid_constant__ TmaMap mapK,
                    const __grid_constant__ TmaMap mapV) {
    using namespace fa3;
    typedef Layout<HD, BC> L;
    static_assert(sizeof(T) == 2, "attention_flash3: float16 and bfloat16");
    extern __shared__ unsigned char smem_raw[];
    const unsigned q_smem = ring_base(smem_raw);
    const unsigned ring = q_smem + L::Q_BYTES;
    const Pipeline<STAGES> pipe{ring + STAGES * L::STAGE_BYTES};
    const Barrier q_full{pipe.base + Pipeline<STAGES>::BYTES};
    if (threadIdx.x == 0) {
        pipe.init(2);  // an empty phase: one arrival per consumer warpgroup
        q_full.init(1);
        mbar_init_fence();
    }
    __syncthreads();

    const int qtile = causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
    const int q0 = qtile * BR, h = blockIdx.y, b = blockIdx.z, hk = h / (Hq / Hkv);
    const int kv_end = block_keys(q0, Sq, Skv, causal, causal_offset);
    const int tiles = kv_end > 0 ? (kv_end + BC - 1) / BC : 0;

    if (warpgroup() == 0) {  // producer
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (threadIdx.x == 0 && tiles > 0) {  // (no tile: the consumers never wait for Q either)
            q_full.arrive_expect_tx(L::Q_BYTES);
#pragma unroll
            for (int w = 0; w < 2; ++w)
#pragma unroll
                for (int p = 0; p < L::DP; ++p)
                    tma_load_4d(q_smem + (w * L::DP + p) * PIECE, &mapQ, 64 * p, q0 + 64 * w, h, b, q_full.addr);
            for (int j = 0; j < tiles; ++j) {
                pipe.producer_acquire(j);
                pipe.producer_expect(j, L::STAGE_BYTES);
                const unsigned st = ring + pipe.stage(j) * L::STAGE_BYTES, bar = pipe.full(j).addr;
#pragma unroll
                for (int p = 0; p < L::DP; ++p) tma_load_4d(st + p * L::K_PIECE, &mapK, 64 * p, j * BC, hk, b, bar);
#pragma unroll
                for (int kb = 0; kb < BC / 64; ++kb)
#pragma unroll
                    for (int p = 0; p < L::DP; ++p)
                        tma_load_4d(st + L::K_BYTES + (kb * L::DP + p) * PIECE, &mapV, 64 * p, j * BC + 64 * kb, hk, b,
                                    bar);
            }
        }
        __syncwarp();
        return;
    }

    // consumers: warpgroup 1 owns query rows q0 + [0, 64), warpgroup 2 q0 + [64, 128)
    setmaxnreg_inc<WS_CONSUMER_REGS>();
    const int w = warpgroup() - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const bool leader = threadIdx.x % WG == 0;
    const unsigned q_tile = q_smem + w * L::DP * PIECE;
    const float scale2 = scale * attn::LOG2E;
    int row[2], vis[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        row[hh] = q0 + 64 * w + 16 * warp + lane / 4 + 8 * hh;
        vis[hh] = attn::visible_keys(row[hh], Skv, causal, causal_offset);
    }
    const int vis_min = min(vis[0], vis[1]);

    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
    float m[2] = {-CUOPS_INF, -CUOPS_INF}, l[2] = {0.f, 0.f};

    if (tiles > 0) q_full.wait(0);
    for (int j = 0; j < tiles; ++j) {
        pipe.consumer_wait(j);
        const unsigned st = ring + pipe.stage(j) * L::STAGE_BYTES;
        float s[BC / 2];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk)
            wgmma_m64nNk16<BC, T, false, false>(s, SwizzledTile16<false>::desc(q_tile + (kk / 4) * PIECE, kk % 4),
                                                SwizzledTile16<false>::desc(st + (kk / 4) * L::K_PIECE, kk % 4),
                                                kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(s);

        // keys past what a row sees (its causal limit, or the end of K) weigh nothing
        const int key0 = j * BC + 2 * (lane % 4);
        if (j * BC + BC > vis_min) {
#pragma unroll
            for (int c = 0; c < BC / 8; ++c)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        if (key0 + 8 * c + e >= vis[hh]) s[4 * c + 2 * hh + e] = -CUOPS_INF;
        }

        // online softmax in base 2: p = 2^(s * scale2 - m), O and l rescaled when m moves
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float mx = -CUOPS_INF;
#pragma unroll
            for (int c = 0; c < BC / 8; ++c) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * hh], s[4 * c + 2 * hh + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[hh], mx * scale2);
            const float base = m_new == -CUOPS_INF ? 0.f : m_new;  // a row with no key yet: all p are 0
            const float alpha = fast_exp2(m[hh] - base);
            m[hh] = m_new;
            l[hh] *= alpha;
#pragma unroll
            for (int c = 0; c < HD / 8; ++c) {
                o[4 * c + 2 * hh] *= alpha;
                o[4 * c + 2 * hh + 1] *= alpha;
            }
#pragma unroll
            for (int c = 0; c < BC / 8; ++c)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float p = fast_exp2(fmaf(s[4 * c + 2 * hh + e], scale2, -base));
                    s[4 * c + 2 * hh + e] = p;
                    l[hh] += p;
                }
        }

        // P as the register A operand, 16 keys a fragment
        unsigned pa[BC / 16][4];
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r) pa[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);

        // the rescale of o and the packing of pa stay above the fence
        fence_regs(o);
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) fence_regs(pa[kk]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk)
            wgmma_m64nNk16_rs<HD, T, true>(
                o, pa[kk], SwizzledTile16<true>::desc(st + L::K_BYTES + (kk / 4) * L::DP * PIECE, kk % 4), true);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) fence_regs(pa[kk]);  // (read by the wgmmas until here)
        if (leader) pipe.consumer_release(j);
    }

    // epilogue: O / l (a row that saw no key: zeros, LSE -inf)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float lt = l[hh];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        const int i = row[hh];
        if (i >= Sq) continue;
        const float inv = lt > 0.f ? __frcp_rn(lt) : 0.f;
        T* orow = O + b * o_sb + static_cast<i64>(i) * o_ss + h * o_sh;
#pragma unroll
        for (int c = 0; c < HD / 8; ++c) {
            const int d = 8 * c + 2 * (lane % 4);
            *reinterpret_cast<unsigned*>(orow + d) = pack2<T>(o[4 * c + 2 * hh] * inv, o[4 * c + 2 * hh + 1] * inv);
        }
        if (LSE != nullptr && lane % 4 == 0)
            LSE[(static_cast<i64>(b) * Hq + h) * Sq + i] = lt > 0.f ? (m[hh] + log2f(lt)) * attn::LN2 : -CUOPS_INF;
    }
}
