// The cpu backend's ops (see cpu.h): each reads its Views' dtypes once and calls the typed
// kernel of kernels/ that runs them. The kernels take contiguous tensors; shapes come from the
// Views.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layers.h"
#include "kernels/cpu/sparse.h"
#include "kernels/dropout.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA::cpu {

namespace {

[[noreturn]] void unsupported(const char* op, const View& v) {
  throw std::logic_error(std::string("cpu::") + op + " does not run " + dtype_name(v.dtype));
}

void require_contiguous(const char* op, std::initializer_list<const View*> views) {
  for (const View* v : views)
    if (*v && !v->contiguous())
      throw std::logic_error(std::string("cpu::") + op + " takes contiguous tensors");
}

// Calls f(T{}) with T the element type of `t`.
template <typename F>
decltype(auto) with_type(DType t, F f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::bf16:
      return f(bf16{});
    case DType::f16:
      return f(f16{});
  }
  throw std::logic_error("no such DType");
}

// Calls f(T{}) for f32 and f64, or fails naming op.
template <typename F>
decltype(auto) with_wide_type(const char* op, const View& v, F f) {
  if (v.dtype == DType::f32) return f(float{});
  if (v.dtype == DType::f64) return f(double{});
  unsupported(op, v);
}

// Calls f(H{}) for bf16 and f16, or fails naming op.
template <typename F>
decltype(auto) with_half_type(const char* op, const View& v, F f) {
  if (v.dtype == DType::bf16) return f(bf16{});
  if (v.dtype == DType::f16) return f(f16{});
  unsupported(op, v);
}

template <typename T>
T* ptr(const View& v) {
  return v.as<T>();
}

bool is16(const View& v) {
  return v && traits(v.dtype).is_16bit;
}

int i32(int64_t x) {
  return static_cast<int>(x);
}

// The caller's scratch, or (empty) room for n elements held by this thread for the call.
template <typename T>
T* scratch_or_own(const View& scratch, int64_t n) {
  if (scratch) return scratch.as<T>();
  thread_local std::vector<T> own;
  own.resize(static_cast<size_t>(n));
  return own.data();
}
template <typename T>
T* sparse_scratch(const View& scratch, const BlockPattern& p, int64_t N) {
  return scratch_or_own<T>(scratch, sparse_linear_scratch(p, i32(N)));
}

}  // namespace

int64_t sparse_linear_scratch_elems(int rows, int cols, int block, int64_t nnz, int tokens) {
  return sparse_linear_scratch(rows, cols, block, nnz, tokens);
}

void linear_forward(View out, View in, View weight, View bias, const BlockPattern* pattern,
                    View scratch) {
  require_contiguous("linear_forward", {&out, &in, &weight, &bias});
  const int N = i32(in.rows), C = i32(in.cols), OC = i32(out.cols);
  if (pattern) {
    if (!is16(in))
      return with_wide_type("linear_forward", in, [&](auto t) {
        using T = decltype(t);
        sparse_linear_forward(ptr<T>(out), ptr<const T>(in), *pattern, ptr<const T>(weight),
                              ptr<const T>(bias), N, sparse_scratch<T>(scratch, *pattern, N));
      });
    return with_half_type("linear_forward", in, [&](auto h) {
      using H = decltype(h);
      sparse_linear_forward(ptr<float>(out), ptr<const H>(in), *pattern, ptr<const float>(weight),
                            ptr<const float>(bias), N, sparse_scratch<float>(scratch, *pattern, N));
    });
  }
  if (!is16(in))
    return with_wide_type("linear_forward", in, [&](auto t) {
      using T = decltype(t);
      kernels::linear_forward(ptr<T>(out), ptr<const T>(in), ptr<const T>(weight),
                              ptr<const T>(bias), N, C, OC);
    });
  with_half_type("linear_forward", in, [&](auto h) {
    using H = decltype(h);
    if (is16(out))
      kernels::linear_forward(ptr<H>(out), ptr<const H>(in), ptr<const H>(weight),
                              ptr<const float>(bias), N, C, OC);
    else
      kernels::linear_forward(ptr<float>(out), ptr<const H>(in), ptr<const H>(weight),
                              ptr<const float>(bias), N, C, OC);
  });
}

