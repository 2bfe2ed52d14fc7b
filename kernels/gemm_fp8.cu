// gemm_fp8.cu: out = (A @ B) * scale_a * scale_b (+ bias) for float8 e4m3 operands on Hopper's
// warpgroup tensor-core instructions (sm_90a), float32 accumulation, out float16 / bfloat16 /
// float32 (cupyops/ops/fp8.py scaled_matmul, the semantics of torch._scaled_mm).
//
// Why a file of its own: 8-bit wgmma has no transpose immediates, so both operands must be
// K-major (A stored M x K, B stored N x K); a stage holds 128 K (128 bytes, the swizzle's
// row) instead of 64; the instruction is k32; and the epilogue applies scales and a bias
// instead of alpha / beta / C. The pipeline itself is gemm_wgmma_ws's (gemm_wgmma.cu).
//
// Kernels:
//   1. scaled_matmul_wgmma_ws<OutT, BN, STAGES>
//                               warp-specialised and persistent, as gemm_wgmma_ws: a
//                               producer warpgroup (one thread issuing tensor copies,
//                               registers given back with setmaxnreg) and two consumer
//                               warpgroups (64 rows each of a 128 x BN tile) around a
//                               full/empty mbarrier ring of STAGES stages of (128 + BN) x
//                               128 bytes; one block an SM walks the tiles in grouped
//                               order. Each stage (128 K), a consumer runs the 4 wgmmas of
//                               a part of its columns into a partial, waits for them and
//                               adds the partial into float32 accumulators: one part of
//                               BN columns for BN = 128 or 192, two m64n128k32 halves for
//                               BN = 256 (a whole m64n256 partial would need 128 + 128
//                               registers a thread).
//                               Why the promotion: the fp8 tensor cores keep only ~14 bits
//                               of their running sum (DeepSeek-V3 report, section 3.3.2:
//                               a relative error of up to ~2 % at K = 4096) when the whole
//                               K stays in the tensor core (what torch._scaled_mm
//                               calls use_fast_accum=True; its default is off); restarting
//                               the partial every 128 K bounds that to one stage's 4 steps.
//                               The cost: each part is waited for (wait_group 0) before
//                               the next is issued; the other consumer's wgmmas keep the
//                               tensor cores busy meanwhile, best when one part is a
//                               whole stage (BN <= 192).
//
// Operands: two 3-D tensor maps (cupyops/ops/_fp8_gemm.py; K innermost, then rows, then a
// batch of 1), 1-byte elements (CU_TENSOR_MAP_DATA_TYPE_UINT8), 128-byte swizzle, boxes of
// 128 K x 128 rows (A) and 128 K x BN rows (B). Edges (M, N, K not multiples of the tile)
// are zeros the copy engine fills in; the epilogue masks the rows and columns it writes.
// The launcher needs 16-byte aligned operands whose row strides are multiples of 16 bytes
// (so K % 16 == 0 for contiguous ones) and K > 0 (K == 0 never launches).
//
// Epilogue: D[m, n] = acc * (sa0 * scale_a[m * sa_step]) * (sb0 * scale_b[n * sb_step])
// + bias[n], rounded once to the output type. A null scale_a / scale_b leaves the scalar
// sa0 / sb0 alone (a Python float scale costs no device array); step 0 is a per-tensor
// scale held in device memory, step 1 one a row of A / column of B. bias_kind: 0 none,
// 1 float32, 2 the output type. Where D is 16-bit and a tensor map describes it, there is
// no bias and B has one scale (mapD, store_by_tma != 0), the outputs go out through shared
// memory and tensor stores (gemm_sm90.cuh store_tile_tma), which drain while the next
// tile's wgmmas run; otherwise by direct stores (per-column factors, loaded once for a
// thread's two rows there, would be loaded for every output in the staged layout and
// spill registers).
//
// Launch geometry: block 384 threads; grid (min(tiles, SMs), 1, 1) with tiles =
// cdiv(M, 128) * cdiv(N, BN); dynamic shared memory STAGES * (128 + BN) * 128 + 32 KB (the
// epilogue's staging) + 1 KB (ring alignment) + 16 * STAGES (mbarriers). group_rows: the
// tile rows of a group of the walk (gemm_sm90.cuh TileOrder; _fp8_gemm.GROUP_ROWS).
#include "gemm_sm90.cuh"

using namespace cuops;
using namespace cuops::sm90;

