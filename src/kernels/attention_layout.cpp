#include "kernels/attention_layout.h"

#include <algorithm>

namespace packbert::kernels {

int64_t attention_band(int64_t L, int window) {
  return window <= 0 ? L : std::min<int64_t>(L, kAttentionTile + 2 * (window / 2));
}

int64_t attention_tile(int64_t L, int window) {
  return attention_band(L, window) == L ? std::max<int64_t>(L, 1) : kAttentionTile;
}

int64_t attention_band_start(int64_t i, int64_t L, int window) {
  const int64_t tile = attention_tile(L, window), band = attention_band(L, window);
  return std::clamp<int64_t>(i / tile * tile - window / 2, 0, L - band);
}

void attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH, int window,
                             int64_t* off) {
  off[0] = 0;
  for (int s = 0; s < n_seq; ++s) {
    const int64_t L = cu_seqlens[s + 1] - cu_seqlens[s];
    off[s + 1] = off[s] + NH * L * attention_band(L, window);
  }
}

std::vector<int64_t> attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH,
                                             int window) {
  std::vector<int64_t> off(n_seq + 1);
  attention_probs_offsets(cu_seqlens, n_seq, NH, window, off.data());
  return off;
}

}  // namespace packbert::kernels
