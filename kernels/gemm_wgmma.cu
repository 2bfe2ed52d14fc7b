// gemm_wgmma.cu: D = alpha * op(A) @ op(B) + beta * C on Hopper's warpgroup tensor-core
// instructions (sm_90a), under the contract of gemm_common.cuh, for float16 / bfloat16 with
// float32 accumulation.
//
// Why a new family: mma.sync (gemm_mma.cu) brings every operand through registers with
// ldmatrix, and on an H100 keeps the tensor pipe ~75 % busy (NOTES 39): 0.6x of cuBLAS.
// wgmma reads both operands straight from shared memory, one instruction per warpgroup
// (4 warps) computing a 64 x 256 x 16 step, and runs asynchronously: the issuing warps are
// free while it runs. The tensor copy engine (TMA) fills shared memory with no thread
// doing address arithmetic. The rungs:
//   1. gemm_wgmma     one warpgroup, a 64 x 256 block tile, a ring of STAGES stages filled
//                     by tensor copies (one thread issues them; an mbarrier a stage says
//                     they landed), one m64n256k16 wgmma per 16 K. Every k-tile waits for
//                     its own wgmmas (wait_group 0) and a block barrier before the stage is
//                     refilled: the first Hopper step, simple and still serial.
//   2. gemm_wgmma_ws  warp-specialised and persistent: a producer warpgroup (one thread
//                     issuing tensor copies, registers given back with setmaxnreg) and two
//                     consumer warpgroups (64 rows each of a 128 x BN tile, registers taken)
//                     around a full/empty mbarrier ring (sm90.cuh Pipeline); a consumer
//                     keeps one group of wgmmas in flight and releases a stage as soon as the
//                     wgmmas that read it are done; one block an SM walks the tiles in
//                     grouped order (`group_rows` tile rows share their B columns in L2,
//                     groups in serpentine order: gemm_sm90.cuh TileOrder), so the
//                     producer fills the next tile's stages during this tile's epilogue.
//                     With beta == 0 the epilogue goes through shared memory and tensor
//                     stores, which drain while the next tile's wgmmas run. BN = 256, or
//                     192 / 128 where the wide tiles would leave SMs idle; CLUSTER = 2 pairs
//                     blocks on tiles stacked along M that multicast halves of their B (the
//                     ring's first fills copy B whole into each block, so that no copy waits
//                     for the cluster's barrier). BN = 176 (pairs, a K-major B only: an
//                     N-major B moves in 64-column pieces) cuts N = 28672 into 163 tile
//                     columns, so a 512-row product makes 4.94 waves of 132 blocks where
//                     128-column pairs make 6.8 (cuBLAS's 176 x 128 tile there).
//   3. gemm_wgmma_ws_sk  the same with stream-K for the tiles past the last whole wave:
//                     their k-tiles cut into one range a block, partial tiles handed from
//                     block to block through a workspace and added in a fixed order.
//
// Operands: the launcher (cupyops/ops/_gemm_wgmma.py) describes A and B by 3-D tensor maps
// (elements innermost, then rows, then the batch) with 128-byte swizzle. A K-contiguous
// operand (A stored M x K, B stored N x K) is copied as one box of 64 K x rows; an M/N-
// contiguous one (A stored K x M, B stored K x N) as boxes of 64 M/N x 64 K, and wgmma
// reads it through its transpose immediate. Edges (M, N, K not multiples of the tile) are
// zeros the copy engine fills in past the tensor's extent; the epilogue masks the rows and
// columns it writes. The launcher runs these kernels only where the operands are 16-byte
// aligned with row and batch strides that are multiples of 16 bytes (what a tensor map
// can describe), and K > 0 (with no k-tile the consumers would release a stage they never
// took); other problems, K == 0 among them, run gemm_mma or the naive rung.
//
// Launch geometry (cupyops/ops/_gemm_wgmma.py computes it):
//   gemm_wgmma<T, TA, TB, STAGES>: block 128; grid (cdiv(M, 64) * cdiv(N, 256), 1, batch');
//       dynamic shared memory STAGES * 40 KB + 1 KB (ring alignment) + 16 * STAGES.
//   gemm_wgmma_ws<T, TA, TB, BN, STAGES, CLUSTER>: block 384, clusters of CLUSTER blocks along x
//       (given at launch, cuLaunchKernelEx: a kernel compiled with __cluster_dims__(1, 1, 1)
//       ran 8-9 % slower than with none, so the size is not fixed in the kernel);
//       grid (CLUSTER * min(units * batch, clusters that fit at once), 1, 1) with units =
//       cdiv(M, 128 * CLUSTER) * cdiv(N, BN); shared memory STAGES * (128 + BN) * 128 +
//       32 KB (the epilogue's staging) + 1 KB + 16 * STAGES. mapD describes D for the epilogue's tensor
//       stores (store_by_tma != 0, where beta == 0 and a map fits D; else direct stores), in
//       boxes of 64 rows x store_box_cols<BN>() columns; group_rows: the tile rows of a group
//       of the walk (_gemm_wgmma.GROUP_ROWS).
//   gemm_wgmma_ws_sk<T, TA, TB, BN, STAGES>: as gemm_wgmma_ws with CLUSTER = 1; grid
//       the SMs where whole waves run, else the blocks that share the tiles' k-tiles
//       (_gemm_wgmma.streamk_plan); `work`: the flags (zeroed) and a partial tile a block.
//   batch' = min(batch, 65535); gemm_wgmma loops z over the rest of the stack.
#include "gemm_common.cuh"
#include "gemm_sm90.cuh"

