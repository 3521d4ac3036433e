// Where attention's per-(sequence, head) probabilities sit in a packed batch and how their
// dropout is keyed: what every backend's attention shares (kernels/backend_ops.inc).
#pragma once

#include <cstdint>
#include <vector>

namespace packbert::kernels {

// qkv: [T, 3C], per token q | k | v, head h owning channels [h*hs, (h+1)*hs) of each (hs = C/NH).
// cu_seqlens: [n_seq + 1] token offsets (FlashAttention's convention), cu_seqlens[n_seq] = T.
// out: [T, C]. probs: the softmax probabilities kept for backward, NH * sum_s L_s^2 values;
// sequence s starts at probs_offsets(...)[s], head h of it at that + h * L_s * band(L_s).
//
// Sliding-window (local) attention, `window` > 0 (ModernBERT's local_attention): token i of a
// sequence attends to the tokens j of its own sequence with |i - j| <= window / 2. Its queries go
// in tiles of kAttentionTile rows; a tile [i0, i0 + tile) sees the band of
// attention_band(L, window) keys from attention_band_start(i0, ...), which holds every key
// within reach of any of its rows, and its probabilities are kept as [rows, band] (zero outside
// each row's window): the cost and the memory are L * (tile + window), not L^2. window = 0, or a
// sequence no longer than the band, is global attention: one tile, band = L.
constexpr int kAttentionTile = 32;
constexpr int kGlobalAttention = 0;  // window of global attention
// Keys per row kept: L (global), or min(L, kAttentionTile + 2 * (window / 2)).
int64_t attention_band(int64_t L, int window);
// Query rows per tile: L (global: the whole sequence at once), or kAttentionTile.
int64_t attention_tile(int64_t L, int window);
// The first key of the band of the tile holding query i.
int64_t attention_band_start(int64_t i, int64_t L, int window);
std::vector<int64_t> attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH,
                                             int window);
void attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH, int window,
                             int64_t* out);

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
