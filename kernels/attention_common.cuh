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
// cache convention). A sliding window (win_left, win_right; < 0: that side unlimited) also
// hides the keys outside i + causal_offset - win_left <= j <= i + causal_offset + win_right
// (the launcher sets causal_offset for the alignment of a window without a causal mask too,
// and hands sides that reach past every key as < 0). softcap > 0 caps each scaled score s
// at softcap * tanh(s / softcap) (Gemma 2's logit soft-capping); 0: no cap. A rung whose
// launcher refuses windows or caps never sees other values than -1, -1, 0. A row that sees
// no key writes zeros to O and -inf to its LSE.
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
        cuops::i64 o_ss, cuops::i64 o_sh, float scale, int causal, int causal_offset, int win_left,     \
        int win_right, float softcap

// ATTN_PARAMS' names, to hand them on to a device function that takes ATTN_PARAMS
#define ATTN_ARGS                                                                                            \
    Q, K, V, O, LSE, B, Hq, Hkv, Sq, Skv, D, q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, \
        o_sh, scale, causal, causal_offset, win_left, win_right, softcap

namespace cuops {
namespace attn {

// The keys row i sees: j < visible_keys(i) (causal), or all Skv. May be <= 0 (no key).
__device__ __forceinline__ int visible_keys(int i, int Skv, int causal, int causal_offset) {
    if (!causal) return Skv;
    const int last = i + causal_offset;  // the last key row i sees
    return last < 0 ? 0 : (last + 1 < Skv ? last + 1 : Skv);
}

// The first key row i sees under the window's left side (0 without one).
__device__ __forceinline__ int first_key(int i, int win_left, int causal_offset) {
    if (win_left < 0) return 0;
    const int first = i + causal_offset - win_left;
    return first > 0 ? first : 0;
}

// One past the last key row i sees: visible_keys, cut by the window's right side. Row i
// sees keys [first_key(i), key_end(i)), none where key_end <= first_key.
__device__ __forceinline__ int key_end(int i, int Skv, int causal, int causal_offset, int win_right) {
    const int end = visible_keys(i, Skv, causal, causal_offset);
    if (win_right < 0) return end;
    const int last = i + causal_offset + win_right;  // (win_right < Sq + Skv: no overflow)
    return last < 0 ? 0 : (last + 1 < end ? last + 1 : end);
}

// Logit soft-capping of a score x held in units of `unit` (the scaled score is unit * x:
// unit = scale for rungs that keep raw scores and fold the scale into exp2 later, 1 for
// rungs that scale first): x -> (softcap / unit) * tanh(unit * x / softcap), as
// out - 2 out / (e^{2 unit x / softcap} + 1). Monotone in x for unit > 0, so running maxima
// and masks work on capped scores as on plain ones. exp2 and a fast division: the capped
// score's absolute error is a few float32 ulps of softcap (~6e-6 at a cap of 50), where
// tanh.approx's 2^-11 relative error would move a score capped at 50 by 0.02 (2 % in its
// weight).
struct SoftCap {
    float in, out;  // 2 log2(e) unit / softcap, softcap / unit

    __device__ __forceinline__ static SoftCap make(float softcap, float unit) {
        return {2.f * 1.4426950408889634f * unit / softcap, softcap / unit};
    }
    __device__ __forceinline__ float operator()(float x) const {
        return out - __fdividef(2.f * out, exp2f(x * in) + 1.f);
    }
};

// log2(e): kernels work in base 2 (exp2f is one MUFU op) with scale * log2(e) folded into
// the scores, and convert the LSE back to natural log at the end.
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

}  // namespace attn
}  // namespace cuops
