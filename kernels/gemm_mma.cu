// gemm_mma.cu: D = alpha * op(A) @ op(B) + beta * C on the tensor cores, under the contract
// of gemm_common.cuh (GEMM_PARAMS, the four layouts, BLAS beta, any shape and alignment).
//
// Work: 2*M*N*K flops. An H200 does ~990 TFLOP/s of dense fp16/bf16 (2x that for int8):
// 2048 fp16 MAC/clk/SM, one m16n8k16 per 4 clocks per SM sub-partition. cuBLAS (wgmma +
// TMA) sustains ~770 (fp16) / ~795 (bf16). The warp-level mma.sync these rungs use must
// bring every operand through registers with ldmatrix: a 64x64 warp tile reads 4 KB of
// shared memory per k16 step for 32 mma, so a 128x256 block tile moves 1408 x 128-byte
// wavefronts (ldmatrix + cp.async writes) per BK = 64 slice against 1024 clocks of mma at
// peak: shared memory caps mma.sync near 70% of peak. What separates the rungs is how well
// the tensor cores are fed from shared memory:
//   1. gemm_wmma    nvcuda::wmma 16x16x16 fragments, 64x64 block tile, 4 warps of 32x32,
//                   BK = 32 tiles staged in padded shared memory, load / barrier / compute /
//                   barrier. The textbook tensor-core GEMM: the fragment layout is hidden,
//                   so nothing can be tuned below it, and nothing overlaps global latency.
//   2. gemm_mma     mma.sync m16n8k16 (fp32 accumulate) from inline PTX, fragments loaded
//                   with ldmatrix.x4 (.trans for the M/N-contiguous operands) from an
//                   XOR-swizzled shared-memory ring (no bank conflicts for the cp.async
//                   writes nor the ldmatrix reads, no padding), filled 3-4 stages ahead by
//                   16-byte cp.async, fragments of k-step s+1 loaded while the mma of s
//                   issue, 64x64 warp tiles (32 mma per 8 ldmatrix), grouped block order
//                   for L2 reuse, epilogue staged through shared memory for 16-byte stores.
//                   On sm_90 (gemm_mma_tma), when both operands are K-contiguous, the
//                   ring is filled by two tensor copies a stage instead (TMA, mbarriers).
//   3. gemm_mma_s8  the same pipeline with mma.sync m16n8k32 s8 -> s32 (2x the fp16 rate).
//                   The mma wants 4 consecutive k in every register of both operands and
//                   ldmatrix.trans moves 16-bit elements, so an M- or N-contiguous int8
//                   operand (TA, or !TB: matmul(a, b)) is staged as it lies, by cp.async,
//                   and each ldmatrix.x4.trans picks k rows so that its four registers
//                   hold 2 k x 2 m/n byte blocks, which 4 prmt regroup into 4 k x 1 m/n
//                   registers (Operand::frag_base): one load still feeds a whole fragment,
//                   the m/n rows of the fragment come out interleaved (even / odd), and
//                   the epilogue puts them back.
// (Leaves room for 4. an sm_90a wgmma + TMA rung: the launcher picks kernels in one place.)
//
// Launch geometry (cupyops/ops/_gemm_mma.py computes it):
//   gemm_wmma<T, TA, TB>: block 128; grid (cdiv(M, 64) * cdiv(N, 64), 1, batch');
//       ~27 KB static shared memory.
//   gemm_mma<T, TA, TB, BM, BN, WM, WN, STAGES, MINB> and gemm_mma_s8<TA, TB, ...>:
//       block 32 * (BM / WM) * (BN / WN); grid (cdiv(M, BM) * cdiv(N, BN), 1, batch');
//       dynamic shared memory max(STAGES * (BM + BN) * 128, BM * (BN + 8) * 4) bytes (a
//       stage holds 128 bytes of K: BK = 64 for 16-bit types, 128 for int8).
//   gemm_mma_tma<T, false, true, ...>: the same geometry, 8 * STAGES + 1024 bytes more
//       shared memory (the stages' mbarriers, the ring's 1024-byte alignment).
//   batch' = min(batch, 65535); every kernel loops z over the rest of the stack, and the
//   1-D tile grids loop over tiles past gridDim.x.
#include "gemm_common.cuh"
// nvcuda::wmma lives in <mma.h>, which includes crt/mma.h; NVIDIA's pip wheels ship the
// former without the latter. Where the pair is incomplete the wmma rung uses gmma::wmma_lite
// below: the same API subset on the same compiler builtins crt/mma.hpp calls.
#if __has_include(<crt/mma.h>)
#include <mma.h>
#define CUOPS_WMMA_NS nvcuda::wmma
#else
#define CUOPS_WMMA_NS gmma::wmma_lite
#endif

using namespace cuops;

