// sm90.cuh: the one Hopper layer (sm_90a) that the wgmma GEMM and the Hopper attention
// rungs build on. Each wrapper is a few lines of PTX; its comment says what it guarantees.
//
//   Barrier            a typed mbarrier: init, arrive, arrive + expect-tx, wait on a parity
//   Pipeline<STAGES>   a ring of STAGES stages with a full and an empty barrier each; the
//                      stage and the parity to wait for come from a running index `it`
//                      (the it-th use of the ring), never from a hand-kept bitmask
//   tensor copies      tma_load_3d (ptx.cuh: it serves the sm_90 mma feed too), its cluster
//                      multicast form, tma_load_4d, and tensor stores from shared memory
//                      (3-D and 4-D; bulk groups)
//   clusters           the block's rank, an arrival on another block's barrier
//   wgmma              shared-memory matrix descriptors of 128-byte-swizzled tiles (both
//                      operand majors), fence / commit_group / wait_group, m64nNk16 (N = 128,
//                      192, 256) for f16 and bf16 with the transpose immediates, the same
//                      with A in registers (N = 64, 128: attention's P @ V), m64nNk32 for
//                      e4m3, fence_regs
//   setmaxnreg         register reallocation between warpgroups
//   named barriers     bar.sync on a subset of the block's warps
//
// Facts the wrappers rely on (PTX ISA 8.x, "Asynchronous Warpgroup Level Matrix
// Instructions"; checked against CUTLASS's descriptor packing):
// - wgmma is issued by a warpgroup: 4 consecutive warps, the first at a warp index that is a
//   multiple of 4. Its accumulators stay in registers; for m64nNk16 the thread of lane l in
//   warp w of the warpgroup holds, in d[4j + 2h + e], row 16w + l/4 + 8h, column
//   8j + 2(l%4) + e of the 64 x N tile (the mma.sync m16n8 C layout, N/8 times).
// - A and B come from shared memory through 64-bit descriptors. A 128-byte-swizzled tile is
//   made of 1024-byte atoms of 8 rows of 128 bytes (16-byte chunk c of row r stored at
//   chunk c ^ (r % 8): what a tensor copy with CU_TENSOR_MAP_SWIZZLE_128B writes at a
//   1024-byte-aligned address). K-major (the operand stored rows x K): a row is 64 K of one
//   M/N row, the stride-byte offset (SBO) steps 8 rows. MN-major (stored K x rows): a row is
//   64 M/N elements of one k, SBO steps 8 k, the leading-byte offset (LBO) steps 64 M/N.
// - Only f16 / bf16 have the transpose immediates (MN-major operands); 8-bit types must be
//   K-major on both sides.
#pragma once
#include "ptx.cuh"

// Hopper-only code fails at compile time on any other target (never a run-time trap).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "sm90.cuh: wgmma and setmaxnreg need the sm_90a target (-arch=sm_90a)"
#endif

namespace cuops {
namespace sm90 {

typedef unsigned long long u64;

// ---------------------------------------------------------------------------------- mbarriers
struct Barrier {
    unsigned addr;  // shared-memory address of the 8-byte barrier

