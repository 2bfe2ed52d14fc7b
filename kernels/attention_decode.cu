// attention_decode.cu: the `decode` rung of attention (split-KV, "flash-decoding"), for
// q_len 1..16 against a long KV sequence, contiguous or in a paged cache (and the paged
// cache's writer, kv_cache_append, its reader for packed prefill, kv_cache_gather, and the
// public two-state merge). kernels/
// attention_common.cuh has the contract; cupyops/ops/_attention_decode.py computes the
// launches described here.
//
// At q_len = 1 attention is a stream over K and V: bf16, Hkv = 8, head_dim 128, 4096 keys is
// 16 MB of K + V per batch element against a few hundred bytes of queries, so the time is
// K + V bytes over the read bandwidth and everything below serves that stream:
//   - K and V are read ONCE per KV head: one block holds every query row of a KV head's
//     group (rows r = g * q_len + i for query head hk * group + g and query position i;
//     group * q_len rows, tiled by RT: more rows go to neighbouring blocks, which read the
//     same K/V tiles through L2 at about the same time).
//   - The KV sequence is split into S chunks of `chunk` keys (a multiple of the tile), one
//     block each, when B * Hkv blocks are too few to saturate HBM (measured on an H200: 128
//     blocks, one an SM, already do; B 16 x Hkv 8 runs unsplit). Each split ends with its
//     own (max, sum, output) for its rows; a second kernel merges the splits of a row in
//     split order through their log-sum-exp (no float atomics: bitwise reproducible). With
//     S == 1 the block writes O and LSE itself (no workspace, no second launch).
//   - K/V tiles of BK keys stream through a STAGES-deep ring in shared memory filled by
//     16-byte cp.async copies (zero-filled past the keys a block needs and past head_dim),
//     so the bytes in flight are bounded by shared memory, not registers: STAGES - 1 tiles
//     of 2 * BK * DT * sizeof(T) bytes a block (48 KB at DT 64, 64 KB at 128, 128 KB at
//     256), 64 to 144 KB an SM. The query tile's loads go out just ahead of the first tiles.
//     Unaligned K/V (pointer, a stride or head_dim not a multiple of 16 bytes: checked in
//     the kernel, uniform per launch) take element loads into the same layout.
//   - Rows of a tile are 16-byte chunks XOR-swizzled by (row & 7) (element (j, chunk c) at
//     chunk c ^ (j & 7)), so ldmatrix (8 rows, one chunk column) and the float32 path's
//     reads (8 keys, one chunk column) hit 8 distinct bank groups.
//   - The 4 warps of a block split every tile's keys (KPW keys each) and keep their own
//     online-softmax state (running max m, sum l, unnormalised output) in registers; at the
//     end they meet in shared memory (fixed warp order) and the block combines them.
//   - fp16/bf16 multiply on the tensor cores (mma.sync m16n8k16, rows padded to 16, fp32
//     accumulators; P rounded to the input type for P @ V, as FlashAttention does): 16 rows
//     x 16 keys a warp and tile. At 1 row in 16 the padding costs nothing that matters: the
//     mma rate is ~40x what the stream needs. float32 stays on the CUDA cores (tf32 would
//     miss the float32 tolerance): lane (key j = lane % 8, quarter c = lane / 8) dots its
//     quarter of head_dim for 8 keys (2 shuffles combine the quarters), and for P @ V each
//     lane owns DT / 32 output columns.
//   - Scores are scaled by scale * log2(e) and exponentiated with exp2f; the LSE written is
//     natural log. A key a row must not see (causal: attn::visible_keys; a sliding window:
//     attn::first_key, attn::key_end; past the block's range) scores -inf; a state whose max
//     is still -inf subtracts 0 instead, so nothing computes exp2(-inf - -inf). A row that
//     sees no key ends with l = 0: O = 0, LSE = -inf.
//   - Masks cost only where a tile needs one: every row of a block sees the keys [kfirst,
//     kfull) (the tile's last query position's first key, its first position's last), and a
//     tile wholly inside them takes no mask; the others test each score against its row's
//     [first, first + n) (one unsigned compare). Row i's first and last keys grow with i, so
//     the tile's smallest and largest positions bound every row's.
//   - Sliding windows cut the stream, not just the scores: the splits are laid from the
//     sequence's first visible key kbase (that of query position 0, rounded down to 16 keys)
//     rather than from key 0, and a block starts at its rows' first visible key (rounded
//     down to 16); keys before it are never loaded, so a left window of W keys streams ~W
//     keys (+ q_len + < 16) whatever the cache's length. The contiguous launcher plans the
//     splits over [kbase, last visible key): the split count is chosen for the keys that
//     stream, so W keys of a 128K cache get the splits (and the grid) of a W-key sequence,
//     not a 128K-key grid of mostly idle blocks that would each still take a block slot and
//     a merge input. The paged kernel finds each sequence's kbase from its own length
//     (bottom-right, as its causal offset), so its launcher plans the splits for a window's
//     span (W + q_len + 15 keys) rather than the table's capacity. A
//     block with no key to load (a split past its sequence's end, or before its rows'
//     windows) loads nothing; with S > 1 it only writes LSE -inf, which the merge skips
//     (it never reads such a split's output).
//   - Logit soft-capping (softcap > 0) applies attn::SoftCap to every score a row sees,
//     after the scaling and before the mask and the running max (the cap is monotone, so
//     maxima and masks work on capped scores as on plain ones), in base-2 units: a score
//     held as s * log2(e) is in units of ln 2 (SoftCap::make(softcap, ln 2)). The LSE is
//     then that of the capped scores. One uniform branch a tile: the uncapped stream runs
//     the code it ran before.
//   - head_dim is compiled in tiers DT = 64, 128, 256 (zero-padded in shared memory; the
//     padded columns are never written), so 1..256 are all served.
//
// Launch geometry (cupyops/ops/_attention_decode.py computes the same numbers):
//   attention_decode<T, DT, RT, STAGES>: block = 128 threads (NW = 4 warps),
//     grid.x = B * Hkv * S * NRT, blockIdx.x = ((b * Hkv + hk) * S + s) * NRT + rt
//     (row tiles of one split are neighbours: their K/V reads meet in L2), NRT = cdiv(group
//     * q_len, RT); RT = 16 for fp16/bf16 (one mma row tile), 4, 8 or 16 for float32.
//     Split s covers keys [kbase + s * chunk, min(Skv, kbase + (s + 1) * chunk)); chunk is a
//     multiple of BK; kbase = attn::first_key(0, win_left, causal_offset) rounded down to a
//     multiple of 16 (0 without a left window).
//     BK = 64 (fp16/bf16: 16 keys a warp) or 32 (float32: 8 keys a warp): 2 * BK * DT *
//     sizeof(T) = 256 * DT bytes a stage either way.
//     dynamic shared memory = STAGES * 256 * DT (the K/V ring; reused at the end for the
//     warps' states and the rows' warp weights, NW * RTP * (DT + 3) floats, RTP = 16 (mma)
//     or RT) + the query tile
//     (fp16/bf16: 16 x DT elements of T, swizzled; float32: RT x DT floats) + RTP 64-bit
//     offsets of its rows in Q. STAGES: 4 (DT 64), 3 (128, 256): 3, 2, 1 blocks an SM
//     (decode::MinBlocks; float32 16-row tiles at DT 64: 2).
//   attention_decode_merge<T> (S > 1 only): block = 128 threads, one warp a row,
//     grid.x = cdiv(B * Hq * q_len, 4).
// Workspace (S > 1; float32, rows in LSE order row = (b * Hq + h) * q_len + i, which is also
// (b * Hkv + hk) * group * q_len + r):
//   work_o[(row * S + s) * D + d]: split s's output for the row, normalised by its own sum;
//   work_lse[row * S + s]: its log2-sum-exp in the scaled base-2 units (-inf: saw no key).
// The merge: M = max_s lse_s, w_s = 2^(lse_s - M), O = sum_s w_s o_s / sum_s w_s, LSE =
// ln 2 * (M + log2 sum_s w_s), in split order.
//
// attention_decode_paged<T, DT, RT, STAGES>: the same kernel (one body, decode_split) over a
// paged KV cache (cupyops.attention_paged): K/V [num_pages, page_size, Hkv, D] with
// page_size a power of two from 16 to 256, a block table of int32 page numbers per sequence,
// per-sequence lengths, and each sequence's Sq query rows its last Sq tokens (bottom-right
// causal). The body asks a KV policy (StridedKV, PagedKV) where its rows are and how long
// its sequence is; the ring copies each tile in groups of 16 keys, and the paged policy
// looks up one page a group, two tiles ahead, after prefetching the block's table entries
// into L2. The launch is planned for the table's capacity
// (max_pages * page_size keys), or for a left window's span (win_left + Sq + 15 keys)
// where that is shorter, as the lengths live on the GPU; each sequence's splits start at
// its own kbase (from its offset seq_len - Sq, which the window shares), and a split past
// its sequence's end loads nothing and leaves the no-key state (LSE -inf), which the
// merge skips. Grid, block, shared memory and workspace as attention_decode's;
// instantiated for fp16/bf16 (cupyops/ops/_attention_decode.py PAGED_DTYPES says why).
// attention_merge_states<T> (cupyops.merge_attention_states), kv_cache_append<T>
// (cupyops.kv_cache_append, the writer of the layout the paged kernel reads) and
// kv_cache_gather<T> (attention_paged's packed prefill: pages into packed K/V): one thread
// a 16-byte chunk, 128 threads a block; see each kernel.
#include "attention_common.cuh"
#include "ptx.cuh"

