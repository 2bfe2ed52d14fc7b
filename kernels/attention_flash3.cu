// attention_flash3.cu: FlashAttention on Hopper's warpgroup tensor-core instructions
// (sm_90a), float16 / bfloat16, under the contract of attention_common.cuh (ATTN_PARAMS:
// strided Q/K/V/O, GQA, both causal alignments, sliding windows, logit soft-capping,
// optional LSE).
//
// Why a new rung: attention_flash.cu (FlashAttention-2 on mma.sync) brings every K and V
// fragment through registers with ldmatrix; on an H100 it runs at 0.57-0.72x of cuDNN's
// attention, which is built on wgmma (NOTES). Here, as in FlashAttention-3:
//   - a work tile is 64 NC query rows of one (query head, batch element): a producer
//     warpgroup (one thread issuing tensor copies, registers given back with setmaxnreg) and
//     NC consumer warpgroups of 64 query rows each (registers taken; NC = 2, or 3 for
//     head_dim 64's 192-row tiles, Warpgroups);
//   - the producer copies a work tile's Q once, then K and V tiles of BC keys into two
//     STAGES-deep rings of full/empty mbarriers (sm90.cuh Pipeline; K and V apart, so a K
//     tile is released as soon as its scores are made), by TMA tensor maps of the strided
//     tensors (head_dim, rows, heads, batch): no layout needs a copy, rows past the tensor
//     read as zeros;
//   - S = Q K^T: one m64nBCk16 wgmma per 16 of head_dim, both operands from shared
//     memory, K-major as stored (head_dim contiguous);
//   - the online softmax runs on the S accumulators in registers (scale * log2(e) folded
//     in, exp2), a row's max and sum over the 4 lanes that hold it;
//   - O += P V: P, rounded to 16 bits, is the A operand straight from registers (the
//     accumulator layout of S is the register-A fragment layout: sm90.cuh
//     wgmma_m64nNk16_rs), V from shared memory through the transpose immediate (V is
//     stored key-major, head_dim contiguous);
//   - SCHED, the consumers' schedule, is the ladder inside the rung (NOTES has what each
//     step bought):
//       SERIAL   each tile: S = Q K^T, wait, softmax, O += P V, wait;
//       OVERLAP  FlashAttention-3's intra-warpgroup overlap: the S = Q K^T of tile j and
//                the P V of tile j - 1 are issued together, and the softmax of tile j runs
//                while P V is in flight (O is rescaled before P V is issued, by the factor
//                of the softmax before);
//       PINGPONG OVERLAP, and the consumer warpgroups take turns issuing their wgmmas
//                (a named barrier each, round the consumers), so that one's softmax runs
//                while another's GEMMs use the tensor cores;
//   - masks (causal, the sliding window win_left / win_right, each row's keys
//     [attn::first_key, attn::key_end)): a work tile runs the K/V tiles from the one
//     holding its first row's first key to the one holding its last row's last key
//     (kv_range, which producer and consumers both call, so they agree on the tiles and
//     the ring's phases): tiles outside every row's keys are never loaded nor multiplied,
//     and the work of a windowed tile is the window's, not the sequence's. Only tiles
//     that some thread's row does not see whole (across the window's left edge, past the
//     causal limit, the window's right edge or the end of K) pay for the element-wise
//     -inf mask; a warpgroup of a 192-row tile may run tiles that its own rows do not see
//     at all (all masked: no weight). A row that sees no key keeps m = -inf and l = 0:
//     zeros in O, -inf in its LSE;
//   - soft caps (softcap > 0): the softmax caps a row's maximum and each score as it
//     makes its weight (attn::SoftCap's tanh, the scale and log2(e) folded in: two MUFU
//     operations a score more, so capped launches run 1.2x (head_dim 256) to 2x (64) the
//     uncapped time); a masked score keeps weight 0;
//   - windows and caps are instantiations of their own (MASKS, below): in the kernel of
//     a plain launch every window and cap term folds away (a runtime branch on them, never
//     taken, slowed plain launches by 0.6-5 %: NOTES 96 and 100);
//   - work tiles go round robin to the blocks (WorkTiles: longest first under a causal
//     mask, heads in groups whose K and V stay in L2); in a persistent grid the producer
//     loads the next tile's Q and K/V while the consumers finish the last P V and the
//     epilogue of this one;
//   - the epilogue divides by the row sum and rounds O to T; the LSE is (m + log2(l)) *
//     ln 2. Where a block has two Q buffers and the schedule overlaps (TMA_EPILOGUE), a
//     warpgroup writes its O rows over its own rows of the tile's Q buffer and stores them
//     by tensor copies; else (and for a packed sequence's last rows) from registers (two
//     elements a 4-byte store), after the next work tile's first S = Q K^T is issued
//     where the schedule overlaps.
//
// Shared memory (1024-byte aligned for the 128-byte swizzle): Q (QStages buffers) as NC x DP
// pieces of 64 rows x 64 head_dim (DP = cdiv(D, 64); 8 KB each: consumer warpgroup w's rows
// at piece w * DP), the K ring and the V ring (a stage: DP pieces of BC keys x 64 head_dim, rows of 128 bytes;
// K-major for S = Q K^T, and for P V the MN-major layout of sm90.cuh SwizzledTile16<true,
// BC * 128>), then the two rings' barriers and Q's (QStages: two Q buffers where they fit).
// head_dim 96 is held as 128: the tensor copies fill the columns past it with zeros,
// S = Q K^T stops at 96, and P V's extra columns (zeros) are not written.
//
// Launch geometry (cupyops/ops/_attention_flash3.py computes the same numbers):
//   attention_flash3<T, HD, BC, STAGES, SCHED, NC, MASKS> (HD = head_dim: 64, 96, 128 or 256;
//   MASKS: fa3::WINDOW for a launch with a sliding window, WINDOW | CAP for one with a soft
//   cap (and a window or not), 0 otherwise):
//   block 128 (NC + 1); 1-D grid of one block an SM (persistent) or one a work tile
//   (cdiv(Sq, BR) * Hq * B tiles, BR = 64 NC, WorkTiles); dynamic shared memory QSTAGES *
//   BR * DPAD * 2 + STAGES * 2 * BC * DPAD * 2 + 1 KB (alignment) + 32 * STAGES + 16 *
//   QSTAGES (DPAD: D rounded up to 64). Tensor maps of Q, K, V, O: 4-D (D, rows, heads,
//   batch) of 16-bit elements with the 128-byte swizzle, boxes (64, 64, 1, 1) for Q and O,
//   (64, BC, 1, 1) for K and V. Needs 16-byte aligned tensors with strides that are multiples of 16 bytes
//   (the launcher checks). causal, causal_offset, win_left, win_right, softcap: as
//   attention_common.cuh has them, in any combination (for packed sequences each
//   sequence's offset replaces causal_offset, SeqView). head_group: WorkTiles' group. cu_q,
//   cu_k, total_q, total_k, bottom_right: packed sequences (SeqView; null cu_q: a padded
//   batch), where Sq and Skv are the longest sequence's lengths and the maps' rows the
//   packed tokens (batch 1).
#include "attention_common.cuh"
#include "gemm_sm90.cuh"

