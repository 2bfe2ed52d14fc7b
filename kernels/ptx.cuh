// ptx.cuh: thin wrappers over the PTX the tensor-core kernels share (GEMM, attention):
// cp.async copies into shared memory, ldmatrix, and mma.sync m16n8k16 / m16n8k32.
// Fragment layouts are spelled out where each kernel uses them.
#pragma once
#include "common.cuh"

namespace cuops {

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses registers (and L1: .cg; the tile is reused
// from shared memory).
__device__ __forceinline__ void cp16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// 16-byte cp.async with zero fill: the first `bytes` (0..16) bytes come from src, the rest
// of the copy is zero (src-size < cp-size), so an edge chunk costs no branch and a chunk
// past the edge reads nothing when bytes == 0.
__device__ __forceinline__ void cp16_zfill(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most N groups of this thread's copies are still in flight.
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- sm_90 tensor copies (TMA) tracked by mbarriers.
// A tensor map (CUtensorMap, built on the host by cuTensorMapEncodeTiled: cupyops/_tma.py)
// describes a global array and the box one copy moves; kernels take it by value as a
// __grid_constant__ parameter and hand the copy engine its address. The wrappers compile
// for every target (the kernels are instantiated for sm_80 too); before sm_90 the
// tensor-copy ones trap, and the launchers never run them there.
struct __align__(64) TmaMap {
    unsigned long long words[16];
};

// A ring stage's mbarrier: initialised with the number of arrivals a phase needs; a
// consumer waits for the parity of the phase it needs (it flips with every completion).
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// After the inits, before the copy engine or other threads use the barriers.
__device__ __forceinline__ void mbar_init_fence() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// Wait until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
#if __CUDA_ARCH__ >= 900
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
#else
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
#endif
    } while (!done);
}
// One arrival that also announces `bytes` of tensor copies the phase must wait for
// (announced before the copies are issued, so the transaction count never runs ahead).
__device__ __forceinline__ void mbar_arrive_tx(unsigned bar, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
#else
    __trap();
#endif
}
// Copy the box of tensor map `map` at element coordinates (c0, c1, c2) (innermost first;
// what lies outside the tensor reads as zeros) into shared memory at dst (1024-byte
// aligned for the 128-byte swizzle); its bytes complete on mbarrier `bar`.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaMap* map, int c0, int c1, int c2, unsigned bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
#else
    __trap();
#endif
}
// Orders this thread's generic-proxy shared-memory accesses before later tensor copies
// (async proxy) into the same bytes.
__device__ __forceinline__ void fence_proxy_async() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Byte offset of 16-byte chunk c of row r in a shared tile of `row_bytes`-byte rows,
// XOR-swizzled (chunk c of row r lives at chunk c ^ (r & 7)): ldmatrix reading 8 rows at one
// chunk, and 8 lanes writing the chunks of one row, each hit 8 distinct bank groups. Rows
// need at least 8 chunks (the XOR stays inside the row).
__device__ __forceinline__ unsigned swizzle16(int r, int c, int row_bytes) {
    return static_cast<unsigned>(r * row_bytes + ((c ^ (r & 7)) << 4));
}

// Two floats -> one register of two 16-bit T (the first in the low half), as the mma
// fragments of f16 / bf16 operands hold them.
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
}

// Four 8x8 matrices of 16-bit elements (8 rows of 16 bytes each; lanes 8i..8i+7 give the
// row addresses of matrix i). Without .trans lane l receives, of matrix i, row l/4,
// elements 2(l%4) and 2(l%4)+1 in register i; with .trans it receives column l/4, rows
// 2(l%4) and 2(l%4)+1, i.e. the same from the transposed matrix.
template <bool TRANS> __device__ __forceinline__ void ldsm4(unsigned addr, unsigned (&r)[4]) {
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// d += a * b for one 16x8 output tile. Fragments (PTX ISA, "Matrix Fragments for mma"),
// g = lane / 4, t = lane % 4:
//   m16n8k16 f16/bf16: a0 = (row g, k 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
//       a3 = (g+8, 2t+8..); b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., g).
//   m16n8k32 s8: the same with 4 bytes of k per register: a0 = (g, 4t..4t+3),
//       a1 = (g+8, 4t..), a2 = (g, 4t+16..), a3 = (g+8, 4t+16..); b0 = (k 4t.., g),
//       b1 = (k 4t+16.., g).
//   d0, d1 = (row g, cols 2t, 2t+1), d2, d3 = (row g+8, cols 2t, 2t+1).
template <typename T> struct IsF16 { static constexpr bool value = false; };
template <> struct IsF16<__half> { static constexpr bool value = true; };

template <typename T, typename Acc>
__device__ __forceinline__ void mma_tile(Acc (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if constexpr (sizeof(T) == 1) {
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else if constexpr (IsF16<T>::value) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

}  // namespace cuops