namespace cuops {
namespace decode {

constexpr int NW = 4;  // warps a block
constexpr int THREADS = NW * 32;

template <typename T> struct Cfg {
    static constexpr bool MMA = sizeof(T) == 2;
    static constexpr int KPW = MMA ? 16 : 8;  // keys a warp takes of every tile
    static constexpr int BK = NW * KPW;       // keys a tile
    static constexpr int VEC = 16 / sizeof(T);
};

// Resident blocks an SM: what the shared memory allows (3, 2, 1 for DT 64, 128, 256), but 2
// for float32's 16 x 64 accumulator tile, which needs more than 168 registers. Told to
// ptxas so that it neither caps registers lower (without a minimum it capped some
// instantiations at 96 registers and spilled) nor takes more than fit; the launcher's plan
// assumes the same numbers.
template <typename T, int DT, int RT> struct MinBlocks {
    static constexpr int value = DT == 64 ? (sizeof(T) == 4 && RT == 16 ? 2 : 3) : DT == 128 ? 2 : 1;
};

// (swizzle16, pack2: ptx.cuh)

// Can this tensor be moved in 16-byte pieces: pointer, strides and head_dim all multiples
// of 16 bytes? Uniform per launch.
template <typename T>
__device__ __forceinline__ bool vec_ok(const T* p, i64 sb, i64 ss, i64 sh, int D) {
    constexpr int V = 16 / sizeof(T);
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0 && sb % V == 0 && ss % V == 0 &&
           sh % V == 0 && D % V == 0;
}

// Row r of a KV head's rows is query head group member r / q_len at position r % q_len. In
// plain decoding q_len is 1 and the divisions are skipped: they run once a launch, on its
// critical path (each is a chain of ~20 dependent instructions).
__device__ __forceinline__ int member_of(int row, int Sq) { return Sq == 1 ? row : row / Sq; }
__device__ __forceinline__ int pos_of(int row, int Sq) { return Sq == 1 ? 0 : row % Sq; }
// Offset of row `row` in Q or O: base = the batch's offset, head0 = the KV head's first
// query head.
__device__ __forceinline__ i64 row_offset(i64 base, int head0, int row, int Sq, i64 ss, i64 sh) {
    return base + pos_of(row, Sq) * ss + (i64)(head0 + member_of(row, Sq)) * sh;
}

// q / d and q % d for the block-index split; d is often 1 (one row tile, one split).
__device__ __forceinline__ unsigned split_index(unsigned& q, unsigned d) {
    if (d == 1) return 0;
    const unsigned r = q % d;
    q /= d;
    return r;
}

// The keys row `row` (of a KV head's R rows) uses in a split ending at k1: [first, first +
// n), n = 0 for none (rows past the group too), so that a key is masked iff (unsigned)(key -
// first) >= n: one compare for the window's both sides, the causal mask and the split's end.
__device__ __forceinline__ unsigned row_keys(int row, int R, int Sq, int Skv, int causal, int causal_offset,
                                             int win_left, int win_right, int k1, int& first) {
    first = 0;
    if (row >= R) return 0u;
    const int i = pos_of(row, Sq);
    first = attn::first_key(i, win_left, causal_offset);
    const int end = min(attn::key_end(i, Skv, causal, causal_offset, win_right), k1);
    return end > first ? (unsigned)(end - first) : 0u;
}


// ---- Where a block's K and V rows live: the KV policy of the kernel body. The ring asks it
// for a thread's rows a group of GROUP_KEYS keys at a time. A group starts at a multiple of
// 16 keys (a block's first key k0 is one, group_floor, and its tiles whole multiples of BK
// past it), so it never straddles a page of 16 or more keys, and a thread's rows in it (j0
// + u * RSTEP, j0 < RSTEP <= 16) are one page's rows at a constant stride: the paged cache
// costs a page lookup a group, not a row. A policy's PER_GROUP says what group() returns:
// the group's first row (paged), or one base for the whole tile that every copy u steps
// from (strided: the address arithmetic of the kernel before it had policies; ptxas allots
// registers a little differently, e.g. 21 more moves in the bf16 head_dim-128 loop of ~800
// instructions, the same 144 registers).
constexpr int GROUP_KEYS = 16;

// Where a sequence's split grid starts: query position 0's first visible key (no row sees
// an earlier one), rounded down to a copy group so that every tile's groups stay aligned
// to 16 keys (the paged policy's one page a group); 0 without a left window. A block's
// own start (its rows' first key) is rounded the same way. (_attention_decode.py
// split_base computes the same for the contiguous plan.)
__device__ __forceinline__ int group_floor(int key) { return key & ~(GROUP_KEYS - 1); }
__device__ __forceinline__ int split_base(int win_left, int causal_offset) {
    return group_floor(attn::first_key(0, win_left, causal_offset));
}

// Bring the 128-byte line holding p into L2 (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// A contiguous KV sequence: key j of (b, hk) at K + b * k_sb + j * k_ss + hk * k_sh (the
// `decode` rung: attention()'s strides). Its addresses are the ones the kernel always used.
template <typename T> struct StridedKV {
    static constexpr bool PER_GROUP = false;
    const T* kp;  // the head's key 0; on the 16-byte path, after thread_rows, the thread's
    const T* vp;  // first element (key k0 + j0, its chunk)
    i64 k_ss, v_ss;
    int len, offset;  // keys of this block's sequence, its causal offset

    __device__ __forceinline__ StridedKV(const T* K, const T* V, i64 k_sb, i64 k_ss_, i64 k_sh, i64 v_sb, i64 v_ss_,
                                         i64 v_sh, int b, int hk, int Skv, int causal_offset)
        : kp(K + b * k_sb + (i64)hk * k_sh), vp(V + b * v_sb + (i64)hk * v_sh), k_ss(k_ss_), v_ss(v_ss_), len(Skv),
          offset(causal_offset) {}
    __device__ __forceinline__ void thread_rows(int k0, int, int j0, int col, bool vec) {
        if (vec) {
            kp += (i64)(k0 + j0) * k_ss + col;
            vp += (i64)(k0 + j0) * v_ss + col;
        }
    }
    __device__ __forceinline__ void advance(int) {}  // nothing to look up
    // 16-byte path: the thread's first row of the tile kt keys past k0 (copy u reads the row
    // u * RSTEP * k_ss further, whatever its group g); whether the rows may be read
    __device__ __forceinline__ bool group(int kt, int, const T*& kq, const T*& vq) const {
        kq = kp + (i64)kt * k_ss;
        vq = vp + (i64)kt * v_ss;
        return true;
    }
    // element path: the row of key j
    __device__ __forceinline__ bool row(int j, const T*& kr, const T*& vr) const {
        kr = kp + (i64)j * k_ss;
        vr = vp + (i64)j * v_ss;
        return true;
    }
};

// A paged KV cache [num_pages, page_size, Hkv, D] (vLLM / FlashInfer "NHD"): key j of
// sequence b is slot j % page_size of page block_table[b, j / page_size]. Values that live
// on the GPU are never trusted: the sequence length is clamped to [0, max_pages *
// page_size] (so the table is read only inside its row), and a table entry outside [0,
// num_pages) reads as a page of zeros (its keys score 0 against zero values). A table
// lookup sits between a tile's turn and its copies, so it must never wait on memory: the
// block's whole range of table entries is prefetched into L2 at its start (a 4-byte entry
// a page: 8 lines for 4096 keys of 16-key pages), and each tile's pages are loaded into
// registers two tiles ahead (pg: the tile being issued, pn: the next one).
template <typename T, int NG> struct PagedKV {
    static constexpr bool PER_GROUP = true;
    const T* kp;  // the head's column 0 (+ the thread's chunk on the 16-byte path)
    const T* vp;
    const int* table;  // this sequence's row of block_table
    i64 k_sp, k_ss, v_sp, v_ss;
    int shift, num_pages, max_pages, k0, j0;
    int len, offset;
    int pg[NG];  // pages of the groups of the tile issue() copies next
    int pn[NG];  // and of the tile after it

    __device__ __forceinline__ PagedKV(const T* K, const T* V, i64 k_sp_, i64 k_ss_, i64 k_sh, i64 v_sp_, i64 v_ss_,
                                       i64 v_sh, int b, int hk, int Sq, int capacity, const int* block_table,
                                       i64 bt_sb, const int* seq_lens, int page_shift, int num_pages_)
        : kp(K + (i64)hk * k_sh), vp(V + (i64)hk * v_sh), table(block_table + b * bt_sb), k_sp(k_sp_), k_ss(k_ss_),
          v_sp(v_sp_), v_ss(v_ss_), shift(page_shift), num_pages(num_pages_), max_pages(capacity >> page_shift),
          k0(0), j0(0) {
        len = min(max(seq_lens[b], 0), capacity);
        offset = len - Sq;  // the query rows are the sequence's last Sq tokens
    }
    __device__ __forceinline__ void thread_rows(int k0_, int kend, int j0_, int col, bool vec) {
        k0 = k0_;
        j0 = j0_;
        if (vec) {
            kp += col;
            vp += col;
            if (kend > k0) {  // the table entries of keys [k0, kend): a line (32 entries) a thread
                const int first = k0 >> shift, last = (kend - 1) >> shift;
                for (int e = first + 32 * (int)threadIdx.x; e <= last; e += 32 * THREADS) prefetch_l2(table + e);
                if (threadIdx.x == 0) prefetch_l2(table + last);  // (a line the stride of 32 steps over)
            }
            load(0, pg);
            load(Cfg<T>::BK, pn);
        }
    }
    // the pages of tile kt's groups (keys from k0 + kt); -1 past the table's row
    __device__ __forceinline__ void load(int kt, int (&p)[NG]) const {
#pragma unroll
        for (int g = 0; g < NG; ++g) {
            const int page = (k0 + kt + GROUP_KEYS * g) >> shift;
            p[g] = page < max_pages ? __ldg(table + page) : -1;
        }
    }
    // after tile kt's copies: its successor's pages move up, and the loads of the tile two
    // ahead go out
    __device__ __forceinline__ void advance(int kt) {
#pragma unroll
        for (int g = 0; g < NG; ++g) pg[g] = pn[g];
        load(kt + 2 * Cfg<T>::BK, pn);
    }
    // the thread's row of group g of the tile kt keys past k0 (its further rows in the group
    // are RSTEP * k_ss apart); whether the page may be read
    __device__ __forceinline__ bool group(int kt, int g, const T*& kq, const T*& vq) const {
        const int slot = (k0 + kt + GROUP_KEYS * g + j0) & ((1 << shift) - 1);
        const bool ok = (unsigned)pg[g] < (unsigned)num_pages;
        const i64 page = ok ? pg[g] : 0;
        kq = kp + page * k_sp + (i64)slot * k_ss;
        vq = vp + page * v_sp + (i64)slot * v_ss;
        return ok;
    }
    // element path: key j's row (any j >= 0: past the table's row it reads nothing)
    __device__ __forceinline__ bool row(int j, const T*& kr, const T*& vr) const {
        const int p = (j >> shift) < max_pages ? __ldg(table + (j >> shift)) : -1;
        const bool ok = (unsigned)p < (unsigned)num_pages;
        const i64 page = ok ? p : 0;
        const int slot = j & ((1 << shift) - 1);
        kr = kp + page * k_sp + (i64)slot * k_ss;
        vr = vp + page * v_sp + (i64)slot * v_ss;
        return ok;
    }
};

// The K/V ring of one block: tile t (keys k0 + t * BK ..) goes to stage t % STAGES, K then
// V, each BK rows of DT elements, swizzled. issue() is called for t = 0, 1, 2, ... in turn
// (the paged policy's lookahead relies on it).
template <typename T, int DT, int STAGES, typename KV> struct Ring {
    using C = Cfg<T>;
    static constexpr int BK = C::BK, VEC = C::VEC, CH = DT / VEC, ROWB = DT * (int)sizeof(T);
    static constexpr int TILE_BYTES = BK * ROWB;
    static constexpr int STAGE_BYTES = 2 * TILE_BYTES;
    // 16-byte path: thread tid copies chunk c = tid % CH of rows j0 + u * RSTEP (j0 = tid /
    // CH), so its addresses step by a constant and the swizzle (j & 7) changes by a constant
    // XOR: a copy costs a few instructions (and the kernel little code, which a cold
    // instruction cache fetches at every launch). The copies go by groups of GROUP_KEYS
    // keys (NG a tile, UPG copies each), whose first row the KV policy places.
    static constexpr int RSTEP = THREADS / CH, COPIES = BK / RSTEP;
    static constexpr int NG = BK / GROUP_KEYS, UPG = GROUP_KEYS / RSTEP;
    static_assert(THREADS % CH == 0 && BK % RSTEP == 0, "copy layout");
    static_assert(BK % GROUP_KEYS == 0 && GROUP_KEYS % RSTEP == 0 && NG * UPG == COPIES, "copy groups");
    // (j0 + u * RSTEP) & 7 == (j0 & 7) ^ ((u * RSTEP) & 7) when RSTEP is 4 or a multiple of 8
    static constexpr bool XOR_STEP = RSTEP % 8 == 0 || RSTEP == 4;

    KV kv;
    const T* K;  // a valid address for the zero-byte copies
    const T* V;
    unsigned char* smem;
    unsigned base;  // shared-window address of smem
    unsigned off0;  // 16-byte path: byte offset of the thread's first row in a tile
    int k0, kend, nt, D, tid, j0, c, cx;
    bool vec, cok;

    __device__ __forceinline__ Ring(const KV& kv_, const T* K_, const T* V_, unsigned char* sm, int k0_, int kend_,
                                    int nt_, int D_, bool vec_)
        : kv(kv_), K(K_), V(V_), smem(sm), base(smem_u32(sm)), k0(k0_), kend(kend_), nt(nt_), D(D_),
          tid(threadIdx.x), vec(vec_) {
        c = tid % CH;
        j0 = tid / CH;
        cx = c ^ (j0 & 7);  // row j0 + u * RSTEP: chunk cx ^ ((u * RSTEP) & 7)
        cok = c * VEC < D;
        off0 = (unsigned)(j0 * ROWB);
        kv.thread_rows(k0, kend, j0, c * VEC, vec);
    }

    // Copy tile t (if t < nt); always commit a group (empty past the last tile) so that
    // cp_wait's count means the same on every iteration.
    __device__ __forceinline__ void issue(int t) {
        if (t < nt) {
            const int kt = t * BK;  // from k0
            const unsigned ks = base + (unsigned)((t % STAGES) * STAGE_BYTES);
            if (vec) {
                const int rows = kend - k0 - kt;  // rows of this tile that exist
#pragma unroll
                for (int g = 0; g < NG; ++g) {
                    const T* kq;
                    const T* vq;
                    const bool gok = kv.group(kt, g, kq, vq);
#pragma unroll
                    for (int uu = 0; uu < UPG; ++uu) {
                        const int u = g * UPG + uu, step = KV::PER_GROUP ? uu : u;
                        const bool ok = cok && gok && j0 + u * RSTEP < rows;
                        const unsigned off = XOR_STEP ? off0 + (unsigned)(u * RSTEP * ROWB) + ((cx ^ ((u * RSTEP) & 7)) << 4)
                                                      : swizzle16(j0 + u * RSTEP, c, ROWB);
                        // zero-filled (0 source bytes: nothing read) past the keys and head_dim
                        cp16_zfill(ks + off, ok ? kq + (i64)(step * RSTEP) * kv.k_ss : K, ok ? 16 : 0);
                        cp16_zfill(ks + TILE_BYTES + off, ok ? vq + (i64)(step * RSTEP) * kv.v_ss : V, ok ? 16 : 0);
                    }
                }
                kv.advance(kt);  // the page lookahead, if paged
            } else {
                // element loads (unaligned K/V), U in flight a thread, into the same layout
                T* ksp = reinterpret_cast<T*>(smem + (ks - base));
                T* vsp = ksp + BK * DT;
                constexpr int U = 4;
#pragma unroll 1
                for (int b0 = tid; b0 < BK * DT; b0 += THREADS * U) {  // BK * DT is a multiple of THREADS * U
                    T kx[U], vx[U];
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const int idx = b0 + u * THREADS, j = idx / DT, d = idx - j * DT;
                        const T* kr;
                        const T* vr;
                        const bool rok = kv.row(k0 + kt + j, kr, vr);
                        const bool ok = k0 + kt + j < kend && d < D && rok;
                        kx[u] = ok ? kr[d] : from_f32<T>(0.f);
                        vx[u] = ok ? vr[d] : from_f32<T>(0.f);
                    }
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const int idx = b0 + u * THREADS, j = idx / DT, d = idx - j * DT;
                        const unsigned off = swizzle16(j, d / VEC, ROWB) / sizeof(T) + d % VEC;
                        ksp[off] = kx[u];
                        vsp[off] = vx[u];
                    }
                }
            }
        }
        cp_commit();
    }
};

}  // namespace decode
}  // namespace cuops

