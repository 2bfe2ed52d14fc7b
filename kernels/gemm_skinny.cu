// gemm_skinny.cu: the small-M (LLM decode) GEMM rung, D = alpha * op(A) @ op(B) + beta * C
// for M <= 64 (kernels/gemm_common.cuh has the contract; this kernel adds two parameters).
//
// At M <= 64 the product is a stream over B (K x N): B must be read once at the device's
// read bandwidth while A (M x K) is tiny. Why each piece is the way it is:
//   - 16-byte loads of B, 8 of them (128 bytes) in flight per thread while it waits: stages
//     of 4 loads double-buffered by hand (the next stage is issued before the current one
//     is used; int8 TB=false: one stage of 8): the bytes in flight per SM, not the flops,
//     set the speed of a stream.
//   - fp16/bf16/int8 multiply on the tensor cores (mma.sync m16n8k16 / m16n8k32) with the
//     roles swapped: B is the mma's 16-row "A" operand (16 columns n) and the token rows are
//     its 8-wide "n" (M = 1..8 per m-tile, zero-padded). With CUDA cores, 16 rows x 8 fp16
//     columns a thread is 128 FFMAs per 16-byte load: at M = 16 the issue rate, not memory,
//     would set the time (and 128 accumulators a thread cost occupancy). The mma sums over
//     k inside the instruction, so 4 threads share a column and each holds 4x fewer
//     accumulators.
//   - The mma's k index is a dummy summation index: any k order works as long as both
//     operands use the same one. It is chosen so that each thread's 16-byte loads of B
//     become mma fragments with at most a few byte permutes (TB=false: 2E k-rows of 4E
//     columns, transposed by __byte_perm; TB=true: rows of K are already fragment words).
//   - float32 stays on the CUDA cores (tf32 would miss the float32 tolerance): a thread owns
//     4 consecutive columns (TB=false) or 4 rows walked along K by 4 lanes (TB=true).
//   - A is staged into shared memory in chunks (KC k per warp, 32 KB a block at most, so the
//     k range of a split is not limited by shared memory), zero-padded to the tile (rows
//     >= M, k >= K), in the layout the fragments read ([m][k], k contiguous, rows padded so
//     that the fragment reads are free of bank conflicts). B loads stay in flight across
//     the staging barriers: the first stage is issued before the first chunk is staged.
//   - Split-K, three levels, so that a few columns still fill 132 SMs: the 4 lanes of an mma
//     (inside the instruction), the WK warps of a block (shared-memory sum, warp order
//     fixed), the S blocks of gridDim.y ("last block done": each writes its fp32/int32
//     partial tile to `work`, __threadfence, a ticket from atomicAdd on `tickets`; the block
//     drawing the last ticket sums the partials in split order 0..S-1, applies the
//     epilogue, writes D and resets its ticket to 0). No float atomics: the result is
//     bitwise the same run to run for a given launch geometry.
//   - Unaligned B (gemm_vec_ok false: pointer, ldb or batch stride) takes an element-wise
//     path with the same tile, the same output mapping and no more registers, so the
//     launch geometry never depends on alignment. A is read element-wise when unaligned.
//
// Launch geometry (cupyops/ops/_gemm_skinny.py computes the same numbers):
//   block  = (32, WK, WN): WN warps side by side along n, WK warps splitting the block's k
//            range; at most 256 threads.
//   grid.x = RG * NT, row group rg = blockIdx.x % RG (MT rows each, RG = cdiv(M, MT); row
//            groups of one column tile are neighbours, so they read B through L2 together),
//            column tile nt = blockIdx.x / RG of BN = WN * WNE columns (WNE below).
//   grid.y = S splits of K; split s covers [s * KS, min(K, (s + 1) * KS)),
//            KS = roundup(cdiv(K, S), 128); warp wk covers KW = roundup(cdiv(KS, WK), 128) of it.
//   grid.z = min(batch, 65535); the kernel loops over the rest of the batch.
//   A chunks: KC = min(KW, max(128, 32768 / (MT * WK * sizeof(T)) rounded down to a multiple
//            of 128)) k per warp, NC = cdiv(KW, KC) chunks (the same count for every warp).
//   dynamic shared memory = max(MT * pitch, WK * WN * 16 * 32 * 4) bytes,
//            pitch = roundup(WK * KC * sizeof(T), 128) + (TB ? 64 : 32).
//   work   : S > 1: batch * RG * NT * S * MT * BN accumulators (partial tiles, row-major
//            MT x BN each); tickets: batch * RG * NT zeroed counters. S == 1: unused.
#include "gemm_common.cuh"