    // One thread, before any use; `arrivals` arrivals (plus the announced bytes) complete
    // a phase. Make inits visible with mbar_init_fence() and a block barrier.
    __device__ __forceinline__ void init(unsigned arrivals) const { mbar_init(addr, arrivals); }
    __device__ __forceinline__ void arrive() const {
        asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(addr) : "memory");
    }
    // One arrival that also announces `bytes` of tensor copies completing on this barrier,
    // made before this thread issues its copies. (A multicast copy from another block of the
    // cluster may land first and take the count below zero: the phase still waits for this
    // arrival, so it completes only when every announced byte has come.)
    __device__ __forceinline__ void arrive_expect_tx(unsigned bytes) const { mbar_arrive_tx(addr, bytes); }
    // One arrival on the barrier at the same offset in block `rank` of this cluster. Release
    // at CTA scope, as a local arrive: the arrival only says that this warpgroup's wgmmas,
    // already waited for, stopped reading a stage. (.release.cluster, a cluster-scope fence
    // with every arrival, made the clustered GEMM run at half speed.)
    __device__ __forceinline__ void arrive_at(unsigned rank) const {
        asm volatile(
            "{\n\t.reg .b32 remote;\n\tmapa.shared::cluster.u32 remote, %0, %1;\n\t"
            "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}" ::"r"(addr),
            "r"(rank)
            : "memory");
    }
    // Returns once the phase of parity `parity` has completed. A fresh barrier counts the
    // phase before its first as completed: waiting on parity 1 returns at once.
    __device__ __forceinline__ void wait(unsigned parity) const { mbar_wait(addr, parity); }
};

// A producer/consumer ring of STAGES stages. full(it): the copies of the it-th fill have
// landed (one producer arrival + the announced bytes); empty(it): every consumer is done
// reading the stage (`consumers` arrivals). The it-th use of the ring is stage it % STAGES,
// its (it / STAGES)-th phase.
template <int STAGES> struct Pipeline {
    unsigned base;  // 2 * STAGES barriers: full[0, STAGES), then empty[0, STAGES)
    static constexpr unsigned BYTES = 16 * STAGES;

    __device__ __forceinline__ static int stage(unsigned it) { return static_cast<int>(it % STAGES); }
    __device__ __forceinline__ static unsigned parity(unsigned it) { return (it / STAGES) & 1u; }
    __device__ __forceinline__ Barrier full(unsigned it) const { return {base + 8u * stage(it)}; }
    __device__ __forceinline__ Barrier empty(unsigned it) const { return {base + 8u * (STAGES + stage(it))}; }

    // One thread; then a block barrier before the ring is used.
    __device__ __forceinline__ void init(unsigned consumers) const {
        for (int s = 0; s < STAGES; ++s) {
            Barrier{base + 8u * s}.init(1);
            Barrier{base + 8u * (STAGES + s)}.init(consumers);
        }
        mbar_init_fence();
    }
    // Producer: wait until the consumers released the stage's previous use (the first
    // STAGES uses pass at once), then announce the bytes of this fill.
    __device__ __forceinline__ void producer_acquire(unsigned it) const { empty(it).wait(parity(it) ^ 1u); }
    __device__ __forceinline__ void producer_expect(unsigned it, unsigned bytes) const {
        full(it).arrive_expect_tx(bytes);
    }
    // Consumer: wait for the it-th fill; release it once nothing reads the stage any more.
    // In a cluster whose blocks fill each other's stages (multicast), a stage is released
    // to the producers of every block: init(consumers) then counts the consumers of all.
    __device__ __forceinline__ void consumer_wait(unsigned it) const { full(it).wait(parity(it)); }
    template <int CLUSTER = 1> __device__ __forceinline__ void consumer_release(unsigned it) const {
        if constexpr (CLUSTER == 1) {
            empty(it).arrive();
        } else {
#pragma unroll
            for (int r = 0; r < CLUSTER; ++r) empty(it).arrive_at(r);
        }
    }
};

// -------------------------------------------------------------------------- clusters
// This block's rank in its cluster.
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// tma_load_3d into every block of the cluster in `cta_mask` (bit r: block rank r): the box
// lands at offset dst of each one's shared memory, and its bytes complete on the barrier at
// offset bar of each one.
__device__ __forceinline__ void tma_load_3d_multicast(unsigned dst, const TmaMap* map, int c0, int c1, int c2,
                                                      unsigned bar, unsigned short cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
        "[%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(cta_mask)
        : "memory");
}

// tma_load_3d with a fourth coordinate (a 4-D map: attention's (head_dim, rows, heads,
// batch)).
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaMap* map, int c0, int c1, int c2, int c3,
                                            unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6];" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// Store the box of tensor map `map` at element coordinates (c0, c1, c2) from shared memory
