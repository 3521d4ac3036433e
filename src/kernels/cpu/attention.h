// Multi-head self-attention over variable-length sequences laid back to back (no padding, no
// mask): each sequence attends only to itself, so packing cannot cross-contaminate, and work is
// proportional to sum_s L_s^2, never to the padded S^2.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention_layout.h"
#include "kernels/cpu/isa.h"
#include "kernels/grad_write.h"
#include "kernels/tensor.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

// Working memory of one call, owned by the caller so a training step allocates nothing:
// offsets = attention_probs_offsets(...) ([n_seq + 1]); scratch = attention_scratch_elems(...)
// elements. Either may be null, and the kernel then allocates its own (tests, one-off calls).
template <typename T>
struct AttentionWork {
  const int64_t* offsets = nullptr;
  T* scratch = nullptr;
};
// Per-thread room for three L x L blocks of the longest sequence and four L x head_size blocks
// (the bf16 forms' widened q, k, v and output), for `threads` threads.
int64_t attention_scratch_elems(int max_len, int threads, int head_size);

// probs may be null: the probabilities are then not kept (recompute policy `attention`), and
// attention_backward rebuilds each block's from q and k, bit for bit. window: 0 (global) or the
// sliding window of attention_layout.h, which runs a tile of queries at a time in every form (the
// bf16 block products take global attention only).
template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, const int32_t* cu_seqlens, int n_seq, int C,
                       int NH, int window, AttentionDropout dropout = {},
                       AttentionWork<T> work = {});
// The same under `--precision bf16`: qkv and the output in bf16 (written by and read by bf16
// GEMMs), and the kept probabilities in bf16. On a CPU with AVX512-BF16 the per-(sequence, head)
// products take bf16 operands (softmax and the elementwise work stay fp32); without it each
// block's q, k, v are widened to fp32 once and multiplied in fp32. The output and probabilities
// are rounded once. Backward uses the rounded
// probabilities (rebuilt ones are rounded the same way, so policies still agree bit for bit).
void attention_forward(bf16* out, bf16* probs, const bf16* qkv, const int32_t* cu_seqlens,
                       int n_seq, int C, int NH, int window, AttentionDropout dropout = {},
                       AttentionWork<float> work = {});
// Under `--precision fp16` likewise in f16 (every product in fp32 on the widened blocks).
void attention_forward(f16* out, f16* probs, const f16* qkv, const int32_t* cu_seqlens, int n_seq,
                       int C, int NH, int window, AttentionDropout dropout = {},
                       AttentionWork<float> work = {});
// Accumulates into dqkv [T, 3C], or (GradWrite::overwrite) writes over it: every row of it
// belongs to one sequence (cu_seqlens[n_seq] = T), so every element is written once. probs: as
// kept by the forward, or null to recompute them.
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH, int window,
                        AttentionDropout dropout = {}, AttentionWork<T> work = {},
                        GradWrite mode = GradWrite::accumulate);
// With bf16 qkv and probabilities (gradients stay fp32).
void attention_backward(float* dqkv, const float* dout, const bf16* qkv, const bf16* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH, int window,
                        AttentionDropout dropout = {}, AttentionWork<float> work = {},
                        GradWrite mode = GradWrite::accumulate);
void attention_backward(float* dqkv, const float* dout, const f16* qkv, const f16* probs,
                        const int32_t* cu_seqlens, int n_seq, int C, int NH, int window,
                        AttentionDropout dropout = {}, AttentionWork<float> work = {},
                        GradWrite mode = GradWrite::accumulate);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