namespace cuops {
namespace skinny {

constexpr int KQ = 128;  // split and warp k ranges are multiples of this: every stage fits
// Shared memory for one chunk of staged A (all warps of the block): bounds the chunk, not
// the k range of a split, so S depends only on filling the GPU.
constexpr int A_SMEM = 32 * 1024;

// Per element type and B layout: does it use the tensor cores, k elements per mma register
// (E), and the columns n one warp covers (WNE).
template <typename T, bool TB> struct Shape {
    static constexpr bool MMA = sizeof(T) < 4;
    static constexpr int V = 16 / sizeof(T);           // elements per 16-byte vector
    static constexpr int E = MMA ? 4 / sizeof(T) : 1;  // fp16/bf16: 2, int8: 4
    // TB=false: mma 32E (8 lane groups x 4E columns), float32 32 lanes x 4;
    // TB=true: 2 sub-tiles of 16 rows (mma), or 8 lane groups x 4 rows (float32).
    static constexpr int WNE = TB ? 32 : (MMA ? 32 * E : 32 * V);
    static constexpr int CPL = WNE / 32;  // columns a lane owns on the CUDA-core TB=false path
    // fp16/bf16 (the decode types) fit 128 registers: two 256-thread blocks an SM, 16 warps
    // with 128 bytes in flight each. int8 (64 accumulators at MT = 16) and float32 may take
    // more registers rather than spill.
    static constexpr int MIN_BLOCKS = sizeof(T) == 2 ? 2 : 1;
};

template <typename T> struct Raw;
template <> struct Raw<float> { typedef unsigned type; };
template <> struct Raw<__half> { typedef unsigned short type; };
template <> struct Raw<__nv_bfloat16> { typedef unsigned short type; };
template <> struct Raw<signed char> { typedef unsigned char type; };

// The low bits of b hold one element of T: widen it to the accumulator type.
template <typename T> __device__ __forceinline__ typename GemmTypes<T>::Acc from_bits(unsigned b);
template <> __device__ __forceinline__ float from_bits<float>(unsigned b) { return __uint_as_float(b); }
template <> __device__ __forceinline__ float from_bits<__half>(unsigned b) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}
template <> __device__ __forceinline__ float from_bits<__nv_bfloat16>(unsigned b) {
    return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(b)));
}
template <> __device__ __forceinline__ int from_bits<signed char>(unsigned b) {
    return static_cast<int>(static_cast<signed char>(b & 0xffu));
}

// Word i (a compile-time constant after unrolling) of a 16-byte vector.
__device__ __forceinline__ unsigned word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Element j of a vector of raw T bits, widened.
template <typename T>
__device__ __forceinline__ typename GemmTypes<T>::Acc elem(const uint4& v, int j) {
    constexpr int PER = 4 / sizeof(T);
    return from_bits<T>(word(v, j / PER) >> (8 * sizeof(T) * (j % PER)));
}

// p[0], p[stride], ... p[(cnt - 1) * stride] (cnt <= V elements) packed into a vector of
// raw bits, zero above: element loads for edges and unaligned operands. Built with shifts
// (no local array), so it stays in registers.
template <typename T>
__device__ __forceinline__ uint4 load_part(const T* p, int cnt, i64 stride) {
    typedef typename Raw<T>::type U;
    constexpr int V = 16 / sizeof(T), PER = 4 / sizeof(T);
    const U* q = reinterpret_cast<const U*>(p);
    unsigned w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int j = 0; j < V; ++j)
        if (j < cnt) w[j / PER] |= static_cast<unsigned>(q[j * stride]) << (8 * sizeof(T) * (j % PER));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 16-byte vector at p (16-byte aligned) of which only the first cnt elements exist
// (cnt >= V: all; cnt <= 0: none, zeros). The partial case never reads past the matrix.
template <typename T> __device__ __forceinline__ uint4 load_vec_or_part(const T* p, int cnt) {
    constexpr int V = 16 / sizeof(T);
    if (cnt >= V) return __ldg(reinterpret_cast<const uint4*>(p));
    if (cnt > 0) return load_part(p, cnt, 1);
    return make_uint4(0u, 0u, 0u, 0u);
}

__device__ __forceinline__ int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The vector of B at p whose first cnt elements exist: one 16-byte load when B allows it
// (vec: uniform per launch), else the same V elements one by one (unaligned B). Both give
// the same bits, so every path serves aligned and unaligned B with the same code.
template <typename T> __device__ __forceinline__ uint4 load_b(const T* p, int cnt, bool vec) {
    constexpr int V = 16 / sizeof(T);
    return vec ? load_vec_or_part(p, cnt) : load_part(p, clampi(cnt, 0, V), 1);
}