void linear_backward(View dinp, View dweight, View dbias, View dout, View in, View weight,
                     const BlockPattern* pattern, GradWrite mode, View scratch) {
  require_contiguous("linear_backward", {&dinp, &dweight, &dbias, &dout, &in, &weight});
  const int N = i32(in.rows), C = i32(in.cols), OC = i32(dout.cols);
  if (pattern) {
    if (!dweight) throw std::logic_error("linear_backward: a block-sparse layer forms its dweight");
    // The sparse kernels accumulate into dinp.
    if (dinp && mode == GradWrite::overwrite)
      with_wide_type("linear_backward", dinp,
                     [&](auto t) { zero_fill(ptr<decltype(t)>(dinp), dinp.numel()); });
    if (!is16(in))
      return with_wide_type("linear_backward", in, [&](auto t) {
        using T = decltype(t);
        sparse_linear_backward(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dbias), ptr<const T>(dout),
                               ptr<const T>(in), *pattern, ptr<const T>(weight), N,
                               sparse_scratch<T>(scratch, *pattern, N));
      });
    return with_half_type("linear_backward", in, [&](auto h) {
      using H = decltype(h);
      sparse_linear_backward(ptr<float>(dinp), ptr<float>(dweight), ptr<float>(dbias),
                             ptr<const float>(dout), ptr<const H>(in), *pattern,
                             ptr<const float>(weight), N,
                             sparse_scratch<float>(scratch, *pattern, N));
    });
  }
  if (!is16(in))
    return with_wide_type("linear_backward", in, [&](auto t) {
      using T = decltype(t);
      kernels::linear_backward(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dbias), ptr<const T>(dout),
                               ptr<const T>(in), ptr<const T>(weight), N, C, OC, mode);
    });
  with_half_type("linear_backward", in, [&](auto h) {
    using H = decltype(h);
    if (is16(dout)) {
      if (dbias) throw std::logic_error("cpu::linear_backward: a 16-bit dout comes without dbias");
      return kernels::linear_backward(ptr<float>(dinp), ptr<float>(dweight), ptr<const H>(dout),
                                      ptr<const H>(in), ptr<const H>(weight), N, C, OC, mode);
    }
    kernels::linear_backward(ptr<float>(dinp), ptr<float>(dweight), ptr<float>(dbias),
                             ptr<const float>(dout), scratch_or_own<H>(scratch, dout.numel()),
                             ptr<const H>(in), ptr<const H>(weight), N, C, OC, mode);
  });
}

void linear_block_grad_norms(View block_l1, View dout, View in, int block, View scratch,
                             View scratch16) {
  require_contiguous("linear_block_grad_norms", {&block_l1, &dout, &in});
  const int N = i32(in.rows), C = i32(in.cols), OC = i32(dout.cols);
  const int64_t n_out = static_cast<int64_t>(OC) * C;
  float* l1 = ptr<float>(block_l1);
  auto add_norms = [&](const auto* dW) {
    const int Cb = C / block;
#pragma omp parallel for schedule(static)
    for (int rb = 0; rb < OC / block; ++rb)
      for (int o = 0; o < block; ++o)
        for (int c = 0; c < C; ++c)
          l1[static_cast<size_t>(rb) * Cb + c / block] +=
              static_cast<float>(std::abs(dW[static_cast<int64_t>(rb * block + o) * C + c]));
  };
  if (!is16(in))
    return with_wide_type("linear_block_grad_norms", in, [&](auto t) {
      using T = decltype(t);
      T* dW = scratch_or_own<T>(scratch, n_out);
      gemm(true, false, OC, C, N, T(1), ptr<const T>(dout), OC, ptr<const T>(in), C, T(0), dW, C);
      add_norms(dW);
    });
  with_half_type("linear_block_grad_norms", in, [&](auto h) {
    using H = decltype(h);
    float* dW = scratch_or_own<float>(scratch, n_out);
    H* dout16 = scratch_or_own<H>(scratch16, dout.numel());
    to_half(dout16, ptr<const float>(dout), dout.numel());
    gemm(true, false, OC, C, N, 1.0f, dout16, OC, ptr<const H>(in), C, 0.0f, dW, C);
    add_norms(dW);
  });
}