namespace gf8 {

constexpr int BM = 128;  // rows of a tile: 64 a consumer warpgroup
constexpr int BK = 128;  // K of a stage: 128 one-byte elements, the 128-byte swizzle's row
constexpr int KSTEP = 32;  // K of one wgmma
constexpr unsigned A_BYTES = BM * BK;
// 64 rows of 128 bytes: where a consumer's rows, or a part's B rows, start in a stage
constexpr unsigned PIECE_BYTES = 64 * BK;
static_assert(PIECE_BYTES == SwizzledTile16<false>::PIECE_BYTES,
              "a K-major 128-byte-swizzled piece is 64 rows of 128 bytes for any element size");

// A 128 x BN tile. A consumer's BN columns are computed as PARTS parts of PART_N columns,
// each into a partial of PART_N / 2 registers a thread: one part where the partial fits
// beside the BN / 2 accumulators (BN <= 192: 96 + 96 registers), two halves at BN = 256
// (128 + 64: a whole partial would need 256).
template <int BN> struct Tile {
    static_assert(BN == 128 || BN == 192 || BN == 256, "fp8 tiles: 128 x 128, 192 or 256");
    static constexpr int PART_N = BN == 256 ? 128 : BN, PARTS = BN / PART_N;
    static constexpr unsigned B_BYTES = BN * BK, STAGE_BYTES = A_BYTES + B_BYTES;
};

// One consumer warpgroup's share of a stage: its 64 rows of A against the BN rows of B.
// Each part: 4 k32 wgmmas into `part` (the first overwrites it), waited for, then added
// into acc[PART_N / 2 * h, ...), which is the m64nBN accumulator layout. The K-major
// descriptor of an 8-bit tile is the 16-bit one: a k32 step is 32 bytes, as a k16 step of
// 16-bit elements is.
template <int BN>
__device__ __forceinline__ void mma_stage(float (&acc)[BN / 2], float (&part)[Tile<BN>::PART_N / 2], unsigned st,
                                          int a_row) {
    constexpr int PART_N = Tile<BN>::PART_N;
    const unsigned a = st + (a_row / 64) * PIECE_BYTES;
#pragma unroll
    for (int h = 0; h < Tile<BN>::PARTS; ++h) {
        const unsigned b = st + A_BYTES + h * PART_N * BK;
        wgmma_fence();  // part was read by the previous promotion
#pragma unroll
        for (int k = 0; k < BK / KSTEP; ++k)
            wgmma_m64nNk32_e4m3<PART_N>(part, SwizzledTile16<false>::desc(a, k), SwizzledTile16<false>::desc(b, k),
                                        k > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(part);
#pragma unroll
        for (int i = 0; i < PART_N / 2; ++i) acc[PART_N / 2 * h + i] += part[i];
    }
}

// What the epilogue applies: D[m, n] = acc * row(m) * col(n) + add(n) (the header's formula).
template <typename OutT> struct Scales {
    int M, N;
    const float* scale_a;
    int sa_step;
    float sa0;
    const float* scale_b;
    int sb_step;
    float sb0;
    const void* bias;
    int bias_kind;

    __device__ __forceinline__ float row(int m) const {  // any m (past M: never stored)
        return scale_a != nullptr && m < M ? sa0 * __ldg(scale_a + static_cast<i64>(m) * sa_step) : sa0;
    }
    __device__ __forceinline__ float col(int n) const {  // n < N
        return scale_b != nullptr ? sb0 * __ldg(scale_b + static_cast<i64>(n) * sb_step) : sb0;
    }
    __device__ __forceinline__ float add(int n) const {  // n < N
        if (bias_kind == 0) return 0.f;
        if (bias_kind == 1) return __ldg(static_cast<const float*>(bias) + n);
        return to_f32(static_cast<const OutT*>(bias)[n]);
    }
};

// Two adjacent outputs as one 4-byte (16-bit types) or 8-byte (float32) store.
template <typename OutT> __device__ __forceinline__ void store_pair(OutT* p, float x0, float x1) {
    if constexpr (sizeof(OutT) == 4) *reinterpret_cast<float2*>(p) = make_float2(x0, x1);
    else *reinterpret_cast<unsigned*>(p) = pack2<OutT>(x0, x1);
}

// The epilogue of one consumer warpgroup by direct stores (float32 D, or a D no tensor map
// describes): its 64 x BN accumulators (rows from m_row, columns from n0) scaled, biased,
// rounded and stored, masked to M x N. A column's scale and bias are loaded once for the
// thread's two rows.
template <typename OutT, int BN>
__device__ __forceinline__ void store_tile(const float (&acc)[BN / 2], OutT* D, i64 ldd, const Scales<OutT>& sc,
                                           int m_row, int n0) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const int col = n0 + 2 * (lane % 4), M = sc.M, N = sc.N;
    int m[2];
    float ra[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        m[h] = m_row + 16 * warp + lane / 4 + 8 * h;
        ra[h] = sc.row(m[h]);
    }
    const bool pairs = ldd % 2 == 0 && reinterpret_cast<unsigned long long>(D) % (2 * sizeof(OutT)) == 0;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int n = col + 8 * j;
        if (n >= N) continue;
        const bool two = n + 1 < N;
        const float cb0 = sc.col(n), cb1 = two ? sc.col(n + 1) : 0.f;
        const float b0 = sc.add(n), b1 = two ? sc.add(n + 1) : 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (m[h] >= M) continue;
            const float x0 = fmaf(acc[4 * j + 2 * h] * ra[h], cb0, b0);
            const float x1 = fmaf(acc[4 * j + 2 * h + 1] * ra[h], cb1, b1);
            OutT* drow = D + static_cast<i64>(m[h]) * ldd;
            if (pairs && two) {
                store_pair<OutT>(drow + n, x0, x1);
            } else {
                drow[n] = from_f32<OutT>(x0);
                if (two) drow[n + 1] = from_f32<OutT>(x1);
            }
        }
    }
}

}  // namespace gf8