// ------------------------------------------------------------------------- tensor cores
// d += a (16 x 8E, row) * b (8E x 8, col): m16n8k16 for 2-byte types, m16n8k32 for int8
// (wrapping int32 accumulation, as the contract asks).
__device__ __forceinline__ void mma(float* d, const unsigned (&a)[4], unsigned b0, unsigned b1, __half) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma(float* d, const unsigned (&a)[4], unsigned b0, unsigned b1, __nv_bfloat16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma(int* d, const unsigned (&a)[4], unsigned b0, unsigned b1, signed char) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Fragment layouts (PTX ISA, mma.m16n8k16 .f16/.bf16 and m16n8k32 .s8; g = lane / 4,
// t = lane % 4, E = elements per register, the mma's K = 8E):
//   A (16 x 8E): reg0 = row g,   k-cols E*t + [0, E)     reg1 = row g+8, same k-cols
//                reg2 = row g,   k-cols 4E + E*t + [0,E)  reg3 = row g+8, same
//   B (8E x 8):  reg0 = k-rows E*t + [0, E), col g;       reg1 = k-rows 4E + E*t + [0,E)
//   C (16 x 8):  c0, c1 = row g, cols 2t, 2t+1;           c2, c3 = row g+8, cols 2t, 2t+1
// Rows of the mma's A are our columns n, its B is A^T (cols = our rows m), its C is D^T.
// Our k order: thread t's k-cols {E*t + e, 4E + E*t + e} are the 2E consecutive k
// (TB=false: kb + 2E*t + [0, 2E); TB=true, mma j of a 16E-deep step: kb + 4E*t + 2E*j +
// [0, 2E)), so each thread's slice of A is one 8- or 16-byte shared-memory read.

// TB=false: L[r] (r < 2E) is k-row kb + 2E*t + r at the thread's 4E columns 4E*g + [0, 4E).
// mma i (i < 2E) takes columns 4E*g + 2i (its row g) and 4E*g + 2i + 1 (its row g+8);
// register e-th element = k-row r = e (reg0/reg1) or E + e (reg2/reg3).
template <int E> __device__ __forceinline__ void pack_n(const uint4* L, int i, unsigned (&a)[4]);
template <> __device__ __forceinline__ void pack_n<2>(const uint4* L, int i, unsigned (&a)[4]) {
    // word i of a row holds columns 2i (low half) and 2i+1 (high half)
    a[0] = __byte_perm(word(L[0], i), word(L[1], i), 0x5410);  // (col 2i;   k-rows 0, 1)
    a[1] = __byte_perm(word(L[0], i), word(L[1], i), 0x7632);  // (col 2i+1; k-rows 0, 1)
    a[2] = __byte_perm(word(L[2], i), word(L[3], i), 0x5410);  // (col 2i;   k-rows 2, 3)
    a[3] = __byte_perm(word(L[2], i), word(L[3], i), 0x7632);  // (col 2i+1; k-rows 2, 3)
}
template <> __device__ __forceinline__ void pack_n<4>(const uint4* L, int i, unsigned (&a)[4]) {
    // columns 2i, 2i+1 are bytes 2(i%2), 2(i%2)+1 of word i/2. First interleave two rows
    // (x01 = r0.b, r1.b, r0.b', r1.b'), then take the low / high byte pairs of two of those.
    const int j = i >> 1;
    const unsigned sel = (i & 1) ? 0x7362u : 0x5140u;
    const unsigned x01 = __byte_perm(word(L[0], j), word(L[1], j), sel);
    const unsigned x23 = __byte_perm(word(L[2], j), word(L[3], j), sel);
    const unsigned y01 = __byte_perm(word(L[4], j), word(L[5], j), sel);
    const unsigned y23 = __byte_perm(word(L[6], j), word(L[7], j), sel);
    a[0] = __byte_perm(x01, x23, 0x5410);  // (col 2i;   k-rows 0..3)
    a[1] = __byte_perm(x01, x23, 0x7632);  // (col 2i+1; k-rows 0..3)
    a[2] = __byte_perm(y01, y23, 0x5410);  // (col 2i;   k-rows 4..7)
    a[3] = __byte_perm(y01, y23, 0x7632);  // (col 2i+1; k-rows 4..7)
}

// ------------------------------------------------------------------------- block context
template <typename T> struct Ctx {
    typedef typename GemmTypes<T>::Out Out;
    typedef typename GemmTypes<T>::Acc Acc;
    typedef typename GemmTypes<T>::Scalar Scalar;
    const T* A;
    const T* B;
    const Out* C;
    Out* D;
    Acc* work;
    int M, N, K;
    i64 lda, ldb, ldc, ldd;
    Scalar alpha, beta;
    int lane, wk, wn, WK, WN, tid, nthr;
    int m0, n0, nW, BN;         // first row, first column of the block, of the warp; tile width
    int k0, k1, KS, KW;         // block's k range [k0, k1), KS = its nominal length; per warp
    int kw0, kw1;               // this warp's k range
    int KC, NC;                 // A arrives in NC chunks of KC k per warp
    int pitch;                  // row pitch of the staged A chunk, elements
    int S, s;                   // splits, this block's split
    i64 tile;                   // output tile index (batch element, row group, column tile)
    bool avec, bvec;            // A, B allow 16-byte loads
    T* As;
    Acc* red;
};

// Stage chunk j of op(A): for each warp w of the block, the KC k that follow
// kbeg(w) + j * KC, where kbeg(w) = min(k1, k0 + w * KW) is where warp w's k range starts,
// into columns [w * KC, (w + 1) * KC) of As (row m at As + m * pitch), zeros outside the
// matrix (rows >= M, k >= K). Every thread of the block takes part; the caller barriers.
template <typename T, bool TA, int MT> __device__ __forceinline__ void stage_a(const Ctx<T>& c, int j) {
    constexpr int V = 16 / sizeof(T);
    typedef typename Raw<T>::type U;  // raw bits: no conversion, exact zero padding
    const int KC = c.KC, W = c.WK * KC;
    // k of staged column cc (KC is a multiple of V, so a vector never straddles two warps)
    auto kof = [&](int cc) {
        const int w = cc / KC;
        return min(c.k1, c.k0 + w * c.KW) + j * KC + (cc - w * KC);
    };
    if (!TA) {  // A(m, k) = A[m * lda + k]: vectors along k
        if (c.avec) {  // kbeg(w) is a multiple of 128 unless it is k1 == K (nothing to load)
            const int nv = W / V;
            for (int q = c.tid; q < MT * nv; q += c.nthr) {
                const int m = q / nv, cc = (q - m * nv) * V;
                const int gm = c.m0 + m, gk = kof(cc);
                uint4 v = make_uint4(0u, 0u, 0u, 0u);
                if (gm < c.M) v = load_vec_or_part(c.A + gm * c.lda + gk, c.K - gk);
                *reinterpret_cast<uint4*>(c.As + m * c.pitch + cc) = v;
            }
        } else {
            for (int q = c.tid; q < MT * W; q += c.nthr) {
                const int m = q / W, cc = q - m * W;
                const int gm = c.m0 + m, gk = kof(cc);
                reinterpret_cast<U*>(c.As)[m * c.pitch + cc] =
                    (gm < c.M && gk < c.K) ? reinterpret_cast<const U*>(c.A)[gm * c.lda + gk] : U(0);
            }
        }
    } else {  // A(m, k) = A[k * lda + m]: vectors along m, transposed on the way in
        constexpr int MV = (MT + V - 1) / V;  // vectors per k
        const bool vec = c.avec && c.m0 % V == 0;
        for (int q = c.tid; q < W * MV; q += c.nthr) {
            const int cc = q / MV, mv = (q - cc * MV) * V;
            const int gk = kof(cc), gm = c.m0 + mv;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (gk < c.K) {
                const T* p = c.A + gk * c.lda + gm;
                v = vec ? load_vec_or_part(p, c.M - gm) : load_part(p, c.M - gm, 1);
            }
            constexpr int PER = 4 / sizeof(T);
#pragma unroll
            for (int e = 0; e < V; ++e)
                if (mv + e < MT)
                    reinterpret_cast<U*>(c.As)[(mv + e) * c.pitch + cc] =
                        static_cast<U>(word(v, e / PER) >> (8 * sizeof(T) * (e % PER)));
        }
    }
}

// The k loop of one warp over [kw0, kw1) in stages of `step` k: load(L, kb) issues the
// 16-byte loads of stage kb into L, compute(L, kl) consumes them, kl being the As column
// of kb. A arrives in NC chunks of KC k per warp (two barriers each: every warp runs the
// same number of chunks, even with an empty range). PIPE: the next stage's loads are
// issued before the current stage is used (ptxas does not pipeline this by itself), at
// the cost of a second set of NL registers. B loads stay in flight across the chunk
// barriers: the first stage is issued before the first chunk is staged.
template <int NL, bool PIPE, typename T, bool TA, int MT, typename Load, typename Compute>
__device__ __forceinline__ void kloop(const Ctx<T>& c, int step, Load load, Compute compute) {
    uint4 cur[NL];
    int kb = c.kw0;
    if (kb < c.kw1) load(cur, kb);
    for (int j = 0; j < c.NC; ++j) {
        __syncthreads();  // every warp is done with the previous chunk
        stage_a<T, TA, MT>(c, j);
        __syncthreads();
        const int cbase = c.kw0 + j * c.KC, cend = min(c.kw1, cbase + c.KC);
        const int col = c.wk * c.KC - cbase;  // As column of k is k + col
        if constexpr (PIPE) {
            while (kb < cend) {
                uint4 nxt[NL];
                const int kn = kb + step;
                const bool more = kn < c.kw1;
                if (more) load(nxt, kn);
                compute(cur, kb + col);
                kb = kn;
                if (more) {
#pragma unroll
                    for (int i = 0; i < NL; ++i) cur[i] = nxt[i];
                }
            }
        } else {
            while (kb < cend) {
                compute(cur, kb + col);
                kb += step;
                if (kb < c.kw1) load(cur, kb);
            }
        }
    }
}

// Sum the R accumulators of the WK warps of each column group over k (shared memory, warp
// order fixed), in rounds of 16 registers, and send each tile element to D (S == 1) or to
// this split's partial tile in `work`. map(wn, reg, lane, ml, nl) says which tile element
// (row ml < MT, column nl < BN) register `reg` of lane `lane` of column group wn holds, or
// false for a lane that holds a duplicate.
template <typename T, int MT, int R, typename Map>
__device__ __forceinline__ void block_out(const Ctx<T>& c, const typename GemmTypes<T>::Acc (&acc)[R], Map map) {
    typedef typename GemmTypes<T>::Acc Acc;
    const i64 wbase = (c.tile * c.S + c.s) * (i64)(MT * c.BN);
#pragma unroll
    for (int base = 0; base < R; base += 16) {
        const int RC = (R - base < 16) ? R - base : 16;
        __syncthreads();  // As (aliased by red) or the previous round is no longer read
#pragma unroll
        for (int r = 0; r < RC; ++r) c.red[((c.wk * c.WN + c.wn) * RC + r) * 32 + c.lane] = acc[base + r];
        __syncthreads();
        for (int q = c.tid; q < c.WN * RC * 32; q += c.nthr) {
            const int l = q & 31, r = (q >> 5) % RC, w = (q >> 5) / RC;
            Acc v = c.red[(w * RC + r) * 32 + l];
            for (int k = 1; k < c.WK; ++k) v += c.red[((k * c.WN + w) * RC + r) * 32 + l];
            int ml, nl;
            if (!map(w, base + r, l, ml, nl)) continue;
            const int m = c.m0 + ml, n = c.n0 + nl;
            if (m >= c.M || n >= c.N) continue;
            if (c.S == 1) {
                c.D[m * c.ldd + n] = gemm_epilogue<T>(v, c.C + m * c.ldc + n, c.alpha, c.beta);
            } else {
                c.work[wbase + ml * c.BN + nl] = v;
            }
        }
    }
}

// ------------------------------------------------------------------------- the paths
// Tensor cores, B is K x N (N contiguous). A warp covers 32E columns; per 8E-deep step a
// thread loads k-rows kb + 2E*t + [0, 2E) at columns nW + 4E*g + [0, 4E) (one 16-byte
// vector each; a warp instruction reads 4 rows x 128 contiguous bytes).
template <typename T, bool TA, int MT> __device__ __forceinline__ void path_mma_n(const Ctx<T>& c) {
    typedef typename GemmTypes<T>::Acc Acc;
    typedef Shape<T, false> Sh;
    constexpr int E = Sh::E, V = Sh::V, MTL = MT / 8, LPS = 2 * E, KST = 8 * E, U = 1;
    // 2-byte types: 4 loads a step, double-buffered (8 loads, 128 bytes, in flight while a
    // warp waits); int8: 8 loads a step, not double-buffered (the same 128 bytes; a second
    // buffer of 32 registers would not fit next to 64 accumulators).
    constexpr bool PIPE = E == 2;
    static_assert(MT % 8 == 0, "mma rows come in tiles of 8");
    const int g = c.lane >> 2, t = c.lane & 3;
    const int n = c.nW + 4 * E * g;
    const int cnt = clampi(c.N - n, 0, V);  // columns of the thread's vector inside N
    const T* bp = c.B + n;
    Acc acc[MTL * LPS * 4];
#pragma unroll
    for (int i = 0; i < MTL * LPS * 4; ++i) acc[i] = 0;

    auto load = [&](uint4(&L)[U * LPS], int kb) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < LPS; ++r) {
                const int k = kb + u * KST + 2 * E * t + r;
                L[u * LPS + r] = (k < c.kw1) ? load_b(bp + k * c.ldb, cnt, c.bvec) : make_uint4(0u, 0u, 0u, 0u);
            }
    };
    auto compute = [&](const uint4(&L)[U * LPS], int kl) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int ku = kl + u * KST + 2 * E * t;
            uint2 b[MTL];
#pragma unroll
            for (int mt = 0; mt < MTL; ++mt) b[mt] = *reinterpret_cast<const uint2*>(c.As + (mt * 8 + g) * c.pitch + ku);
#pragma unroll
            for (int i = 0; i < LPS; ++i) {
                unsigned a[4];
                pack_n<E>(L + u * LPS, i, a);
#pragma unroll
                for (int mt = 0; mt < MTL; ++mt) mma(acc + (mt * LPS + i) * 4, a, b[mt].x, b[mt].y, T());
            }
        }
    };
    kloop<U * LPS, PIPE, T, TA, MT>(c, U * KST, load, compute);
    block_out<T, MT>(c, acc, [&](int w, int reg, int l, int& ml, int& nl) {
        const int q = reg & 3, i = (reg >> 2) % LPS, mt = (reg >> 2) / LPS;
        ml = mt * 8 + 2 * (l & 3) + (q & 1);
        nl = w * Sh::WNE + 4 * E * (l >> 2) + 2 * i + (q >> 1);
        return true;
    });
}