using namespace cuops;

// ------------------------------------------------------------------------ split kernel
// The body of attention_decode (contiguous K/V) and attention_decode_paged (a paged cache):
// make_kv(b, hk) gives the block's KV policy (StridedKV, PagedKV), which places its K/V rows
// and says how many keys its sequence has; everything else is the same code.
template <typename T, int DT, int RT, int STAGES, typename MakeKV>
__device__ __forceinline__ void decode_split(ATTN_PARAMS(T), float* __restrict__ work_o, float* __restrict__ work_lse,
                                             int S, int chunk, int NRT, const MakeKV& make_kv) {
    using namespace decode;
    using C = Cfg<T>;
    constexpr int BK = C::BK, KPW = C::KPW, VEC = C::VEC;
    constexpr int CH = DT / VEC;                 // 16-byte chunks a tile row
    constexpr int ROWB = DT * (int)sizeof(T);    // bytes a tile row
    constexpr int TILE = BK * DT;                // elements of one K (or V) tile
    constexpr int RING = STAGES * 2 * TILE * (int)sizeof(T);
    constexpr int RTP = C::MMA ? 16 : RT;        // rows of the per-warp states
    static_assert(!C::MMA || RT == 16, "the mma path handles one 16-row tile");
    static_assert(CH >= 8, "the swizzle needs 8 chunks a row");
    static_assert((BK * CH) % THREADS == 0 && (BK * DT) % (THREADS * 4) == 0, "tile copies split evenly");
    static_assert((NW * RTP * (DT + 3)) * 4 <= RING, "the warp states and row weights fit in the ring");
    static_assert(STAGES >= 2, "a ring needs two stages");

    extern __shared__ __align__(128) unsigned char smem[];
    // the query tile (fp16/bf16: 16 x DT of T, swizzled; float32: RT x DT floats), then its
    // rows' offsets in Q
    constexpr int QBYTES = C::MMA ? 16 * DT * (int)sizeof(T) : RT * DT * 4;
    unsigned char* qsm = smem + RING;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int group = Hq / Hkv, R = group * Sq;
    unsigned bid = blockIdx.x;
    const int rt = (int)split_index(bid, (unsigned)NRT);
    const int s = (int)split_index(bid, (unsigned)S);
    const int hk = (int)split_index(bid, (unsigned)Hkv), b = (int)bid;
    const int r0 = rt * RT, nrows = min(RT, R - r0);
    auto kv = make_kv(b, hk);
    const int Skv_b = kv.len, offset_b = kv.offset;  // this block's sequence
    // This split's keys: [ks, k1) of the sequence's split grid, which starts at its first
    // visible key (split_base: a sliding window's keys before it are no split's)
    const int ks = split_base(win_left, offset_b) + s * chunk, k1 = min(Skv_b, ks + chunk);

    // The tile's rows see keys from attn::first_key of its smallest query position i = row
    // % q_len (ilo) to attn::key_end of its largest (ihi): both grow with i. k0: where the
    // block starts loading (keys before its rows' windows are never loaded); kend: past the
    // last key any row sees (tiles beyond are never loaded); every row sees every key of
    // [kfirst, kfull) (tiles inside skip the mask).
    int ilo = 0, ihi = Sq - 1;
    if (nrows < Sq) {
        const int i0 = pos_of(r0, Sq);
        if (i0 + nrows <= Sq) ilo = i0, ihi = i0 + nrows - 1;
    }
    const int k0 = max(ks, group_floor(attn::first_key(ilo, win_left, offset_b)));
    const int kend = max(k0, min(k1, attn::key_end(ihi, Skv_b, causal, offset_b, win_right)));
    const int kfirst = attn::first_key(ihi, win_left, offset_b);
    const int kfull = min(k1, attn::key_end(ilo, Skv_b, causal, offset_b, win_right));
    const int nt = (kend - k0 + BK - 1) / BK;
    if (nt == 0 && S > 1) {
        // No key to load (a split past a shorter sequence's end, or wholly before its rows'
        // windows): the no-key state is LSE -inf alone, as the merge skips such a split and
        // never reads its output. (S == 1 writes O = 0 and LSE = -inf below.)
        if (tid < nrows) work_lse[(((i64)b * Hkv + hk) * R + r0 + tid) * S + s] = -CUOPS_INF;
        return;
    }

    // ---- the K/V ring (a paged cache's k_sb / v_sb are its page strides)
    const bool vec = vec_ok(K, k_sb, k_ss, k_sh, D) && vec_ok(V, v_sb, v_ss, v_sh, D);
    Ring<T, DT, STAGES, decltype(kv)> ring(kv, K, V, smem, k0, kend, nt, D, vec);

    const float sl2 = scale * attn::LOG2E;
    const float NEG_INF = -CUOPS_INF;
    // logit soft-capping of the base-2 scores s * log2(e): units of ln 2 (attn::SoftCap)
    const bool capped = softcap > 0.f;
    const attn::SoftCap cap = attn::SoftCap::make(capped ? softcap : 1.f, attn::LN2);

    // ---- the query tile (at most 16 x 256 elements). Aligned Q (the usual case) moves in
    // 16-byte chunks, a few a thread, each thread finding its rows' offsets itself: short
    // code and no barrier, which matters here because this part runs once a launch, on
    // its critical path (measured: 0.6-1.2 us a launch against element loads through a
    // table of row offsets). Its loads go out first, the ring's first STAGES - 1 tiles
    // right behind them, so the query (a few hundred bytes a block) does not queue behind
    // 32-64 KB of K/V. Unaligned Q goes element by element through that table (one
    // division by q_len a row, not one an element) after the ring's tiles, every load of a
    // thread issued before the first store. The first iteration's barrier publishes the
    // tile.
    const i64 qbase = b * q_sb;  // row_offset's base
    const bool q_vec = vec_ok(Q, q_sb, q_ss, q_sh, D);
    constexpr int QV = 16 / (int)sizeof(T);  // elements a chunk
    constexpr int QCH = DT / QV, QCHUNKS = RTP * QCH, QN = (QCHUNKS + THREADS - 1) / THREADS;
    uint4 qv[QN];
    if (q_vec) {
#pragma unroll
        for (int u = 0; u < QN; ++u) {
            const int idx = tid + u * THREADS, r = idx / QCH, c = idx - r * QCH;
            qv[u] = make_uint4(0u, 0u, 0u, 0u);
            if (r < nrows && c * QV < D) {
                const i64 off = row_offset(qbase, hk * group, r0 + r, Sq, q_ss, q_sh);
                qv[u] = *reinterpret_cast<const uint4*>(Q + off + c * QV);
            }
        }
    }

#pragma unroll 1
    for (int t = 0; t < STAGES - 1; ++t) ring.issue(t);

    if (q_vec) {
#pragma unroll
        for (int u = 0; u < QN; ++u) {
            const int idx = tid + u * THREADS, r = idx / QCH, c = idx - r * QCH;
            const int off = C::MMA ? (int)swizzle16(r, c, ROWB) : (r * DT + c * QV) * 4;
            if (QCHUNKS % THREADS == 0 || idx < QCHUNKS) *reinterpret_cast<uint4*>(qsm + off) = qv[u];
        }
    } else {
        i64* qoff = reinterpret_cast<i64*>(qsm + QBYTES);  // [RTP]
        if (tid < nrows) {
            qoff[tid] = row_offset(qbase, hk * group, r0 + tid, Sq, q_ss, q_sh);
        }
        __syncthreads();
        constexpr int QE = RTP * DT / THREADS;
        static_assert((RTP * DT) % THREADS == 0, "the query tile splits evenly");
        float qe[QE];
#pragma unroll
        for (int u = 0; u < QE; ++u) {
            const int idx = tid + u * THREADS, r = idx / DT, d = idx - r * DT;
            qe[u] = r < nrows && d < D ? to_f32(Q[qoff[r] + d]) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < QE; ++u) {
            const int idx = tid + u * THREADS, r = idx / DT, d = idx - r * DT;
            if constexpr (C::MMA) {
                *reinterpret_cast<T*>(qsm + swizzle16(r, d / VEC, ROWB) + (d % VEC) * sizeof(T)) = from_f32<T>(qe[u]);
            } else {
                reinterpret_cast<float*>(qsm)[r * DT + d] = qe[u];
            }
        }
    }

    if constexpr (C::MMA) {
        // ================= fp16/bf16: mma.sync, 16 rows x 16 keys a warp and tile
        const int g = lane >> 2, tq = lane & 3;
        int f0, f1;  // rows g and g + 8 see keys [f0, f0 + n0) and [f1, f1 + n1)
        const unsigned n0 = row_keys(r0 + g, R, Sq, Skv_b, causal, offset_b, win_left, win_right, k1, f0);
        const unsigned n1 = row_keys(r0 + g + 8, R, Sq, Skv_b, causal, offset_b, win_left, win_right, k1, f1);
        float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
        float acc[DT / 8][4];
#pragma unroll
        for (int n = 0; n < DT / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
        const unsigned qs = smem_u32(qsm);
        const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: matrix mi, its row mr

        for (int t = 0; t < nt; ++t) {
            cp_wait<STAGES - 2>();
            __syncthreads();  // tile t landed for every thread; every warp is done with t - 1
            ring.issue(t + STAGES - 1);
            const unsigned ks = ring.base + (unsigned)((t % STAGES) * 2 * TILE * sizeof(T)), vs = ks + TILE * sizeof(T);
            const int kt = k0 + t * BK;

            // S = Q K^T for keys kt + 16 * warp ... + 15: sc[n] = keys 8n.. (d0, d1: row g,
            // keys 2tq, 2tq + 1; d2, d3: row g + 8)
            float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
            for (int kk = 0; kk < DT / 16; ++kk) {
                unsigned a[4], kb[4];
                {   // Q: matrix mi = (rows 8 (mi & 1) .., chunk 2kk + (mi >> 1)) -> a0..a3
                    const int row = (mi & 1) * 8 + mr;
                    ldsm4<false>(qs + swizzle16(row, 2 * kk + (mi >> 1), ROWB), a);
                }
                {   // K: matrix mi = (keys 8 (mi >> 1) .., chunk 2kk + (mi & 1)) -> b0, b1 of
                    // key tiles 0 and 1
                    const int row = KPW * warp + (mi >> 1) * 8 + mr;
                    ldsm4<false>(ks + swizzle16(row, 2 * kk + (mi & 1), ROWB), kb);
                }
                mma_tile<T>(sc[0], a, kb[0], kb[1]);
                mma_tile<T>(sc[1], a, kb[2], kb[3]);
            }

            // online softmax, base 2: scaled, capped, masked (in that order: a masked score
            // must stay -inf, which the cap would make finite); a tile inside every row's
            // keys takes no mask
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) sc[n][e] *= sl2;
            if (capped) {
#pragma unroll
                for (int n = 0; n < 2; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sc[n][e] = cap(sc[n][e]);
            }
            const bool full = kt >= kfirst && kt + BK <= kfull;
            float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float v = sc[n][e];
                    if (!full) {
                        const int key = kt + KPW * warp + 8 * n + 2 * tq + (e & 1);
                        if ((e >> 1) ? (unsigned)(key - f1) >= n1 : (unsigned)(key - f0) >= n0) v = NEG_INF;
                    }
                    sc[n][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
            float alpha[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                const float mnew = fmaxf(m[h], mx[h]);
                const float mu = mnew == NEG_INF ? 0.f : mnew;  // no key yet: exp2(-inf - 0) = 0
                alpha[h] = exp2f(m[h] - mu);
                m[h] = mnew;
                mx[h] = mu;
            }
            float ps[2] = {0.f, 0.f};
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float p = exp2f(sc[n][e] - mx[e >> 1]);
                    sc[n][e] = p;
                    ps[e >> 1] += p;
                }
            l[0] = l[0] * alpha[0] + ps[0];  // this lane's share; the 4 lanes of a row sum at the end
            l[1] = l[1] * alpha[1] + ps[1];
#pragma unroll
            for (int n = 0; n < DT / 8; ++n) {
                acc[n][0] *= alpha[0];
                acc[n][1] *= alpha[0];
                acc[n][2] *= alpha[1];
                acc[n][3] *= alpha[1];
            }

            // O += P V: the score accumulators of key tiles 0, 1 are the A fragment of P
            unsigned pa[4];
            pa[0] = pack2<T>(sc[0][0], sc[0][1]);
            pa[1] = pack2<T>(sc[0][2], sc[0][3]);
            pa[2] = pack2<T>(sc[1][0], sc[1][1]);
            pa[3] = pack2<T>(sc[1][2], sc[1][3]);
#pragma unroll
            for (int c = 0; c < DT / 16; ++c) {
                // V (keys x columns) transposed: matrix mi = (keys 8 (mi & 1) .., chunk 2c +
                // (mi >> 1)) -> b0, b1 of column tiles 2c and 2c + 1
                unsigned vb[4];
                const int row = KPW * warp + (mi & 1) * 8 + mr;
                ldsm4<true>(vs + swizzle16(row, 2 * c + (mi >> 1), ROWB), vb);
                mma_tile<T>(acc[2 * c], pa, vb[0], vb[1]);
                mma_tile<T>(acc[2 * c + 1], pa, vb[2], vb[3]);
            }
        }
        cp_wait<0>();
        __syncthreads();  // the ring is free: it holds the warps' states now

#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
            l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        }
        float* o_s = reinterpret_cast<float*>(smem);  // [NW][16][DT]
        float* m_s = o_s + NW * RTP * DT;             // [NW][16]
        float* l_s = m_s + NW * RTP;
        float* ow = o_s + warp * RTP * DT;
        // Only real rows are stored: in plain decoding a block has group (4-8) of its 16
        // rows, and these stores are on the launch's critical path.
        if (g < nrows) {
#pragma unroll
            for (int n = 0; n < DT / 8; ++n)
                *reinterpret_cast<float2*>(ow + g * DT + 8 * n + 2 * tq) = make_float2(acc[n][0], acc[n][1]);
        }
        if (nrows > 8 && g + 8 < nrows) {
#pragma unroll
            for (int n = 0; n < DT / 8; ++n)
                *reinterpret_cast<float2*>(ow + (g + 8) * DT + 8 * n + 2 * tq) = make_float2(acc[n][2], acc[n][3]);
        }
        if (tq == 0) {
            m_s[warp * RTP + g] = m[0];
            m_s[warp * RTP + g + 8] = m[1];
            l_s[warp * RTP + g] = l[0];
            l_s[warp * RTP + g + 8] = l[1];
        }
    } else {
        // ================= float32: CUDA cores, RT rows x 8 keys a warp and tile
        constexpr int EL = DT / 32;  // output columns a lane owns
        const int j = lane & 7, c4 = lane >> 3;
        const float* qf = reinterpret_cast<const float*>(qsm);
        float m[RT], l[RT], acc[RT][EL];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            m[r] = NEG_INF;
            l[r] = 0.f;
#pragma unroll
            for (int e = 0; e < EL; ++e) acc[r][e] = 0.f;
        }

        for (int t = 0; t < nt; ++t) {
            cp_wait<STAGES - 2>();
            __syncthreads();  // tile t landed for every thread; every warp is done with t - 1
            ring.issue(t + STAGES - 1);
            const float* ksf = reinterpret_cast<const float*>(smem + (t % STAGES) * 2 * TILE * sizeof(T));
            const float* vsf = ksf + TILE;
            const int kt = k0 + t * BK;

            // scores of key j (tile row KPW * warp + j, whose swizzle is j): this lane's
            // quarter is chunks c4, c4 + 4, ...; the 8 lanes of one chunk column hit 8 banks
            float sc[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) sc[r] = 0.f;
            const float* krow = ksf + (KPW * warp + j) * DT;
#pragma unroll
            for (int ii = 0; ii < CH / 4; ++ii) {
                const int ch = c4 + 4 * ii;
                const float4 kv = *reinterpret_cast<const float4*>(krow + ((ch ^ j) << 2));
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    const float4 qv = *reinterpret_cast<const float4*>(qf + r * DT + ch * 4);
                    sc[r] = fmaf(qv.x, kv.x, sc[r]);
                    sc[r] = fmaf(qv.y, kv.y, sc[r]);
                    sc[r] = fmaf(qv.z, kv.z, sc[r]);
                    sc[r] = fmaf(qv.w, kv.w, sc[r]);
                }
            }
            // this lane's key's scores: the quarters summed, scaled, capped, masked (in that
            // order: a masked score must stay -inf)
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                float v = sc[r] + __shfl_xor_sync(0xffffffffu, sc[r], 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                sc[r] = v * sl2;
            }
            if (capped) {
#pragma unroll
                for (int r = 0; r < RT; ++r) sc[r] = cap(sc[r]);
            }
            const bool full = kt >= kfirst && kt + BK <= kfull;
            const int key = kt + KPW * warp + j;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                float v = sc[r];
                if (!full) {
                    int first;
                    const unsigned n = row_keys(r0 + r, R, Sq, Skv_b, causal, offset_b, win_left, win_right, k1, first);
                    if ((unsigned)(key - first) >= n) v = NEG_INF;
                }
                float mx = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                const float mnew = fmaxf(m[r], mx);
                const float mu = mnew == NEG_INF ? 0.f : mnew;  // no key yet: exp2(-inf - 0) = 0
                const float alpha = exp2f(m[r] - mu);
                m[r] = mnew;
                const float p = exp2f(v - mu);
                sc[r] = p;
                l[r] = l[r] * alpha + p;  // this lane's key only; the 8 keys sum at the end
#pragma unroll
                for (int e = 0; e < EL; ++e) acc[r][e] *= alpha;
            }
            // O += P V: key jj's probabilities come from lane jj
