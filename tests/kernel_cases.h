// The kernel harness's table (ggml's test-backend-ops is the model): one row per kernel case,
// its tensors and how to run forward and backward on them, for any scalar type, directly and
// through the op seam (kernels/ops.h) on any backend and dtype. tests/test_kernels.cpp checks
// every row (finite differences, the += contract, the PyTorch golden, the 16-bit forms, the
// backends against each other) at the goldens' small shapes; bench/micro/kernel_bench.cpp times the
// same rows at BERT-base's. A new kernel is a new row; a new dtype or backend is a new column.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace packbert::kernels::harness {

// tests/golden/kernels.json (tools/make_kernel_goldens.py, PyTorch fp32): each golden kernel's
// shapes, inputs, outputs and gradients.
const nlohmann::json& goldens();

// The tensors of one run: inputs, outputs and saved state by name; gradients "d" + name (of an
// output: the upstream gradient; of an input: accumulated by backward); index arrays; the
// 16-bit copies the seam's columns stage (Stored below).
template <typename T>
struct Env {
  using value_type = T;
  std::map<std::string, std::vector<T>> x, d;
  std::map<std::string, std::vector<int32_t>> idx;
  std::map<std::string, std::vector<uint16_t>> staged;
  bool restage = true;
  T* operator[](const std::string& n) { return x.at(n).data(); }
  T* grad(const std::string& n) { return d.at("d" + n).data(); }
  const int32_t* ints(const std::string& n) { return idx.at(n).data(); }
};

struct Tensor {
  std::string name;
  size_t size;
  double scale = 1.0;  // random inputs ~ N(0, scale)
};

struct KernelCase {
  std::string name, golden;     // golden: key in kernels.json, or empty
  std::vector<Tensor> inputs;   // differentiable
  std::vector<Tensor> outputs;  // in the loss
  std::vector<Tensor> state;    // written by forward for backward, not in the loss
  std::map<std::string, std::vector<int32_t>> ints;
  double fd_tol = 1e-7;
  std::function<void(Env<double>&)> forward_d, backward_d;
  std::function<void(Env<float>&)> forward_f, backward_f;
  // The bf16 column: the kernel as `--precision bf16` runs it (bf16 operands or outputs, fp32
  // elsewhere), on float tensors; unset for kernels that stay fp32 under bf16. The fp16 column
  // (forward_h, backward_h): the same with fp16 where bf16 is.
  std::function<void(Env<float>&)> forward_b, backward_b, forward_h, backward_h;
  // The backend columns: the same op through the seam (kernels/ops.h) on a given backend, its
  // tensors stored in the given dtype where the engine stores 16 bits (the Env's own type
  // otherwise); `halves` says whether the op has 16-bit forms. exact16: the 16-bit forms round
  // only what they store, so the backends agree up to the odd last-bit rounding flip (false for
  // attention, whose cpu form also rounds inside each block where the CPU has AVX512-BF16).
  std::function<void(const Backend&, DType, Env<double>&)> ops_forward_d, ops_backward_d;
  std::function<void(const Backend&, DType, Env<float>&)> ops_forward_f, ops_backward_f;
  bool halves = false, exact16 = true;
  // Floating-point operations of one forward and one backward (the GEMM rows; 0: not counted),
  // which kernel_bench turns into GFLOP/s.
  double flops_forward = 0, flops_backward = 0;
};

// The element type of an Env a generic lambda was handed.
template <typename E>
using env_type = typename std::remove_reference_t<E>::value_type;
constexpr GradWrite kAdd = GradWrite::accumulate;

// Sets a row's backend columns from generic lambdas f(backend, dtype, env).
template <typename F, typename B>
void set_ops(KernelCase& c, F forward, B backward, bool halves) {
  c.ops_forward_d = forward;
  c.ops_backward_d = backward;
  c.ops_forward_f = forward;
  c.ops_backward_f = backward;
  c.halves = halves;
}