// Tensor cores, B stored N x K (K contiguous). A warp covers 32 columns as 2 sub-tiles of
// 16; per 16E-deep step a thread loads rows nW + 16s + g + 8r (s, r < 2) at k = kb + 4E*t
// + [0, 4E): words 2j, 2j+1 of a row vector are the mma j (j < 2) fragment words.
template <typename T, bool TA, int MT> __device__ __forceinline__ void path_mma_t(const Ctx<T>& c) {
    typedef typename GemmTypes<T>::Acc Acc;
    typedef Shape<T, true> Sh;
    // 4 loads a step, double-buffered: 8 loads (128 bytes) in flight while a warp waits
    constexpr int E = Sh::E, MTL = MT / 8, KST = 16 * E, U = 1, LPS = 4;
    static_assert(MT % 8 == 0, "mma rows come in tiles of 8");
    const int g = c.lane >> 2, t = c.lane & 3;
    Acc acc[MTL * 2 * 4];
#pragma unroll
    for (int i = 0; i < MTL * 8; ++i) acc[i] = 0;
    const T* rows[4];
    bool rok[4];
#pragma unroll
    for (int sr = 0; sr < 4; ++sr) {
        const int n = c.nW + 16 * (sr >> 1) + g + 8 * (sr & 1);
        rok[sr] = n < c.N;
        rows[sr] = c.B + (rok[sr] ? n : 0) * c.ldb;
    }

    auto load = [&](uint4(&L)[U * LPS], int kb) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = kb + u * KST + 4 * E * t;
            const int cnt = c.kw1 - k;
#pragma unroll
            for (int sr = 0; sr < 4; ++sr)
                L[u * LPS + sr] = rok[sr] ? load_b(rows[sr] + k, cnt, c.bvec) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    auto compute = [&](const uint4(&L)[U * LPS], int kl) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int ku = kl + u * KST + 4 * E * t;
            uint4 b[MTL];
#pragma unroll
            for (int mt = 0; mt < MTL; ++mt) b[mt] = *reinterpret_cast<const uint4*>(c.As + (mt * 8 + g) * c.pitch + ku);
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const uint4& lo = L[u * LPS + 2 * s];     // row g of sub-tile s
                    const uint4& hi = L[u * LPS + 2 * s + 1]; // row g + 8
                    const unsigned a[4] = {word(lo, 2 * j), word(hi, 2 * j), word(lo, 2 * j + 1), word(hi, 2 * j + 1)};
#pragma unroll
                    for (int mt = 0; mt < MTL; ++mt)
                        mma(acc + (mt * 2 + s) * 4, a, word(b[mt], 2 * j), word(b[mt], 2 * j + 1), T());
                }
        }
    };
    kloop<U * LPS, true, T, TA, MT>(c, U * KST, load, compute);
    block_out<T, MT>(c, acc, [&](int w, int reg, int l, int& ml, int& nl) {
        const int q = reg & 3, s = (reg >> 2) & 1, mt = reg >> 3;
        ml = mt * 8 + 2 * (l & 3) + (q & 1);
        nl = w * Sh::WNE + 16 * s + (l >> 2) + 8 * (q >> 1);
        return true;
    });
}

