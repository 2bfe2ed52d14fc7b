"""Does the order in which decode blocks read a [B, S, Hkv, D] cache change the DRAM rate?

A probe for issue 19's decode gap (NOTES 128): a kernel that only streams K and V into a
cp.async ring the way kernels/attention_decode.cu does (128 threads, 16-byte copies, 3
stages of 32 KB, two blocks an SM), with no attention math, in several read orders over the
same bytes:

- ``heads=1``: a block a (sequence, KV head), as the decode kernel: 256-byte rows 2 KB apart;
- ``heads=2`` / ``heads=8``: a block a (sequence, 2 or 8 KV heads, a share of the keys):
  512-byte or whole 2 KB token rows, the keys split so the grid keeps ~512 blocks;
- ``bhsd``: one head a block over a [B, Hkv, S, D] cache (contiguous 256-byte rows, what a
  head-major layout would read), the same bytes;
- ``pages of 16 in random order``: decode's order over a paged pool (a block table of a
  random permutation), as attention_paged reads; ``in order (a table)`` the same lookups
  over pages laid out in order (what the lookups cost apart from where the pages lie);
  ``random inside 2 MB`` pages shuffled only inside each 2 MB of the pool (the GPU's large
  page: what the translations cost); ``warmed`` one line of each page fetched to L2 one or
  four tiles before its copies;
- ``16 KB bulk copies``: all heads a block, each tile of 8 whole tokens (16 KB of K, 16 KB
  of V) one cp.async.bulk copy completing on an mbarrier.

CUDA events, L2 flushed, median of 30; SDPA's cuDNN backend on the same [B, S, Hkv, D]
tensors for scale.

    python benchmarks/decode_stream_probe.py [--rounds 2]
"""
import argparse

import cupy as cp
import numpy as np

from cupyops.bench.timing import L2Flusher, time_gpu