namespace gmma {

// ------------------------------------------------------------------ PTX wrappers
// (smem_u32, cp16, cp16_zfill, cp_commit, cp_wait, ldsm4, mma_tile and its fragment
// layouts: ptx.cuh.) In bytes the m16n8k16 and m16n8k32 fragments are the same: register
// i of A covers rows (i&1)*8 + g and the 16-byte k-chunk i/2 of the k-step; register j of
// B the k-chunk j. So one ldmatrix addressing serves both element types.
__device__ __forceinline__ void sts128(unsigned dst, unsigned a, unsigned b, unsigned c, unsigned d) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// An int8 MC fragment (see Operand::frag_base): ldmatrix.x4.trans left lane (g, t) with
// r0 = bytes (k 4t, mn 2g), (4t, 2g+1), (4t+1, 2g), (4t+1, 2g+1); r1 the same at k 4t+2,
// 4t+3; r2, r3 the same 16 k further. prmt (bytes 0-3 from the first operand, 4-7 from the
// second) regroups them into registers of 4 consecutive k of one m/n: even = m/n 2g, odd
// = m/n 2g+1. A (m16 tile): a0, a2 = row g -> m 2g, a1, a3 = row g+8 -> m 2g+1. B (pair of
// n8 tiles): the first tile's column g -> n 2g, the second's -> n 2g+1.
template <bool ROLE_A> __device__ __forceinline__ void regroup_k4(unsigned (&r)[4]) {
    const unsigned e01 = __byte_perm(r[0], r[1], 0x6420), o01 = __byte_perm(r[0], r[1], 0x7531);
    const unsigned e23 = __byte_perm(r[2], r[3], 0x6420), o23 = __byte_perm(r[2], r[3], 0x7531);
    if constexpr (ROLE_A) {
        r[0] = e01; r[1] = o01; r[2] = e23; r[3] = o23;
    } else {
        r[0] = e01; r[1] = e23; r[2] = o01; r[3] = o23;
    }
}

// Accumulator <-> raw 32-bit word (the epilogue moves accumulators through shared memory).
__device__ __forceinline__ unsigned to_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned to_bits(int v) { return static_cast<unsigned>(v); }
template <typename A> __device__ __forceinline__ A from_bits(unsigned w) {
    if constexpr (sizeof(A) == 4 && A(0.5) == A(0)) return static_cast<A>(w);
    else return __uint_as_float(w);
}

template <int S> struct RawOf;
template <> struct RawOf<1> { typedef unsigned char type; };
template <> struct RawOf<2> { typedef unsigned short type; };

// Grouped block order: consecutive blocks walk down a group of GROUP tile rows before
// moving right, so the ~132 resident blocks share a few A row panels and B column panels
// in L2 instead of each streaming its own.
template <int GROUP>
__device__ __forceinline__ void tile_coords(int tile, int tm, int tn, int& pm, int& pn) {
    const int width = GROUP * tn, group = tile / width, first = group * GROUP;
    const int rows = min(tm - first, GROUP), local = tile - group * width;
    pm = first + local % rows;
    pn = local / rows;
}

// ------------------------------------------------------------------ one operand's tile
// A stage holds, for each operand, R rows (m for A, n for B) x 128 bytes of K, in one of
// two arrangements:
//   KC  K contiguous in global memory (A when !TA, B when TB): shared rows are the R
//       m/n rows, 8 chunks of 16 bytes of K each; filled by cp.async; read by ldmatrix.
//   MC  M/N contiguous (A when TA, B when !TB): shared rows are the BK = 128 / sizeof(T)
//       k rows, R bytes each (R / 16 chunks); cp.async; ldmatrix.trans hands out the
//       k-pairs the 16-bit mma wants; for int8, see frag_base and regroup_k4.
// Swizzle: chunk c of shared row r lives at chunk c ^ sw(r) of that row (the XOR only
// touches the low 3 bits, staying inside the row). ldmatrix reads 8 rows at one logical
// chunk per matrix, which sw must send to 8 different physical chunks (all 32 banks):
// rows aligned to 8 for KC and 16-bit MC, so sw(r) = r & 7; for int8 MC the k rows
// {0, 1, 4, 5, 8, 9, 12, 13} (+ 2, + 16, + 32 ks), so sw takes k bits 0, 2, 3 -- or, in
// the 64-byte rows of a 64-wide int8 tile (two rows per 128 bytes, k bit 0 choosing the
// half), bits 2, 3 within the row's 4 chunks. cp.async writes whole rows per 8 lanes.
enum { KC = 0, MC = 1 };

template <typename T, int KIND, int R, int THREADS, bool ROLE_A>
struct Operand {
    static constexpr int VE = 16 / sizeof(T);            // elements per 16-byte chunk
    static constexpr int BK = 128 / sizeof(T);           // K per stage
    static constexpr bool MC8 = KIND == MC && sizeof(T) == 1;
    static constexpr int ROWS = KIND == MC ? BK : R;     // shared rows of the tile
    static constexpr int CPR = KIND == MC ? R / VE : 8;  // 16-byte chunks per shared row
    static constexpr int ROWB = CPR * 16;
    static constexpr int BYTES = ROWS * ROWB;  // = R * 128 in every arrangement
    static constexpr int CHUNKS = ROWS * CPR / THREADS;  // cp.async per thread per stage
    static constexpr int RSTEP = THREADS / CPR;          // rows between a thread's chunks
    static constexpr bool TRANS = KIND == MC;
    static_assert((ROWS * CPR) % THREADS == 0, "chunks must split evenly over the block");
    static_assert(THREADS % CPR == 0 && RSTEP % (MC8 ? 16 : 8) == 0, "a thread's chunks share one swizzle");
    static_assert(CPR >= 8 || (MC8 && CPR == 4), "the swizzle stays inside a shared row");

    __device__ __forceinline__ static int sw(int row) {
        if constexpr (MC8 && CPR >= 8) return (row & 1) | ((row >> 1) & 6);
        else if constexpr (MC8) return (row >> 2) & 3;  // 64-byte rows: k bit 0 picks the half
        else return row & 7;
    }