// CUDA cores (float32), B is K x N. A lane owns the 4 consecutive columns of one 16-byte
// vector (a warp instruction reads 512 contiguous bytes of a row); stages of 4 k-rows; the
// 4 values of A a row needs are one shared-memory read (the same address for the whole
// warp: a broadcast).
template <typename T, bool TA, int MT> __device__ __forceinline__ void path_simt_n(const Ctx<T>& c) {
    typedef typename GemmTypes<T>::Acc Acc;
    typedef Shape<T, false> Sh;
    constexpr int V = Sh::V;
    static_assert(Sh::CPL == V && sizeof(T) == 4, "a lane owns one 16-byte vector of float32 columns");
    const int n = c.nW + V * c.lane;
    const int cnt = clampi(c.N - n, 0, V);  // columns of the lane's vector inside N
    const T* bp = c.B + n;
    Acc acc[MT * V];
#pragma unroll
    for (int i = 0; i < MT * V; ++i) acc[i] = 0;

    auto load = [&](uint4(&L)[4], int kb) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const int k = kb + kk;
            L[kk] = (k < c.kw1) ? load_b(bp + k * c.ldb, cnt, c.bvec) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    auto compute = [&](const uint4(&L)[4], int kl) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const float4 a = *reinterpret_cast<const float4*>(c.As + m * c.pitch + kl);
            const float a4[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int v = 0; v < V; ++v) acc[m * V + v] = fmaf(a4[kk], elem<T>(L[kk], v), acc[m * V + v]);
        }
    };
    kloop<4, true, T, TA, MT>(c, 4, load, compute);
    block_out<T, MT>(c, acc, [&](int w, int reg, int l, int& ml, int& nl) {
        ml = reg / V;
        nl = w * Sh::WNE + V * l + reg % V;
        return true;
    });
}

