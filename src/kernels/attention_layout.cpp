#include "kernels/attention_layout.h"

namespace packbert::kernels {

void attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH, int64_t* off) {
  off[0] = 0;
  for (int s = 0; s < n_seq; ++s) {
    const int64_t L = cu_seqlens[s + 1] - cu_seqlens[s];
    off[s + 1] = off[s] + NH * L * L;
  }
}

std::vector<int64_t> attention_probs_offsets(const int32_t* cu_seqlens, int n_seq, int NH) {
  std::vector<int64_t> off(n_seq + 1);
  attention_probs_offsets(cu_seqlens, n_seq, NH, off.data());
  return off;
}

}  // namespace packbert::kernels