    // cp.async the stage whose K range starts at k0 and M/N range at mn0 (KC, MC).
    // vec: the operand passed gemm_vec_ok. A whole in-range tile takes the unguarded
    // copies; an edge tile zero-fills per chunk; an unaligned operand loads elements.
    __device__ __forceinline__ static void issue(unsigned s, const T* g, i64 ld, int mn0, int k0, int MN, int K,
                                                 bool vec, int tid) {
        const int r0 = KIND == MC ? k0 : mn0, c0 = KIND == MC ? mn0 : k0;  // storage origin
        const int rlim = KIND == MC ? K : MN, clim = KIND == MC ? MN : K;
        const int row = tid / CPR, ch = tid % CPR;
        const unsigned dst = s + row * ROWB + ((ch ^ sw(row)) << 4);
        const int col = c0 + ch * VE;
        const T* src = g + (i64)(r0 + row) * ld + col;
        const i64 step = (i64)RSTEP * ld;
        if (vec && r0 + ROWS <= rlim && c0 + CPR * VE <= clim) {
            // A whole tile (all but the edge tiles): 2-3 instructions per 16 bytes.
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) cp16(dst + i * RSTEP * ROWB, src + i * step);
        } else if (vec) {
            // An edge tile: per chunk, the bytes inside the operand, zero fill for the rest.
            const int bytes = max(0, min(VE, clim - col)) * (int)sizeof(T);
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) {
                const bool ok = r0 + row + i * RSTEP < rlim && bytes > 0;
                cp16_zfill(dst + i * RSTEP * ROWB, ok ? (const void*)(src + i * step) : (const void*)g, ok ? bytes : 0);
            }
        } else {
            typedef typename RawOf<sizeof(T)>::type Raw;
            constexpr int PER = 4 / sizeof(T);  // elements per 32-bit word
            const Raw* p = reinterpret_cast<const Raw*>(src);
#pragma unroll 1
            for (int i = 0; i < CHUNKS; ++i) {
                const bool rok = r0 + row + i * RSTEP < rlim;
                unsigned w[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    w[q] = 0;
#pragma unroll
                    for (int e = 0; e < PER; ++e) {
                        const int j = q * PER + e;
                        if (rok && col + j < clim) w[q] |= (unsigned)p[i * step + j] << (8 * sizeof(T) * e);
                    }
                }
                sts128(dst + i * RSTEP * ROWB, w[0], w[1], w[2], w[3]);
            }
        }
    }

    // Where lane l's row address for ldmatrix.x4 lies in an operand tile, for fragment idx
    // of k-step ks (32 bytes of K); the warp's tile starts at m/n row wbase.
    //   A role (idx = m16 tile): matrices (rows 0-7, chunk 0), (rows 8-15, chunk 0),
    //       (rows 0-7, chunk 1), (rows 8-15, chunk 1) -> registers a0..a3.
    //   B role (idx = pair of n8 tiles): (n 0-7, chunk 0), (n 0-7, chunk 1), (n 8-15,
    //       chunk 0), (n 8-15, chunk 1) -> b0, b1 of tile 2 idx, b0, b1 of tile 2 idx + 1.
    // 16-bit MC stores the same matrices transposed (k rows): .trans turns them back.
    // int8 MC (idx = 16 m/n bytes = one chunk, either role): matrix i reads the k rows
    // 16 (i >> 1) + 2 (i & 1) + {0, 1, 4, 5, 8, 9, 12, 13}, so that .trans gives lane
    // (g, t) k 4t, 4t+1 from matrices 0, 2 and 4t+2, 4t+3 from 1, 3 (see regroup_k4).
    // The swizzled offset splits into a per-thread part (frag_base, computed once) and
    // compile-time parts: offset(ks, idx) = (base ^ frag_xor(ks, idx)) + frag_add(ks, idx).
    // That holds because the k-step and idx terms land on bits the base leaves clear: KC:
    // chunk = 2 ks + cc (cc = bit 0), rows idx * 16 apart (a multiple of 8, so row & 7 is
    // idx-free); MC: k rows ks * 32 bytes apart (sw is ks-free), chunk = wbase / VE +
    // (16-bit: 2 idx + cc; int8: idx) with wbase / VE a multiple of the number of chunks
    // the idx span (a power of 2).
    __device__ __forceinline__ static unsigned frag_base(int wbase, int l) {
        if constexpr (MC8) {
            const int i = l >> 3, r = l & 7;
            const int kr = 16 * (i >> 1) + 2 * (i & 1) + (r & 1) + 4 * (r >> 1);
            return kr * ROWB + (((wbase / 16) ^ sw(kr)) << 4);
        } else if constexpr (KIND == MC) {
            const int kr = ROLE_A ? ((l & 7) | ((l >> 4) << 3)) : (l & 15);
            const int cc = ROLE_A ? ((l >> 3) & 1) : (l >> 4);
            return kr * ROWB + (((wbase / 8 + cc) ^ (kr & 7)) << 4);
        } else {
            const int rr = ROLE_A ? (l & 15) : ((l & 7) | ((l >> 4) << 3));
            const int cc = ROLE_A ? (l >> 4) : ((l >> 3) & 1);
            const int row = wbase + rr;
            return row * 128 + ((cc ^ sw(row)) << 4);
        }
    }
    __host__ __device__ static constexpr unsigned frag_xor(int ks, int idx) {
        return KIND == MC ? (unsigned)idx << (MC8 ? 4 : 5) : (unsigned)ks << 5;
    }
    __host__ __device__ static constexpr unsigned frag_add(int ks, int idx) {
        return KIND == MC ? (unsigned)(ks * 32 / (int)sizeof(T) * ROWB) : (unsigned)(idx * 16 * 128);
    }
    // ldmatrix.x4 of fragment idx of k-step ks from the stage at s into r.
    __device__ __forceinline__ static void load(unsigned s, unsigned base, int ks, int idx, unsigned (&r)[4]) {
        ldsm4<TRANS>(s + ((base ^ frag_xor(ks, idx)) + frag_add(ks, idx)), r);
        if constexpr (MC8) regroup_k4<ROLE_A>(r);
    }
};

