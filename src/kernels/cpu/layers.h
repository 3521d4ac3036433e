// Element-wise and per-row kernels: forward/backward pairs over plain buffers (llm.c style).
// Backward functions ACCUMULATE (+=) into every gradient they write, so a tensor used twice
// needs no special case; those that take a GradWrite can instead write their input gradient over
// a fresh buffer. All are templates instantiated for float (training) and double
// (finite-difference tests).
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/grad_write.h"
#include "kernels/tensor.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

// Under `--precision bf16|fp16` the kernels below take the 16-bit storage type H (bf16 or f16,
// kernels/tensor.h) where a tensor is stored in it; each such form has an overload per type.

// LayerNorm over rows. inp, out: [N, C]; weight, bias: [C]; mean, rstd: [N] (saved for backward).
// out16, when given, receives to_half(out) too, written row by row while the row is in cache:
// the 16-bit operand of the GEMM that reads the output under a 16-bit precision. out may then be
// null: only the 16-bit form is written (the same values).
template <typename T, typename H = bf16>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C, T eps, H* out16 = nullptr);
// Rebuilds layernorm_forward's `out` (and out16) from its input and the saved mean and rstd, bit
// for bit (recompute policy `ln`).
template <typename T, typename H = bf16>
void layernorm_apply(T* out, const T* inp, const T* mean, const T* rstd, const T* weight,
                     const T* bias, int N, int C, H* out16 = nullptr);
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int N, int C,
                        GradWrite mode = GradWrite::accumulate);
// The same over a 16-bit input (the residual sums under a 16-bit precision), widened and
// computed in fp32.
void layernorm_forward(float* out, float* mean, float* rstd, const bf16* inp, const float* weight,
                       const float* bias, int N, int C, float eps, bf16* out16 = nullptr);
void layernorm_forward(float* out, float* mean, float* rstd, const f16* inp, const float* weight,
                       const float* bias, int N, int C, float eps, f16* out16 = nullptr);
void layernorm_apply(float* out, const bf16* inp, const float* mean, const float* rstd,
                     const float* weight, const float* bias, int N, int C, bf16* out16 = nullptr);
void layernorm_apply(float* out, const f16* inp, const float* mean, const float* rstd,
                     const float* weight, const float* bias, int N, int C, f16* out16 = nullptr);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const bf16* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, GradWrite mode = GradWrite::accumulate);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const f16* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, GradWrite mode = GradWrite::accumulate);

// Exact GELU, 0.5 x (1 + erf(x / sqrt 2)), as BERT and torch's F.gelu use. [n] elements.
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n,
                   GradWrite mode = GradWrite::accumulate);
// 16-bit input and output (GELU's input is written by a GEMM, its output read by one): widened,
// computed in fp32, rounded once. Backward from a 16-bit input.
void gelu_forward(bf16* out, const bf16* inp, int64_t n);
void gelu_forward(f16* out, const f16* inp, int64_t n);
void gelu_backward(float* dinp, const bf16* inp, const float* dout, int64_t n,
                   GradWrite mode = GradWrite::accumulate);
void gelu_backward(float* dinp, const f16* inp, const float* dout, int64_t n,
                   GradWrite mode = GradWrite::accumulate);
// GELU's backward straight into the 16-bit backward of the linear layer that feeds it: of
// d = what gelu_backward would write over dinp ([N, OC]), only to_half(d) (dinp16, the layer's
// GEMM operand) and dbias += the column sums of d are written, in one pass, so d never goes to
// memory in fp32. gelu_backward followed by linear_backward's rounding and bias sum, up to the
// last bit of d (a vector loop's scalar tail falls on other elements).
void gelu_backward_to_half(bf16* dinp16, float* dbias, const bf16* inp, const float* dout, int N,
                           int OC);
void gelu_backward_to_half(f16* dinp16, float* dbias, const f16* inp, const float* dout, int N,
                           int OC);

// GeGLU, ModernBERT's MLP activation: out[N, I] = gelu(in[:, :I]) * in[:, I:], in [N, 2I]
// (exact GELU; double, float, or 16-bit in and out computed in fp32). Backward: dinp[N, 2I]
// (+)= [dout * in2 * gelu'(in1), dout * gelu(in1)], T double (In double) or float (In float or
// 16-bit).
template <typename T>
void geglu_forward(T* out, const T* in, int N, int I);
template <typename T, typename In>
void geglu_backward(T* dinp, const In* in, const T* dout, int N, int I,
                    GradWrite mode = GradWrite::accumulate);