// A tensor of an Env as an op of the seam reads or writes it in dtype h: a View of the Env's own
// values when h is their type, else of a rounded copy staged in the Env (Env::staged);
// widen() copies a staged output back into the Env's values. While the Env's `restage` is on
// (the tests) every use rounds the values afresh and every output is widened back; the bench
// turns it off after a first call, so that its timings hold the op alone.
template <typename T>
struct Stored {
  View view;
  Env<T>* env = nullptr;  // set when staged
  std::string name;
  Stored(Env<T>& e, const std::string& name_, int64_t rows, int64_t cols, DType h) {
    T* x = e[name_];
    if (h == dtype_of<T>) {
      view = View(x, rows, cols);
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      std::vector<uint16_t>& bits = e.staged[name_ + "/" + dtype_name(h)];
      const size_t n = static_cast<size_t>(rows * cols);
      const bool fresh = bits.size() != n;
      bits.resize(n);
      view.data = bits.data();
      view.dtype = h;
      view.rows = rows, view.cols = view.ld = cols;
      if (fresh || e.restage) traits(h).narrow(bits.data(), x, rows * cols);
      env = &e, name = name_;
    } else {
      throw std::logic_error("16-bit tensors are stored from float envs");
    }
  }
  void widen() const {
    if constexpr (std::is_same_v<T, float>)
      if (env && env->restage) traits(view.dtype).widen((*env)[name], view.data, view.numel());
  }
  operator View() const { return view; }
};

// The 16-bit columns of a row from one generic lambda f(H{}, env), instantiated for bf16 and f16.
template <typename F>
void set_forward16(KernelCase& c, F f) {
  c.forward_b = [f](Env<float>& e) { f(bf16{}, e); };
  c.forward_h = [f](Env<float>& e) { f(f16{}, e); };
}
template <typename F>
void set_backward16(KernelCase& c, F f) {
  c.backward_b = [f](Env<float>& e) { f(bf16{}, e); };
  c.backward_h = [f](Env<float>& e) { f(f16{}, e); };
}

inline void PrintTo(const KernelCase& c, std::ostream* os) {
  *os << c.name;
}

// A row from generic forward/backward lambdas, instantiated for every scalar type (column).
template <typename F, typename B>
KernelCase row(KernelCase c, F forward, B backward) {
  c.forward_d = forward;
  c.backward_d = backward;
  c.forward_f = forward;
  c.backward_f = backward;
  return c;
}

template <typename T>
Env<T> make_env(const KernelCase& c, std::mt19937& rng) {
  Env<T> e;
  auto fill = [&](const Tensor& t) {
    std::normal_distribution<double> nd(0.0, t.scale);
    std::vector<T> v(t.size);
    for (T& a : v) a = static_cast<T>(nd(rng));
    return v;
  };
  for (const Tensor& t : c.inputs) {
    e.x[t.name] = fill(t);
    e.d["d" + t.name].assign(t.size, T(0));
  }
  for (const Tensor& t : c.outputs) {
    e.x[t.name].assign(t.size, T(0));
    e.d["d" + t.name] = fill(Tensor{t.name, t.size, 1.0});
  }
  for (const Tensor& t : c.state) e.x[t.name].assign(t.size, T(0));
  e.idx = c.ints;
  return e;
}

// x rounded to the 16-bit type H (bf16 or f16).
template <typename H>
std::vector<H> rounded(const float* x, size_t n) {
  std::vector<H> out(n);
  to_half(out.data(), x, static_cast<int64_t>(n));
  return out;
}

// Where the rows' sizes and index arrays come from, by kernel and key (the goldens' names:
// "linear" "N", "attention" "cu_seqlens", ...).
struct Shapes {
  std::string name;
  std::function<int(const std::string& kernel, const char* key)> integer;
  std::function<std::vector<int32_t>(const std::string& kernel, const char* key)> ints;
};
// The goldens' small shapes (every check runs in seconds), for the tests.
Shapes golden_shapes();
// BERT-base's (T = 512 tokens in one packed row of 3 sequences, C = 768, 12 heads, I = 3072,
// V = 30522, 76 masked tokens; block-sparse FFN up-projections at s = 0.9), for the bench.
Shapes bert_base_shapes();

// Every row at the given shapes.
std::vector<KernelCase> kernel_cases(const Shapes& s);

}  // namespace packbert::kernels::harness