using namespace cuops;
using namespace cuops::sm90;

namespace gwg {

constexpr int BK = 64;  // K of a stage: 128 bytes of a 16-bit type, the swizzle's row

// One stage of the ring: BM rows of A then BN rows of B, each 64 K wide, in the layout of
// sm90::SwizzledTile16. MN_A: A is M-major (TA); MN_B: B is N-major (!TB). A warpgroup
// computes 64 x BN with one m64nBNk16 wgmma per 16 K.
template <bool TA, bool TB, int BM, int BN> struct Stage {
    static constexpr bool MN_A = TA, MN_B = !TB;
    static_assert(!MN_B || BN % 64 == 0, "an N-major B moves in 64-column pieces: BN = 176 needs a K-major B");
    static constexpr unsigned A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, BYTES = A_BYTES + B_BYTES;

    // The copies of one operand: rows [r0, r0 + ROWS) and K [k0, k0 + 64) of batch entry z,
    // into this block's stage (MASK == 0) or multicast to the blocks of the cluster in MASK.
    template <bool MN, int ROWS, unsigned short MASK = 0>
    __device__ __forceinline__ static void load_operand(unsigned dst, const TmaMap* map, int k0, int r0, int z,
                                                        unsigned bar) {
        if constexpr (MN) {
#pragma unroll
            for (int p = 0; p < ROWS / 64; ++p) {
                const unsigned d = dst + p * SwizzledTile16<true>::PIECE_BYTES;
                if constexpr (MASK) tma_load_3d_multicast(d, map, r0 + 64 * p, k0, z, bar, MASK);
                else tma_load_3d(d, map, r0 + 64 * p, k0, z, bar);
            }
        } else {
            if constexpr (MASK) tma_load_3d_multicast(dst, map, k0, r0, z, bar, MASK);
            else tma_load_3d(dst, map, k0, r0, z, bar);
        }
    }
    // One thread: the copies of k-tile kt of tile (m0, n0) into the stage at `st`,
    // completing on barrier `bar` (whose expected bytes are BYTES). In a cluster of
    // CLUSTER blocks that share the tile's columns (tiles of consecutive rows), block
    // `rank` copies its A and 1/CLUSTER of B, multicast to all: every block's stage
    // receives the whole B, and B is read from L2 once for the cluster.
    // ALONE: every share of B copied into this block only (B's map still has boxes of one
    // share's rows), for fills made before the cluster's barriers are known to exist.
    template <int CLUSTER = 1, bool ALONE = false>
    __device__ __forceinline__ static void load(unsigned st, const TmaMap* ma, const TmaMap* mb, int kt, int m0,
                                                int n0, int za, int zb, unsigned bar, int rank = 0) {
        load_operand<MN_A, BM>(st, ma, kt * BK, m0, za, bar);
        constexpr int PART = BN / CLUSTER;  // rows of B this block copies
        // (a share starts on a swizzle atom: 8 rows of a K-major B, a 64-row piece of an N-major one)
        static_assert(PART % (MN_B ? 64 : 8) == 0, "a multicast share of B is whole swizzle atoms");
        constexpr unsigned short ALL = CLUSTER == 1 || ALONE ? 0 : (1u << CLUSTER) - 1;  // (0: no multicast)
#pragma unroll
        for (int r = ALONE ? 0 : rank; r < (ALONE ? CLUSTER : rank + 1); ++r)
            load_operand<MN_B, PART, ALL>(st + A_BYTES + r * PART * BK * 2, mb, kt * BK, n0 + r * PART, zb, bar);
    }
    // The wgmmas of one warpgroup over the stage at `st`: rows [a_row, a_row + 64) of the A
    // tile against the whole B tile, 4 steps of 16 K. accumulate false: the first k-tile
    // of a tile overwrites the accumulators.
    template <typename T>
    __device__ __forceinline__ static void mma(float (&acc)[BN / 2], unsigned st, int a_row, bool accumulate) {
        const unsigned a = st + (a_row / 64) * SwizzledTile16<MN_A>::PIECE_BYTES;
#pragma unroll
        for (int k16 = 0; k16 < BK / 16; ++k16)
            wgmma_m64nNk16<BN, T, MN_A, MN_B>(acc, SwizzledTile16<MN_A>::desc(a, k16),
                                              SwizzledTile16<MN_B>::desc(st + A_BYTES, k16), accumulate || k16 > 0);
    }
};

// The epilogue of one warpgroup: its 64 x BN accumulators (rows from m_row, columns from
// n0; the layout of sm90.cuh) to D = alpha * acc + beta * C, masked to M x N. Two adjacent
// columns go out as one 4-byte store where D's rows allow it.
template <typename T, int BN>
__device__ __forceinline__ void store_tile(const float (&acc)[BN / 2], const T* C, T* D, int M, int N, i64 ldc,
                                           i64 ldd, float alpha, float beta, int m_row, int n0) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const int col = n0 + 2 * (lane % 4);
    const bool pairs = ldd % 2 == 0 && reinterpret_cast<unsigned long long>(D) % 4 == 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int m = m_row + 16 * warp + lane / 4 + 8 * h;
        if (m >= M) continue;
        T* drow = D + static_cast<i64>(m) * ldd;
        const T* crow = C + static_cast<i64>(m) * ldc;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int n = col + 8 * j;
            const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
            if (pairs && n + 1 < N) {
                float x0 = alpha * v0, x1 = alpha * v1;
                if (beta != 0.f) {
                    x0 = fmaf(beta, to_f32(crow[n]), x0);
                    x1 = fmaf(beta, to_f32(crow[n + 1]), x1);
                }
                *reinterpret_cast<unsigned*>(drow + n) = pack2<T>(x0, x1);
            } else {
                if (n < N) drow[n] = gemm_epilogue<T>(v0, crow + n, alpha, beta);
                if (n + 1 < N) drow[n + 1] = gemm_epilogue<T>(v1, crow + n + 1, alpha, beta);
            }
        }
    }
}


}  // namespace gwg