// Rotary position embedding over each head of in [N, heads * D] (kernels/rotary.h's angles at
// pos[n]); out may be in. T double, float, or 16-bit computed in fp32. Backward (the inverse
// rotation): dinp (+)= R^T dout, double or float. ld_*: the rows' strides (0: heads * D), so q | k
// can be rotated inside q | k | v.
template <typename T>
void rotary_forward(T* out, const T* in, const int32_t* pos, int N, int heads, int D, double theta,
                    int64_t ld_out = 0, int64_t ld_in = 0);
template <typename T>
void rotary_backward(T* dinp, const T* dout, const int32_t* pos, int N, int heads, int D,
                     double theta, GradWrite mode = GradWrite::accumulate, int64_t ld_dinp = 0,
                     int64_t ld_dout = 0);

// Linear layer with PyTorch's weight layout: out[N, OC] = inp[N, C] . weight[OC, C]^T + bias.
// bias may be null.
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC);
template <typename T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC, GradWrite mode = GradWrite::accumulate);
// The same with 16-bit operands (input and weight) and fp32 accumulation, output and gradients.
// Backward rounds dout to 16 bits into dout16 ([N, OC], the caller's scratch) for its two GEMMs
// (under fp16, where a gradient scaled too far overflows to infinity: the loss scaler's signal);
// the bias gradient sums the fp32 dout in the same pass. dinp may be null.
void linear_forward(float* out, const bf16* inp, const bf16* weight, const float* bias, int N,
                    int C, int OC);
void linear_forward(float* out, const f16* inp, const f16* weight, const float* bias, int N, int C,
                    int OC);
// With a 16-bit output, rounded once after the fp32 bias (inside the GEMM under bf16): for
// outputs only 16-bit-reading kernels take (q | k | v, GELU's input).
void linear_forward(bf16* out, const bf16* inp, const bf16* weight, const float* bias, int N, int C,
                    int OC);
void linear_forward(f16* out, const f16* inp, const f16* weight, const float* bias, int N, int C,
                    int OC);
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, bf16* dout16,
                     const bf16* inp, const bf16* weight, int N, int C, int OC,
                     GradWrite mode = GradWrite::accumulate);
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, f16* dout16,
                     const f16* inp, const f16* weight, int N, int C, int OC,
                     GradWrite mode = GradWrite::accumulate);
// The two GEMMs of that backward over an output gradient already in 16 bits (the bias gradient
// is its producer's: cross_entropy_logits_backward's 16-bit form).
void linear_backward(float* dinp, float* dweight, const bf16* dout16, const bf16* inp,
                     const bf16* weight, int N, int C, int OC,
                     GradWrite mode = GradWrite::accumulate);
void linear_backward(float* dinp, float* dweight, const f16* dout16, const f16* inp,
                     const f16* weight, int N, int C, int OC,
                     GradWrite mode = GradWrite::accumulate);

// BERT embeddings: out[t] = word[ids[t]] + position[pos[t]] + token_type[types[t]], [T, C].
template <typename T>
void embedding_forward(T* out, const int32_t* ids, const int32_t* pos, const int32_t* types,
                       const T* word, const T* position, const T* token_type, int n_tokens, int C);
// The same with the word embeddings in bf16 (`--master-weights bf16`), widened as read.
void embedding_forward(float* out, const int32_t* ids, const int32_t* pos, const int32_t* types,
                       const bf16* word, const float* position, const float* token_type,
                       int n_tokens, int C);
template <typename T>
void embedding_backward(T* dword, T* dposition, T* dtoken_type, const T* dout, const int32_t* ids,
                        const int32_t* pos, const int32_t* types, int n_tokens, int C);

// Softmax cross-entropy per row (every head's classification loss: MLM, NSP, classifier) that
// keeps the logits and writes no probabilities: over the MLM decoder's vocabulary a probability
// matrix would be one more [N, V] to write and read back. logits: [N, V]; targets: [N] (< 0 =
// ignored: loss 0, no gradient); losses: [N].
// The forward gives losses[n] = lse[n] - z[n, target] and keeps lse[n] = log(sum_v exp(z[n, v]))
// for the backward, in two passes over each row: the first finds the maximum and, split at the
// target, whether the target is the row's first maximum, the second sums the exponentials. It
// returns how many rows have their target as the first maximum of the logits (the accuracy
// count; the probabilities have the same argmax). Rows without a target (< 0): loss 0, lse 0,
// not counted.
template <typename T>
int64_t cross_entropy_logits_forward(T* losses, T* lse, const T* logits, const int32_t* targets,
                                     int N, int V);