// at src (1024-byte aligned, in the map's swizzle); the part outside the tensor is not
// written. One thread issues it; it joins this thread's open bulk group. Each thread that
// wrote src must fence_proxy_async() before the barrier that precedes the store.
__device__ __forceinline__ void tma_store_3d(const TmaMap* map, unsigned src, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                     reinterpret_cast<unsigned long long>(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}
// tma_store_3d with a fourth coordinate (a 4-D map: attention's O, (head_dim, rows, heads,
// batch)).
__device__ __forceinline__ void tma_store_4d(const TmaMap* map, unsigned src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                     reinterpret_cast<unsigned long long>(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
// Closes the bulk group of the tensor stores this thread issued since the last commit.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Returns once at most N of this thread's bulk groups are still reading shared memory (the
// source may then be overwritten, or the block end: the global writes may still be under
// way, and are complete, as every write of the grid, when the grid is; CUTLASS's epilogues
// end on this wait too).
template <int N> __device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// -------------------------------------------------------------------------------- wgmma
// Descriptor of a 128-byte-swizzled shared-memory tile starting at `addr` (PTX "Matrix
// Descriptor Format"): address >> 4 in bits [0, 14), LBO >> 4 in [16, 30), SBO >> 4 in
// [32, 46), base offset 0 (atoms 1024-byte aligned), layout type 1 (128B swizzle) in [62, 64).
__device__ __forceinline__ u64 wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return static_cast<u64>((addr & 0x3FFFFu) >> 4) | static_cast<u64>(lbo >> 4) << 16 |
           static_cast<u64>(sbo >> 4) << 32 | 1ull << 62;
}

// A 16-bit operand tile of 64 K by a multiple of 64 M/N rows, as 128-byte-swizzled tensor
// copies leave it: both majors keep each 64-row x 64-K piece in one 8192-byte block
// (K-major: 64 rows of 128 bytes; MN-major: 64 k of 128 bytes), pieces back to back, so
// rows [64p, 64p + 64) start at byte 8192p either way. desc(tile, k16) reads K
// [16 k16, 16 k16 + 16): K-major steps 32 bytes along the rows (the swizzle is a function
// of the address bits, so a shifted start reads the shifted columns); MN-major steps 16 k
// rows, 2048 bytes.
// PIECE_BYTES: the distance between the 64-wide M/N pieces of an MN-major tile, 8192 for
// pieces of 64 k (a tile of more k, copied as one box of (64, k) a piece, has pieces of 128 k
// bytes: attention's V tiles of BC keys).
template <bool MN_MAJOR, unsigned PIECE = 8192> struct SwizzledTile16 {
    static constexpr unsigned PIECE_BYTES = PIECE;
    __device__ __forceinline__ static u64 desc(unsigned tile, int k16) {
        if constexpr (MN_MAJOR) return wgmma_desc(tile + 2048u * k16, PIECE_BYTES, 1024);
        else return wgmma_desc(tile + 32u * k16, 16, 1024);  // (LBO unused when K-major)
    }
};

// Orders this warpgroup's register and shared-memory accesses before the wgmmas that follow
// (before the first wgmma of a tile, and after the accumulators were read or written).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// Closes the group of wgmmas issued since the last commit.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Returns once at most N committed groups of this warpgroup are still running.
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// A scheduling fence: code after it stays after `value` is computed. ptxas schedules within
// basic blocks and hoists a wgmma wait above arithmetic it does not depend on (seen in
// attention_flash3.cu: the wait for P V went above the softmax meant to run while P V is in
// flight, NOTES 81); a branch on `value` ends the block. The branch is never taken
// (`value` must be >= 0 or NaN) and is uniform across the warp (a vote); it costs a compare,
// a vote and a branch.
__device__ __forceinline__ void schedule_after(float value) {
    if (__any_sync(0xffffffffu, value < 0.f)) __nanosleep(0);
}
// Tells the compiler that the accumulators may have changed here (after wgmma_wait): the
// code that reads them cannot be moved above the wait.
template <int R> __device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for register A fragments (packed 16-bit pairs). Called before wgmma_fence() it
// also keeps the writes that made them (and, with the float form, a rescale of the
// accumulators) above the fence, which the PTX ISA asks for: wgmma.fence must separate
// other accesses to a wgmma's registers from the wgmma.
template <int R> __device__ __forceinline__ void fence_regs(unsigned (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// The accumulator operands of a 64 x N wgmma, N / 2 = R floats a thread: the register
// list of the instruction ("{%0, ..., %R-1}") and the asm output list binding them to
// d[0..R). Built eight at a time: CUOPS_NAMES_n names %0 .. %8n-1, CUOPS_BINDS_n binds
// them to d[0 .. 8n); one CUOPS_ACC<R>_REGS / _OUTS pair per R the wgmma forms below use.
#define CUOPS_NAMES_1 "%0, %1, %2, %3, %4, %5, %6, %7"
#define CUOPS_NAMES_2 CUOPS_NAMES_1 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define CUOPS_NAMES_3 CUOPS_NAMES_2 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define CUOPS_NAMES_4 CUOPS_NAMES_3 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define CUOPS_NAMES_5 CUOPS_NAMES_4 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define CUOPS_NAMES_6 CUOPS_NAMES_5 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define CUOPS_NAMES_7 CUOPS_NAMES_6 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define CUOPS_NAMES_8 CUOPS_NAMES_7 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define CUOPS_NAMES_9 CUOPS_NAMES_8 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define CUOPS_NAMES_10 CUOPS_NAMES_9 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define CUOPS_NAMES_11 CUOPS_NAMES_10 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define CUOPS_NAMES_12 CUOPS_NAMES_11 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define CUOPS_NAMES_13 CUOPS_NAMES_12 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define CUOPS_NAMES_14 CUOPS_NAMES_13 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define CUOPS_NAMES_15 CUOPS_NAMES_14 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define CUOPS_NAMES_16 CUOPS_NAMES_15 ", %120, %121, %122, %123, %124, %125, %126, %127"
#define CUOPS_BIND8(k)                                                                \
    "+f"(d[8 * k]), "+f"(d[8 * k + 1]), "+f"(d[8 * k + 2]), "+f"(d[8 * k + 3]), "+f"(d[8 * k + 4]), \
        "+f"(d[8 * k + 5]), "+f"(d[8 * k + 6]), "+f"(d[8 * k + 7])
#define CUOPS_BINDS_1 CUOPS_BIND8(0)
#define CUOPS_BINDS_2 CUOPS_BINDS_1, CUOPS_BIND8(1)
#define CUOPS_BINDS_3 CUOPS_BINDS_2, CUOPS_BIND8(2)
#define CUOPS_BINDS_4 CUOPS_BINDS_3, CUOPS_BIND8(3)
#define CUOPS_BINDS_5 CUOPS_BINDS_4, CUOPS_BIND8(4)
#define CUOPS_BINDS_6 CUOPS_BINDS_5, CUOPS_BIND8(5)
#define CUOPS_BINDS_7 CUOPS_BINDS_6, CUOPS_BIND8(6)
#define CUOPS_BINDS_8 CUOPS_BINDS_7, CUOPS_BIND8(7)
#define CUOPS_BINDS_9 CUOPS_BINDS_8, CUOPS_BIND8(8)
#define CUOPS_BINDS_10 CUOPS_BINDS_9, CUOPS_BIND8(9)
#define CUOPS_BINDS_11 CUOPS_BINDS_10, CUOPS_BIND8(10)
#define CUOPS_BINDS_12 CUOPS_BINDS_11, CUOPS_BIND8(11)
#define CUOPS_BINDS_13 CUOPS_BINDS_12, CUOPS_BIND8(12)
#define CUOPS_BINDS_14 CUOPS_BINDS_13, CUOPS_BIND8(13)
#define CUOPS_BINDS_15 CUOPS_BINDS_14, CUOPS_BIND8(14)
#define CUOPS_BINDS_16 CUOPS_BINDS_15, CUOPS_BIND8(15)
#define CUOPS_ACC32_REGS "{" CUOPS_NAMES_4 "}"
#define CUOPS_ACC32_OUTS CUOPS_BINDS_4
#define CUOPS_ACC40_REGS "{" CUOPS_NAMES_5 "}"
#define CUOPS_ACC40_OUTS CUOPS_BINDS_5
#define CUOPS_ACC64_REGS "{" CUOPS_NAMES_8 "}"
#define CUOPS_ACC64_OUTS CUOPS_BINDS_8
#define CUOPS_ACC88_REGS "{" CUOPS_NAMES_11 "}"
#define CUOPS_ACC88_OUTS CUOPS_BINDS_11
#define CUOPS_ACC96_REGS "{" CUOPS_NAMES_12 "}"
#define CUOPS_ACC96_OUTS CUOPS_BINDS_12
#define CUOPS_ACC128_REGS "{" CUOPS_NAMES_16 "}"
#define CUOPS_ACC128_OUTS CUOPS_BINDS_16

// d[N / 2] (+)= A(desc) * B(desc), a 64 x N step. KIND is the rest of the instruction's
// name ("k16.f32.bf16.bf16", "k32.f32.e4m3.e4m3"); after the N / 2 accumulators come the
// two descriptors (%N/2, %N/2+1), the accumulate flag, and the transpose immediates of A and
// B, which IMMEDIATES names (", %N/2+3, %N/2+4") for 16-bit types and leaves out ("") for
// 8-bit ones, which have none.
#define CUOPS_WGMMA_M64N64(KIND, IMMEDIATES)                                                 \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"                                  \
                 "wgmma.mma_async.sync.aligned.m64n64" KIND " " CUOPS_ACC32_REGS                       \
                 ", %32, %33, p, 1, 1" IMMEDIATES ";\n}\n"                                          \
                 : CUOPS_ACC32_OUTS                                                              \
                 : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TRANS_A ? 1 : 0), "n"(TRANS_B ? 1 : 0))
#define CUOPS_WGMMA_M64N80(KIND, IMMEDIATES)                                                 \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %42, 0;\n\t"                                  \
                 "wgmma.mma_async.sync.aligned.m64n80" KIND " " CUOPS_ACC40_REGS                       \
                 ", %40, %41, p, 1, 1" IMMEDIATES ";\n}\n"                                          \
                 : CUOPS_ACC40_OUTS                                                              \
                 : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TRANS_A ? 1 : 0), "n"(TRANS_B ? 1 : 0))
