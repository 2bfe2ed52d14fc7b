// gemm_simt.cu: D = alpha * op(A) @ op(B) + beta * C on the CUDA cores (FFMA, no tensor
// cores), under the contract of gemm_common.cuh (GEMM_PARAMS, the four layouts, BLAS beta).
//
// Work that must be done: 2*M*N*K flops. An H200 issues 132 SMs x 128 FFMA/clk x 2 flops
// x ~1.98 GHz = ~67 TFLOP/s of fp32; cuBLAS (TF32 off) sustains ~51. Every FFMA needs two
// operands, so the ladder is about how far each operand is reused from where it sits:
//   1. gemm_naive      one thread per output, a plain K loop straight from global memory
//                      (each element of A and B fetched N resp. M times, through L1/L2).
//                      Any T: float, __half, __nv_bfloat16, signed char (int8 -> int32);
//                      the universal reference rung.
//   2. gemm_tiled      32x32 tiles of A and B staged in shared memory, one output per
//                      thread: each global load now feeds 32 FMAs (the textbook step), but
//                      every FMA still costs a shared-memory load.
//   3. gemm_regblock   128x128 block tile, 8x8 outputs per thread as outer products from
//                      registers: 16 floats read from shared memory (4 LDS.128) feed 64
//                      FFMAs; the A tile is stored k-major so both fragments are 16-byte
//                      reads, lanes interleaved so each costs 2 clocks of shared-memory
//                      bandwidth, not 4; 16-byte global loads when aligned. Load, barrier,
//                      compute, barrier: memory latency is still exposed between tiles.
//   4. gemm_pipelined  the same thread tiles fed by a STAGES-deep ring of shared-memory
//                      tiles filled with cp.async (no staging registers, copies in flight
//                      while computing), register fragments double-buffered (the k+1 LDS
//                      issue under the FFMAs of k), one barrier per BK slice, grouped block
//                      order for L2 reuse, 16-byte epilogue stores.
//
// Launch geometry (the launcher in cupyops/ops/_gemm_simt.py computes it):
//   gemm_naive      block (16, 16): x -> n (stores coalesce), y -> m;
//                   grid (cdiv(N, 16), min(cdiv(M, 16), 65535), batch'); rows past
//                   gridDim.y * 16 loop.
//   gemm_tiled      block (32, 32); grid (cdiv(N, 32), min(cdiv(M, 32), 65535), batch').
//   gemm_regblock   block 256; grid (cdiv(M, 128) * cdiv(N, 128), 1, batch'); 8448 B
//                   static shared memory.
//   gemm_pipelined  <BM, BN, BK, STAGES, TM, TN>: block SimtTile::THREADS =
//                   32 * (BM / (4 TM)) * (BN / (8 TN)); grid (cdiv(M, BM) * cdiv(N, BN), 1,
//                   batch'); dynamic shared memory STAGES * BK * (BM + 4 + BN + 4) * 4 B.
//   batch' = min(batch, 65535): every kernel loops z over the rest of the stack, and the
//   1-D tile grids loop over tiles past gridDim.x.
#include "gemm_common.cuh"

using namespace cuops;