// CUDA cores (float32), B stored N x K. Lane (g, t) owns rows nW + g + 8j (j < 4) and walks
// K in vectors kb + 4t + [0, 4) (a warp instruction reads 64 contiguous bytes of 8 rows);
// the 4 lanes of a row are summed with shuffles at the end, after which only t == 0 holds
// a result.
template <typename T, bool TA, int MT> __device__ __forceinline__ void path_simt_t(const Ctx<T>& c) {
    typedef typename GemmTypes<T>::Acc Acc;
    typedef Shape<T, true> Sh;
    constexpr int V = Sh::V;
    static_assert(sizeof(T) == 4, "float32 only");
    const int g = c.lane >> 2, t = c.lane & 3;
    Acc acc[MT * 4];
#pragma unroll
    for (int i = 0; i < MT * 4; ++i) acc[i] = 0;
    const T* rows[4];
    bool rok[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int n = c.nW + g + 8 * j;
        rok[j] = n < c.N;
        rows[j] = c.B + (rok[j] ? n : 0) * c.ldb;
    }
    auto load = [&](uint4(&L)[4], int kb) {
        const int k = kb + V * t, cnt = c.kw1 - k;
#pragma unroll
        for (int j = 0; j < 4; ++j) L[j] = rok[j] ? load_b(rows[j] + k, cnt, c.bvec) : make_uint4(0u, 0u, 0u, 0u);
    };
    auto compute = [&](const uint4(&L)[4], int k0l) {
        const int kl = k0l + V * t;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const float4 a = *reinterpret_cast<const float4*>(c.As + m * c.pitch + kl);
            const float a4[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int e = 0; e < V; ++e)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[m * 4 + j] = fmaf(a4[e], elem<T>(L[j], e), acc[m * 4 + j]);
        }
    };
    kloop<4, true, T, TA, MT>(c, 4 * V, load, compute);