#pragma unroll
            for (int jj = 0; jj < KPW; ++jj) {
                const float* vrow = vsf + (KPW * warp + jj) * DT;
                float vv[EL];
                if constexpr (EL == 2) {
                    const float2 x = *reinterpret_cast<const float2*>(vrow + (((lane >> 1) ^ jj) << 2) + ((lane & 1) << 1));
                    vv[0] = x.x;
                    vv[1] = x.y;
                } else {
#pragma unroll
                    for (int q = 0; q < EL / 4; ++q) {
                        const float4 x = *reinterpret_cast<const float4*>(vrow + (((lane + 32 * q) ^ jj) << 2));
                        vv[4 * q] = x.x;
                        vv[4 * q + 1] = x.y;
                        vv[4 * q + 2] = x.z;
                        vv[4 * q + 3] = x.w;
                    }
                }
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    const float pj = __shfl_sync(0xffffffffu, sc[r], jj);
#pragma unroll
                    for (int e = 0; e < EL; ++e) acc[r][e] = fmaf(pj, vv[e], acc[r][e]);
                }
            }
        }
        cp_wait<0>();
        __syncthreads();  // the ring is free: it holds the warps' states now

        float* o_s = reinterpret_cast<float*>(smem);  // [NW][RT][DT]
        float* m_s = o_s + NW * RTP * DT;             // [NW][RT]
        float* l_s = m_s + NW * RTP;
        float* ow = o_s + warp * RTP * DT;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            float lr = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            lr += __shfl_xor_sync(0xffffffffu, lr, 4);
            if (lane == 0) {
                m_s[warp * RTP + r] = m[r];
                l_s[warp * RTP + r] = lr;
            }
            if (r >= nrows) continue;  // padding rows: never read
            if constexpr (EL == 2) {
                *reinterpret_cast<float2*>(ow + r * DT + 2 * lane) = make_float2(acc[r][0], acc[r][1]);
            } else {
#pragma unroll
                for (int q = 0; q < EL / 4; ++q)
                    *reinterpret_cast<float4*>(ow + r * DT + 4 * (lane + 32 * q)) =
                        make_float4(acc[r][4 * q], acc[r][4 * q + 1], acc[r][4 * q + 2], acc[r][4 * q + 3]);
            }
        }
    }
    __syncthreads();

    // ---- combine the warps (fixed order) and write O / LSE, or this split's partial. One
    // thread a row first turns the warps' maxima and sums into per-warp weights with 1 / L
    // folded in (w = 2^(m_w - M) / L; 0 for a warp that saw no key, and for every warp when
    // the row saw none: O = 0), so that each output element is a 4-term dot product.
    {
        float* o_s = reinterpret_cast<float*>(smem);
        float* m_s = o_s + NW * RTP * DT;
        float* l_s = m_s + NW * RTP;
        float* w_s = l_s + NW * RTP;  // [RTP][NW]
        const i64 row0 = ((i64)b * Hkv + hk) * R + r0;  // LSE-order index of the tile's row 0
        if (tid < nrows) {
            const int r = tid;
            float M = NEG_INF;
#pragma unroll
            for (int w = 0; w < NW; ++w) M = fmaxf(M, m_s[w * RTP + r]);
            float wt[NW], L = 0.f;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                const float mw = m_s[w * RTP + r];
                wt[w] = M == NEG_INF || mw == NEG_INF ? 0.f : exp2f(mw - M);
                L += wt[w] * l_s[w * RTP + r];
            }
            // L >= 1 whenever M is finite (the max key adds 2^0); L == 0: no key seen
            const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
            for (int w = 0; w < NW; ++w) w_s[r * NW + w] = wt[w] * inv;
            const i64 row = row0 + r;
            if (S == 1) {
                if (LSE != nullptr) LSE[row] = L > 0.f ? (M + log2f(L)) * attn::LN2 : NEG_INF;
            } else {
                work_lse[row * S + s] = L > 0.f ? M + log2f(L) : NEG_INF;
            }
        }
        __syncthreads();
        for (int idx = tid; idx < nrows * DT; idx += THREADS) {
            const int r = idx / DT, d = idx - r * DT;
            if (d >= D) continue;
            float o = 0.f;
#pragma unroll
            for (int w = 0; w < NW; ++w) o = fmaf(w_s[r * NW + w], o_s[(w * RTP + r) * DT + d], o);
            if (S == 1) {
                O[row_offset(b * o_sb, hk * group, r0 + r, Sq, o_ss, o_sh) + d] = from_f32<T>(o);
            } else {
                work_o[((row0 + r) * S + s) * D + d] = o;
            }
        }
    }
}

