// gemm_sm90.cuh: what the sm_90a GEMM kernels (gemm_wgmma.cu, gemm_fp8.cu) share beyond the
// Hopper layer of sm90.cuh: the warpgroup's size, where the ring starts, the order in which
// a persistent grid walks its tiles, the epilogue of tensor stores, and the flags by which
// blocks hand partial tiles to each other (stream-K).
#pragma once
#include "sm90.cuh"

namespace cuops {
namespace sm90 {

constexpr int WG = 128;                // threads of a warpgroup
constexpr unsigned RING_ALIGN = 1024;  // the swizzle atom: stages start 1024-byte aligned
constexpr int GROUP_M = 8;             // tile rows that walk the tile columns together
// The warp-specialised kernels: a producer warpgroup and two consumer warpgroups, one block
// an SM. 384 threads start with 65536 / 384 = 170 registers (capped at 168); the producer
// gives back to 40 and the consumers take 232 (128 * 40 + 256 * 232 <= 65536).
constexpr int WS_THREADS = 3 * WG;
constexpr int WS_PRODUCER_REGS = 40;
constexpr int WS_CONSUMER_REGS = 232;

__device__ __forceinline__ int cdiv(int a, int b) { return (a + b - 1) / b; }

// The ring's start: the first 1024-byte boundary of the dynamic shared memory (the launchers
// ask for 1 KB more than the ring needs).
__device__ __forceinline__ unsigned ring_base(const void* smem) {
    return (smem_u32(smem) + RING_ALIGN - 1) & ~(RING_ALIGN - 1);
}

struct TileRef {
    int z, tm, tn;  // the product of the stack, the tile's row and column
};

// The tiles of a stack of products of TM x TN tiles each, in the order a grid walks them:
// product by product, and inside one in groups of GROUP_M tile rows, each group walked
// column by column, so the blocks resident at one time share B's columns and A's rows in
// L2.
struct TileOrder {
    int TM, TN;

    __device__ __forceinline__ long long tiles() const { return static_cast<long long>(TM) * TN; }
    __device__ __forceinline__ TileRef at(long long t) const {
        const long long n = tiles(), per_group = static_cast<long long>(GROUP_M) * TN;
        const int z = static_cast<int>(t / n);
        const long long u = t - z * n;
        const int first = static_cast<int>(u / per_group) * GROUP_M;
        const int rows = min(TM - first, GROUP_M);
        const int r = static_cast<int>(u % per_group);
        return {z, first + r % rows, r / rows};
    }
};

// The staging buffer of a consumer warpgroup's tensor-store epilogue: 64 rows x 128 columns
// of a 16-bit type, as two 64 x 64 boxes in the 128-byte swizzle.
constexpr unsigned STAGING_BYTES = 64 * 128 * 2;

// Writes the 8-column block j of a warpgroup's 64 x N outputs (value(i, h, c): accumulator
// i, the m64nN layout) into the staging box at `box` (64 x 64, 128-byte swizzle) as that
// box's 8-column block `col8`: chunk col8 of row r sits at chunk col8 ^ (r % 8), so a
// warp's 4-byte writes (8 rows x 4 column pairs) land in 32 distinct banks.
template <typename T, typename Value>
__device__ __forceinline__ void stage_8_columns(const Value& value, unsigned box, int col8, int j) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + lane / 4 + 8 * h, c = 8 * j + 2 * (lane % 4);
        const unsigned addr = box + r * 128u + ((col8 ^ (r % 8)) << 4) + (lane % 4) * 4u;
        const unsigned v = pack2<T>(value(4 * j + 2 * h, h, c), value(4 * j + 2 * h + 1, h, c + 1));
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
    }
}

// The epilogue of one warpgroup through shared memory and tensor stores, for a 16-bit D
// described by tensor map `mapD` (boxes of 64 x 64): its 64 x BN outputs, value(i, h, c)
// for accumulator i (the m64nN layout: row 16 * warp + lane / 4 + 8 * h, column c of the
// tile), go out in parts of (at most) 128 columns, each staged in the 128-byte swizzle at
// `buf` (STAGING_BYTES, by stage_8_columns) and stored by the warpgroup's first thread.
// The copy engine clips what lies past D's extent, so edges need no
// masks. The stores run on while the warpgroup goes on to its next tile; only the staging
// buffer waits for them to have read it. `bar_id`: this warpgroup's named barrier.
template <typename T, int BN, typename Value>
__device__ __forceinline__ void store_tile_tma(const Value& value, const TmaMap* mapD, unsigned buf, int m_row,
                                               int n0, int z, int bar_id, bool leader) {
    static_assert(sizeof(T) == 2 && BN % 64 == 0, "tensor-store epilogue: 16-bit D, whole 64-column boxes");
    constexpr int BOXES = BN / 64;
#pragma unroll
    for (int half = 0; half < (BOXES + 1) / 2; ++half) {
        const int boxes = min(2, BOXES - 2 * half);  // (compile-time after unrolling)
        if (leader) bulk_wait_read<0>();  // the previous stores from buf have read it
        named_barrier_sync(bar_id, WG);
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) {
            if (jj >= 8 * boxes) break;
            // (the 8-column block 16 * half + jj of the accumulators)
            stage_8_columns<T>(value, buf + (jj / 8) * 8192u, jj % 8, 16 * half + jj);
        }
        fence_proxy_async();  // these generic-proxy writes before the tensor store reads them
        named_barrier_sync(bar_id, WG);
        if (leader) {
            tma_store_3d(mapD, buf, n0 + 128 * half, m_row, z);
            if (boxes == 2) tma_store_3d(mapD, buf + 8192u, n0 + 128 * half + 64, m_row, z);
            bulk_commit();
        }
    }
}

// ------------------------------------------------------------- flags between blocks
// A stream-K GEMM hands partial tiles from block to block through global memory: the
// writer's warpgroup stores its partial, synchronises, and its first thread publishes a
// flag with release semantics at GPU scope (after a fence, so that the other threads'
// stores, ordered before it by the barrier, are covered); the reader's first thread spins
// on the flag with acquire semantics, then synchronises its warpgroup before anyone reads.
__device__ __forceinline__ void flag_publish(int* flag, int value) {
    __threadfence();
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}
__device__ __forceinline__ int flag_read(const int* flag) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    return v;
}

}  // namespace sm90
}  // namespace cuops