// ---------------------------------------------------------------------------- 1. gemm_wgmma
template <typename T, bool TA, bool TB, int STAGES>
__global__ void __launch_bounds__(WG, 1)
    gemm_wgmma(GEMM_PARAMS(T), const __grid_constant__ TmaMap mapA, const __grid_constant__ TmaMap mapB) {
    using namespace gwg;
    constexpr int BN = 256;
    typedef Stage<TA, TB, 64, BN> S;
    static_assert(sizeof(T) == 2, "wgmma rungs: float16 and bfloat16");
    extern __shared__ unsigned char smem_raw[];
    const unsigned ring = ring_base(smem_raw);
    const Pipeline<STAGES> pipe{ring + STAGES * S::BYTES};  // (its empty barriers are unused here)
    if (threadIdx.x == 0) pipe.init(1);
    __syncthreads();

    const TileOrder order{cdiv(M, 64), cdiv(N, BN), GROUP_M};
    const int KT = cdiv(K, BK);
    float acc[128];
    unsigned it = 0;  // k-tiles this block has consumed: the ring position of the next one
    for (int z = blockIdx.z; z < batch; z += gridDim.z) {
        const int za = sA ? z : 0, zb = sB ? z : 0;
        for (int t = blockIdx.x; t < order.tiles(); t += gridDim.x) {
            const TileRef tile = order.at(t);  // (one product's tiles: tile.z is 0)
            const int m0 = tile.tm * 64, n0 = tile.tn * BN;
            if (threadIdx.x == 0) {
                for (int kt = 0; kt < min(STAGES, KT); ++kt) {
                    pipe.producer_expect(it + kt, S::BYTES);
                    S::load(ring + pipe.stage(it + kt) * S::BYTES, &mapA, &mapB, kt, m0, n0, za, zb,
                            pipe.full(it + kt).addr);
                }
            }
            for (int kt = 0; kt < KT; ++kt, ++it) {
                pipe.consumer_wait(it);
                wgmma_fence();
                S::template mma<T>(acc, ring + pipe.stage(it) * S::BYTES, 0, kt > 0);
                wgmma_commit();
                wgmma_wait<0>();
                __syncthreads();  // every warp's wgmmas on this stage are done: refill it
                if (threadIdx.x == 0 && kt + STAGES < KT) {
                    pipe.producer_expect(it + STAGES, S::BYTES);
                    S::load(ring + pipe.stage(it) * S::BYTES, &mapA, &mapB, kt + STAGES, m0, n0, za, zb,
                            pipe.full(it + STAGES).addr);
                }
            }
            fence_regs(acc);
            store_tile<T, BN>(acc, C + z * sC, D + z * sD, M, N, ldc, ldd, alpha, beta, m0, n0);
        }
    }
}

