// Element-wise and per-row kernels: forward/backward pairs over plain buffers (llm.c style).
// Backward functions ACCUMULATE (+=) into every gradient they write, so a tensor used twice
// needs no special case. All are templates instantiated for float (training) and double
// (finite-difference tests).
#pragma once

#include <cstdint>

namespace packbert::kernels {

// LayerNorm over rows. inp, out: [N, C]; weight, bias: [C]; mean, rstd: [N] (saved for backward).
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C, T eps);
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int N, int C);

// Exact GELU, 0.5 x (1 + erf(x / sqrt 2)), as BERT and torch's F.gelu use. [n] elements.
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);

// Linear layer with PyTorch's weight layout: out[N, OC] = inp[N, C] . weight[OC, C]^T + bias.
// bias may be null.
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC);
template <typename T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC);

// BERT embeddings: out[t] = word[ids[t]] + position[pos[t]] + token_type[types[t]], [T, C].
template <typename T>
void embedding_forward(T* out, const int32_t* ids, const int32_t* pos, const int32_t* types,
                       const T* word, const T* position, const T* token_type, int n_tokens, int C);
template <typename T>
void embedding_backward(T* dword, T* dposition, T* dtoken_type, const T* dout, const int32_t* ids,
                        const int32_t* pos, const int32_t* types, int n_tokens, int C);

// Softmax cross-entropy per row. logits, probs: [N, V]; targets: [N] (< 0 = ignored: loss 0,
// no gradient); losses: [N]. Backward: dlogits += (probs - onehot(target)) * dlosses[n].
template <typename T>
void cross_entropy_forward(T* losses, T* probs, const T* logits, const int32_t* targets, int N,
                           int V);
template <typename T>
void cross_entropy_backward(T* dlogits, const T* probs, const int32_t* targets, const T* dlosses,
                            int N, int V);

// out = a + b, [n].
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n);

}  // namespace packbert::kernels