// ------------------------------------------------------------------ the mma.sync GEMM
// SPLIT: split-K for decode shapes (a few rows, few tiles). Batch entry z is split z of
// K: its operands start ks columns of op(A) / rows of op(B) further on (sA, sB), it
// covers min(ks, K - z * ks) of K, and it stores its fp32 accumulators as they are into
// the M x N slice z of the workspace D (really float*), without alpha, beta or C; then
// gemm_splitk_reduce adds the slices in order and applies the epilogue.
// TMA (sm_90, 16-bit, both operands K-contiguous, not SPLIT): the stages are filled by
// tensor copies instead of cp.async. A stage is one box of each operand, 128 bytes of K by
// BM (A) or BN (B) rows, which the copy engine writes with the 128-byte swizzle: exactly
// the KC arrangement above, so the fragments load as they do from cp.async. Thread 0
// announces the stage's bytes on the stage's mbarrier and issues both copies from the
// tensor maps mapA and mapB (rank 3: the batch is the outer dimension; a broadcast
// operand's map has one entry, read at z = 0); every thread waits on the mbarrier where
// the cp.async path waits for its groups. The copies zero-fill past the edges, so edge
// tiles need no guards. (M/N-contiguous operands stay on cp.async: as 64 x 64 boxes into
// 64-wide blocks they ran 3-5 % slower than cp.async, NOTES 50.)
template <typename T, bool TA, bool TB, int BM, int BN, int WM, int WN, int STAGES, bool SPLIT = false,
          bool TMA = false>