using namespace cuops;
using namespace cuops::sm90;

namespace fa3 {

constexpr unsigned PIECE = 8192;  // 64 rows x 128 bytes
enum Sched { SERIAL = 0, OVERLAP = 1, PINGPONG = 2 };
// What a launch has beyond the causal mask (the kernel's MASKS, bits).
enum Masks { WINDOW = 1, CAP = 2 };
// Named barriers 1 .. NC: "consumer warpgroup w may issue its wgmmas" (PINGPONG).
constexpr int TURN_BARRIER = 1;
// Named barriers 4 .. 3 + NC: consumer warpgroup w's output is staged (the tensor-store
// epilogue).
constexpr int EPILOGUE_BARRIER = 4;
// How far (log2 units) a row's max may rise above the m its P is made against (Consumer::softmax).
constexpr float RESCALE_SLACK = 8.f;

// NC consumer warpgroups of 64 query rows each (a work tile of BR = 64 NC rows) and the
// producer warpgroup: their register shares (setmaxnreg), all within the 64K of an SM.
// Two consumers take gemm_sm90.cuh's split; three (head_dim 64's 192-row tiles, as
// FlashAttention-3 has them) 160 each and 24 for the producer.
template <int NC> struct Warpgroups {
    static_assert(NC == 2 || NC == 3, "attention_flash3: two or three consumer warpgroups");
    static constexpr int BR = 64 * NC, THREADS = (NC + 1) * WG;
    static constexpr int PRODUCER_REGS = NC == 2 ? WS_PRODUCER_REGS : 24;
    static constexpr int CONSUMER_REGS = NC == 2 ? WS_CONSUMER_REGS : 160;
    static_assert(THREADS == WS_THREADS || NC != 2, "attention_flash3: two consumers are the GEMM's split");
    // (the pool setmaxnreg moves registers within: every thread's cap at entry, a multiple of 8)
    static_assert(WG * (PRODUCER_REGS + NC * CONSUMER_REGS) <= THREADS * ((65536 / THREADS) & ~7),
                  "attention_flash3: registers");
};

template <int D, int BC, int BR> struct Layout {
    static_assert(D == 64 || D == 96 || D == 128 || D == 256, "attention_flash3: head_dim 64, 96, 128 or 256");
    static_assert(BC % 16 == 0 && BC <= 256, "attention_flash3: key tiles of whole k16 steps, at most a box");
    static constexpr int DP = (D + 63) / 64;  // 64-wide pieces of head_dim (96: the second half reads as zeros)
    static constexpr int DPAD = 64 * DP;       // head_dim as the tiles and O's accumulators hold it
    static constexpr unsigned Q_BYTES = BR * DPAD * 2, KV_BYTES = BC * DPAD * 2;  // Q; a K or a V tile
    static constexpr unsigned KV_PIECE = BC * 128;  // a 64-wide slice of head_dim of all BC keys (K and V)
};

// Q buffers: two where they fit beside STAGES-deep K and V rings in the 227 KB of a block
// (then the producer loads the next work tile's Q as soon as it has issued this tile's K/V
// copies, and a persistent block's next tile does not wait for Q), else one. The launcher's
// q_stages mirrors this.
template <typename L, int STAGES> struct QStages {
    static constexpr int value =
        2 * L::Q_BYTES + STAGES * 2 * L::KV_BYTES + 1024 + 32 * STAGES + 32 <= 227 * 1024 ? 2 : 1;
};

// The K/V tiles [j0, j0 + n) of the work tile of query rows [q0, q0 + BR); returns n
// (0: no key to see, and for a tile past the end of its sequence, which packed sequences
// have). A row's first key (attn::first_key) and its key_end do not decrease with the
// row, so every row's keys lie in [first key of the first row, key_end of the last):
// the tiles from the one holding the first to the one holding the last. The producer and
// the consumers both take the range from here, so they agree on it exactly.
template <int BC, int BR>
__device__ __forceinline__ int kv_range(int q0, int Sq, int Skv, int causal, int causal_offset, int win_left,
                                        int win_right, int& j0) {
    j0 = 0;
    if (q0 >= Sq) return 0;
    const int end = attn::key_end(min(q0 + BR, Sq) - 1, Skv, causal, causal_offset, win_right);
    const int first = attn::first_key(q0, win_left, causal_offset);
    if (end <= first) return 0;
    j0 = first / BC;
    return (end + BC - 1) / BC - j0;
}

// The work of a launch: a tile of BR query rows of one (head, batch element), qtiles x
// heads x batch tiles, handed out round robin to the blocks (a persistent grid of one block
// an SM, or one block a tile). Heads (h + Hq * b) go in groups of `group`, chosen so that a
// group's K and V stay in L2 while its tiles run; inside a group the query tiles go longest
// first under a causal mask (the last query tile sees every key), each for every head of
// the group before the next. (A persistent grid's fixed round robin still leaves SMs idle
// at the end of a causal launch, NOTES 72: the launcher gives those one block a tile. Odd
// rounds handed out in reverse, to even out each block's sum of lengths, measured worse:
// NOTES 81.)
template <int BR> struct WorkTiles {
    int qtiles, Hq, B, group;
    bool causal;
    __device__ __forceinline__ int count() const { return qtiles * Hq * B; }
    __device__ __forceinline__ void at(int t, int& q0, int& h, int& b) const {
        const int per_group = group * qtiles, g = t / per_group, local = t - g * per_group;
        const int size = min(group, Hq * B - g * group);
        const int qi = local / size, head = g * group + (local - qi * size);
        q0 = (causal ? qtiles - 1 - qi : qi) * BR;
        h = head % Hq;
        b = head / Hq;
    }
};

// Where batch element b's sequence lies. Padded batches (cu_q null): Sq query rows and Skv
// keys each, batch coordinate b, the launch's causal offset. Packed sequences (attention_varlen:
// cu_q, cu_k int32 [B + 1]): element b is query rows [cu_q[b], cu_q[b + 1]) of a Q of
// total_q rows and keys [cu_k[b], cu_k[b + 1]) of total_k, batch coordinate 0, its own
// offset (of the causal mask and the window alike) 0 (top_left) or Skv - Sq (bottom_right),
// its LSE rows h * total_q + q_row + i. The offsets are clamped into the tensors and the
// lengths to the launch's Sq and Skv (values on the GPU are not checked on the host: a bad
// one shortens its sequence, never addresses out of bounds).
struct SeqView {
    int Sq, Skv, offset, q_row, k_row, b;
    i64 lse_row;
};

__device__ __forceinline__ SeqView seq_view(int b, int h, int Hq, int Sq, int Skv, int causal_offset,
                                            const int* cu_q, const int* cu_k, int total_q, int total_k,
                                            int bottom_right) {
    SeqView s;
    if (cu_q == nullptr) {
        s.Sq = Sq;
        s.Skv = Skv;
        s.offset = causal_offset;
        s.q_row = s.k_row = 0;
        s.b = b;
        s.lse_row = (static_cast<i64>(b) * Hq + h) * Sq;
        return s;
    }
    const int q_lo = min(max(cu_q[b], 0), total_q), q_hi = min(max(cu_q[b + 1], q_lo), total_q);
    const int k_lo = min(max(cu_k[b], 0), total_k), k_hi = min(max(cu_k[b + 1], k_lo), total_k);
    s.Sq = min(q_hi - q_lo, Sq);
    s.Skv = min(k_hi - k_lo, Skv);
    s.offset = bottom_right ? s.Skv - s.Sq : 0;
    s.q_row = q_lo;
    s.k_row = k_lo;
    s.b = 0;
    s.lse_row = static_cast<i64>(h) * total_q + q_lo;
    return s;
}

// 2^x in one MUFU op (2^-inf = +0).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// One consumer warpgroup's state and steps: 64 query rows, O and the running max and sum
// in registers (a thread holds rows r0 = 16 warp + lane / 4 and r0 + 8, index hh).
template <typename T, int HD, int BC, int STAGES, int BR> struct Consumer {
    typedef Layout<HD, BC, BR> L;
    unsigned q_tile, k_ring, v_ring;
    float scale2;  // scale * log2(e)
    // (kernels with CAP) the raw score x capped, in the softmax's base-2 units, plus a:
    // A tanh(scale x / softcap) + a = A - 2 A / (2^(x cap_in) + 1) + a, A = softcap log2(e)
    // (attn::SoftCap's tanh with the scale and log2(e) folded in): cap_in = 2 log2(e) scale /
    // softcap, cap_m2a = -2 A.
    float cap_in, cap_m2a;
    __device__ __forceinline__ float capped(float x, float a) const {
        float r;
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(fast_exp2(x * cap_in) + 1.f));
        return fmaf(cap_m2a, r, fmaf(-0.5f, cap_m2a, a));
    }
    // The keys each of the thread's two rows sees, [lo, hi), counted from the work tile's
    // first K/V tile (kv_range's j0): row r0 + 8 (hh = 1) never sees a key before row r0's
    // first, nor stops before row r0's last, so lo[1] and hi[0] bound both rows.
    int lo[2], hi[2];
    float o[L::DPAD / 2];
    float m[2], l[2];