// ------------------------------------------------------------------------- 2. gemm_wgmma_ws
// (registers: gemm_sm90.cuh's producer / consumer split)

namespace gwg {

// The work of a persistent grid: tiles [0, dp) whole, in the grouped order, the grid's
// blocks (clusters) taking every step-th from `first`; with stream-K, the k-tiles of the
// remaining tiles [dp, total) laid end to end tile by tile and cut into sk_blocks equal
// ranges, block b < sk_blocks taking range b. A tile whose k-tiles fall in several ranges
// is finished (its partials added, its epilogue run) by the block holding its last k-tile;
// the others hand it their float32 partials through global memory.
struct Schedule {
    long long total, dp;
    int KT, sk_blocks;

    __device__ __forceinline__ long long sk_start(int b) const { return (total - dp) * KT * b / sk_blocks; }

    // f(t, k0, k1) for each piece of this block's work: k-tiles [k0, k1) of tile t. A
    // stream-K range is walked from its last piece to its first: the last is the head of a
    // tile that a later block finishes (handed over first, so that block need not wait), the
    // first the tail of a tile whose head earlier blocks hold (finished last, when they have
    // handed theirs over). A block waits only for blocks of lower index, so a grid whose
    // blocks start in index order cannot deadlock even if not all are resident at once.
    template <bool SK, typename F>
    __device__ __forceinline__ void walk(long long first, long long step, int b, F&& f) const {
        for (long long t = first; t < dp; t += step) f(t, 0, KT);
        if constexpr (SK) {
            if (b >= sk_blocks) return;
            const long long s = sk_start(b);
            for (long long u = sk_start(b + 1); u > s;) {
                const long long j = (u - 1) / KT, seg = max(s, j * KT);
                f(dp + j, static_cast<int>(seg - j * KT), static_cast<int>(u - j * KT));
                u = seg;
            }
        }
    }
};

// The stream-K workspace: 2 flags a block (one a consumer warpgroup: its partial is
// there), padded to 256 bytes, then a partial a block: its two warpgroups' 64 x BN float32
// accumulators, float4 q of thread x of warpgroup g at float4 ((2 b + g) * BN / 8 + q) * 128
// + x (every access a coalesced 2 KB row). The launcher sizes it and zeroes the flags.
__device__ __forceinline__ int sk_flag_words(int sk_blocks) { return (2 * sk_blocks + 63) / 64 * 64; }

template <int BN>
__device__ __forceinline__ float4* sk_partial(int* work, int sk_blocks, int b, int g) {
    return reinterpret_cast<float4*>(work + sk_flag_words(sk_blocks)) + (2ll * b + g) * (BN / 8) * WG +
           threadIdx.x % WG;
}

template <typename T, bool TA, bool TB, int BN, int STAGES, int CLUSTER, bool SK>
__device__ __forceinline__ void wgmma_ws_body(GEMM_PARAMS(T), const TmaMap& mapA, const TmaMap& mapB,
                                              const TmaMap& mapD, int store_by_tma, int group_rows, int* work,
                                              long long dp_tiles, int sk_blocks) {
    typedef Stage<TA, TB, 128, BN> S;
    static_assert(sizeof(T) == 2, "wgmma rungs: float16 and bfloat16");
    static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of 1 or 2 blocks along M");
    static_assert(!SK || CLUSTER == 1, "stream-K: single blocks");
    extern __shared__ unsigned char smem_raw[];
    const unsigned ring = ring_base(smem_raw);
    const unsigned staging = ring + STAGES * S::BYTES;  // 16 KB a consumer warpgroup
    const Pipeline<STAGES> pipe{staging + 2 * STAGING_BYTES};
    // An empty phase: one arrival per consumer warpgroup of every block that writes into
    // this block's stages (the cluster's, through the multicast of B).
    if (threadIdx.x == 0) pipe.init(2 * CLUSTER);
    __syncthreads();
    // Every block's barriers exist before any multicast: each thread arrives on the cluster
    // barrier here and waits for it only before it first touches another block (NOTES 122):
    // the producer before its first multicast, the consumers before their first release.
    // A relaxed arrival: pipe.init's fence.mbarrier_init is what releases the inits to the
    // cluster (an arrival with release semantics, a fence of every prior write, took ~1k
    // cycles of each block's start on an H100).
    if constexpr (CLUSTER > 1) cluster_arrive_relaxed();

    // The cluster walks units of CLUSTER tiles stacked along M (rank r takes the r-th): a
    // unit's tiles share their B columns. (A tile row past M, when TM is odd, is copied as
    // zeros and not stored: its block still copies its share of B.)
    const int rank = CLUSTER > 1 ? static_cast<int>(cluster_rank()) : 0;
    const TileOrder order{cdiv(M, 128 * CLUSTER), cdiv(N, BN), group_rows};
    const int KT = cdiv(K, BK);
    const long long total = order.tiles() * batch;
    const Schedule sched{total, SK ? dp_tiles : total, KT, sk_blocks};
    const long long first = blockIdx.x / CLUSTER, step = gridDim.x / CLUSTER;
    const int b = static_cast<int>(blockIdx.x);
    if (warpgroup() == 0) {  // producer
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            unsigned it = 0;
            sched.template walk<SK>(first, step, b, [&](long long t, int k0, int k1) {
                const TileRef u = order.at(t);
                for (int kt = k0; kt < k1; ++kt, ++it) {
                    pipe.producer_acquire(it);
                    pipe.producer_expect(it, S::BYTES);
                    const unsigned st = ring + pipe.stage(it) * S::BYTES;
                    const int m0 = (u.tm * CLUSTER + rank) * 128, za = sA ? u.z : 0, zb = sB ? u.z : 0;
                    if (CLUSTER > 1 && it < STAGES) {  // the ring's first fills: B copied whole, unicast
                        S::template load<CLUSTER, true>(st, &mapA, &mapB, kt, m0, u.tn * BN, za, zb,
                                                        pipe.full(it).addr);
                    } else {
                        if (CLUSTER > 1 && it == STAGES) cluster_wait_thread();
                        S::template load<CLUSTER>(st, &mapA, &mapB, kt, m0, u.tn * BN, za, zb, pipe.full(it).addr,
                                                  rank);
                    }
                }
            });
            if constexpr (CLUSTER > 1) {
                if (it <= STAGES) cluster_wait_thread();
                // No block may leave while the other's consumers can still arrive on its
                // empty barriers: the producer waits until every stage's last fill has been
                // released by all of them (acquiring the next STAGES positions, which it
                // never fills). Incoming multicasts are all done by then too, as this block's
                // consumers waited for every fill. (This replaces a closing cluster barrier,
                // whose arrival with release semantics took ~1k cycles of a block's end.)
                for (unsigned j = it; j < it + STAGES; ++j) pipe.producer_acquire(j);
            }
        } else if (CLUSTER > 1) {
            cluster_wait_thread();
        }
        __syncwarp();
    } else {  // consumers: warpgroup 1 computes rows 0-63 of the tile, warpgroup 2 rows 64-127
        setmaxnreg_inc<WS_CONSUMER_REGS>();
        if constexpr (CLUSTER > 1) cluster_wait();  // (long before the first stage lands)
        const int a_row = 64 * (warpgroup() - 1);
        const bool leader = threadIdx.x % WG == 0;
        float acc[BN / 2];
        unsigned it = 0;
        sched.template walk<SK>(first, step, b, [&](long long t, int k0, int k1) {
            const TileRef u = order.at(t);
            for (int kt = k0; kt < k1; ++kt, ++it) {
                pipe.consumer_wait(it);
                wgmma_fence();
                S::template mma<T>(acc, ring + pipe.stage(it) * S::BYTES, a_row, kt > k0);
                wgmma_commit();
                // The previous k-tile's group is done (this one may still run): its stage
                // goes back to the producer(s).
                wgmma_wait<1>();
                if (kt > k0 && leader) pipe.template consumer_release<CLUSTER>(it - 1);
            }
            wgmma_wait<0>();
            if (leader) pipe.template consumer_release<CLUSTER>(it - 1);
            fence_regs(acc);
            if constexpr (SK) {
                const int g = warpgroup() - 1;
                if (k1 < KT) {  // the head of a tile that a later block finishes: hand it over
                    float4* dst = sk_partial<BN>(work, sk_blocks, b, g);
#pragma unroll
                    for (int q = 0; q < BN / 8; ++q)
                        __stcg(dst + q * WG, make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
                    named_barrier_sync(warpgroup(), WG);
                    if (leader) flag_publish(work + 2 * b + g, 1);
                    return;
                }
                if (k0 > 0) {  // the tail: add the heads, from the blocks before, in that order
                    const long long unit0 = (t - sched.dp) * KT;  // the tile's first k-tile's unit
                    for (int p = b - 1;; --p) {
                        if (leader)
                            while (flag_read(work + 2 * p + g) == 0) {
                            }
                        named_barrier_sync(warpgroup(), WG);
                        const float4* src = sk_partial<BN>(work, sk_blocks, p, g);
#pragma unroll
                        for (int q = 0; q < BN / 8; ++q) {
                            const float4 v = __ldcg(src + q * WG);
                            acc[4 * q] += v.x;
                            acc[4 * q + 1] += v.y;
                            acc[4 * q + 2] += v.z;
                            acc[4 * q + 3] += v.w;
                        }
                        if (sched.sk_start(p) <= unit0) break;
                    }
                }
            }
            const int m_row = (u.tm * CLUSTER + rank) * 128 + a_row;
            if (store_by_tma)  // (the launcher's choice: beta == 0 and a map of D)
                store_tile_tma<T, BN>([&](int i, int, int) { return alpha * acc[i]; }, &mapD,
                                      staging + (warpgroup() - 1) * STAGING_BYTES, m_row, u.tn * BN, sD ? u.z : 0,
                                      warpgroup(), leader);
            else
                store_tile<T, BN>(acc, C + u.z * sC, D + u.z * sD, M, N, ldc, ldd, alpha, beta, m_row, u.tn * BN);
        });
        if (leader) bulk_wait_read<0>();  // the stores have read shared memory before the block ends
    }
}

}  // namespace gwg