template <typename T, int DT, int RT, int STAGES>
__global__ void __launch_bounds__(decode::THREADS, decode::MinBlocks<T, DT, RT>::value)
    attention_decode(ATTN_PARAMS(T), float* __restrict__ work_o, float* __restrict__ work_lse, int S, int chunk,
                     int NRT) {
    decode_split<T, DT, RT, STAGES>(ATTN_ARGS, work_o, work_lse, S, chunk, NRT, [&](int b, int hk) {
        return decode::StridedKV<T>(K, V, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, b, hk, Skv, causal_offset);
    });
}

// The paged cache: K and V are [num_pages, page_size, Hkv, D] with k_sb / v_sb their page
// strides, Skv = max_pages * page_size (the table's capacity: what the plan splits, or a
// left window's span where shorter), block_table[b * bt_sb + p] (int32) the page of
// sequence b's keys p * page_size .., seq_lens[b] its length, page_size = 1 << page_shift.
// causal_offset is unused: each sequence's query rows are its last Sq tokens (offset
// seq_len - Sq, for the causal mask and the window alike).
template <typename T, int DT, int RT, int STAGES>
__global__ void __launch_bounds__(decode::THREADS, decode::MinBlocks<T, DT, RT>::value)
    attention_decode_paged(ATTN_PARAMS(T), float* __restrict__ work_o, float* __restrict__ work_lse, int S,
                           int chunk, int NRT, const int* __restrict__ block_table, i64 bt_sb,
                           const int* __restrict__ seq_lens, int page_shift, int num_pages) {
    decode_split<T, DT, RT, STAGES>(ATTN_ARGS, work_o, work_lse, S, chunk, NRT, [&](int b, int hk) {
        return decode::PagedKV<T, decode::Cfg<T>::BK / decode::GROUP_KEYS>(
            K, V, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, b, hk, Sq, Skv, block_table, bt_sb, seq_lens, page_shift,
            num_pages);
    });
}