    // S = Q K_j^T issued (not waited for).
    __device__ __forceinline__ void issue_s(float (&s)[BC / 2], int j) {
        const unsigned kst = k_ring + Pipeline<STAGES>::stage(j) * L::KV_BYTES;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk)  // (head_dim 96: the zeros past it are not multiplied)
            wgmma_m64nNk16<BC, T, false, false>(s, SwizzledTile16<false>::desc(q_tile + (kk / 4) * PIECE, kk % 4),
                                                SwizzledTile16<false>::desc(kst + (kk / 4) * L::KV_PIECE, kk % 4),
                                                kk > 0);
        wgmma_commit();
    }

    // O += P V_j issued (not waited for); P in registers, 16 keys a fragment.
    __device__ __forceinline__ void issue_pv(unsigned (&pa)[BC / 16][4], int j) {
        const unsigned vst = v_ring + Pipeline<STAGES>::stage(j) * L::KV_BYTES;
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) fence_regs(pa[kk]);  // (the packing stays above the fence)
        fence_regs(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk)
            wgmma_m64nNk16_rs<L::DPAD, T, true>(o, pa[kk], SwizzledTile16<true, L::KV_PIECE>::desc(vst, kk), true);
        wgmma_commit();
    }

    // Waits for every wgmma in flight (P V the last), then fences O and P: their readers
    // and the next writers of P stay below the wait.
    __device__ __forceinline__ void wait_pv(unsigned (&pa)[BC / 16][4]) {
        wgmma_wait<0>();
        fence_regs(o);
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) fence_regs(pa[kk]);
    }

    // The online softmax of the work tile's K/V tile j in base 2, in place (S -> P). Keys
    // outside what a row sees (left of its window; past its causal limit, its window's
    // right side or the end of K) weigh nothing: masked, only on tiles that reach past one
    // of the thread's rows' bounds. alpha is what O (accumulated against the old m)
    // must be multiplied by. m moves to the tile's max only when that is more than
    // RESCALE_SLACK above it (FlashAttention-4's lazy rescale): otherwise P is made against the
    // old m, at most 2^RESCALE_SLACK, alpha is 1 and O is not touched. The result is the same
    // (O and l carry the same m; the epilogue divides one by the other), and after the first
    // tiles a row's max rarely moves by that much, so most tiles skip the rescale of O.
    // `windowed`: the launch has a left window side (a kernel parameter, so the branch is
    // uniform): without one a row's keys start at 0 and its mask keeps the one compare a
    // score of the kernel before windows (two compares a score on every masked tile made
    // the unmasked kernel slower, NOTES 96). CAPPED: a row's raw maximum is capped (the cap
    // is monotone: that is the capped scores' maximum), and each score as its weight is
    // made (a masked score, -inf, is skipped: its cap would be finite).
    template <bool CAPPED>
    __device__ __forceinline__ void softmax(float (&s)[BC / 2], int j, int lane, float (&alpha)[2],
                                            bool windowed) {
        const int key0 = j * BC + 2 * (lane % 4);
        if (windowed) {
            if (j * BC < lo[1] || j * BC + BC > hi[0]) {
#pragma unroll
                for (int c = 0; c < BC / 8; ++c)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int key = key0 + 8 * c + e;
                            if (key < lo[hh] || key >= hi[hh]) s[4 * c + 2 * hh + e] = -CUOPS_INF;
                        }
            }
        } else if (j * BC + BC > hi[0]) {
#pragma unroll
            for (int c = 0; c < BC / 8; ++c)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        if (key0 + 8 * c + e >= hi[hh]) s[4 * c + 2 * hh + e] = -CUOPS_INF;
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float mx = -CUOPS_INF;
#pragma unroll
            for (int c = 0; c < BC / 8; ++c) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * hh], s[4 * c + 2 * hh + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // (the 4 lanes of a row agree on it, and on m)
            const float m_tile = CAPPED && mx != -CUOPS_INF ? capped(mx, 0.f) : mx * scale2;
            alpha[hh] = 1.f;
            if (m_tile > m[hh] + RESCALE_SLACK) {  // (m = -inf: any key seen moves it)
                alpha[hh] = fast_exp2(m[hh] - m_tile);
                m[hh] = m_tile;
            }
            const float base = m[hh] == -CUOPS_INF ? 0.f : m[hh];  // a row with no key yet: all p are 0
            float sum = 0.f;
#pragma unroll
            for (int c = 0; c < BC / 8; ++c)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float x = s[4 * c + 2 * hh + e];
                    float p;
                    if constexpr (CAPPED)  // (a masked score stays masked: cap(-inf) is finite)
                        p = x == -CUOPS_INF ? 0.f : fast_exp2(capped(x, -base));
                    else
                        p = fast_exp2(fmaf(x, scale2, -base));
                    s[4 * c + 2 * hh + e] = p;
                    sum += p;
                }
            l[hh] = l[hh] * alpha[hh] + sum;
        }
    }

    // O *= alpha, skipped where no row of the warp moved its max (a branch the warp takes as one).
    __device__ __forceinline__ void rescale(const float (&alpha)[2]) {
        if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
        for (int c = 0; c < L::DPAD / 8; ++c)  // (all: head_dim 96's zero columns too, or ptxas
                                               // serialises the wgmmas, C7511)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                o[4 * c + 2 * hh] *= alpha[hh];
                o[4 * c + 2 * hh + 1] *= alpha[hh];
            }
    }

    // P as the register A operand of P V, rounded to T.
    __device__ __forceinline__ static void pack(unsigned (&pa)[BC / 16][4], const float (&s)[BC / 2]) {
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r) pa[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    }
};

}  // namespace fa3