void layernorm_forward(View out, View mean, View rstd, View in, View weight, View bias, double eps,
                       View out16) {
  require_contiguous("layernorm_forward", {&out, &mean, &rstd, &in, &weight, &bias, &out16});
  const int N = i32(in.rows), C = i32(in.cols);
  if (!is16(in) && !out16)
    return with_wide_type("layernorm_forward", in, [&](auto t) {
      using T = decltype(t);
      kernels::layernorm_forward(ptr<T>(out), ptr<T>(mean), ptr<T>(rstd), ptr<const T>(in),
                                 ptr<const T>(weight), ptr<const T>(bias), N, C,
                                 static_cast<T>(eps));
    });
  // Under 16 bits: an f32 or 16-bit input, the output's 16-bit twin.
  const View& half = out16 ? out16 : in;
  with_half_type("layernorm_forward", half, [&](auto h) {
    using H = decltype(h);
    H* twin = out16 ? ptr<H>(out16) : nullptr;
    if (is16(in))
      kernels::layernorm_forward(ptr<float>(out), ptr<float>(mean), ptr<float>(rstd),
                                 ptr<const H>(in), ptr<const float>(weight), ptr<const float>(bias),
                                 N, C, static_cast<float>(eps), twin);
    else
      kernels::layernorm_forward<float, H>(
          ptr<float>(out), ptr<float>(mean), ptr<float>(rstd), ptr<const float>(in),
          ptr<const float>(weight), ptr<const float>(bias), N, C, static_cast<float>(eps), twin);
  });
}

void layernorm_apply(View out, View in, View mean, View rstd, View weight, View bias, View out16) {
  require_contiguous("layernorm_apply", {&out, &in, &mean, &rstd, &weight, &bias, &out16});
  const int N = i32(in.rows), C = i32(in.cols);
  if (!is16(in) && !out16)
    return with_wide_type("layernorm_apply", in, [&](auto t) {
      using T = decltype(t);
      kernels::layernorm_apply(ptr<T>(out), ptr<const T>(in), ptr<const T>(mean),
                               ptr<const T>(rstd), ptr<const T>(weight), ptr<const T>(bias), N, C);
    });
  const View& half = out16 ? out16 : in;
  with_half_type("layernorm_apply", half, [&](auto h) {
    using H = decltype(h);
    H* twin = out16 ? ptr<H>(out16) : nullptr;
    if (is16(in))
      kernels::layernorm_apply(ptr<float>(out), ptr<const H>(in), ptr<const float>(mean),
                               ptr<const float>(rstd), ptr<const float>(weight),
                               ptr<const float>(bias), N, C, twin);
    else
      kernels::layernorm_apply<float, H>(
          ptr<float>(out), ptr<const float>(in), ptr<const float>(mean), ptr<const float>(rstd),
          ptr<const float>(weight), ptr<const float>(bias), N, C, twin);
  });
}

void layernorm_backward(View dinp, View dweight, View dbias, View dout, View in, View weight,
                        View mean, View rstd, GradWrite mode) {
  require_contiguous("layernorm_backward", {&dinp, &dweight, &dbias, &dout, &in, &weight});
  const int N = i32(in.rows), C = i32(in.cols);
  with_type(in.dtype, [&](auto t) {
    using I = decltype(t);
    using T = std::conditional_t<std::is_same_v<I, double>, double, float>;
    kernels::layernorm_backward(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dbias), ptr<const T>(dout),
                                ptr<const I>(in), ptr<const T>(weight), ptr<const T>(mean),
                                ptr<const T>(rstd), N, C, mode);
  });
}

void gelu_forward(View out, View in) {
  require_contiguous("gelu_forward", {&out, &in});
  with_type(in.dtype, [&](auto t) {
    using T = decltype(t);
    kernels::gelu_forward(ptr<T>(out), ptr<const T>(in), in.numel());
  });
}

void gelu_backward(View dinp, View dbias, View in, View dout, GradWrite mode) {
  require_contiguous("gelu_backward", {&dinp, &dbias, &in, &dout});
  if (is16(dinp)) {
    if (!dbias || mode != GradWrite::overwrite)
      throw std::logic_error("cpu::gelu_backward: a 16-bit dinp is written over, with dbias");
    return with_half_type("gelu_backward", dinp, [&](auto h) {
      using H = decltype(h);
      kernels::gelu_backward_to_half(ptr<H>(dinp), ptr<float>(dbias), ptr<const H>(in),
                                     ptr<const float>(dout), i32(in.rows), i32(in.cols));
    });
  }
  if (dbias) throw std::logic_error("cpu::gelu_backward: dbias goes with a 16-bit dinp");
  with_type(in.dtype, [&](auto t) {
    using I = decltype(t);
    using T = std::conditional_t<std::is_same_v<I, double>, double, float>;
    kernels::gelu_backward(ptr<T>(dinp), ptr<const I>(in), ptr<const T>(dout), in.numel(), mode);
  });
}