// ------------------------------------------------------------------------ merge kernel
// One warp a row: the S partials of the row, combined in split order through their LSE.
template <typename T>
__global__ void __launch_bounds__(decode::THREADS)
    attention_decode_merge(ATTN_PARAMS(T), const float* __restrict__ work_o, const float* __restrict__ work_lse,
                           int S) {
    const float NEG_INF = -CUOPS_INF;
    const i64 rows = (i64)B * Hq * Sq;
    const i64 row = (i64)blockIdx.x * decode::NW + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;  // a whole warp: no shuffle is left waiting
    const float* lse = work_lse + row * S;
    float M = NEG_INF;
    for (int s = lane; s < S; s += 32) M = fmaxf(M, lse[s]);
    M = warp_reduce<FMax>(M);
    float L = 0.f;
    if (M != NEG_INF)
        for (int s = lane; s < S; s += 32) L += exp2f(lse[s] - M);
    L = warp_reduce<FSum>(L);
    const int i = (int)(row % Sq), h = (int)((row / Sq) % Hq);
    const i64 b = row / ((i64)Sq * Hq);
    T* o = O + b * o_sb + i * o_ss + (i64)h * o_sh;
    const float inv = M != NEG_INF ? 1.f / L : 0.f;
    const float* wo = work_o + row * S * D;
    for (int d = lane; d < D; d += 32) {
        float acc = 0.f;
        if (M != NEG_INF)
            for (int s = 0; s < S; ++s) {
                const float ls = lse[s];
                if (ls != NEG_INF) acc += exp2f(ls - M) * wo[(i64)s * D + d];
            }
        o[d] = from_f32<T>(acc * inv);
    }
    if (lane == 0 && LSE != nullptr) LSE[row] = M != NEG_INF ? (M + log2f(L)) * attn::LN2 : NEG_INF;
}