template <typename T, int HD, int BC, int STAGES, int SCHED, int NC, int MASKS>
__global__ void __launch_bounds__(fa3::Warpgroups<NC>::THREADS, 1)
    attention_flash3(ATTN_PARAMS(T), const __grid_constant__ TmaMap mapQ, const __grid_constant__ TmaMap mapK,
                     const __grid_constant__ TmaMap mapV, const __grid_constant__ TmaMap mapO, int head_group,
                     const int* __restrict__ cu_q,
                     const int* __restrict__ cu_k, int total_q, int total_k, int bottom_right) {
    using namespace fa3;
    // MASKS: what the launch has (the launcher's choice). Without WINDOW the window's sides
    // are the constant "unlimited", without CAP there is no cap, so that every such term
    // folds away and a plain launch runs the kernel before windows and caps (the same SASS:
    // a runtime branch on the window slowed plain launches by 0.6-4 %, NOTES 96 and 100).
    static_assert(MASKS == 0 || MASKS == WINDOW || MASKS == (WINDOW | CAP), "attention_flash3: MASKS");
    constexpr bool WINDOWED = (MASKS & WINDOW) != 0, CAPPED = (MASKS & CAP) != 0;
    if constexpr (!WINDOWED) {
        win_left = -1;
        win_right = -1;
    }
    typedef Warpgroups<NC> W;
    constexpr int BR = W::BR;
    typedef Layout<HD, BC, BR> L;
    static_assert(sizeof(T) == 2, "attention_flash3: float16 and bfloat16");
    static_assert(SCHED == SERIAL || SCHED == OVERLAP || SCHED == PINGPONG, "attention_flash3: SCHED");
    extern __shared__ unsigned char smem_raw[];
    constexpr int QSTAGES = QStages<L, STAGES>::value;
    const unsigned q_smem = ring_base(smem_raw);
    const unsigned k_ring = q_smem + QSTAGES * L::Q_BYTES, v_ring = k_ring + STAGES * L::KV_BYTES;
    const Pipeline<STAGES> kpipe{v_ring + STAGES * L::KV_BYTES};
    const Pipeline<STAGES> vpipe{kpipe.base + Pipeline<STAGES>::BYTES};
    const Pipeline<QSTAGES> qpipe{vpipe.base + Pipeline<STAGES>::BYTES};  // Q: a buffer a work tile
    if (threadIdx.x == 0) {
        kpipe.init(NC);  // an empty phase: one arrival per consumer warpgroup
        vpipe.init(NC);
        qpipe.init(NC);
    }
    __syncthreads();

    // (each warpgroup makes the work list after its setmaxnreg: a value kept across that
    // was spilled in the capped head_dim-256 kernel)
    auto work_tiles = [&] { return WorkTiles<BR>{(Sq + BR - 1) / BR, Hq, B, head_group, causal != 0}; };
    auto seq = [&](int b, int h) {
        return seq_view(b, h, Hq, Sq, Skv, causal_offset, cu_q, cu_k, total_q, total_k, bottom_right);
    };

    if (warpgroup() == 0) {  // producer
        setmaxnreg_dec<W::PRODUCER_REGS>();
        const WorkTiles<BR> work = work_tiles();
        if (threadIdx.x == 0) {
            unsigned q_it = 0, kv = 0;  // uses of the Q buffer and of the K/V rings so far
            for (int t = blockIdx.x; t < work.count(); t += gridDim.x) {
                int q0, h, b;
                work.at(t, q0, h, b);
                const SeqView sv = seq(b, h);
                int j0;
                const int tiles = kv_range<BC, BR>(q0, sv.Sq, sv.Skv, causal, sv.offset, win_left, win_right, j0);
                if (tiles == 0) continue;  // (the consumers do not wait for this tile's Q either)
                const int hk = h / (Hq / Hkv);
                qpipe.producer_acquire(q_it);
                qpipe.producer_expect(q_it, L::Q_BYTES);
#pragma unroll
                for (int w = 0; w < NC; ++w)
#pragma unroll
                    for (int p = 0; p < L::DP; ++p)
                        tma_load_4d(q_smem + qpipe.stage(q_it) * L::Q_BYTES + (w * L::DP + p) * PIECE, &mapQ,
                                    64 * p, sv.q_row + q0 + 64 * w, h, sv.b, qpipe.full(q_it).addr);
                ++q_it;
                // K or V tile j (keys [j * BC, j * BC + BC)) into its ring: a box of (64
                // head_dim, BC keys) a head_dim slice
                auto load_tile = [&](const Pipeline<STAGES>& pipe, unsigned ring, const TmaMap* map, int j) {
                    pipe.producer_acquire(kv);
                    pipe.producer_expect(kv, L::KV_BYTES);
                    const unsigned st = ring + pipe.stage(kv) * L::KV_BYTES;
#pragma unroll
                    for (int p = 0; p < L::DP; ++p)
                        tma_load_4d(st + p * L::KV_PIECE, map, 64 * p, sv.k_row + j * BC, hk, sv.b, pipe.full(kv).addr);
                };
                for (int j = j0; j < j0 + tiles; ++j, ++kv) {
                    load_tile(kpipe, k_ring, &mapK, j);
                    load_tile(vpipe, v_ring, &mapV, j);
                }
            }
        }
        __syncwarp();
        return;
    }

    // consumers: warpgroup 1 + w owns query rows q0 + [64 w, 64 w + 64) of a work tile
    setmaxnreg_inc<W::CONSUMER_REGS>();
    const WorkTiles<BR> work = work_tiles();
    const int w = warpgroup() - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const bool leader = threadIdx.x % WG == 0;
    Consumer<T, HD, BC, STAGES, BR> c;
    c.k_ring = k_ring;
    c.v_ring = v_ring;
    c.scale2 = scale * attn::LOG2E;
    if constexpr (CAPPED) {  // (the launcher sends softcap > 0)
        c.cap_in = __fdividef(2.f * attn::LOG2E * scale, softcap);  // (a division's slow path spills)
        c.cap_m2a = -2.f * attn::LOG2E * softcap;
    }

    // PINGPONG turns: a token goes round the consumers, named barrier TURN_BARRIER + w
    // meaning "warpgroup w may issue its wgmmas". Each issue passes it to w + 1 (mod NC); all
    // issue the same number of times a work tile (tiles + 1), so the token is back with
    // warpgroup 0 at the start of the next tile, whose first S = Q K^T may go to the tensor
    // cores while the others still finish the last P V and the epilogue of this one. The last
    // consumer puts the token in play before the block's first tile; warpgroup 0 takes it
    // back after the last, so every barrier phase is completed.
    auto my_turn = [&] {
        if constexpr (SCHED == PINGPONG) named_barrier_sync(TURN_BARRIER + w, 2 * WG);
    };
    auto your_turn = [&] {
        if constexpr (SCHED == PINGPONG) named_barrier_arrive(TURN_BARRIER + (NC == 2 ? 1 - w : (w + 1) % NC), 2 * WG);
    };
    bool token_in_play = false;
    auto join_turns = [&] {  // before the warpgroup's first turn in the block
        if (!token_in_play && w == NC - 1) your_turn();
        token_in_play = true;
    };

    // A work tile's output, O / l rounded to T (two columns a register) and the LSE of the
    // thread's two rows (a row that saw no key: zeros, LSE -inf), made from the running
    // state once the tile's last P V is done; stored by `store`. With the overlapped
    // schedules the stores wait until the next tile's first S = Q K^T is issued and go out
    // under it: the tensor cores are kept busy while the warpgroup stores, and the registers
    // the stores read are no wgmma's accumulators (ptxas would wait for the wgmma in flight
    // before reading those).
    struct Out {
        unsigned v[2][HD / 8];
        float lse[2];
        int q0, h, b, Sq, q_row;
        i64 lse_row;
        bool valid;
    } out;
    out.valid = false;
    // Row half hh's total weight l (its 4 lanes' partial sums added) and, from it, the
    // row's log-sum-exp (natural log; -inf for a row that saw no key). Both epilogues.
    auto row_total = [&](int hh) {
        float lt = c.l[hh];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        return lt;
    };
    auto row_lse = [&](int hh, float lt) { return lt > 0.f ? (c.m[hh] + log2f(lt)) * attn::LN2 : -CUOPS_INF; };
    auto finish = [&](int q0, int h, const SeqView& sv) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float lt = row_total(hh);
            const float inv = lt > 0.f ? __frcp_rn(lt) : 0.f;
#pragma unroll
            for (int cc = 0; cc < HD / 8; ++cc)
                out.v[hh][cc] = pack2<T>(c.o[4 * cc + 2 * hh] * inv, c.o[4 * cc + 2 * hh + 1] * inv);
            out.lse[hh] = row_lse(hh, lt);
        }
        out.q0 = q0;
        out.h = h;
        out.b = sv.b;
        out.Sq = sv.Sq;
        out.q_row = sv.q_row;
        out.lse_row = sv.lse_row;
        out.valid = true;
    };
    auto store = [&] {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int i = out.q0 + 64 * w + 16 * warp + lane / 4 + 8 * hh;
            if (i >= out.Sq) continue;
            T* orow = O + out.b * o_sb + static_cast<i64>(out.q_row + i) * o_ss + out.h * o_sh;
#pragma unroll
            for (int cc = 0; cc < HD / 8; ++cc)
                *reinterpret_cast<unsigned*>(orow + 8 * cc + 2 * (lane % 4)) = out.v[hh][cc];
            if (LSE != nullptr && lane % 4 == 0) LSE[out.lse_row + i] = out.lse[hh];
        }
        out.valid = false;
    };
    // The tensor-store epilogue (where a work tile has two Q buffers and the overlapped
    // schedules): a warpgroup writes its 64 rows of O / l, rounded to T, over its own rows
    // of the tile's Q buffer (the same 64 x 64 pieces in the 128-byte swizzle: its S = Q K^T
    // are all done), and its first thread stores them with tensor copies of O's map, which
    // clip the rows past the tensor. Direct stores (32 4-byte stores a thread, 8 rows x 16
    // bytes a warp instruction) took ~1800 cycles of a 64-row epilogue on an H100, and the
    // next tile's first softmax, whose shuffles share the memory-instruction queue with them,
    // ~1000 more (an instrumented kernel: NOTES). The Q buffer goes back to the producer
    // once the copies have read it (q_held: checked after the next tile's first S = Q K^T
    // is issued, by then long done). A packed sequence's last tile, whose rows run into the
    // next sequence's, stores directly.
    constexpr bool TMA_EPILOGUE = QSTAGES == 2 && SCHED != SERIAL;
    bool q_held = false;  // (TMA_EPILOGUE) the last tile's Q buffer awaits its stores' reads
    unsigned q_held_it = 0;
    auto give_back_q = [&] {
        if (q_held && leader) {
            bulk_wait_read<0>();
            qpipe.consumer_release(q_held_it);
        }
        q_held = false;
    };
    auto finish_tma = [&](int q0, int h, const SeqView& sv, unsigned q_it) {
        if (cu_q != nullptr && q0 + 64 * w + 64 > sv.Sq) {  // a packed sequence's last rows
            finish(q0, h, sv);
            store();
            if (leader) qpipe.consumer_release(q_it);
            return;
        }
        float inv[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float lt = row_total(hh);
            inv[hh] = lt > 0.f ? __frcp_rn(lt) : 0.f;
            const int i = q0 + 64 * w + 16 * warp + lane / 4 + 8 * hh;
            if (LSE != nullptr && lane % 4 == 0 && i < sv.Sq) LSE[sv.lse_row + i] = row_lse(hh, lt);
        }
        const unsigned buf = q_smem + qpipe.stage(q_it) * L::Q_BYTES + w * L::DP * PIECE;
        auto value = [&](int i, int hh, int) { return c.o[i] * inv[hh]; };
#pragma unroll
        for (int j = 0; j < HD / 8; ++j) stage_8_columns<T>(value, buf + (j / 8) * PIECE, j % 8, j);
        fence_proxy_async();  // (these writes before the tensor copies read them)
        named_barrier_sync(EPILOGUE_BARRIER + w, WG);
        if (leader) {
#pragma unroll
            for (int p = 0; p < L::DP; ++p)  // (head_dim 96: the columns past it are clipped)
                tma_store_4d(&mapO, buf + p * PIECE, 64 * p, sv.q_row + q0 + 64 * w, h, sv.b);
            bulk_commit();
        }
        q_held = true;
        q_held_it = q_it;
    };
    // A work tile's running state, from no key seen; j0: its first K/V tile.
    auto start = [&](int q0, const SeqView& sv, int j0) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int i = q0 + 64 * w + 16 * warp + lane / 4 + 8 * hh;
            c.lo[hh] = attn::first_key(i, win_left, sv.offset) - j0 * BC;
            c.hi[hh] = attn::key_end(i, sv.Skv, causal, sv.offset, win_right) - j0 * BC;
            c.m[hh] = -CUOPS_INF;
            c.l[hh] = 0.f;
        }
