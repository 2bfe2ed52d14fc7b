// gemm_sm90.cuh: what the sm_90a GEMM kernels (gemm_wgmma.cu, gemm_fp8.cu) share beyond the
// Hopper layer of sm90.cuh: the warpgroup's size, where the ring starts, and the order in
// which a persistent grid walks its tiles.
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

}  // namespace sm90
}  // namespace cuops