// ------------------------------------------------------------------------ merge_attention_states
// Two partial attentions of the same rows (o_a over keys A, o_b over keys B, each
// normalised by its own sum, with natural-log LSEs) into the attention over A and B: with
// M = max(lse_a, lse_b) and w = e^(lse - M), o = (w_a o_a + w_b o_b) / (w_a + w_b) and
// lse = M + ln(w_a + w_b). The decode merge's arithmetic for two states, in natural log
// (no base-2 round trip), so that the larger side's weight is exactly 1: a side whose LSE is
// -inf (it saw no key) leaves the other side's o and lse bit for bit, and its o is never
// read into the sum (whatever it holds); both -inf: o = 0, lse = -inf, as a row that sees
// no key. rows = tokens * H (row r = t * H + h); out holds o [rows, D] (T), then, lse_off
// bytes in, lse [rows] (float32): one buffer, one result array for a fast call to make.
// One thread a 16-byte chunk (VEC elements) of a row; element by element where a pointer, a
// stride or D is not a multiple of 16 bytes (uniform per launch).
namespace cuops {
namespace decode {
// w_a x_a + w_b x_b, a side of weight 0 left out (its x may be anything, NaN included);
// products and sum rounded one by one (no FMA contraction), so the 16-byte and the element
// path give the same bits, and a weight of 1 against 0 gives x itself (-0 included)
__device__ __forceinline__ float weigh(float wa, float xa, float wb, float xb) {
    const float a = __fmul_rn(wa, xa), b = __fmul_rn(wb, xb);
    return wa == 0.f ? (wb == 0.f ? 0.f : b) : (wb == 0.f ? a : __fadd_rn(a, b));
}
}  // namespace decode
}  // namespace cuops

template <typename T>
__global__ void __launch_bounds__(decode::THREADS)
    attention_merge_states(const T* __restrict__ oa, const float* __restrict__ la, const T* __restrict__ ob,
                           const float* __restrict__ lb, unsigned char* __restrict__ out, i64 lse_off, i64 rows,
                           int H, int D, i64 oa_st, i64 oa_sh, i64 ob_st, i64 ob_sh, i64 la_st, i64 la_sh,
                           i64 lb_st, i64 lb_sh) {
    using decode::weigh;
    constexpr int VEC = Vec<T>::N;
    const float NEG_INF = -CUOPS_INF;
    const int CH = (D + VEC - 1) / VEC;
    const i64 idx = (i64)blockIdx.x * decode::THREADS + threadIdx.x;
    if (idx >= rows * CH) return;
    const i64 r = idx / CH, t = r / H;
    const int c = (int)(idx - r * CH), h = (int)(r - t * H);
    const float a = la[t * la_st + h * la_sh], b = lb[t * lb_st + h * lb_sh];
    const float M = fmaxf(a, b);
    float wa = 0.f, wb = 0.f, lse = NEG_INF;
    if (M != NEG_INF) {  // (a NaN LSE gives NaN weights: it propagates)
        wa = expf(a - M);
        wb = expf(b - M);
        const float sum = wa + wb;
        lse = M + logf(sum);
        wa /= sum;
        wb /= sum;
    }
    if (c == 0) reinterpret_cast<float*>(out + lse_off)[r] = lse;
    const T* pa = oa + t * oa_st + h * oa_sh + c * VEC;
    const T* pb = ob + t * ob_st + h * ob_sh + c * VEC;
    T* po = reinterpret_cast<T*>(out) + r * D + c * VEC;
    const bool vec = ((reinterpret_cast<unsigned long long>(oa) | reinterpret_cast<unsigned long long>(ob) |
                       reinterpret_cast<unsigned long long>(out)) & 15ull) == 0 &&
                     oa_st % VEC == 0 && oa_sh % VEC == 0 && ob_st % VEC == 0 && ob_sh % VEC == 0 && D % VEC == 0;
    if (vec) {
        float xa[VEC], xb[VEC], y[VEC];
        if (wa != 0.f) load_vec(pa, xa);
        if (wb != 0.f) load_vec(pb, xb);
#pragma unroll
        for (int e = 0; e < VEC; ++e) y[e] = weigh(wa, xa[e], wb, xb[e]);
        store_vec(po, y);
    } else {
        for (int e = 0; e < VEC && c * VEC + e < D; ++e)
            po[e] = from_f32<T>(weigh(wa, wa != 0.f ? to_f32(pa[e]) : 0.f, wb, wb != 0.f ? to_f32(pb[e]) : 0.f));
    }
}