namespace simt {

// acc + a * b in the accumulator type: one fp32 FMA, or int32 arithmetic that wraps
// (done in unsigned: signed overflow would be undefined behaviour).
__device__ __forceinline__ float mac(float acc, float a, float b) { return fmaf(a, b, acc); }
__device__ __forceinline__ int mac(int acc, int a, int b) {
    return static_cast<int>(static_cast<unsigned>(acc) + static_cast<unsigned>(a) * static_cast<unsigned>(b));
}

template <typename T> struct is_float { static constexpr bool value = false; };
template <> struct is_float<float> { static constexpr bool value = true; };

// (smem_u32, cp16, cp16_zfill, cp_commit, cp_wait: ptx.cuh)
// 4-byte cp.async, plain and with zero fill (as cp16_zfill); 4-byte copies must be .ca.
__device__ __forceinline__ void cp4(unsigned dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp4_zfill(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// Hide a value from the optimizer, so that what a loop computes from it stays in the loop
// (recomputed with a couple of integer ops) instead of being hoisted into registers.
__device__ __forceinline__ i64 opaque(i64 v) {
    asm volatile("" : "+l"(v));
    return v;
}

// ------------------------------------------------------------------ the thread tile
// Shared with gemm_regblock and gemm_pipelined. A warp computes a (4 TM) x (8 TN) tile with
// its lanes as a 4 x 8 grid (lm, ln); a lane owns TM x TN outputs made of (TM/4) x (TN/4)
// sub-blocks of 4x4: rows lm*4 + 16*si + (0..3), columns ln*4 + 32*sj + (0..3).
// Why sub-blocks instead of TM contiguous rows: one k-row of the fragments is then whole
// 16-byte LDS.128 reads in which the distinct addresses of one instruction are consecutive
// 16-byte words (A: 4 words = 64 B, B: 8 words = 128 B, every bank at most once: no
// conflicts), and the epilogue's 8 lanes of a row write 128 contiguous bytes.
// Why this lane order (CUTLASS's RowMajorInterleaved<2> lane layout): shared memory returns
// 128 B a clock, so an LDS.128 to 32 lanes costs 4 clocks however few distinct addresses
// it has, unless every lane pair (n, n^1), or every pair (n, n^2), reads the same address:
// then 2 (NVIDIA's description for sm_70/75 on its forum, "Unexpected shared memory bank
// conflict"; CUTLASS picks this lane layout for its SIMT GEMMs on every architecture).
// With lm = b0 + 2 b4 and ln = b1 + 2 b2 + 4 b3 of the lane's bits, A reads (one address
// per lm) pair up over n^2 and B reads (one per ln) over n^1: every fragment read costs 2
// clocks, not 4. Why it matters: an 8x8 thread tile reads 16 floats per 64 FFMAs, i.e.
// 128 FFMA/clk x 16/64 x 4 B = 128 B/clk for the whole SM at full FFMA rate, which is all
// of shared memory's return bandwidth at 4 clocks per LDS.128 and half of it at 2.
__device__ __forceinline__ int lane_m(int lane) { return (lane & 1) | ((lane >> 3) & 2); }
__device__ __forceinline__ int lane_n(int lane) { return (lane >> 1) & 7; }
// The block is (BM / WM) x (BN / WN) warps, warp w at (w / WARPS_N, w % WARPS_N).
template <int BM, int BN, int TM, int TN> struct SimtTile {
    static constexpr int WM = 4 * TM, WN = 8 * TN;
    static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    // 64K registers per SM: up to 64 accumulators a thread, ask for the blocks that fit
    // with <= 128 registers (two 256-thread blocks per SM, whose barriers then overlap);
    // 128 accumulators need ~200 registers: one block.
    static constexpr int MIN_BLOCKS = TM * TN >= 128 ? 1 : 65536 / 128 / THREADS;
    // Shared tiles are k-major, As[k][m] and Bs[k][n]; rows padded by 4 floats (16 B, so
    // rows stay 16-byte aligned). The pad makes the row stride = 4 banks mod 32, which
    // makes the transposing 4-byte copies (8 k x 4 m per warp instruction) conflict-free:
    // bank = 4k + m mod 32 takes each value once.
    static constexpr int LDS_A = BM + 4, LDS_B = BN + 4;
    static_assert(TM % 4 == 0 && TN % 4 == 0, "thread tiles are 4x4 sub-blocks");
    static_assert(WARPS_M * WM == BM && WARPS_N * WN == BN, "block tile = whole warp tiles");
};

// Fragments of one k: a[si*4 + i] = As[k][wm0 + lm*4 + 16 si + i] (as_k points at the
// first), b likewise with sub-blocks 32 columns apart.
template <int TM, int TN>
__device__ __forceinline__ void load_frag(float (&a)[TM], float (&b)[TN], const float* as_k, const float* bs_k) {
#pragma unroll
    for (int s = 0; s < TM / 4; ++s) {
        const float4 v = *reinterpret_cast<const float4*>(as_k + 16 * s);
        a[4 * s + 0] = v.x, a[4 * s + 1] = v.y, a[4 * s + 2] = v.z, a[4 * s + 3] = v.w;
    }
#pragma unroll
    for (int s = 0; s < TN / 4; ++s) {
        const float4 v = *reinterpret_cast<const float4*>(bs_k + 32 * s);
        b[4 * s + 0] = v.x, b[4 * s + 1] = v.y, b[4 * s + 2] = v.z, b[4 * s + 3] = v.w;
    }
}

template <int TM, int TN>
__device__ __forceinline__ void outer(float (&acc)[TM][TN], const float (&a)[TM], const float (&b)[TN]) {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
}

// D = alpha * acc + beta * C for a lane's TM x TN outputs; (row0, col0) is the lane's first
// output. Each 4-column run is one 16-byte store when D allows it (the run starts at a
// multiple of 4 columns) and lies inside N; C is read element by element, and only by
// gemm_epilogue when beta != 0, before the store (C may alias D).
template <typename T, int TM, int TN>
__device__ __forceinline__ void store_tile(const float (&acc)[TM][TN], const float* C, float* D, int M, int N,
                                           i64 ldc, i64 ldd, int row0, int col0, float alpha, float beta,
                                           bool d_vec) {
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + (i & 3) + 16 * (i >> 2);
        if (r >= M) continue;
        const float* c = C + (i64)r * ldc;
        float* d = D + (i64)r * ldd;
#pragma unroll
        for (int s = 0; s < TN / 4; ++s) {
            const int col = col0 + 32 * s;
            if (d_vec && col + 3 < N) {
                float4 v;
                v.x = gemm_epilogue<T>(acc[i][4 * s + 0], c + col + 0, alpha, beta);
                v.y = gemm_epilogue<T>(acc[i][4 * s + 1], c + col + 1, alpha, beta);
                v.z = gemm_epilogue<T>(acc[i][4 * s + 2], c + col + 2, alpha, beta);
                v.w = gemm_epilogue<T>(acc[i][4 * s + 3], c + col + 3, alpha, beta);
                *reinterpret_cast<float4*>(d + col) = v;
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (col + j < N) d[col + j] = gemm_epilogue<T>(acc[i][4 * s + j], c + col + j, alpha, beta);
            }
        }
    }
}

// Tile t of a tiles_m x tiles_n grid of block tiles, in groups of GROUP tile-rows:
// consecutive blocks walk down the GROUP tile-rows of a group before moving one tile-column
// right, so the ~264 blocks resident at once work on ~8 row panels of A and ~33 column
// panels of B (instead of 2-3 rows x all columns), and each k-slice they fetch into L2 is
// reused by many blocks. The last group may have fewer rows; the map stays a bijection.
template <int GROUP>
__device__ __forceinline__ void grouped_tile(unsigned t, unsigned tiles_m, unsigned tiles_n, int& tm, int& tn) {
    const unsigned per_group = GROUP * tiles_n, group = t / per_group, first = group * GROUP;
    const unsigned rows = min(tiles_m - first, static_cast<unsigned>(GROUP)), r = t - group * per_group;
    tm = static_cast<int>(first + r % rows);
    tn = static_cast<int>(r / rows);
}

// ------------------------------------------------------------------ tile copies
// One BK-slice of operand X into the k-major shared tile S[k][mn] (row stride LDS):
// S[k][mn] = X(mn0 + mn, k0 + k), zero outside mn < MNd, k < K, where
// X(mn, k) = MN_CONTIG ? x[k * ld + mn] : x[mn * ld + k]. A is X with MN_CONTIG = TA,
// B with MN_CONTIG = !TB.
//
// cp.async cannot transpose a 16-byte word, so an operand whose K is contiguous (A when
// !TA, the `a @ b` case; B when TB) is copied as 4-byte elements, each to its transposed
// place: a warp instruction covers 8 consecutive k (32 B, one sector of a row) x 4
// consecutive rows, and writes 32 distinct banks (see LDS_A). Why not keep such a tile
// [m][k] and transpose nothing: a thread's A fragment for one k is then 8 floats from 8
// different rows, i.e. 8 LDS.32 per k instead of 2 LDS.128 (or LDS.128 along k giving 4 k
// at once: 32 fragment registers instead of 8, which with 64 accumulators breaks the
// 128-register budget of two blocks per SM); and the 4 rows, 4 apart, that a warp reads
// at once share at most 2 bank quads for any 16-byte-multiple row stride (2-way conflicts
// at best, without a swizzle). Why not transpose through registers
// (LDG.128 then 4 STS.32): that needs the loaded values parked in registers across a
// whole tile of compute, and the loads can then be at most one tile ahead. The 4-byte
// copies cost BM*BK/THREADS = 4 (BK = 8) cp.async per 512 FFMAs of a thread and keep the
// whole multi-stage ring asynchronous.
template <bool MN_CONTIG, int BMN, int BK, int LDS, int THREADS>
struct AsyncTileCopy {
    // MN_CONTIG: a thread copies PER 16-byte words (4 mn at one k) of column c =
    //   4 (tid % CH), k rows tid / CH + i KSTEP: a warp instruction writes whole rows of
    //   consecutive words (no conflicts) and reads whole 128-byte lines.
    // else: PER elements, rows tid / 8 + RPI ri, k = tid % 8 + 8 kg: a warp instruction
    //   reads 8 consecutive k (32 B) of 4 consecutive rows; bank 4k + m: each bank once.
    static constexpr int CH = BMN / 4, KSTEP = THREADS / CH;
    static constexpr int RPI = THREADS / 8, ROWS_I = BMN / RPI;
    static_assert(MN_CONTIG ? (THREADS % CH == 0 && BK % KSTEP == 0)
                            : (THREADS % 8 == 0 && BMN % RPI == 0 && BK % 8 == 0),
                  "the copy map covers the tile exactly");
    // Registers are the budget (2 blocks/SM = 128 a thread, 96 of them fragments and
    // accumulators), so the state is one pointer and three ints; every per-copy address
    // is rebuilt from it with a running pointer (two IADDs), and `ld` goes through
    // opaque() so the compiler cannot hoist one 64-bit address per copy out of the loop.
    const float* p;  // the thread's first element of slice 0
    int krem;        // K - the thread's first k: copy at slice k0 + dk is inside iff k0 + dk < krem
    int mnrem;       // MN_CONTIG: valid elements of the thread's word column (0..4);
                     // else: rows left from the thread's first row
    unsigned soff;   // byte offset of the thread's first element in the shared tile

    __device__ __forceinline__ AsyncTileCopy(const float* x, i64 ld, int mn0, int mnd, int K) {
        const int tid = threadIdx.x;
        if constexpr (MN_CONTIG) {
            const int kr = tid / CH, c = (tid % CH) * 4;
            p = x + (i64)kr * ld + mn0 + c;
            krem = K - kr;
            mnrem = max(0, min(4, mnd - mn0 - c));
            soff = 4 * (kr * LDS + c);
        } else {
            const int rr = tid / 8, kl = tid % 8;
            p = x + (i64)(mn0 + rr) * ld + kl;
            krem = K - kl;
            mnrem = mnd - mn0 - rr;
            soff = 4 * (kl * LDS + rr);
        }
    }

    // Start the copies of the slice at k0 into the tile at shared byte address s.
    // Out-of-range copies have src-size 0: nothing is read, whatever the pointer. `full`
    // (uniform per block): the tile lies inside the matrix along M/N and the slice along
    // K, so no copy needs its bounds test (most slices of a large product).
    __device__ __forceinline__ void issue(unsigned s, i64 ld, int k0, bool vec, bool full) const {
        s += soff;
        const i64 ldo = opaque(ld);
        if constexpr (MN_CONTIG) {
            const float* q = p + k0 * ldo;
            const i64 step = KSTEP * ldo;
            if (vec && full) {
#pragma unroll
                for (int i = 0; i < BK / KSTEP; ++i, q += step) cp16(s + 4 * i * KSTEP * LDS, q);
            } else if (vec) {  // 16-byte words; a word cut by the mn edge copies its valid part
#pragma unroll
                for (int i = 0; i < BK / KSTEP; ++i, q += step)
                    cp16_zfill(s + 4 * i * KSTEP * LDS, q, k0 + i * KSTEP < krem ? 4 * mnrem : 0);
            } else {  // unaligned rows: the same words as 4 element copies
#pragma unroll
                for (int i = 0; i < BK / KSTEP; ++i, q += step) {
                    const bool ok = k0 + i * KSTEP < krem;
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        cp4_zfill(s + 4 * (i * KSTEP * LDS + j), q + j, ok && j < mnrem ? 4 : 0);
                }
            }
        } else {
            const i64 step = RPI * ldo;
            if (full) {
#pragma unroll
                for (int kg = 0; kg < BK / 8; ++kg) {
                    const float* q = p + k0 + 8 * kg;
#pragma unroll
                    for (int ri = 0; ri < ROWS_I; ++ri, q += step) cp4(s + 4 * (8 * kg * LDS + ri * RPI), q);
                }
            } else {
#pragma unroll
                for (int kg = 0; kg < BK / 8; ++kg) {
                    const float* q = p + k0 + 8 * kg;
                    const bool kok = k0 + 8 * kg < krem;
#pragma unroll
                    for (int ri = 0; ri < ROWS_I; ++ri, q += step)
                        cp4_zfill(s + 4 * (8 * kg * LDS + ri * RPI), q, kok && ri * RPI < mnrem ? 4 : 0);
                }
            }
        }
    }
};

// The same slice through registers (gemm_regblock): load every word, then store to S.
// A thread moves PER 4-element words w = tid + i THREADS: MN_CONTIG, 4 mn of one k row
// (k = w / (BMN/4), mn = 4 (w % (BMN/4))); else 4 k of one mn row (k = 4 (w % (BK/4)),
// mn = w / (BK/4)). A word is one 16-byte __ldg when `vec` (rows 16-byte aligned) and it
// lies inside the matrix, else up to 4 guarded element loads of the same addresses (one
// mapping for both: no second set of addresses in registers). K-contiguous words are
// stored transposed as 4 STS.32; with BK = 8 a warp instruction covers 2 k-words x 16
// rows, banks 16 kq + 4 j + m: conflict-free thanks to the 4-float pad.
template <bool MN_CONTIG, int BMN, int BK, int LDS, int THREADS>
__device__ __forceinline__ void copy_tile_regs(float* S, const float* x, i64 ld_in, int mn0, int mnd, int k0,
                                               int K, bool vec) {
    constexpr int PER = BK * BMN / 4 / THREADS;
    static_assert(PER * THREADS * 4 == BK * BMN, "whole words per thread");
    const int tid = threadIdx.x;
    const i64 ld = opaque(ld_in);  // as in AsyncTileCopy: no hoisted per-load addresses
    float4 v[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int w = tid + i * THREADS;
        const int k = MN_CONTIG ? w / (BMN / 4) : (w % (BK / 4)) * 4;
        const int mn = MN_CONTIG ? (w % (BMN / 4)) * 4 : w / (BK / 4);
        const int gk = k0 + k, gmn = mn0 + mn;
        const float* q = x + (MN_CONTIG ? (i64)gk * ld + gmn : (i64)gmn * ld + gk);
        // elements of the word inside the matrix (they are its first n)
        const int n = MN_CONTIG ? (gk < K ? max(0, min(4, mnd - gmn)) : 0) : (gmn < mnd ? max(0, min(4, K - gk)) : 0);
        if (vec && n == 4) {
            v[i] = __ldg(reinterpret_cast<const float4*>(q));
        } else {
            v[i].x = n > 0 ? q[0] : 0.f;
            v[i].y = n > 1 ? q[1] : 0.f;
            v[i].z = n > 2 ? q[2] : 0.f;
            v[i].w = n > 3 ? q[3] : 0.f;
        }
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int w = tid + i * THREADS;
        if constexpr (MN_CONTIG) {
            *reinterpret_cast<float4*>(S + (w / (BMN / 4)) * LDS + (w % (BMN / 4)) * 4) = v[i];
        } else {
            float* p = S + (w % (BK / 4)) * 4 * LDS + w / (BK / 4);
            p[0] = v[i].x, p[LDS] = v[i].y, p[2 * LDS] = v[i].z, p[3 * LDS] = v[i].w;
        }
    }
}

}  // namespace simt

// ============================================================================ 1. naive
// One thread per output, the K loop reading A and B from global memory. Lanes of a warp
// share m and take consecutive n: B (!TB) and D accesses coalesce, A is a broadcast.
template <typename T, bool TA, bool TB>
__global__ void __launch_bounds__(256) gemm_naive(GEMM_PARAMS(T)) {
    typedef typename GemmTypes<T>::Acc Acc;
    const i64 n = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;  // no barriers below: a thread may leave early
    for (int z = blockIdx.z; z < batch; z += gridDim.z) {
        const T* a = A + z * sA;
        const T* b = B + z * sB;
        const typename GemmTypes<T>::Out* c = C + z * sC;
        typename GemmTypes<T>::Out* d = D + z * sD;
        for (i64 m = (i64)blockIdx.y * blockDim.y + threadIdx.y; m < M; m += (i64)gridDim.y * blockDim.y) {
            Acc acc = 0;
            for (int k = 0; k < K; ++k)
                acc = simt::mac(acc, gemm_in(a[a_offset<TA>(m, k, lda)]), gemm_in(b[b_offset<TB>(k, n, ldb)]));
            d[m * ldd + n] = gemm_epilogue<T>(acc, c + m * ldc + n, alpha, beta);
        }
    }
}

// ============================================================================ 2. tiled
// 32x32 output tile per 32x32-thread block; A and B tiles of 32 k staged in shared
// memory, each loaded along whichever index is contiguous in memory (so every layout's
// loads coalesce) and stored into As[m][k] / Bs[k][n]. The inner loop reads As[ty][k]
// (one address per warp: broadcast) and Bs[k][tx] (consecutive): conflict-free; the +1
// column pad keeps the transposed stores of the TA / TB layouts conflict-free too.
template <typename T, bool TA, bool TB>
__global__ void __launch_bounds__(1024) gemm_tiled(GEMM_PARAMS(T)) {
    static_assert(simt::is_float<T>::value, "gemm_tiled is the float32 rung");
    constexpr int TS = 32;
    __shared__ float As[TS][TS + 1];
    __shared__ float Bs[TS][TS + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tiles_m = (M + TS - 1) / TS;
    const int n0 = blockIdx.x * TS;
    for (int z = blockIdx.z; z < batch; z += gridDim.z) {
        const float* a = A + z * sA;
        const float* b = B + z * sB;
        const float* c = C + z * sC;
        float* d = D + z * sD;
        for (int tm = blockIdx.y; tm < tiles_m; tm += gridDim.y) {  // uniform per block
            const int m0 = tm * TS;
            float acc = 0.f;
            for (int k0 = 0; k0 < K; k0 += TS) {
                if (!TA) {  // A(m, k) = a[m * lda + k]: tx along k
                    const int m = m0 + ty, k = k0 + tx;
                    As[ty][tx] = (m < M && k < K) ? a[(i64)m * lda + k] : 0.f;
                } else {  // A(m, k) = a[k * lda + m]: tx along m
                    const int m = m0 + tx, k = k0 + ty;
                    As[tx][ty] = (m < M && k < K) ? a[(i64)k * lda + m] : 0.f;
                }
                if (!TB) {  // B(k, n) = b[k * ldb + n]: tx along n
                    const int k = k0 + ty, n = n0 + tx;
                    Bs[ty][tx] = (k < K && n < N) ? b[(i64)k * ldb + n] : 0.f;
                } else {  // B(k, n) = b[n * ldb + k]: tx along k
                    const int k = k0 + tx, n = n0 + ty;
                    Bs[tx][ty] = (k < K && n < N) ? b[(i64)n * ldb + k] : 0.f;
                }
                __syncthreads();
#pragma unroll
                for (int kk = 0; kk < TS; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
                __syncthreads();
            }
            const int m = m0 + ty, n = n0 + tx;
            if (m < M && n < N) d[(i64)m * ldd + n] = gemm_epilogue<T>(acc, c + (i64)m * ldc + n, alpha, beta);
        }
    }
}

// ============================================================================ 3. regblock
// 128x128 block tile, BK = 8, 256 threads, 8x8 outputs a thread (SimtTile<128,128,8,8>:
// warps 4 x 2 of 32x64). Per k a thread reads 8 + 8 floats (4 LDS.128) for 64 FFMAs.
// Global -> registers -> shared, single buffer: load, barrier, 8 outer products, barrier.
template <typename T, bool TA, bool TB>
__global__ void __launch_bounds__(256, 2) gemm_regblock(GEMM_PARAMS(T)) {
    static_assert(simt::is_float<T>::value, "gemm_regblock is the float32 rung");
    constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8;
    typedef simt::SimtTile<BM, BN, TM, TN> P;
    static_assert(P::THREADS == 256, "launch geometry");
    __shared__ __align__(16) float As[BK * P::LDS_A];
    __shared__ __align__(16) float Bs[BK * P::LDS_B];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / P::WARPS_N) * P::WM + simt::lane_m(lane) * 4;  // the lane's first row
    const int wn0 = (warp % P::WARPS_N) * P::WN + simt::lane_n(lane) * 4;  // and column, in the tile
    const bool a_vec = gemm_vec_ok(A, lda, sA), b_vec = gemm_vec_ok(B, ldb, sB);
    const bool d_vec = gemm_vec_ok(D, ldd, sD);
    const unsigned tiles_n = (N + BN - 1) / BN, tiles = (unsigned)((M + BM - 1) / BM) * tiles_n;
    for (int z = blockIdx.z; z < batch; z += gridDim.z) {
        const float* a = A + z * sA;
        const float* b = B + z * sB;
        for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform per block
            const int m0 = (t / tiles_n) * BM, n0 = (t % tiles_n) * BN;
            float acc[TM][TN];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
            for (int k0 = 0; k0 < K; k0 += BK) {
                simt::copy_tile_regs<TA, BM, BK, P::LDS_A, 256>(As, a, lda, m0, M, k0, K, a_vec);
                simt::copy_tile_regs<!TB, BN, BK, P::LDS_B, 256>(Bs, b, ldb, n0, N, k0, K, b_vec);
                __syncthreads();
#pragma unroll
                for (int kk = 0; kk < BK; ++kk) {
                    float fa[TM], fb[TN];
                    simt::load_frag(fa, fb, As + kk * P::LDS_A + wm0, Bs + kk * P::LDS_B + wn0);
                    simt::outer(acc, fa, fb);
                }
                __syncthreads();
            }
            simt::store_tile<T>(acc, C + z * sC, D + z * sD, M, N, ldc, ldd, m0 + wm0, n0 + wn0, alpha, beta, d_vec);
        }
    }
}

// ============================================================================ 4. pipelined
// SimtTile<BM, BN, TM, TN> thread tiles over a STAGES-deep ring of BK-slices in dynamic
// shared memory ([stage]{As[BK][BM+4], Bs[BK][BN+4]}), filled by cp.async STAGES-1 slices
// ahead of the compute. Per slice a thread issues its copies for slice kt+STAGES-1 right
// after the first fragment read, then runs BK steps of: LDS the k+1 fragments into the
// other register buffer, FFMA the k fragments. One barrier per slice, before the first
// fragment read of the next slice: it both publishes that slice (after cp.async.wait_group
// says this thread's copies of it landed) and retires the slice just finished, whose
// stage the next iteration's copies overwrite.
// Invariant (commit groups): the prologue commits STAGES-1 groups (slices 0..S-2), every
// iteration kt one (slice kt+S-1, empty past the end). At the wait of iteration kt,
// S-1 + kt+1 groups are committed; wait_group(S-2) leaves the newest S-2 pending, so
// slices 0..kt+1 have landed: exactly what the k+1 fragment read needs.
template <typename T, bool TA, bool TB, int BM, int BN, int BK, int STAGES, int TM, int TN>
__global__ void __launch_bounds__(simt::SimtTile<BM, BN, TM, TN>::THREADS, simt::SimtTile<BM, BN, TM, TN>::MIN_BLOCKS)
    gemm_pipelined(GEMM_PARAMS(T)) {
    static_assert(simt::is_float<T>::value, "gemm_pipelined is the float32 rung");
    static_assert(STAGES >= 2 && BK >= 2, "a ring of at least two slices");
    typedef simt::SimtTile<BM, BN, TM, TN> P;
    constexpr int THREADS = P::THREADS, LDS_A = P::LDS_A, LDS_B = P::LDS_B;
    constexpr int STAGE = BK * (LDS_A + LDS_B);  // floats per stage
    extern __shared__ float4 smem_v4[];
    float* smem = reinterpret_cast<float*>(smem_v4);
    const unsigned smem_s = smem_u32(smem);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / P::WARPS_N) * P::WM + simt::lane_m(lane) * 4;  // the lane's first row
    const int wn0 = (warp % P::WARPS_N) * P::WN + simt::lane_n(lane) * 4;  // and column, in the tile
    // Only an operand whose M / N is contiguous can use 16-byte copies (see AsyncTileCopy).
    const bool a_vec = TA && gemm_vec_ok(A, lda, sA);
    const bool b_vec = !TB && gemm_vec_ok(B, ldb, sB);
    const bool d_vec = gemm_vec_ok(D, ldd, sD);
    const unsigned tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, tiles = tiles_m * tiles_n;
    const int ktiles = (K + BK - 1) / BK;