void geglu_forward(View out, View in) {
  require_contiguous("geglu_forward", {&out, &in});
  if (in.cols != 2 * out.cols || in.rows != out.rows || in.dtype != out.dtype)
    throw std::logic_error("cpu::geglu_forward: in is [N, 2 I], out [N, I], of one dtype");
  with_type(in.dtype, [&](auto t) {
    using T = decltype(t);
    kernels::geglu_forward(ptr<T>(out), ptr<const T>(in), i32(out.rows), i32(out.cols));
  });
}

void geglu_backward(View dinp, View in, View dout, GradWrite mode) {
  require_contiguous("geglu_backward", {&dinp, &in, &dout});
  if (in.cols != 2 * dout.cols || dinp.cols != in.cols || is16(dinp))
    throw std::logic_error("cpu::geglu_backward: in and dinp are [N, 2 I], dinp f32/f64");
  with_type(in.dtype, [&](auto t) {
    using I = decltype(t);
    using T = std::conditional_t<std::is_same_v<I, double>, double, float>;
    kernels::geglu_backward(ptr<T>(dinp), ptr<const I>(in), ptr<const T>(dout), i32(dout.rows),
                            i32(dout.cols), mode);
  });
}

// (rotary's views may be rows of a wider matrix: q | k inside q | k | v)
void rotary_forward(View out, View in, const int32_t* pos, int heads, double theta) {
  const int D = heads > 0 ? i32(in.cols) / heads : 0;
  if (D * heads != in.cols || D % 2 || out.dtype != in.dtype || out.rows != in.rows ||
      out.cols != in.cols || in.batch != 1 || out.batch != 1)
    throw std::logic_error("cpu::rotary_forward: in and out [N, heads x an even D] of one dtype");
  with_type(in.dtype, [&](auto t) {
    using T = decltype(t);
    kernels::rotary_forward(ptr<T>(out), ptr<const T>(in), pos, i32(in.rows), heads, D, theta,
                            out.ld, in.ld);
  });
}

void rotary_backward(View dinp, View dout, const int32_t* pos, int heads, double theta,
                     GradWrite mode) {
  const int D = heads > 0 ? i32(dout.cols) / heads : 0;
  if (D * heads != dout.cols || D % 2 || dinp.dtype != dout.dtype || is16(dinp) ||
      dinp.rows != dout.rows || dinp.cols != dout.cols || dinp.batch != 1 || dout.batch != 1)
    throw std::logic_error("cpu::rotary_backward: dinp and dout [N, heads x an even D], f32/f64");
  with_wide_type("rotary_backward", dout, [&](auto t) {
    using T = decltype(t);
    kernels::rotary_backward(ptr<T>(dinp), ptr<const T>(dout), pos, i32(dout.rows), heads, D, theta,
                             mode, dinp.ld, dout.ld);
  });
}

void tanh_forward(View out, View in) {
  with_wide_type("tanh_forward", in, [&](auto t) {
    using T = decltype(t);
    kernels::tanh_forward(ptr<T>(out), ptr<const T>(in), in.numel());
  });
}

void tanh_backward(View dinp, View out, View dout) {
  with_wide_type("tanh_backward", out, [&](auto t) {
    using T = decltype(t);
    kernels::tanh_backward(ptr<T>(dinp), ptr<const T>(out), ptr<const T>(dout), out.numel());
  });
}

void residual_forward(View out, View a, View b) {
  require_contiguous("residual_forward", {&out, &a, &b});
  with_type(out.dtype, [&](auto t) {
    using T = decltype(t);
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    kernels::residual_forward(ptr<T>(out), ptr<const A>(a), ptr<const T>(b), out.numel());
  });
}

void dropout_forward(View out, View in, double p, uint64_t seed, uint64_t key, uint64_t first) {
  with_wide_type("dropout_forward", in, [&](auto t) {
    using T = decltype(t);
    kernels::dropout_forward(ptr<T>(out), ptr<const T>(in), in.numel(), p, seed, key, first);
  });
}

