// Multi-head self-attention over variable-length sequences laid back to back (no padding, no
// mask): each sequence attends only to itself, so packing cannot cross-contaminate, and work is
// proportional to sum_s L_s^2, never to the padded S^2.
#pragma once

#include <cstdint>
#include <vector>

namespace packbert::kernels {

// qkv: [T, 3C], per token q | k | v, head h owning channels [h*hs, (h+1)*hs) of each (hs = C/NH).
// cu_seqlens: [n_seq + 1] token offsets (FlashAttention's convention), cu_seqlens[n_seq] = T.
// out: [T, C]. probs: the softmax probabilities kept for backward, NH * sum_s L_s^2 values;
// sequence s starts at probs_offsets(...)[s], head h of it at that + h * L_s^2.
std::vector<int64_t> attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH);

// Dropout on the attention probabilities (as BERT does) with probability `dropout` and the
// counter-based mask of kernels/dropout.h keyed by (seed, key), element = index into probs;
// probs keeps the undropped values. dropout = 0 disables it.
struct AttentionDropout {
  double p = 0;
  uint64_t seed = 0, key = 0;
};

template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, const int32_t* cu_seqlens, int n_seq, int C,
                       int NH, AttentionDropout dropout = {});
// Accumulates into dqkv [T, 3C].
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH,
                        AttentionDropout dropout = {});

}  // namespace packbert::kernels