#pragma unroll
        for (int i = 0; i < L::DPAD / 2; ++i) c.o[i] = 0.f;
    };

    // The block's next work tile: WorkTiles::at's divisions took ~900 cycles at a tile's
    // start on an H100 (an instrumented kernel, NOTES), where the tensor cores wait for the
    // tile's first S = Q K^T; the overlapped schedules find it while that S = Q K^T runs.
    // Not where registers are tightest (three consumers, head_dim 256, soft caps): holding
    // the next tile across the loop spilled there, so those find each tile at its start.
    constexpr bool EARLY_NEXT = NC == 2 && HD <= 128 && !CAPPED;
    int nq0 = 0, nh = 0, nb = 0;
    auto find_next = [&](int t) {
        if (EARLY_NEXT && t < work.count() - static_cast<int>(gridDim.x)) work.at(t + gridDim.x, nq0, nh, nb);
    };
    if (EARLY_NEXT && blockIdx.x < work.count()) work.at(blockIdx.x, nq0, nh, nb);
    unsigned q_it = 0, kv = 0;
    for (int t = blockIdx.x; t < work.count(); t += gridDim.x) {
        int q0 = nq0, h = nh, b = nb;
        if constexpr (!EARLY_NEXT) work.at(t, q0, h, b);
        const SeqView sv = seq(b, h);
        int j0;
        const int tiles = kv_range<BC, BR>(q0, sv.Sq, sv.Skv, causal, sv.offset, win_left, win_right, j0);
        if (tiles == 0) {  // no key to see: zeros (none past the end of a packed sequence)
            find_next(t);
            if (out.valid) store();
            start(q0, sv, 0);
            finish(q0, h, sv);
            store();
            continue;
        }
        qpipe.consumer_wait(q_it);
        c.q_tile = q_smem + qpipe.stage(q_it) * L::Q_BYTES + w * L::DP * PIECE;
        start(q0, sv, j0);
        float s[BC / 2], alpha[2];
        unsigned pa[BC / 16][4];
        if constexpr (SCHED == SERIAL) {
            find_next(t);
            for (int j = 0; j < tiles; ++j) {
                kpipe.consumer_wait(kv + j);
                c.issue_s(s, kv + j);
                wgmma_wait<0>();
                fence_regs(s);
                if (leader) kpipe.consumer_release(kv + j);
                c.template softmax<CAPPED>(s, j, lane, alpha, WINDOWED && win_left >= 0);
                c.rescale(alpha);
                c.pack(pa, s);
                vpipe.consumer_wait(kv + j);
                c.issue_pv(pa, kv + j);
                c.wait_pv(pa);
                if (leader) vpipe.consumer_release(kv + j);
            }
            if (leader) qpipe.consumer_release(q_it);
            finish(q0, h, sv);
            store();
        } else if (q0 + 64 * w >= sv.Sq) {
            // Every row of this warpgroup is past the end of Q (the last tile of a tiling
            // of 192 rows can be two-thirds empty): no wgmma and no softmax; it only keeps
            // the protocol, taking its turns and releasing each stage after it was filled
            // (an earlier arrival could complete the stage's previous empty phase).
            find_next(t);
            join_turns();
            if (out.valid) store();
            if constexpr (TMA_EPILOGUE) give_back_q();
            for (int j = 0; j <= tiles; ++j) {
                if (j < tiles) kpipe.consumer_wait(kv + j);
                if (j > 0) vpipe.consumer_wait(kv + j - 1);
                my_turn();
                your_turn();
                if (leader && j < tiles) kpipe.consumer_release(kv + j);
                if (leader && j > 0) vpipe.consumer_release(kv + j - 1);
            }
            if (leader) qpipe.consumer_release(q_it);
        } else {
            join_turns();
            kpipe.consumer_wait(kv);
            my_turn();
            c.issue_s(s, kv);
            your_turn();
            if (out.valid) store();  // (the last tile's, under this one's first S = Q K^T)
            if constexpr (TMA_EPILOGUE) give_back_q();
            find_next(t);  // (under it too)
            wgmma_wait<0>();
            fence_regs(s);
            if (leader) kpipe.consumer_release(kv);
            // (O is still zero: alpha has nothing to scale)
            c.template softmax<CAPPED>(s, 0, lane, alpha, WINDOWED && win_left >= 0);
            c.pack(pa, s);
            for (int j = 1; j < tiles; ++j) {
                kpipe.consumer_wait(kv + j);
                my_turn();
                c.issue_s(s, kv + j);
                c.rescale(alpha);  // O of tiles < j - 1, to the max that P_{j-1} was made against
                vpipe.consumer_wait(kv + j - 1);
                c.issue_pv(pa, kv + j - 1);
                your_turn();
                wgmma_wait<1>();  // S_j has landed; P_{j-1} V_{j-1} may still run
                fence_regs(s);
                if (leader) kpipe.consumer_release(kv + j);
                c.template softmax<CAPPED>(s, j, lane, alpha, WINDOWED && win_left >= 0);
                schedule_after(c.l[0] + c.l[1]);  // (else the wait goes above the softmax)
                c.wait_pv(pa);
                if (leader) vpipe.consumer_release(kv + j - 1);
                c.pack(pa, s);
            }
            // every S = Q K^T of the tile is done: the producer may bring the next Q (with
            // the tensor-store epilogue, once the stores have read the buffer)
            if (!TMA_EPILOGUE && leader) qpipe.consumer_release(q_it);
            c.rescale(alpha);
            vpipe.consumer_wait(kv + tiles - 1);
            my_turn();
            c.issue_pv(pa, kv + tiles - 1);
            your_turn();
            c.wait_pv(pa);
            if (leader) vpipe.consumer_release(kv + tiles - 1);
            if constexpr (TMA_EPILOGUE)
                finish_tma(q0, h, sv, q_it);
            else
                finish(q0, h, sv);
        }
        ++q_it;
        kv += tiles;
    }
    if (out.valid) store();
    if constexpr (TMA_EPILOGUE) give_back_q();  // (and the block's last stores have read shared memory)
    if (token_in_play && w == 0) my_turn();  // the last consumer's last hand-over (PINGPONG)
}