void dropout_backward(View dinp, View dout, double p, uint64_t seed, uint64_t key, uint64_t first) {
  with_wide_type("dropout_backward", dout, [&](auto t) {
    using T = decltype(t);
    kernels::dropout_backward(ptr<T>(dinp), ptr<const T>(dout), dout.numel(), p, seed, key, first);
  });
}

void embedding_forward(View out, const int32_t* ids, const int32_t* pos, const int32_t* types,
                       View word, View position, View token_type) {
  const int T_ = i32(out.rows), C = i32(out.cols);
  if (word.dtype == DType::bf16)
    return kernels::embedding_forward(ptr<float>(out), ids, pos, types, ptr<const bf16>(word),
                                      ptr<const float>(position), ptr<const float>(token_type), T_,
                                      C);
  with_wide_type("embedding_forward", word, [&](auto t) {
    using T = decltype(t);
    kernels::embedding_forward(ptr<T>(out), ids, pos, types, ptr<const T>(word),
                               ptr<const T>(position), ptr<const T>(token_type), T_, C);
  });
}

void embedding_backward(View dword, View dposition, View dtoken_type, View dout, const int32_t* ids,
                        const int32_t* pos, const int32_t* types) {
  with_wide_type("embedding_backward", dout, [&](auto t) {
    using T = decltype(t);
    kernels::embedding_backward(ptr<T>(dword), ptr<T>(dposition), ptr<T>(dtoken_type),
                                ptr<const T>(dout), ids, pos, types, i32(dout.rows),
                                i32(dout.cols));
  });
}

int64_t cross_entropy_forward(View losses, View lse, View logits, const int32_t* targets) {
  return with_wide_type("cross_entropy_forward", logits, [&](auto t) {
    using T = decltype(t);
    return kernels::cross_entropy_logits_forward(ptr<T>(losses), ptr<T>(lse), ptr<const T>(logits),
                                                 targets, i32(logits.rows), i32(logits.cols));
  });
}

void cross_entropy_backward(View dlogits, View dbias, View logits, View lse, const int32_t* targets,
                            View dlosses, GradWrite mode) {
  const int N = i32(logits.rows), V = i32(logits.cols);
  if (is16(dlogits)) {
    return with_half_type("cross_entropy_backward", dlogits, [&](auto h) {
      using H = decltype(h);
      kernels::cross_entropy_logits_backward(ptr<H>(dlogits), ptr<float>(dbias),
                                             ptr<const float>(logits), ptr<const float>(lse),
                                             targets, ptr<const float>(dlosses), N, V);
    });
  }
  if (dbias) throw std::logic_error("cpu::cross_entropy_backward: dbias goes with 16-bit dlogits");
  with_wide_type("cross_entropy_backward", logits, [&](auto t) {
    using T = decltype(t);
    kernels::cross_entropy_logits_backward(ptr<T>(dlogits), ptr<const T>(logits), ptr<const T>(lse),
                                           targets, ptr<const T>(dlosses), N, V, mode);
  });
}

int64_t attention_scratch_elems(int max_len, int threads, int head_size) {
  return kernels::attention_scratch_elems(max_len, threads, head_size);
}

void attention_forward(View out, View probs, View qkv, const int32_t* cu_seqlens, int n_seq, int NH,
                       int window, AttentionDropout dropout, const int64_t* offsets, View scratch) {
  require_contiguous("attention_forward", {&out, &probs, &qkv});
  const int C = i32(out.cols);
  with_type(qkv.dtype, [&](auto t) {
    using T = decltype(t);
    using W = std::conditional_t<std::is_same_v<T, double>, double, float>;
    kernels::attention_forward(ptr<T>(out), ptr<T>(probs), ptr<const T>(qkv), cu_seqlens, n_seq, C,
                               NH, window, dropout, AttentionWork<W>{offsets, ptr<W>(scratch)});
  });
}

void attention_backward(View dqkv, View dout, View qkv, View probs, const int32_t* cu_seqlens,
                        int n_seq, int NH, int window, AttentionDropout dropout,
                        const int64_t* offsets, View scratch, GradWrite mode) {
  require_contiguous("attention_backward", {&dqkv, &dout, &qkv, &probs});
  const int C = i32(dout.cols);
  with_type(qkv.dtype, [&](auto t) {
    using I = decltype(t);
    using T = std::conditional_t<std::is_same_v<I, double>, double, float>;
    kernels::attention_backward(ptr<T>(dqkv), ptr<const T>(dout), ptr<const I>(qkv),
                                ptr<const I>(probs), cu_seqlens, n_seq, C, NH, window, dropout,
                                AttentionWork<T>{offsets, ptr<T>(scratch)}, mode);
  });
}

