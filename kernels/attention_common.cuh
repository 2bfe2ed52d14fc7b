// attention_common.cuh: the contract every attention kernel (attention.cu,
// attention_flash.cu, attention_decode.cu) follows, and the pieces they share.
//
// One launch computes, for every batch b < B, query head h < Hq and query row i < Sq,
//     O[b, i, h, :] = sum_j p_ij V[b, j, hk, :],   p_ij = exp(s_ij - lse_i),
//     s_ij = scale * dot(Q[b, i, h, :], K[b, j, hk, :]),  lse_i = log sum_j exp(s_ij),
// over the keys j < Skv that row i sees, with hk = h / (Hq / Hkv) (GQA; MQA when Hkv == 1).
// Tensors are addressed by element strides, so "bshd" and "bhsd" (and any other view whose
// last axis is contiguous) need no copy: element (b, s, h, d) of X lies at
//     X + b * x_sb + s * x_ss + h * x_sh + d.
// causal == 0: every key is seen. causal != 0: row i sees key j iff j <= i + causal_offset
// (top_left alignment: offset 0, PyTorch SDPA's is_causal; bottom_right: Skv - Sq, the KV
// cache convention). A row that sees no key writes zeros to O and -inf to its LSE.
// LSE may be null; otherwise it is float32 [B, Hq, Sq] contiguous: LSE[(b * Hq + h) * Sq + i]
// = lse_i (natural log, of the scaled scores).
// All math is float32 (fp16/bf16 inputs and outputs; mma rungs multiply in the input type
// with float32 accumulation and round P to the input type for the P @ V product, as
// FlashAttention does). Index arithmetic on tensor offsets is 64-bit.
//
// Every kernel takes exactly this parameter list (ATTN_PARAMS) first; a rung that needs
// more (the naive rung's score matrix, decode's partial results, flash_v1's alignment
// flags) takes it after.
#pragma once
#include "common.cuh"

#define ATTN_PARAMS(T)                                                                        \
    const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ O, \
        float* __restrict__ LSE, int B, int Hq, int Hkv, int Sq, int Skv, int D,                \
        cuops::i64 q_sb, cuops::i64 q_ss, cuops::i64 q_sh, cuops::i64 k_sb, cuops::i64 k_ss,     \
        cuops::i64 k_sh, cuops::i64 v_sb, cuops::i64 v_ss, cuops::i64 v_sh, cuops::i64 o_sb,     \
        cuops::i64 o_ss, cuops::i64 o_sh, float scale, int causal, int causal_offset

namespace cuops {
namespace attn {

// The keys row i sees: j < visible_keys(i) (causal), or all Skv. May be <= 0 (no key).
__device__ __forceinline__ int visible_keys(int i, int Skv, int causal, int causal_offset) {
    if (!causal) return Skv;
    const int last = i + causal_offset;  // the last key row i sees
    return last < 0 ? 0 : (last + 1 < Skv ? last + 1 : Skv);
}

// log2(e): kernels work in base 2 (exp2f is one MUFU op) with scale * log2(e) folded into
// the scores, and convert the LSE back to natural log at the end.
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

}  // namespace attn
}  // namespace cuops