#pragma unroll
    for (int i = 0; i < MT * 4; ++i) {
        acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 1);
        acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 2);
    }
    block_out<T, MT>(c, acc, [&](int w, int reg, int l, int& ml, int& nl) {
        ml = reg >> 2;
        nl = w * Sh::WNE + (l >> 2) + 8 * (reg & 3);
        return (l & 3) == 0;
    });
}

}  // namespace skinny
}  // namespace cuops

using namespace cuops;

// One launch; see the comment block at the top for the geometry.
template <typename T, bool TA, bool TB, int MT>
__global__ void __launch_bounds__(256, skinny::Shape<T, TB>::MIN_BLOCKS) gemm_skinny(GEMM_PARAMS(T), typename GemmTypes<T>::Acc* work,
                                                   unsigned* tickets) {
    typedef typename GemmTypes<T>::Acc Acc;
    typedef skinny::Shape<T, TB> Sh;
    using skinny::KQ;
    extern __shared__ uint4 skinny_smem[];
    __shared__ unsigned s_last;

    skinny::Ctx<T> c;
    c.M = M;
    c.N = N;
    c.K = K;
    c.lda = lda;
    c.ldb = ldb;
    c.ldc = ldc;
    c.ldd = ldd;
    c.alpha = alpha;
    c.beta = beta;
    c.work = work;
    c.lane = threadIdx.x;
    c.wk = threadIdx.y;
    c.wn = threadIdx.z;
    c.WK = blockDim.y;
    c.WN = blockDim.z;
    c.nthr = 32 * c.WK * c.WN;
    c.tid = c.lane + 32 * (c.wk + c.WK * c.wn);
    const int RG = (M + MT - 1) / MT;
    const int rg = blockIdx.x % RG, nt = blockIdx.x / RG;
    c.BN = c.WN * Sh::WNE;
    const int NT = (N + c.BN - 1) / c.BN;
    c.m0 = rg * MT;
    c.n0 = nt * c.BN;
    c.nW = c.n0 + c.wn * Sh::WNE;
    c.S = gridDim.y;
    c.s = blockIdx.y;
    c.KS = ((K + c.S - 1) / c.S + KQ - 1) / KQ * KQ;
    c.k0 = static_cast<int>(min((i64)K, (i64)c.s * c.KS));
    c.k1 = static_cast<int>(min((i64)K, (i64)c.k0 + c.KS));
    c.KW = ((c.KS + c.WK - 1) / c.WK + KQ - 1) / KQ * KQ;
    c.kw0 = static_cast<int>(min((i64)c.k1, (i64)c.k0 + (i64)c.wk * c.KW));
    c.kw1 = static_cast<int>(min((i64)c.k1, (i64)c.kw0 + c.KW));
    // A chunk: as many k per warp as fit skinny::A_SMEM bytes (at least KQ), at most KW
    c.KC = min(c.KW, max(KQ, skinny::A_SMEM / (MT * c.WK * (int)sizeof(T)) / KQ * KQ));
    c.NC = c.KC ? (c.KW + c.KC - 1) / c.KC : 0;
    c.pitch = (((c.WK * c.KC * (int)sizeof(T) + 127) / 128) * 128 + (TB ? 64 : 32)) / (int)sizeof(T);
    c.As = reinterpret_cast<T*>(skinny_smem);
    c.red = reinterpret_cast<Acc*>(skinny_smem);
    // Uniform per launch: every block of every batch element takes the same path, so the
    // partial tiles of one output tile always mean the same thing.
    c.avec = gemm_vec_ok(A, lda, sA);
    c.bvec = gemm_vec_ok(B, ldb, sB);

    for (int z = blockIdx.z; z < batch; z += gridDim.z) {
        c.A = A + z * sA;
        c.B = B + z * sB;
        c.C = C + z * sC;
        c.D = D + z * sD;
        c.tile = ((i64)z * RG + rg) * NT + nt;
        __syncthreads();  // the previous batch element's shared memory is no longer read
        if constexpr (Sh::MMA) {
            if constexpr (TB) skinny::path_mma_t<T, TA, MT>(c);
            else skinny::path_mma_n<T, TA, MT>(c);
        } else {
            if constexpr (TB) skinny::path_simt_t<T, TA, MT>(c);
            else skinny::path_simt_n<T, TA, MT>(c);
        }
        if (c.S == 1) continue;
        // Last block done: publish this split's partial tile, draw a ticket; the block that
        // draws ticket S - 1 sees every other split's partial (each was fenced before its
        // ticket) and reduces them in split order.
        __threadfence();
        __syncthreads();
        if (c.tid == 0) {
            const unsigned ticket = atomicAdd(tickets + c.tile, 1u);
            const bool last = ticket == (unsigned)(c.S - 1);
            if (last) tickets[c.tile] = 0u;  // leave the counters zeroed for the next launch
            s_last = last;
        }
        __syncthreads();
        if (!s_last) continue;
        __threadfence();
        const int tileN = MT * c.BN;
        const Acc* wp = work + c.tile * c.S * (i64)tileN;
        for (int e = c.tid; e < tileN; e += c.nthr) {
            const int ml = e / c.BN, nl = e - ml * c.BN;
            const int m = c.m0 + ml, n = c.n0 + nl;
            if (m >= M || n >= N) continue;
            Acc v = __ldcg(wp + e);
            for (int ss = 1; ss < c.S; ++ss) v += __ldcg(wp + (i64)ss * tileN + e);
            c.D[m * ldd + n] = gemm_epilogue<T>(v, c.C + m * ldc + n, alpha, beta);
        }
    }
}