int64_t count_argmax_hits(View scores, const int32_t* targets) {
  return with_wide_type("count_argmax_hits", scores, [&](auto t) {
    using T = decltype(t);
    return kernels::count_argmax_hits(ptr<const T>(scores), targets, i32(scores.rows),
                                      i32(scores.cols));
  });
}

void convert(View out, View in) {
  require_contiguous("convert", {&out, &in});
  if (out.numel() != in.numel()) throw std::logic_error("cpu::convert: sizes differ");
  const int64_t n = in.numel();
  if (out.dtype == in.dtype) {
    const size_t bytes = static_cast<size_t>(n) * traits(in.dtype).bytes;
    if (out.data != in.data) std::memmove(out.data, in.data, bytes);
    return;
  }
  if (in.dtype == DType::f32) return traits(out.dtype).narrow(out.data, ptr<const float>(in), n);
  if (out.dtype == DType::f32) return traits(in.dtype).widen(ptr<float>(out), in.data, n);
  throw std::logic_error(std::string("cpu::convert: no conversion from ") + dtype_name(in.dtype) +
                         " to " + dtype_name(out.dtype));
}

void zero(View out) {
  require_contiguous("zero", {&out});
  with_wide_type("zero", out, [&](auto t) { zero_fill(ptr<decltype(t)>(out), out.numel()); });
}

void gather_rows_forward(View out, View in, const int32_t* rows) {
  if (out.dtype == DType::f32 && in.dtype == DType::bf16)  // a 16-bit table widened
    return kernels::gather_rows_forward(ptr<float>(out), ptr<const bf16>(in), rows, i32(out.rows),
                                        i32(out.cols));
  if (out.dtype == DType::f32 && in.dtype == DType::f16)
    return kernels::gather_rows_forward(ptr<float>(out), ptr<const f16>(in), rows, i32(out.rows),
                                        i32(out.cols));
  with_type(in.dtype, [&](auto t) {
    using T = decltype(t);
    kernels::gather_rows_forward(ptr<T>(out), ptr<const T>(in), rows, i32(out.rows), i32(out.cols));
  });
}

void gather_rows_backward(View dinp, View dout, const int32_t* rows) {
  with_wide_type("gather_rows_backward", dout, [&](auto t) {
    using T = decltype(t);
    kernels::gather_rows_backward(ptr<T>(dinp), ptr<const T>(dout), rows, i32(dout.rows),
                                  i32(dout.cols));
  });
}

void span_cross_entropy_forward(View losses, View probs, View logits, const int32_t* cu_seqlens,
                                const int32_t* targets, int n_seq) {
  with_wide_type("span_cross_entropy_forward", logits, [&](auto t) {
    using T = decltype(t);
    kernels::span_cross_entropy_forward(ptr<T>(losses), ptr<T>(probs), ptr<const T>(logits),
                                        cu_seqlens, targets, n_seq);
  });
}

void span_cross_entropy_backward(View dlogits, View probs, const int32_t* cu_seqlens,
                                 const int32_t* targets, View dlosses, int n_seq) {
  with_wide_type("span_cross_entropy_backward", probs, [&](auto t) {
    using T = decltype(t);
    kernels::span_cross_entropy_backward(ptr<T>(dlogits), ptr<const T>(probs), cu_seqlens, targets,
                                         ptr<const T>(dlosses), n_seq);
  });
}

void squared_error_forward(View losses, View pred, View target) {
  with_wide_type("squared_error_forward", pred, [&](auto t) {
    using T = decltype(t);
    kernels::squared_error_forward(ptr<T>(losses), ptr<const T>(pred), ptr<const T>(target),
                                   i32(pred.numel()));
  });
}

void squared_error_backward(View dpred, View dtarget, View pred, View target, View dlosses) {
  with_wide_type("squared_error_backward", pred, [&](auto t) {
    using T = decltype(t);
    kernels::squared_error_backward(ptr<T>(dpred), ptr<T>(dtarget), ptr<const T>(pred),
                                    ptr<const T>(target), ptr<const T>(dlosses), i32(pred.numel()));
  });
}

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA::cpu