__device__ __forceinline__ void gemm_mma_body(GEMM_PARAMS(T), int ks, const TmaMap* mapA = nullptr,
                                              const TmaMap* mapB = nullptr) {
    typedef typename GemmTypes<T>::Acc Acc;
    typedef typename GemmTypes<T>::Out Out;
    constexpr int WARPS_N = BN / WN, THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int MT = WM / 16, NT = WN / 8, NP = NT / 2, KSTEPS = 4, BK = 128 / sizeof(T);
    typedef Operand<T, TA ? MC : KC, BM, THREADS, true> OpA;
    typedef Operand<T, TB ? KC : MC, BN, THREADS, false> OpB;
    static_assert(!TMA || (!TA && TB && !SPLIT && sizeof(T) == 2 && BM <= 256 && BN <= 256),
                  "the TMA feed: whole 16-bit products, K-contiguous operands, boxes of at most 256 rows");
    // int8 MC fragments interleave their m (A) / n (B) rows: see regroup_k4.
    constexpr bool ROWS_IL = OpA::MC8, COLS_IL = OpB::MC8;
    constexpr int STAGE = OpA::BYTES + OpB::BYTES;
    // Fragment double buffering costs 8 MT + 4 NT registers. With both operands int8 MC
    // (trans_a and a row-major B) the regrouping temporaries on top of that spill on
    // sm_80, so that layout loads each k-step's fragments at its start instead (the other
    // warps of the SM cover the ldmatrix latency).
    constexpr bool FDB = !(OpA::MC8 && OpB::MC8);
    constexpr int NB = FDB ? 2 : 1;
    constexpr int CS_LD = BN + 8;  // epilogue row stride in words: 8 rows of a float2 store -> 2 wavefronts
    static_assert(STAGES >= 2 && WM % 16 == 0 && WN % 16 == 0 && BM % WM == 0 && BN % WN == 0, "tile shape");
    static_assert((MT & (MT - 1)) == 0 && (NP & (NP - 1)) == 0, "frag_xor needs power-of-2 fragment counts");
    static_assert(KSTEPS % 2 == 0, "fragment double buffer parity");

    // The 128-byte swizzle of the tensor copies follows address bits 7-9, so the TMA ring
    // starts at the first 1024-byte boundary (the launcher asks for 1 KB more).
    extern __shared__ __align__(1024) unsigned char gemm_smem[];
    const unsigned raw0 = smem_u32(gemm_smem);
    const unsigned s0 = TMA ? (raw0 + 1023u) & ~1023u : raw0;
    unsigned char* const smem = gemm_smem + (s0 - raw0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const unsigned fa = OpA::frag_base(wm0, lane), fb = OpB::frag_base(wn0, lane);

    // 16-byte paths need every operand of the stack and every row 16-byte aligned.
    const bool a_vec = gemm_vec_ok(A, lda, sA), b_vec = gemm_vec_ok(B, ldb, sB);
    const bool dc_vec = gemm_vec_ok(D, ldd, sD) && (beta == 0 || gemm_vec_ok(C, ldc, sC));
    const int tm = (M + BM - 1) / BM, tn = (N + BN - 1) / BN, tiles = tm * tn;

    // TMA: stage st's mbarrier lies after the ring and the epilogue's staging area (the
    // launcher's mma_smem counts it); one arrival (thread 0's) plus the stage's bytes
    // complete a phase; bit st of `phase` is the parity of the stage's next completion.
    constexpr int RING = STAGES * STAGE, STAGING = BM * CS_LD * (int)sizeof(Acc);
    const unsigned bar0 = s0 + ((RING > STAGING ? RING : STAGING) + 7) / 8 * 8;
    unsigned phase = 0;
    if constexpr (TMA) {
        if (tid == 0)
#pragma unroll
            for (int st = 0; st < STAGES; ++st) mbar_init(bar0 + 8 * st, 1);
        mbar_init_fence();
        __syncthreads();
    }
    auto wait_stage = [&](int st) {
        mbar_wait(bar0 + 8 * st, (phase >> st) & 1u);
        phase ^= 1u << st;
    };

    for (int z = blockIdx.z; z < batch; z += gridDim.z) {
        const int za = sA != 0 ? z : 0, zb = sB != 0 ? z : 0;  // tensor-map batch coordinates
        const T* Az = A + z * sA;
        const T* Bz = B + z * sB;
        const int Kz = SPLIT ? min(ks, K - z * ks) : K;
        const int KT = (Kz + BK - 1) / BK;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            int pm, pn;
            tile_coords<8>(tile, tm, tn, pm, pn);
            const int m0 = pm * BM, n0 = pn * BN;

            Acc acc[MT][NT][4];
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int q = 0; q < 4; ++q) acc[i][j][q] = 0;

            unsigned af[NB][MT][4], bf[NB][NP][4];  // (double-buffered) fragments

            // Start the copies of k-tile kt into stage st (cp.async; TMA: see above).
            auto issue = [&](int kt, int st) {
                const unsigned sa = s0 + st * STAGE, sb = sa + OpA::BYTES;
                if constexpr (TMA) {
                    if (tid == 0) {
                        const unsigned bar = bar0 + 8 * st;
                        mbar_arrive_tx(bar, STAGE);
                        tma_load_3d(sa, mapA, kt * BK, m0, za, bar);
                        tma_load_3d(sb, mapB, kt * BK, n0, zb, bar);
                    }
                } else {
                    OpA::issue(sa, Az, lda, m0, kt * BK, M, Kz, a_vec, tid);
                    OpB::issue(sb, Bz, ldb, n0, kt * BK, N, Kz, b_vec, tid);
                }
            };
            auto load_frags = [&](int buf, int st, int ks) {
                const unsigned sa = s0 + st * STAGE, sb = sa + OpA::BYTES;
#pragma unroll
                for (int i = 0; i < MT; ++i) OpA::load(sa, fa, ks, i, af[buf][i]);
#pragma unroll
                for (int j = 0; j < NP; ++j) OpB::load(sb, fb, ks, j, bf[buf][j]);
            };

            // Prologue: k-tiles 0 .. STAGES-2 into stages 0 .. STAGES-2, one commit group
            // per k-tile (empty past KT) so that wait_group counts stay uniform.
#pragma unroll 1
            for (int st = 0; st < STAGES - 1; ++st) {
                if (st < KT) issue(st, st);
                if constexpr (!TMA) cp_commit();
            }
            if constexpr (TMA) {
                if (KT > 0) wait_stage(0);
            } else {
                cp_wait<STAGES - 2>();
            }
            __syncthreads();
            if constexpr (FDB) load_frags(0, 0, 0);

            int rs = 0, ws = STAGES - 1;  // stage read this iteration, stage refilled
            for (int kt = 0; kt < KT; ++kt) {
                // Refill the stage k-tile kt-1 used (every warp finished reading it before
                // the previous barrier) with k-tile kt + STAGES - 1.
                const int nk = kt + STAGES - 1;
                if (nk < KT) issue(nk, ws);
                if constexpr (!TMA) cp_commit();
#pragma unroll
                for (int ks = 0; ks < KSTEPS; ++ks) {
                    if constexpr (!FDB) load_frags(0, rs, ks);  // before the barrier moves rs
                    if (ks == KSTEPS - 1) {
                        // k-tile kt+1 has landed (groups retire in order; the STAGES-2
                        // younger ones may still fly; TMA: its stage's mbarrier); the
                        // barrier publishes it and retires every warp's reads of tile kt's
                        // fragments except the last k-step's, already in registers.
                        if constexpr (TMA) {
                            if (kt + 1 < KT) wait_stage(rs + 1 == STAGES ? 0 : rs + 1);
                        } else {
                            cp_wait<STAGES - 2>();
                        }
                        __syncthreads();
                        rs = rs + 1 == STAGES ? 0 : rs + 1;
                        ws = ws + 1 == STAGES ? 0 : ws + 1;
                    }
                    // The next k-step's fragments (the next tile's first after the
                    // barrier) load while this k-step's mma issue.
                    if constexpr (FDB) load_frags((ks + 1) & 1, rs, (ks + 1) % KSTEPS);
                    const int cur = FDB ? (ks & 1) : 0;
#pragma unroll
                    for (int i = 0; i < MT; ++i)
#pragma unroll
                        for (int j = 0; j < NT; ++j)
                            mma_tile<T>(acc[i][j], af[cur][i], bf[cur][j >> 1][(j & 1) * 2],
                                        bf[cur][j >> 1][(j & 1) * 2 + 1]);
                }
            }

            // Epilogue: accumulators -> shared memory (fp32 / int32, rows padded to
            // BN + 8 words) -> each thread takes 16 bytes of output of one row: a 16-byte
            // C load and D store when aligned and inside N, guarded elements otherwise.
            // Fragment row g / g+8 is tile row g / g+8, or 2g / 2g+1 when ROWS_IL; with
            // COLS_IL the n8 tile pair (2p, 2p+1) holds columns 16p + 4t + {0, 2} and
            // {1, 3}: four consecutive words per row, stored together.
            if constexpr (!TMA) cp_wait<0>();  // (TMA: every fill was waited for)
            __syncthreads();  // every warp is done reading the ring
            Acc* cs = reinterpret_cast<Acc*>(smem);
            const int g = lane >> 2, t = lane & 3;
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int r0 = wm0 + i * 16 + (ROWS_IL ? 2 * g : g), r1 = r0 + (ROWS_IL ? 1 : 8);
                if constexpr (COLS_IL) {
#pragma unroll
                    for (int p = 0; p < NP; ++p) {
                        const int c = wn0 + p * 16 + 4 * t;
                        const Acc(&e)[4] = acc[i][2 * p];
                        const Acc(&o)[4] = acc[i][2 * p + 1];
                        *reinterpret_cast<uint4*>(cs + r0 * CS_LD + c) =
                            make_uint4(to_bits(e[0]), to_bits(o[0]), to_bits(e[1]), to_bits(o[1]));
                        *reinterpret_cast<uint4*>(cs + r1 * CS_LD + c) =
                            make_uint4(to_bits(e[2]), to_bits(o[2]), to_bits(e[3]), to_bits(o[3]));
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        const int c = wn0 + j * 8 + 2 * t;
                        *reinterpret_cast<uint2*>(cs + r0 * CS_LD + c) =
                            make_uint2(to_bits(acc[i][j][0]), to_bits(acc[i][j][1]));
                        *reinterpret_cast<uint2*>(cs + r1 * CS_LD + c) =
                            make_uint2(to_bits(acc[i][j][2]), to_bits(acc[i][j][3]));
                    }
                }
            }
            __syncthreads();
            if constexpr (SPLIT) {
                // fp32 partials, 4 to a 16-byte store (rows of N floats: aligned when N % 4 == 0)
                constexpr int TPR = BN / 4, RPP = THREADS / TPR;
                const int cc = (tid % TPR) * 4, n = n0 + cc;
                float* W = reinterpret_cast<float*>(D) + z * (i64)M * N;
                if (n < N) {
                    for (int r = tid / TPR; r < BM && m0 + r < M; r += RPP) {
                        const float* v = reinterpret_cast<const float*>(cs + r * CS_LD + cc);
                        float* w = W + (i64)(m0 + r) * N + n;
                        if ((N & 3) == 0) {
                            *reinterpret_cast<float4*>(w) = *reinterpret_cast<const float4*>(v);
                        } else {
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                if (n + e < N) w[e] = v[e];
                        }
                    }
                }
                __syncthreads();  // the next tile's prologue overwrites cs
                continue;
            }
            constexpr int OV = 16 / sizeof(Out);  // outputs per 16-byte store
            constexpr int TPR = BN / OV, RPP = THREADS / TPR;
            static_assert(THREADS % TPR == 0, "epilogue rows");
            const int cc = (tid % TPR) * OV, n = n0 + cc;
            if (n < N) {
                for (int r = tid / TPR; r < BM && m0 + r < M; r += RPP) {
                    const i64 m = m0 + r;
                    Acc v[OV];
#pragma unroll
                    for (int q = 0; q < OV; q += 4) {
                        const uint4 w = *reinterpret_cast<const uint4*>(cs + r * CS_LD + cc + q);
                        v[q] = from_bits<Acc>(w.x);
                        v[q + 1] = from_bits<Acc>(w.y);
                        v[q + 2] = from_bits<Acc>(w.z);
                        v[q + 3] = from_bits<Acc>(w.w);
                    }
                    Out* d = D + z * sD + m * ldd + n;
                    const Out* c = C + z * sC + m * ldc + n;
                    if (dc_vec && n + OV <= N) {
                        uint4 cin = make_uint4(0, 0, 0, 0), o;
                        if (beta != 0) cin = *reinterpret_cast<const uint4*>(c);  // C may alias D: read first
                        const Out* ce = reinterpret_cast<const Out*>(&cin);
                        Out* oe = reinterpret_cast<Out*>(&o);
#pragma unroll
                        for (int e = 0; e < OV; ++e) oe[e] = gemm_epilogue<T>(v[e], ce + e, alpha, beta);
                        *reinterpret_cast<uint4*>(d) = o;
                    } else {
#pragma unroll
                        for (int e = 0; e < OV; ++e)
                            if (n + e < N) d[e] = gemm_epilogue<T>(v[e], c + e, alpha, beta);
                    }
                }
            }
            // TMA: this thread's shared-memory accesses (generic proxy) come before the
            // next tile's tensor copies (async proxy) into the same bytes.
            if constexpr (TMA) fence_proxy_async();
            __syncthreads();  // the next tile's prologue overwrites cs
        }
    }
}