#define CUOPS_WGMMA_M64N128(KIND, IMMEDIATES)                                                \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %66, 0;\n\t"                                  \
                 "wgmma.mma_async.sync.aligned.m64n128" KIND " " CUOPS_ACC64_REGS                      \
                 ", %64, %65, p, 1, 1" IMMEDIATES ";\n}\n"                                          \
                 : CUOPS_ACC64_OUTS                                                              \
                 : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TRANS_A ? 1 : 0), "n"(TRANS_B ? 1 : 0))
#define CUOPS_WGMMA_M64N176(KIND, IMMEDIATES)                                                \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %90, 0;\n\t"                                  \
                 "wgmma.mma_async.sync.aligned.m64n176" KIND " " CUOPS_ACC88_REGS                      \
                 ", %88, %89, p, 1, 1" IMMEDIATES ";\n}\n"                                          \
                 : CUOPS_ACC88_OUTS                                                              \
                 : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TRANS_A ? 1 : 0), "n"(TRANS_B ? 1 : 0))
#define CUOPS_WGMMA_M64N192(KIND, IMMEDIATES)                                                \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %98, 0;\n\t"                                  \
                 "wgmma.mma_async.sync.aligned.m64n192" KIND " " CUOPS_ACC96_REGS                      \
                 ", %96, %97, p, 1, 1" IMMEDIATES ";\n}\n"                                          \
                 : CUOPS_ACC96_OUTS                                                              \
                 : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TRANS_A ? 1 : 0), "n"(TRANS_B ? 1 : 0))