// dlogits (+)= (exp(z - lse) - onehot(target)) * dlosses[n] (mode; rows without a target add 0).
template <typename T>
void cross_entropy_logits_backward(T* dlogits, const T* logits, const T* lse,
                                   const int32_t* targets, const T* dlosses, int N, int V,
                                   GradWrite mode = GradWrite::accumulate);
// The same for the logits of a 16-bit linear layer (the MLM decoder under bf16 or fp16), in one
// pass: the gradient written rounded to 16 bits (rows without a target are 0), and the layer's
// bias gradient dbias += the column sums of its fp32 values: what the fp32 backward, the rounding
// and bias_backward give, bit for bit, without an fp32 [N, V] gradient.
void cross_entropy_logits_backward(bf16* dlogits16, float* dbias, const float* logits,
                                   const float* lse, const int32_t* targets, const float* dlosses,
                                   int N, int V);
void cross_entropy_logits_backward(f16* dlogits16, float* dbias, const float* logits,
                                   const float* lse, const int32_t* targets, const float* dlosses,
                                   int N, int V);

// out = 0, [n]: gradient buffers before a backward accumulates into them.
template <typename T>
inline void zero_fill(T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = T(0);
}

// out = a + b, [n]; the 16-bit form (a residual sum under a 16-bit precision: b the 16-bit skip)
// widens b and rounds the fp32 sum once.
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n);
void residual_forward(bf16* out, const float* a, const bf16* b, int64_t n);
void residual_forward(f16* out, const float* a, const f16* b, int64_t n);

// Rows picked by index: out[r] = inp[rows[r]], out: [n_rows, C]. Backward scatters with +=
// (rows may repeat).
template <typename T>
void gather_rows_forward(T* out, const T* inp, const int32_t* rows, int n_rows, int C);
template <typename T>
void gather_rows_backward(T* dinp, const T* dout, const int32_t* rows, int n_rows, int C);
void gather_rows_forward(bf16* out, const bf16* inp, const int32_t* rows, int n_rows, int C);
void gather_rows_forward(f16* out, const f16* inp, const int32_t* rows, int n_rows, int C);
// A 16-bit table's rows widened into fp32 (ModernBERT's word embeddings under 16-bit masters).
void gather_rows_forward(float* out, const bf16* inp, const int32_t* rows, int n_rows, int C);
void gather_rows_forward(float* out, const f16* inp, const int32_t* rows, int n_rows, int C);

// out = tanh(inp), [n]. Backward from the output: dinp += dout * (1 - out^2).
template <typename T>
void tanh_forward(T* out, const T* inp, int64_t n);
template <typename T>
void tanh_backward(T* dinp, const T* out, const T* dout, int64_t n);

// How many of N rows of scores [N, V] have their largest entry (the first, on ties) at the
// row's target; rows with target < 0 are not counted.
template <typename T>
int64_t count_argmax_hits(const T* scores, const int32_t* targets, int N, int V);

// Span cross-entropy: logits [T, 2] hold a start and an end score per token; each column is a
// softmax over each sequence's own tokens (cu_seqlens [n_seq + 1]), probs [T, 2]. targets
// [n_seq, 2]: (start, end) token index within the sequence, < 0 = no answer (no loss, no
// gradient); callers check targets < length. losses [n_seq]: (start CE + end CE) / 2.
// Backward: dlogits += (probs - onehot(target)) * dlosses[s] / 2 per column.
template <typename T>
void span_cross_entropy_forward(T* losses, T* probs, const T* logits, const int32_t* cu_seqlens,
                                const int32_t* targets, int n_seq);
template <typename T>
void span_cross_entropy_backward(T* dlogits, const T* probs, const int32_t* cu_seqlens,
                                 const int32_t* targets, const T* dlosses, int n_seq);

// Squared error (the regression head's loss, Hugging Face's MSELoss per row): losses[n] =
// (pred[n] - target[n])^2 over N rows of one output. Backward: dpred[n] += 2 (pred - target)
// dlosses[n], and dtarget (may be null: targets are data) gets its negation.
template <typename T>
void squared_error_forward(T* losses, const T* pred, const T* target, int N);
template <typename T>
void squared_error_backward(T* dpred, T* dtarget, const T* pred, const T* target, const T* dlosses,
                            int N);

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