// ------------------------------------------------------------------ wmma
#if !__has_include(<crt/mma.h>)
// The subset of nvcuda::wmma gemm_wmma uses (m16n16k16, __half / __nv_bfloat16 inputs,
// float accumulators), on the builtins crt/mma.hpp wraps: layout codes 0 = row-major,
// 1 = column-major for loads and stores; for mma, 2 * (A col-major) + (B col-major).
namespace wmma_lite {
struct matrix_a;
struct matrix_b;
struct accumulator;
struct row_major;
struct col_major;
enum layout_t { mem_row_major, mem_col_major };
template <typename L> struct is_col { static constexpr int value = 0; };
template <> struct is_col<col_major> { static constexpr int value = 1; };

template <typename Use, int M_, int N_, int K_, typename T, typename L = void> struct fragment;
// fp16 operand fragments take 8 registers (16 halves), bf16 ones 4 (8 values), as in mma.h.
template <typename Use, typename T, typename L> struct fragment<Use, 16, 16, 16, T, L> {
    int x[IsF16<T>::value ? 8 : 4];
};
template <> struct fragment<accumulator, 16, 16, 16, float, void> {
    float x[8];
};

__device__ __forceinline__ void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) {
#pragma unroll
    for (int i = 0; i < 8; ++i) f.x[i] = v;
}
template <typename T, typename L>
__device__ __forceinline__ void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
    if constexpr (IsF16<T>::value) __hmma_m16n16k16_ld_a(f.x, (const int*)p, ldm, is_col<L>::value);
    else __mma_bf16_m16n16k16_ld_a(f.x, (const int*)p, ldm, is_col<L>::value);
}
template <typename T, typename L>
__device__ __forceinline__ void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
    if constexpr (IsF16<T>::value) __hmma_m16n16k16_ld_b(f.x, (const int*)p, ldm, is_col<L>::value);
    else __mma_bf16_m16n16k16_ld_b(f.x, (const int*)p, ldm, is_col<L>::value);
}
template <typename T, typename LA, typename LB>
__device__ __forceinline__ void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                                         const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                                         const fragment<matrix_b, 16, 16, 16, T, LB>& b,
                                         const fragment<accumulator, 16, 16, 16, float>& c) {
    constexpr int code = 2 * is_col<LA>::value + is_col<LB>::value;
    if constexpr (IsF16<T>::value) __hmma_m16n16k16_mma_f32f32(d.x, a.x, b.x, c.x, code, 0);
    else __mma_bf16_m16n16k16_mma_f32(d.x, a.x, b.x, c.x, code, 0);
}
__device__ __forceinline__ void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                                                  unsigned ldm, layout_t layout) {
    if (layout == mem_row_major) __hmma_m16n16k16_st_c_f32(p, (float*)f.x, ldm, 0);
    else __hmma_m16n16k16_st_c_f32(p, (float*)f.x, ldm, 1);
}
}  // namespace wmma_lite
#endif