#define CUOPS_WGMMA_M64N256(KIND, IMMEDIATES)                                                \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %130, 0;\n\t"                                  \
                 "wgmma.mma_async.sync.aligned.m64n256" KIND " " CUOPS_ACC128_REGS                      \
                 ", %128, %129, p, 1, 1" IMMEDIATES ";\n}\n"                                          \
                 : CUOPS_ACC128_OUTS                                                              \
                 : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TRANS_A ? 1 : 0), "n"(TRANS_B ? 1 : 0))

// d (+)= A * B for a 64 x N x 16 step of a warpgroup (N = 64, 80, 128, 176, 192 or 256: N / 2
// accumulators a thread): T is __half or __nv_bfloat16, A and B in shared memory
// (descriptors da, db); TRANS_A: A is M-major (stored K x M), TRANS_B: B is N-major (stored
// K x N); accumulate false: d = A * B.
template <int N, typename T, bool TRANS_A, bool TRANS_B>
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[N / 2], u64 da, u64 db, bool accumulate) {
    static_assert(N == 64 || N == 80 || N == 128 || N == 176 || N == 192 || N == 256,
                  "wgmma_m64nNk16: N of 64, 80, 128, 176, 192 or 256");
    constexpr bool F16 = IsF16<T>::value;
    if constexpr (N == 64) {
        if constexpr (F16) CUOPS_WGMMA_M64N64("k16.f32.f16.f16", ", %35, %36");
        else CUOPS_WGMMA_M64N64("k16.f32.bf16.bf16", ", %35, %36");
    } else if constexpr (N == 80) {
        if constexpr (F16) CUOPS_WGMMA_M64N80("k16.f32.f16.f16", ", %43, %44");
        else CUOPS_WGMMA_M64N80("k16.f32.bf16.bf16", ", %43, %44");
    } else if constexpr (N == 128) {
        if constexpr (F16) CUOPS_WGMMA_M64N128("k16.f32.f16.f16", ", %67, %68");
        else CUOPS_WGMMA_M64N128("k16.f32.bf16.bf16", ", %67, %68");
    } else if constexpr (N == 176) {
        if constexpr (F16) CUOPS_WGMMA_M64N176("k16.f32.f16.f16", ", %91, %92");
        else CUOPS_WGMMA_M64N176("k16.f32.bf16.bf16", ", %91, %92");
    } else if constexpr (N == 192) {
        if constexpr (F16) CUOPS_WGMMA_M64N192("k16.f32.f16.f16", ", %99, %100");
        else CUOPS_WGMMA_M64N192("k16.f32.bf16.bf16", ", %99, %100");
    } else {
        if constexpr (F16) CUOPS_WGMMA_M64N256("k16.f32.f16.f16", ", %131, %132");
        else CUOPS_WGMMA_M64N256("k16.f32.bf16.bf16", ", %131, %132");
    }
}