// ------------------------------------------------------------------------ kv_cache_append
// New tokens into a paged cache (the layout attention_decode_paged reads): token i of
// sequence b (k[b, i], v[b, i] of [B, N, H, D]) goes to position pos = positions[b] + i,
// slot pos % page_size of page block_table[b * bt_sb + pos / page_size]. A token whose
// position is outside [0, max_pages * page_size), or whose page is outside [0, num_pages),
// is not written: nothing is read or written out of bounds whatever the GPU-resident
// positions and table hold. One thread a 16-byte chunk (VEC elements) of a (token, head)
// row, K and V both; element by element where a pointer, a stride or D is not a multiple of
// 16 bytes (uniform per launch).
template <typename T>
__global__ void __launch_bounds__(decode::THREADS)
    kv_cache_append(T* __restrict__ Kc, T* __restrict__ Vc, const T* __restrict__ Kn, const T* __restrict__ Vn,
                    const int* __restrict__ block_table, const int* __restrict__ positions, int B, int N, int H,
                    int D, i64 kc_sp, i64 kc_ss, i64 kc_sh, i64 vc_sp, i64 vc_ss, i64 vc_sh, i64 kn_sb, i64 kn_sn,
                    i64 kn_sh, i64 vn_sb, i64 vn_sn, i64 vn_sh, i64 bt_sb, int page_shift, int num_pages,
                    int max_pages) {
    constexpr int VEC = Vec<T>::N;
    const int CH = (D + VEC - 1) / VEC;
    const i64 idx = (i64)blockIdx.x * decode::THREADS + threadIdx.x;
    if (idx >= (i64)B * N * H * CH) return;
    i64 r = idx / CH;
    const int c = (int)(idx - r * CH);
    const int h = (int)(r % H);
    r /= H;
    const int i = (int)(r % N), b = (int)(r / N);
    const i64 pos = (i64)positions[b] + i;
    if (pos < 0 || pos >= ((i64)max_pages << page_shift)) return;
    const int page = block_table[b * bt_sb + (pos >> page_shift)];
    if ((unsigned)page >= (unsigned)num_pages) return;
    const i64 slot = pos & ((1 << page_shift) - 1);
    T* kd = Kc + page * kc_sp + slot * kc_ss + h * kc_sh + c * VEC;
    T* vd = Vc + page * vc_sp + slot * vc_ss + h * vc_sh + c * VEC;
    const T* ks = Kn + b * kn_sb + i * kn_sn + h * kn_sh + c * VEC;
    const T* vs = Vn + b * vn_sb + i * vn_sn + h * vn_sh + c * VEC;
    const bool vec = ((reinterpret_cast<unsigned long long>(Kc) | reinterpret_cast<unsigned long long>(Vc) |
                       reinterpret_cast<unsigned long long>(Kn) | reinterpret_cast<unsigned long long>(Vn)) & 15ull) == 0 &&
                     (kc_sp | kc_ss | kc_sh | vc_sp | vc_ss | vc_sh | kn_sb | kn_sn | kn_sh | vn_sb | vn_sn | vn_sh) % VEC == 0 &&
                     D % VEC == 0;
    if (vec) {
        *reinterpret_cast<uint4*>(kd) = __ldg(reinterpret_cast<const uint4*>(ks));
        *reinterpret_cast<uint4*>(vd) = __ldg(reinterpret_cast<const uint4*>(vs));
    } else {
        for (int e = 0; e < VEC && c * VEC + e < D; ++e) {
            kd[e] = ks[e];
            vd[e] = vs[e];
        }
    }
}

// ------------------------------------------------------------------------ kv_cache_gather
// The other direction, for attention_paged's packed chunked prefill: every sequence's keys
// and values copied out of their pages into packed [rows, H, D] arrays (C-contiguous),
// sequence b at rows cu_k[b] .. cu_k[b] + L_b - 1, L_b = seq_lens[b] clamped to [0, max_pages
// * page_size] (its pages in order, as the paged kernel reads them), and the offsets cu_k
// [B + 1] written too (cu_k[0] = 0, cu_k[b + 1] = cu_k[b] + L_b): the input of
// attention_varlen, with nothing read on the host. A key whose page entry is outside [0,
// num_pages) is copied as zeros (as the paged kernel reads it). The `tail` rows after the
// last sequence are written as zeros: attention reads a key tile past a sequence's end
// (masked scores, but a zero weight times a NaN left in the buffer is NaN). Grid (blocks of
// THREADS 16-byte chunks over max_pages * page_size + tail rows x H x CH chunks, B): block
// (x, b) sums the clamped lengths of the sequences before b (B small: a few loads a thread)
// for its rows' offset; the blocks past L_b (the last sequence: L_b + tail) return.
// `rows`: the packed arrays' rows (the launcher's bound on the sum); a row past it is not
// written.
template <typename T>
__global__ void __launch_bounds__(decode::THREADS)
    kv_cache_gather(const T* __restrict__ Kc, const T* __restrict__ Vc, T* __restrict__ Ko, T* __restrict__ Vo,
                    int* __restrict__ cu_k, const int* __restrict__ block_table, const int* __restrict__ seq_lens,
                    int H, int D, i64 rows, i64 kc_sp, i64 kc_ss, i64 kc_sh, i64 vc_sp, i64 vc_ss, i64 vc_sh,
                    i64 bt_sb, int page_shift, int num_pages, int max_pages, int tail) {
    constexpr int VEC = Vec<T>::N;
    const int CH = (D + VEC - 1) / VEC;
    const int b = blockIdx.y;
    const i64 cap = (i64)max_pages << page_shift;
    const i64 len = min(max((i64)seq_lens[b], (i64)0), cap);
    const i64 span = b == (int)gridDim.y - 1 ? len + tail : len;  // rows this sequence's blocks write
    const i64 first = (i64)blockIdx.x * decode::THREADS;  // this block's first chunk of the sequence
    if (blockIdx.x != 0 && first >= span * H * CH) return;  // (block 0 of each sequence writes its offset)

    // the rows before sequence b: its offset in the packed arrays
    __shared__ i64 warp_sums[decode::NW];
    i64 before = 0;
    for (int p = threadIdx.x; p < b; p += decode::THREADS) before += min(max((i64)seq_lens[p], (i64)0), cap);
    before = warp_reduce<SumOp>(before);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = before;
    __syncthreads();
    before = 0;
#pragma unroll
    for (int w = 0; w < decode::NW; ++w) before += warp_sums[w];
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        if (b == 0) cu_k[0] = 0;
        cu_k[b + 1] = (int)min(before + len, rows);
    }

    const i64 idx = first + threadIdx.x;
    if (idx >= span * H * CH) return;
    const i64 r = idx / CH;
    const int c = (int)(idx - r * CH);
    const int h = (int)(r % H);
    const i64 j = r / H;  // the key's position in its sequence (past len: the tail)
    if (before + j >= rows) return;
    const int page = j < len ? block_table[b * bt_sb + (j >> page_shift)] : -1;
    const i64 slot = j & ((1 << page_shift) - 1);
    T* kd = Ko + ((before + j) * H + h) * D + c * VEC;
    T* vd = Vo + ((before + j) * H + h) * D + c * VEC;
    const bool valid = (unsigned)page < (unsigned)num_pages;
    const T* ks = Kc + (valid ? page * kc_sp + slot * kc_ss + h * kc_sh + c * VEC : 0);
    const T* vs = Vc + (valid ? page * vc_sp + slot * vc_ss + h * vc_sh + c * VEC : 0);
    const bool vec = ((reinterpret_cast<unsigned long long>(Kc) | reinterpret_cast<unsigned long long>(Vc) |
                       reinterpret_cast<unsigned long long>(Ko) | reinterpret_cast<unsigned long long>(Vo)) & 15ull) == 0 &&
                     (kc_sp | kc_ss | kc_sh | vc_sp | vc_ss | vc_sh) % VEC == 0 && D % VEC == 0;
    if (vec) {
        const uint4 zero = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(kd) = valid ? __ldg(reinterpret_cast<const uint4*>(ks)) : zero;
        *reinterpret_cast<uint4*>(vd) = valid ? __ldg(reinterpret_cast<const uint4*>(vs)) : zero;
    } else {
        for (int e = 0; e < VEC && c * VEC + e < D; ++e) {
            kd[e] = valid ? ks[e] : from_f32<T>(0.f);
            vd[e] = valid ? vs[e] : from_f32<T>(0.f);
        }
    }
}