template <bool COL> struct WLayout { typedef CUOPS_WMMA_NS::row_major type; };
template <> struct WLayout<true> { typedef CUOPS_WMMA_NS::col_major type; };


// Stage the ROWS x COLS storage tile at (r0, c0) of g (leading dimension ld; rlim x clim
// valid) into s (row stride LD): 16-byte loads for a whole tile of an aligned operand,
// guarded element loads (zero fill) otherwise.
template <int ROWS, int COLS, int LD, int THREADS>
__device__ __forceinline__ void wmma_stage(unsigned short* s, const unsigned short* g, i64 ld, int r0, int c0,
                                           int rlim, int clim, bool vec, int tid) {
    constexpr int VE = 8, CPR = COLS / VE;
    if (vec && r0 + ROWS <= rlim && c0 + COLS <= clim) {
        for (int v = tid; v < ROWS * CPR; v += THREADS) {
            const int r = v / CPR, c = (v % CPR) * VE;
            *reinterpret_cast<uint4*>(s + r * LD + c) = __ldg(reinterpret_cast<const uint4*>(g + (i64)(r0 + r) * ld + c0 + c));
        }
    } else {
        for (int e = tid; e < ROWS * COLS; e += THREADS) {
            const int r = e / COLS, c = e % COLS;
            s[r * LD + c] = (r0 + r < rlim && c0 + c < clim) ? g[(i64)(r0 + r) * ld + c0 + c] : (unsigned short)0;
        }
    }
}

}  // namespace gmma

// ---------------------------------------------------------------------------- kernels
// gemm_wmma: 64x64 block tile, 4 warps in 2x2 of 32x32 (2x2 wmma fragments each), BK = 32.
// Tiles sit in shared memory as they lie in global memory, rows padded by 8 elements (16
// bytes: keeps wmma's 32-byte pointer alignment, shifts the banks row to row); wmma's
// row_major / col_major loads cover the transposed layouts.
template <typename T, bool TA, bool TB>
__global__ void __launch_bounds__(128) gemm_wmma(GEMM_PARAMS(T)) {
    namespace wmma = CUOPS_WMMA_NS;
    constexpr int BM = 64, BN = 64, BK = 32, PAD = 8, THREADS = 128;
    // A: !TA -> [BM][BK + PAD] (m rows), TA -> [BK][BM + PAD] (k rows); B likewise.
    constexpr int A_ROWS = TA ? BK : BM, A_COLS = TA ? BM : BK, A_LD = A_COLS + PAD;
    constexpr int B_ROWS = TB ? BN : BK, B_COLS = TB ? BK : BN, B_LD = B_COLS + PAD;
    constexpr int C_LD = BN + 4;
    __shared__ __align__(128) unsigned short As[A_ROWS * A_LD];
    __shared__ __align__(128) unsigned short Bs[B_ROWS * B_LD];
    __shared__ __align__(128) float Cs[BM * C_LD];
    typedef typename gmma::WLayout<TA>::type LayA;
    typedef typename gmma::WLayout<TB>::type LayB;

    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const bool a_vec = gemm_vec_ok(A, lda, sA), b_vec = gemm_vec_ok(B, ldb, sB);
    const int tm = (M + BM - 1) / BM, tn = (N + BN - 1) / BN, tiles = tm * tn;
    const T* As_t = reinterpret_cast<const T*>(As);
    const T* Bs_t = reinterpret_cast<const T*>(Bs);

    for (int z = blockIdx.z; z < batch; z += gridDim.z) {
        const unsigned short* Az = reinterpret_cast<const unsigned short*>(A + z * sA);
        const unsigned short* Bz = reinterpret_cast<const unsigned short*>(B + z * sB);
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            int pm, pn;
            gmma::tile_coords<8>(tile, tm, tn, pm, pn);
            const int m0 = pm * BM, n0 = pn * BN;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);

            for (int k0 = 0; k0 < K; k0 += BK) {
                // storage coordinates: A is (m, k) when !TA, (k, m) when TA; B is (k, n)
                // when !TB, (n, k) when TB.
                gmma::wmma_stage<A_ROWS, A_COLS, A_LD, THREADS>(As, Az, lda, TA ? k0 : m0, TA ? m0 : k0, TA ? K : M,
                                                                TA ? M : K, a_vec, tid);
                gmma::wmma_stage<B_ROWS, B_COLS, B_LD, THREADS>(Bs, Bz, ldb, TB ? n0 : k0, TB ? k0 : n0, TB ? N : K,
                                                                TB ? K : N, b_vec, tid);
                __syncthreads();
#pragma unroll
                for (int kk = 0; kk < BK; kk += 16) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayA> fa[2];
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayB> fb[2];
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const int m = wm + i * 16;
                        // row_major: (m, k) at m * ld + k; col_major: (m, k) at k * ld + m
                        wmma::load_matrix_sync(fa[i], TA ? As_t + kk * A_LD + m : As_t + m * A_LD + kk, A_LD);
                    }
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const int n = wn + j * 16;
                        // row_major: (k, n) at k * ld + n; col_major: (k, n) at n * ld + k
                        wmma::load_matrix_sync(fb[j], TB ? Bs_t + n * B_LD + kk : Bs_t + kk * B_LD + n, B_LD);
                    }