// d (+)= A * B for a 64 x N x 32 step with e4m3 A and B, both K-major (8-bit wgmma has no
// transpose; N = 128, 192 or 256); the accumulators are laid out as the 16-bit m64nNk16's.
// accumulate false: d = A * B.
template <int N>
__device__ __forceinline__ void wgmma_m64nNk32_e4m3(float (&d)[N / 2], u64 da, u64 db, bool accumulate) {
    static_assert(N == 128 || N == 192 || N == 256, "wgmma_m64nNk32_e4m3: N of 128, 192 or 256");
    constexpr bool TRANS_A = false, TRANS_B = false;  // (operands the macro passes, unused here)
    if constexpr (N == 128) CUOPS_WGMMA_M64N128("k32.f32.e4m3.e4m3", "");
    else if constexpr (N == 192) CUOPS_WGMMA_M64N192("k32.f32.e4m3.e4m3", "");
    else CUOPS_WGMMA_M64N256("k32.f32.e4m3.e4m3", "");
}
#undef CUOPS_WGMMA_M64N64
#undef CUOPS_WGMMA_M64N80
#undef CUOPS_WGMMA_M64N128
#undef CUOPS_WGMMA_M64N176
#undef CUOPS_WGMMA_M64N192
#undef CUOPS_WGMMA_M64N256

// d[N / 2] (+)= A * B(desc) for a 64 x N x 16 step with A in registers (the "RS" form):
// a[4] is the thread's A fragment, two 16-bit values a register, in the mma.sync m16n8k16 A
// layout of its warp's 16 rows (a[0]: row l/4, columns 2(l%4) + {0, 1}; a[1]: row l/4 + 8;
// a[2], a[3]: the same rows, columns + 8), which is the layout of the m64nNk16
// accumulators of columns [16k, 16k + 16) rounded to 16 bits: an attention kernel's
// softmax output P feeds P @ V without a trip through shared memory. Only B has a
// transpose immediate in this form.
#define CUOPS_WGMMA_RS_M64N64(KIND)                                                          \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %37, 0;\n\t"                                  \
                 "wgmma.mma_async.sync.aligned.m64n64" KIND " " CUOPS_ACC32_REGS                      \
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                             \
                 : CUOPS_ACC32_OUTS                                                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(static_cast<int>(accumulate)), \
                   "n"(TRANS_B ? 1 : 0))

#define CUOPS_WGMMA_RS_M64N128(KIND)                                                          \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %69, 0;\n\t"                                  \
                 "wgmma.mma_async.sync.aligned.m64n128" KIND " " CUOPS_ACC64_REGS                      \
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"                             \
                 : CUOPS_ACC64_OUTS                                                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(static_cast<int>(accumulate)), \
                   "n"(TRANS_B ? 1 : 0))