#define GWG_ARGS A, B, C, D, M, N, K, lda, ldb, ldc, ldd, sA, sB, sC, sD, batch, alpha, beta

template <typename T, bool TA, bool TB, int BN, int STAGES, int CLUSTER>
__global__ void __launch_bounds__(WS_THREADS, 1)
    gemm_wgmma_ws(GEMM_PARAMS(T), const __grid_constant__ TmaMap mapA, const __grid_constant__ TmaMap mapB,
                  const __grid_constant__ TmaMap mapD, int store_by_tma, int group_rows) {
    gwg::wgmma_ws_body<T, TA, TB, BN, STAGES, CLUSTER, false>(GWG_ARGS, mapA, mapB, mapD, store_by_tma, group_rows,
                                                              nullptr, 0, 0);
}

// gemm_wgmma_ws with the tiles past the last whole wave shared along K by every block
// (stream-K): `work` the workspace of gwg::sk_partial with its flags zeroed, `dp_tiles`
// the tiles walked whole, `sk_blocks` (<= the grid, >= 1 where tiles remain) the blocks
// that share the rest.
template <typename T, bool TA, bool TB, int BN, int STAGES>
__global__ void __launch_bounds__(WS_THREADS, 1)
    gemm_wgmma_ws_sk(GEMM_PARAMS(T), const __grid_constant__ TmaMap mapA, const __grid_constant__ TmaMap mapB,
                     const __grid_constant__ TmaMap mapD, int store_by_tma, int group_rows, int* work,
                     long long dp_tiles, int sk_blocks) {
    gwg::wgmma_ws_body<T, TA, TB, BN, STAGES, 1, true>(GWG_ARGS, mapA, mapB, mapD, store_by_tma, group_rows, work,
                                                       dp_tiles, sk_blocks);
}
#undef GWG_ARGS