#pragma unroll
                    for (int i = 0; i < 2; ++i)
#pragma unroll
                        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
                }
                __syncthreads();
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    wmma::store_matrix_sync(Cs + (wm + i * 16) * C_LD + wn + j * 16, acc[i][j], C_LD,
                                            wmma::mem_row_major);
            __syncthreads();
            // Consecutive threads take consecutive n: coalesced C reads and D writes.
            for (int e = tid; e < BM * BN; e += THREADS) {
                const int r = e / BN, c = e % BN, m = m0 + r, n = n0 + c;
                if (m < M && n < N)
                    D[z * sD + (i64)m * ldd + n] =
                        gemm_epilogue<T>(Cs[r * C_LD + c], C + z * sC + (i64)m * ldc + n, alpha, beta);
            }
            __syncthreads();  // Cs is rewritten by the next tile
        }
    }
}

// gemm_mma: float16 / bfloat16, fp32 accumulation. See the ladder at the top.
template <typename T, bool TA, bool TB, int BM, int BN, int WM, int WN, int STAGES, int MINB>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, MINB) gemm_mma(GEMM_PARAMS(T)) {
    static_assert(sizeof(T) == 2, "gemm_mma is the 16-bit rung; int8 is gemm_mma_s8");
    gmma::gemm_mma_body<T, TA, TB, BM, BN, WM, WN, STAGES>(A, B, C, D, M, N, K, lda, ldb, ldc, ldd, sA, sB, sC, sD,
                                                           batch, alpha, beta, K);
}

// gemm_mma_tma: gemm_mma with its stages filled by sm_90 tensor copies (see TMA above),
// for A stored M x K and B stored N x K (TA = false, TB = true: x @ W^T with W as a linear
// layer stores it). mapA and mapB describe them as rank-3 tensors of 16-bit elements,
// innermost first (K, M, batch) and (K, N, batch), with the 128-byte swizzle and boxes of
// 64 x BM and 64 x BN x 1; _gemm_mma.tma_maps builds them. The launcher runs it on sm_90
// and later only, with both operands 16-byte aligned; compiled for an earlier target it
// traps.
template <typename T, bool TA, bool TB, int BM, int BN, int WM, int WN, int STAGES, int MINB>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, MINB)
    gemm_mma_tma(GEMM_PARAMS(T), const __grid_constant__ cuops::TmaMap mapA, const __grid_constant__ cuops::TmaMap mapB) {
    static_assert(sizeof(T) == 2, "the TMA feed is instantiated for the 16-bit types");
#if __CUDA_ARCH__ >= 900
    gmma::gemm_mma_body<T, TA, TB, BM, BN, WM, WN, STAGES, false, true>(
        A, B, C, D, M, N, K, lda, ldb, ldc, ldd, sA, sB, sC, sD, batch, alpha, beta, K, &mapA, &mapB);
#else
    __trap();
#endif
}

// gemm_mma_splitk: the split-K pass of gemm_mma for decode shapes (float16 / bfloat16,
// one product, batch entries = splits of ks; see SPLIT above). W: S x M x N floats.
template <typename T, bool TA, bool TB, int BM, int BN, int WM, int WN, int STAGES, int MINB>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, MINB)
    gemm_mma_splitk(const T* __restrict__ A, const T* __restrict__ B, float* __restrict__ W, int M, int N, int K,
                    cuops::i64 lda, cuops::i64 ldb, int ks, int S) {
    static_assert(sizeof(T) == 2, "split-K is instantiated for the 16-bit types");
    typedef typename GemmTypes<T>::Out Out;
    const cuops::i64 sA = TA ? ks * lda : ks, sB = TB ? ks : ks * ldb;
    gmma::gemm_mma_body<T, TA, TB, BM, BN, WM, WN, STAGES, true>(
        A, B, nullptr, reinterpret_cast<Out*>(W), M, N, K, lda, ldb, 0, N, sA, sB, 0, 0, S, 1.f, 0.f, ks);
}

// D = alpha * (sum of the S partial slices of W, added in order 0..S-1) + beta * C: the
// split-K finish, deterministic (no atomics). Consecutive threads take consecutive
// columns of a row, so every slice is read coalesced.
template <typename T>
__global__ void gemm_splitk_reduce(const float* __restrict__ W, const typename GemmTypes<T>::Out* C,
                                   typename GemmTypes<T>::Out* D, int M, int N, int S, cuops::i64 ldc,
                                   cuops::i64 ldd, typename GemmTypes<T>::Scalar alpha,
                                   typename GemmTypes<T>::Scalar beta) {
    const cuops::i64 MN = (cuops::i64)M * N;
    for (cuops::i64 e = blockIdx.x * (cuops::i64)blockDim.x + threadIdx.x; e < MN;
         e += (cuops::i64)gridDim.x * blockDim.x) {
        float acc = 0.f;
        for (int z = 0; z < S; ++z) acc += __ldcs(W + z * MN + e);
        const cuops::i64 m = e / N, n = e - m * N;
        D[m * ldd + n] = gemm_epilogue<T>(acc, C + m * ldc + n, alpha, beta);
    }
}

// gemm_mma_s8: int8 in, int32 out, exact (wrapping) integer arithmetic.
template <bool TA, bool TB, int BM, int BN, int WM, int WN, int STAGES, int MINB>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, MINB) gemm_mma_s8(GEMM_PARAMS(signed char)) {
    gmma::gemm_mma_body<signed char, TA, TB, BM, BN, WM, WN, STAGES>(A, B, C, D, M, N, K, lda, ldb, ldc, ldd, sA, sB,
                                                                     sC, sD, batch, alpha, beta, K);
}