B, S, HKV, HQ, D = 64, 4096, 8, 32, 128
SRC = r"""
extern "C" __global__ void __launch_bounds__(128, 2)
stream_kv(const uint4* __restrict__ K, const uint4* __restrict__ V, int S, int hkv, int heads, int splits,
          int head_stride, int key_stride, int batch_stride, const int* __restrict__ table, int warm_ahead,
          unsigned* out) {
    // strides in uint4 (16 bytes): a head's row is 16 of them (D = 128 bf16)
    extern __shared__ uint4 ring[];
    const int STAGES = 3, TILE = 1024;  // uint4 a tile of K (16 KB), as many of V
    const int groups = hkv / heads, tile_keys = 64 / heads;
    int bid = blockIdx.x;
    const int split = bid % splits; bid /= splits;
    const int hg = bid % groups; const int b = bid / groups;
    const int keys = S / splits, k0 = split * keys, nt = keys / tile_keys;
    const int tid = threadIdx.x;
    const unsigned base = (unsigned)__cvta_generic_to_shared(ring);
    auto issue = [&](int t) {
        if (table && warm_ahead && tid < tile_keys / 16 && t + warm_ahead < nt) {
            // one line of each page that tile t + warm_ahead reads, fetched to L2 now (its
            // address translation with it)
            const int key = k0 + (t + warm_ahead) * tile_keys + 16 * tid;
            const long long off = (long long)__ldg(table + (b * S + key) / 16) * 16 * key_stride + hg * heads * head_stride;
            asm volatile("prefetch.global.L2 [%0];" :: "l"(K + off));
            asm volatile("prefetch.global.L2 [%0];" :: "l"(V + off));
        }
        if (t < nt) {
            const unsigned st = base + (t % STAGES) * 2 * TILE * 16;
            #pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int i = tid + 128 * u;          // chunk of the tile: (key, head, 16-byte piece)
                const int c = i % 16, r = i / 16;     // r: (key, head) row of the tile
                const int h = r % heads, j = r / heads;
                const int key = k0 + t * tile_keys + j;
                // paged: 16-token pages of [pages, 16, Hkv, D] placed by the table
                const long long slot = table ? (long long)__ldg(table + (b * S + key) / 16) * 16 + key % 16
                                             : (long long)b * S + key;
                const long long off = table ? slot * key_stride + (long long)(hg * heads + h) * head_stride + c
                                            : (long long)b * batch_stride + (long long)key * key_stride
                                              + (long long)(hg * heads + h) * head_stride + c;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(st + i * 16), "l"(K + off) : "memory");
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(st + (TILE + i) * 16), "l"(V + off) : "memory");
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    unsigned acc = 0;
    issue(0); issue(1);
    for (int t = 0; t < nt; ++t) {
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        __syncthreads();
        issue(t + 2);
        const uint4* st = ring + (t % STAGES) * 2 * TILE;
        #pragma unroll
        for (int u = 0; u < 16; ++u) { const uint4 x = st[tid + 128 * u]; acc ^= x.x ^ x.w; }
        __syncthreads();
    }
    if (acc == 0x12345678u) out[0] = acc;  // (keeps the reads; never true for random data in practice)
}

// All heads a block, each tile of 16 KB of K (and of V) one bulk copy: in [B, S, Hkv, D] a run
// of whole tokens is contiguous. One thread issues; a stage's mbarrier says it landed.
extern "C" __global__ void __launch_bounds__(128, 2)
stream_kv_bulk(const char* __restrict__ K, const char* __restrict__ V, int S, int hkv, int splits, unsigned* out) {
    extern __shared__ __align__(1024) unsigned char bring[];
    unsigned char* ring = bring;
    const int STAGES = 3, TILE = 16384;
    const int row_bytes = hkv * 256, tile_keys = TILE / row_bytes;
    int bid = blockIdx.x;
    const int split = bid % splits; const int b = bid / splits;
    const int keys = S / splits, k0 = split * keys, nt = keys / tile_keys;
    const int tid = threadIdx.x;
    const unsigned base = (unsigned)__cvta_generic_to_shared(ring), bars = base + STAGES * 2 * TILE;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bars + 8 * s));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int t) {
        if (tid == 0 && t < nt) {
            const unsigned st = base + (t % STAGES) * 2 * TILE, bar = bars + 8 * (t % STAGES);
            const long long src = ((long long)b * S + k0 + (long long)t * tile_keys) * row_bytes;
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(2 * TILE) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(st), "l"(K + src), "r"(TILE), "r"(bar) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(st + TILE), "l"(V + src), "r"(TILE), "r"(bar) : "memory");
        }
    };
    unsigned acc = 0;
    issue(0); issue(1);
    for (int t = 0; t < nt; ++t) {
        const unsigned bar = bars + 8 * (t % STAGES), parity = (t / STAGES) & 1;
        unsigned done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        __syncthreads();
        issue(t + 2);
        const uint4* st = reinterpret_cast<const uint4*>(ring + (t % STAGES) * 2 * TILE);
        #pragma unroll
        for (int u = 0; u < 16; ++u) { const uint4 x = st[tid + 128 * u]; acc ^= x.x ^ x.w; }
        __syncthreads();
    }
    if (acc == 0x12345678u) out[0] = acc;
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    fn, bulk = mod.get_function("stream_kv"), mod.get_function("stream_kv_bulk")
    smem = 3 * 2 * 1024 * 16
    fn.max_dynamic_shared_size_bytes = smem
    bulk.max_dynamic_shared_size_bytes = smem + 1024 + 64
    flush = L2Flusher()
    k = cp.random.standard_normal((B, S, HKV, D), dtype=cp.float32).astype(cp.float16)
    v = cp.random.standard_normal((B, S, HKV, D), dtype=cp.float32).astype(cp.float16)
    kh, vh = cp.ascontiguousarray(k.transpose(0, 2, 1, 3)), cp.ascontiguousarray(v.transpose(0, 2, 1, 3))
    out = cp.zeros(1, cp.uint32)
    nbytes = k.nbytes + v.nbytes
    row = D * 2 // 16  # uint4 a head row

    def launcher(kk, vv, heads, splits, head_stride, key_stride, batch_stride, table=None, warm=0):
        grid = B * (HKV // heads) * splits
        argv = (kk, vv, np.int32(S), np.int32(HKV), np.int32(heads), np.int32(splits), np.int32(head_stride),
                np.int32(key_stride), np.int32(batch_stride), table if table is not None else np.uint64(0),
                np.int32(warm), out)
        return lambda: fn((grid,), (128,), argv, shared_mem=smem)

    def bulk_launcher(splits):
        argv = (k, v, np.int32(S), np.int32(HKV), np.int32(splits), out)
        return lambda: bulk((B * splits,), (128,), argv, shared_mem=smem + 1024 + 64)

    # a paged pool: the same tokens' pages of 16 in a random order (the bytes moved by page)
    rng = np.random.default_rng(0)
    perm = rng.permutation(B * S // 16).astype(np.int32)
    table = cp.asarray(perm)
    in_order = cp.arange(B * S // 16, dtype=cp.int32)  # the lookups alone: pages where they are
    kp, vp = cp.empty_like(k), cp.empty_like(v)
    kp.reshape(-1, 16, HKV, D)[table] = k.reshape(-1, 16, HKV, D)
    vp.reshape(-1, 16, HKV, D)[table] = v.reshape(-1, 16, HKV, D)
    # random inside each 2 MB of the pool (64 pages), the 2 MB pieces in order
    local = cp.asarray(np.concatenate([g * 64 + rng.permutation(64) for g in range(B * S // 16 // 64)]).astype(np.int32))
    kl, vl = cp.empty_like(k), cp.empty_like(v)
    kl.reshape(-1, 16, HKV, D)[local] = k.reshape(-1, 16, HKV, D)
    vl.reshape(-1, 16, HKV, D)[local] = v.reshape(-1, 16, HKV, D)

    bshd = (row, HKV * row, S * HKV * row)  # head, key, batch strides of [B, S, Hkv, D]
    cases = {"heads=1 (decode's order)": launcher(k, v, 1, 1, *bshd),
             "heads=2, keys in 2": launcher(k, v, 2, 2, *bshd),
             "heads=8, keys in 8": launcher(k, v, 8, 8, *bshd),
             "bhsd, heads=1": launcher(kh, vh, 1, 1, S * row, row, HKV * S * row),
             "heads=1, pages of 16 in random order": launcher(kp, vp, 1, 1, *bshd, table=table),
             "heads=1, pages of 16 in order (a table)": launcher(k, v, 1, 1, *bshd, table=in_order),
             "heads=1, pages random inside 2 MB": launcher(kl, vl, 1, 1, *bshd, table=local),
             "heads=1, random pages, warmed 1 tile ahead": launcher(kp, vp, 1, 1, *bshd, table=table, warm=1),
             "heads=1, random pages, warmed 4 tiles ahead": launcher(kp, vp, 1, 1, *bshd, table=table, warm=4),
             "heads=8, keys in 8, 16 KB bulk copies": bulk_launcher(8)}
    q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.float16)
    tk, tv = torch.from_dlpack(k).transpose(1, 2), torch.from_dlpack(v).transpose(1, 2)

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, tk, tv, enable_gqa=True)

    cases["SDPA cudnn (attention, same bytes)"] = sdpa
    for r in range(args.rounds):
        for name, f in cases.items():
            us = time_gpu(f, flush=flush, repeats=30, warmup=3).median_ms * 1e3
            print(f"r{r} {name:36s} {us:8.1f} us {nbytes / us / 1e3:7.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
