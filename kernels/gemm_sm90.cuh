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
constexpr int GROUP_M = 8;             // tile rows that walk the tile columns together (gemm_wgmma)
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
// product by product, and inside one in groups of `group` tile rows, each group walked
// column by column, so that the blocks resident at one time share B's columns and A's rows
// in L2; the groups in turn walk their columns left to right and right to left
// (serpentine), so that a group's first tiles read the B columns that the previous
// group's last tiles left in L2. (The warp-specialised launchers pass `group`:
// _gemm_wgmma.GROUP_ROWS, _fp8_gemm.GROUP_ROWS; NOTES 132.)
struct TileOrder {
    int TM, TN, group;

    __device__ __forceinline__ long long tiles() const { return static_cast<long long>(TM) * TN; }
    __device__ __forceinline__ TileRef at(long long t) const {
        const long long n = tiles(), per_group = static_cast<long long>(group) * TN;
        const int z = static_cast<int>(t / n);
        const long long u = t - z * n;
        const int g = static_cast<int>(u / per_group), first = g * group;
        const int rows = min(TM - first, group);
        const int r = static_cast<int>(u % per_group), col = r / rows;
        return {z, first + r % rows, g % 2 ? TN - 1 - col : col};
    }
};

// The staging buffer of a consumer warpgroup's tensor-store epilogue: 64 rows x 128 columns
// of a 16-bit type, as boxes of 64 rows in the swizzle of their width.
constexpr unsigned STAGING_BYTES = 64 * 128 * 2;

// Writes the 8-column block j of a warpgroup's 64 x N outputs (value(i, h, c): accumulator
// i, the m64nN layout) into the staging box at `box` (64 rows of BOX_COLS columns, in the
// swizzle of the row's width: 128 bytes for 64 columns, 32 bytes for 16) as that box's
// 8-column block `col8`. The swizzle XORs the 16-byte chunk with address bits [7, 10)
// (the mask: chunks a row less one): chunk col8 of row r sits at col8 ^ (r % 8) in 128-byte
// rows, col8 ^ (r / 4 % 2) in 32-byte rows, and either way a warp's 4-byte writes (8 rows x
// 4 column pairs) land in 32 distinct banks.
template <typename T, int BOX_COLS = 64, typename Value>
__device__ __forceinline__ void stage_8_columns(const Value& value, unsigned box, int col8, int j) {
    static_assert(BOX_COLS == 64 || BOX_COLS == 32 || BOX_COLS == 16, "staging boxes of 16, 32 or 64 columns");
    constexpr unsigned ROW_BYTES = BOX_COLS * 2, CHUNK_MASK = ROW_BYTES / 16 - 1;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + lane / 4 + 8 * h, c = 8 * j + 2 * (lane % 4);
        const unsigned row = r * ROW_BYTES;
        // (for 128-byte rows, r % 8 as such: the SASS of the 64-column boxes stays as it was)
        const int chunk = col8 ^ (BOX_COLS == 64 ? r % 8 : static_cast<int>((row >> 7) & CHUNK_MASK));
        const unsigned addr = box + row + (chunk << 4) + (lane % 4) * 4u;
        const unsigned v = pack2<T>(value(4 * j + 2 * h, h, c), value(4 * j + 2 * h + 1, h, c + 1));
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
    }
}

// The columns of a tensor-store epilogue's box for a BN-column tile: 64 (the 128-byte
// swizzle) where BN is whole such boxes, else 16 (the 32-byte swizzle; BN = 176). The
// launcher's map of D has boxes of 64 rows x this many columns.
template <int BN> __host__ __device__ constexpr int store_box_cols() { return BN % 64 == 0 ? 64 : 16; }

// The epilogue of one warpgroup through shared memory and tensor stores, for a 16-bit D
// described by tensor map `mapD` (boxes of 64 rows x store_box_cols<BN>()): its 64 x BN
// outputs, value(i, h, c) for accumulator i (the m64nN layout: row 16 * warp + lane / 4 +
// 8 * h, column c of the tile), go out in parts of (at most) 128 columns, each staged at
// `buf` (STAGING_BYTES, by stage_8_columns) and stored by the warpgroup's first thread.
// The copy engine clips what lies past D's extent, so edges need no
// masks. The stores run on while the warpgroup goes on to its next tile; only the staging
// buffer waits for them to have read it. `bar_id`: this warpgroup's named barrier.
template <typename T, int BN, typename Value>
__device__ __forceinline__ void store_tile_tma(const Value& value, const TmaMap* mapD, unsigned buf, int m_row,
                                               int n0, int z, int bar_id, bool leader) {
    constexpr int BOX = store_box_cols<BN>(), BOX_BYTES = 64 * BOX * 2, PER_BOX = BOX / 8;  // (8-column blocks)
    static_assert(sizeof(T) == 2 && BN % BOX == 0, "tensor-store epilogue: 16-bit D, whole boxes");
#pragma unroll
    for (int part = 0; part < (BN + 127) / 128; ++part) {
        const int blocks = min(16, BN / 8 - 16 * part);  // 8-column blocks of this part (compile-time after unrolling)
        if (leader) bulk_wait_read<0>();  // the previous stores from buf have read it
        named_barrier_sync(bar_id, WG);
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) {
            if (jj >= blocks) break;
            // (the 8-column block 16 * part + jj of the accumulators)
            stage_8_columns<T, BOX>(value, buf + (jj / PER_BOX) * BOX_BYTES, jj % PER_BOX, 16 * part + jj);
        }
        fence_proxy_async();  // these generic-proxy writes before the tensor store reads them
        named_barrier_sync(bar_id, WG);
        if (leader) {
#pragma unroll
            for (int b = 0; b < 16 / PER_BOX; ++b)
                if (b * PER_BOX < blocks) tma_store_3d(mapD, buf + b * BOX_BYTES, n0 + 128 * part + b * BOX, m_row, z);
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