    for (int z = blockIdx.z; z < batch; z += gridDim.z) {
        const float* a = A + z * sA;
        const float* b = B + z * sB;
        for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform per block
            int tm, tn;
            simt::grouped_tile<8>(t, tiles_m, tiles_n, tm, tn);
            const int m0 = tm * BM, n0 = tn * BN;
            const simt::AsyncTileCopy<TA, BM, BK, LDS_A, THREADS> copy_a(a, lda, m0, M, K);
            const simt::AsyncTileCopy<!TB, BN, BK, LDS_B, THREADS> copy_b(b, ldb, n0, N, K);
            // Copy slice kt into stage st.
            const bool mn_full = m0 + BM <= M && n0 + BN <= N;
            auto issue = [&](int st, int kt) {
                const unsigned s = smem_s + 4 * st * STAGE;
                const bool full = mn_full && (kt + 1) * BK <= K;
                copy_a.issue(s, lda, kt * BK, a_vec, full);
                copy_b.issue(s + 4 * BK * LDS_A, ldb, kt * BK, b_vec, full);
            };
            // The previous tile's last fragment reads finish before the prologue refills.
            __syncthreads();
#pragma unroll
            for (int s = 0; s < STAGES - 1; ++s) {
                if (s < ktiles) issue(s, s);
                cp_commit();
            }
            float acc[TM][TN];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
            cp_wait<STAGES - 2>();
            __syncthreads();

            float fa[2][TM], fb[2][TN];
            const float* as = smem + wm0;          // read stage 0: As + the lane's row
            const float* bs = smem + BK * LDS_A + wn0;
            int rs = 0, ws = STAGES - 1;           // read stage, write stage
            simt::load_frag(fa[0], fb[0], as, bs);
#pragma unroll 1
            for (int kt = 0; kt < ktiles; ++kt) {
#pragma unroll
                for (int kk = 0; kk < BK; ++kk) {
                    if (kk == BK - 1) {  // next slice: landed (this thread), published (barrier)
                        cp_wait<STAGES - 2>();
                        __syncthreads();
                        rs = rs + 1 == STAGES ? 0 : rs + 1;
                        as = smem + rs * STAGE + wm0;
                        bs = smem + rs * STAGE + BK * LDS_A + wn0;
                    }
                    const int nk = (kk + 1) % BK;
                    simt::load_frag(fa[(kk + 1) & 1], fb[(kk + 1) & 1], as + nk * LDS_A, bs + nk * LDS_B);
                    if (kk == 0) {  // stage ws held slice kt-1, retired by the last barrier
                        if (kt + STAGES - 1 < ktiles) issue(ws, kt + STAGES - 1);
                        cp_commit();
                        ws = ws + 1 == STAGES ? 0 : ws + 1;
                    }
                    simt::outer(acc, fa[kk & 1], fb[kk & 1]);
                }
            }
            simt::store_tile<T>(acc, C + z * sC, D + z * sD, M, N, ldc, ldd, m0 + wm0, n0 + wn0, alpha, beta, d_vec);
        }
    }
}
