// Where attention's per-(sequence, head) probabilities sit in a packed batch and how their
// dropout is keyed: what every backend's attention shares (kernels/backend_ops.inc).
#pragma once

#include <cstdint>
#include <vector>

namespace packbert::kernels {

// qkv: [T, 3C], per token q | k | v, head h owning channels [h*hs, (h+1)*hs) of each (hs = C/NH).
// cu_seqlens: [n_seq + 1] token offsets (FlashAttention's convention), cu_seqlens[n_seq] = T.
// out: [T, C]. probs: the softmax probabilities kept for backward, NH * sum_s L_s^2 values;
// sequence s starts at probs_offsets(...)[s], head h of it at that + h * L_s^2.
std::vector<int64_t> attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH);
void attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH, int64_t* out);

// Dropout on the attention probabilities (as BERT does) with probability `dropout` and the
// counter-based mask of kernels/dropout.h keyed by (seed, key), element = index into probs;
// probs keeps the undropped values. dropout = 0 disables it.
struct AttentionDropout {
  double p = 0;
  uint64_t seed = 0, key = 0;
  // [n_seq] the element index of each sequence's first probability (head 0) in the whole batch
  // when this is a share of a batch split across processes; null: the offsets of this batch.
  const int64_t* first = nullptr;
};

}  // namespace packbert::kernels