// ----------------------------------------------------------------- 1. scaled_matmul_wgmma_ws
// Registers: gemm_sm90.cuh's split; a consumer's 232 hold acc BN / 2 + the partial (96 + 96
// at BN = 192, 128 + 64 at 256) + addressing.

template <typename OutT, int BN, int STAGES>
__global__ void __launch_bounds__(WS_THREADS, 1)
    scaled_matmul_wgmma_ws(OutT* __restrict__ D, int M, int N, int K, i64 ldd, const float* __restrict__ scale_a,
                           int sa_step, float sa0, const float* __restrict__ scale_b, int sb_step, float sb0,
                           const void* __restrict__ bias, int bias_kind, const __grid_constant__ TmaMap mapA,
                           const __grid_constant__ TmaMap mapB, const __grid_constant__ TmaMap mapD,
                           int store_by_tma, int group_rows) {
    using namespace gf8;
    typedef Tile<BN> TL;
    extern __shared__ unsigned char smem_raw[];
    const unsigned ring = ring_base(smem_raw);
    const unsigned staging = ring + STAGES * TL::STAGE_BYTES;  // STAGING_BYTES a consumer warpgroup
    const Pipeline<STAGES> pipe{staging + 2 * STAGING_BYTES};
    if (threadIdx.x == 0) pipe.init(2);  // an empty phase: one arrival per consumer warpgroup
    __syncthreads();

    const TileOrder order{cdiv(M, BM), cdiv(N, BN), group_rows};  // (one product: every tile's z is 0)
    const int KT = cdiv(K, BK);
    const long long tiles = order.tiles();
    if (warpgroup() == 0) {  // producer
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            unsigned it = 0;
            for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
                const TileRef u = order.at(t);
                for (int kt = 0; kt < KT; ++kt, ++it) {
                    pipe.producer_acquire(it);
                    pipe.producer_expect(it, TL::STAGE_BYTES);
                    const unsigned st = ring + pipe.stage(it) * TL::STAGE_BYTES;
                    tma_load_3d(st, &mapA, kt * BK, u.tm * BM, 0, pipe.full(it).addr);
                    tma_load_3d(st + A_BYTES, &mapB, kt * BK, u.tn * BN, 0, pipe.full(it).addr);
                }
            }
        }
        __syncwarp();
    } else {  // consumers: warpgroup 1 computes rows 0-63 of the tile, warpgroup 2 rows 64-127
        setmaxnreg_inc<WS_CONSUMER_REGS>();
        const int a_row = 64 * (warpgroup() - 1);
        const bool leader = threadIdx.x % WG == 0;
        float acc[BN / 2], part[TL::PART_N / 2];
        unsigned it = 0;
        for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
            const TileRef u = order.at(t);
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
            for (int kt = 0; kt < KT; ++kt, ++it) {
                pipe.consumer_wait(it);
                mma_stage<BN>(acc, part, ring + pipe.stage(it) * TL::STAGE_BYTES, a_row);
                // both halves were waited for: nothing of this warpgroup reads the stage now
                if (leader) pipe.consumer_release(it);
            }
            // (made here from the parameters, not held in registers through the main loop)
            const Scales<OutT> sc{M, N, scale_a, sa_step, sa0, scale_b, sb_step, sb0, bias, bias_kind};
            const int m_row = u.tm * BM + a_row, n0 = u.tn * BN;
            bool stored = false;
            if constexpr (sizeof(OutT) == 2) {
                if (store_by_tma) {  // (the launcher's choice: a 16-bit D that a map describes,
                                     // no bias, one scale for all of B's columns)
                    const int r = 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4;
                    const float cb = sc.col(0), f[2] = {sc.row(m_row + r) * cb, sc.row(m_row + r + 8) * cb};
                    store_tile_tma<OutT, BN>([&](int i, int h, int) { return acc[i] * f[h]; }, &mapD,
                                             staging + (warpgroup() - 1) * STAGING_BYTES, m_row, n0, 0, warpgroup(),
                                             leader);
                    stored = true;
                }
            }
            if (!stored) store_tile<OutT, BN>(acc, D, ldd, sc, m_row, n0);
        }
        if (leader) bulk_wait_read<0>();  // the stores have read shared memory before the block ends
    }
}