#define CUOPS_WGMMA_RS_M64N256(KIND)                                                          \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %133, 0;\n\t"                                 \
                 "wgmma.mma_async.sync.aligned.m64n256" KIND " " CUOPS_ACC128_REGS                     \
                 ", {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"                         \
                 : CUOPS_ACC128_OUTS                                                             \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(static_cast<int>(accumulate)), \
                   "n"(TRANS_B ? 1 : 0))

template <int N, typename T, bool TRANS_B>
__device__ __forceinline__ void wgmma_m64nNk16_rs(float (&d)[N / 2], const unsigned (&a)[4], u64 db,
                                                  bool accumulate) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_m64nNk16_rs: N of 64, 128 or 256");
    constexpr bool F16 = IsF16<T>::value;
    if constexpr (N == 64) {
        if constexpr (F16) CUOPS_WGMMA_RS_M64N64("k16.f32.f16.f16");
        else CUOPS_WGMMA_RS_M64N64("k16.f32.bf16.bf16");
    } else if constexpr (N == 128) {
        if constexpr (F16) CUOPS_WGMMA_RS_M64N128("k16.f32.f16.f16");
        else CUOPS_WGMMA_RS_M64N128("k16.f32.bf16.bf16");
    } else {
        if constexpr (F16) CUOPS_WGMMA_RS_M64N256("k16.f32.f16.f16");
        else CUOPS_WGMMA_RS_M64N256("k16.f32.bf16.bf16");
    }
}
#undef CUOPS_WGMMA_RS_M64N64
#undef CUOPS_WGMMA_RS_M64N128
#undef CUOPS_WGMMA_RS_M64N256
#undef CUOPS_ACC32_REGS
#undef CUOPS_ACC32_OUTS
#undef CUOPS_ACC40_REGS
#undef CUOPS_ACC40_OUTS
#undef CUOPS_ACC64_REGS
#undef CUOPS_ACC64_OUTS
#undef CUOPS_ACC88_REGS
#undef CUOPS_ACC88_OUTS
#undef CUOPS_ACC96_REGS
#undef CUOPS_ACC96_OUTS
#undef CUOPS_ACC128_REGS
#undef CUOPS_ACC128_OUTS
#undef CUOPS_NAMES_1
#undef CUOPS_BINDS_1
#undef CUOPS_NAMES_2
#undef CUOPS_BINDS_2
#undef CUOPS_NAMES_3
#undef CUOPS_BINDS_3
#undef CUOPS_NAMES_4
#undef CUOPS_BINDS_4
#undef CUOPS_NAMES_5
#undef CUOPS_BINDS_5
#undef CUOPS_NAMES_6
#undef CUOPS_BINDS_6
#undef CUOPS_NAMES_7
#undef CUOPS_BINDS_7
#undef CUOPS_NAMES_8
#undef CUOPS_BINDS_8
#undef CUOPS_NAMES_9
#undef CUOPS_BINDS_9
#undef CUOPS_NAMES_10
#undef CUOPS_BINDS_10
#undef CUOPS_NAMES_11
#undef CUOPS_BINDS_11
#undef CUOPS_NAMES_12
#undef CUOPS_BINDS_12
#undef CUOPS_NAMES_13
#undef CUOPS_BINDS_13
#undef CUOPS_NAMES_14
#undef CUOPS_BINDS_14
#undef CUOPS_NAMES_15
#undef CUOPS_BINDS_15
#undef CUOPS_NAMES_16
#undef CUOPS_BINDS_16
#undef CUOPS_BIND8

// ------------------------------------------------------------------ registers, barriers
// Register reallocation between warpgroups: every thread of the warpgroup executes it, and
// the kernel needs a register cap at entry (__launch_bounds__(threads, 1)), or ptxas drops
// it with warning C7508 (the compile tests fail on any warning).
template <int R> __device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(R % 8 == 0 && R >= 24 && R <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R> __device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(R % 8 == 0 && R >= 24 && R <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}

// A barrier among `threads` threads (a multiple of 32) of the block: ids 1..15 (0 is
// __syncthreads) keep warpgroups that synchronise among themselves out of each other's way.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at barrier `id` without waiting: with bar.sync of the others it lets one group
// of warps signal another (`threads` counts both groups).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The warpgroup of the calling thread, uniform across the warp (the compiler can tell).
__device__ __forceinline__ int warpgroup() { return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0); }

}  // namespace sm90
}  // namespace cuops
