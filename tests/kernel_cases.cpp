#include "kernel_cases.h"

#include <fstream>

#include "kernels/block_pattern.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/layers.h"
#include "kernels/cpu/sparse.h"
#include "kernels/dropout.h"

namespace packbert::kernels::harness {

using Json = nlohmann::json;

const Json& goldens() {
  static const Json g = [] {
    std::ifstream in(std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/kernels.json");
    return Json::parse(in);
  }();
  return g;
}

Shapes golden_shapes() {
  Shapes s;
  s.name = "the goldens' shapes";
  s.integer = [](const std::string& kernel, const char* key) {
    if (kernel == "dropout") return 57;  // (no golden: any length that is not a vector multiple)
    return goldens().at(kernel).at(key).get<int>();
  };
  s.ints = [](const std::string& kernel, const char* key) {
    return goldens().at(kernel).at(key).get<std::vector<int32_t>>();
  };
  return s;
}

namespace {

constexpr int kT = 512, kC = 768, kNH = 12, kI = 3072, kV = 30522, kMasked = 76, kP = 512;
const std::vector<int32_t> kSeqlens = {0, 173, 424, 512};  // one packed row of 3 sequences

std::vector<int32_t> uniform_ints(size_t n, int32_t lo, int32_t hi, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}

// The FFN up-projection's pattern at s = 0.9 for block size `block`.
BlockPattern ffn_pattern(int block) {
  return random_block_pattern(kI, kC, block, blocks_kept(kI, kC, block, 0.9), 5);
}

}  // namespace

Shapes bert_base_shapes() {
  Shapes s;
  s.name = "BERT-base shapes";
  s.integer = [](const std::string& kernel, const char* key) {
    const std::string k = key;
    if (kernel == "gelu") return kT * kI;
    if (kernel == "geglu") return k == "N" ? kT : 1152;  // ModernBERT-base's intermediate
    if (kernel == "rotary")
      return k == "N" ? kT : k == "heads" ? kNH : k == "D" ? kC / kNH : 160000;
    if (kernel == "tanh") return 3 * kC;  // the pooler: one row per sequence
    if (kernel == "dropout") return kT * kC;
    if (kernel == "cross_entropy") return k == "N" ? kMasked : kV;
    if (kernel == "squared_error") return 3;
    if (kernel == "attention") return k == "C" ? kC : kNH;
    if (kernel == "attention_local") return k == "C" ? kC : k == "NH" ? kNH : 128;
    if (kernel == "embedding") return k == "V" ? kV : k == "P" ? kP : k == "Y" ? 2 : kC;
    if (kernel == "linear" || kernel.starts_with("sparse_linear"))
      return k == "N" ? kT : k == "OC" ? kI : kC;
    if (k == "N") return kT;  // layernorm, gather_rows
    if (k == "C") return kC;
    throw std::logic_error("bert_base_shapes: no " + kernel + " " + k);
  };
  s.ints = [](const std::string& kernel, const char* key) {
    const std::string k = key;
    if (k == "cu_seqlens") return kSeqlens;
    if (kernel == "rotary") {  // each token's place in its sequence of the packed row
      std::vector<int32_t> v(kT);
      for (size_t q = 0; q + 1 < kSeqlens.size(); ++q)
        for (int32_t t = kSeqlens[q]; t < kSeqlens[q + 1]; ++t) v[t] = t - kSeqlens[q];
      return v;
    }
    if (kernel == "embedding") {
      if (k == "ids") return uniform_ints(kT, 0, kV - 1, 1);
      std::vector<int32_t> v(kT);
      for (size_t q = 0; q + 1 < kSeqlens.size(); ++q)
        for (int32_t t = kSeqlens[q]; t < kSeqlens[q + 1]; ++t)
          v[t] = k == "pos"
                     ? t - kSeqlens[q]
                     : static_cast<int32_t>(2 * (t - kSeqlens[q]) >= kSeqlens[q + 1] - kSeqlens[q]);
      return v;
    }
    if (kernel == "cross_entropy") return uniform_ints(kMasked, 0, kV - 1, 2);
    if (kernel == "gather_rows") return uniform_ints(kMasked, 0, kT - 1, 3);
    if (kernel == "span_cross_entropy") {  // (start, end) in each sequence, or (-1, -1)
      return std::vector<int32_t>{10, 20, -1, -1, 3, 40};
    }
    if (kernel.starts_with("sparse_linear")) {
      const BlockPattern p =
          ffn_pattern(std::stoi(kernel.substr(std::string("sparse_linear_b").size())));
      return k == "slot_row" ? p.slot_row : p.slot_col;
    }
    throw std::logic_error("bert_base_shapes: no " + kernel + " " + k);
  };
  return s;
}

int64_t probs_size(const std::vector<int32_t>& cu, int NH, int window) {
  return attention_probs_offsets(cu.data(), static_cast<int>(cu.size()) - 1, NH, window).back();
}

// Rows list only the fields they use; the rest (ints, tolerance, the per-type functions that
// row() fills) keep their defaults.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
std::vector<KernelCase> kernel_cases(const Shapes& s) {
  std::vector<KernelCase> rows;
  // BERT's LayerNorm, and ModernBERT's without bias (eps 1e-5, its norm_eps).
  for (const bool biased : {true, false}) {
    const std::string name = biased ? "layernorm" : "layernorm_nobias";
    const int N = s.integer(name, "N"), C = s.integer(name, "C");
    const size_t n = static_cast<size_t>(N) * C, c = C;
    const double eps = biased ? 1e-12 : 1e-5;
    std::vector<Tensor> inputs = {{"inp", n}, {"weight", c}};
    if (biased) inputs.push_back({"bias", c});
    // The bias and its gradient, or none.
    auto bias = [biased](auto& e) { return biased ? e["bias"] : nullptr; };
    auto dbias = [biased](auto& e) { return biased ? e.grad("bias") : nullptr; };
    auto bias_view = [biased, C](auto& e) { return biased ? View::vector(e["bias"], C) : View(); };
    auto dbias_view = [biased, C](auto& e) {
      return biased ? View::vector(e.grad("bias"), C) : View();
    };
    rows.push_back(row(
        {name, name, inputs, {{"out", n}}, {{"mean", size_t(N)}, {"rstd", size_t(N)}}},
        [=](auto& e) {
          layernorm_forward(e["out"], e["mean"], e["rstd"], e["inp"], e["weight"], bias(e), N, C,
                            decltype (*e["out"] + 0)(eps));
        },
        [=](auto& e) {
          layernorm_backward(e.grad("inp"), e.grad("weight"), dbias(e), e.grad("out"), e["inp"],
                             e["weight"], e["mean"], e["rstd"], N, C);
        }));
    // bf16: the input (a residual sum) in bf16, the fp32 output plus its bf16 twin, which must be
    // exactly the rounded output; the column compares the twin (what the next GEMM reads).
    set_forward16(rows.back(), [=](auto h, Env<float>& e) {
      using H = decltype(h);
      std::vector<H> twin(n);
      layernorm_forward(e["out"], e["mean"], e["rstd"], rounded<H>(e["inp"], n).data(), e["weight"],
                        bias(e), N, C, static_cast<float>(eps), twin.data());
      for (size_t i = 0; i < n; ++i) {
        if (twin[i].bits != to_half<H>(e["out"][i]).bits)  // (a failure of the test running it)
          throw std::logic_error("layernorm: the 16-bit twin of out[" + std::to_string(i) +
                                 "] is not the rounded output");
        e["out"][i] = to_float(twin[i]);
      }
    });
    set_backward16(rows.back(), [=](auto h, Env<float>& e) {
      using H = decltype(h);
      layernorm_backward(e.grad("inp"), e.grad("weight"), dbias(e), e.grad("out"),
                         rounded<H>(e["inp"], n).data(), e["weight"], e["mean"], e["rstd"], N, C);
    });
    set_ops(
        rows.back(),
        [=](const Backend& be, DType h, auto& e) {
          using T = env_type<decltype(e)>;
          const bool half = traits(h).is_16bit;
          const Stored<T> in(e, "inp", N, C, h), out16(e, "out", N, C, h);
          be.layernorm_forward(half ? View() : View(e["out"], N, C), View::vector(e["mean"], N),
                               View::vector(e["rstd"], N), in, View::vector(e["weight"], C),
                               bias_view(e), eps, half ? out16.view : View());
          out16.widen();
        },
        [=](const Backend& be, DType h, auto& e) {
          using T = env_type<decltype(e)>;
          be.layernorm_backward(View(e.grad("inp"), N, C), View::vector(e.grad("weight"), C),
                                dbias_view(e), View(e.grad("out"), N, C),
                                Stored<T>(e, "inp", N, C, h), View::vector(e["weight"], C),
                                View::vector(e["mean"], N), View::vector(e["rstd"], N), kAdd);
        },
        true);
  }
  for (const char* kernel : {"gelu", "tanh"}) {
    const int n = s.integer(kernel, "n");
    const bool gelu = std::string(kernel) == "gelu";
    rows.push_back(row(
        {kernel, kernel, {{"inp", size_t(n), 2.0}}, {{"out", size_t(n)}}, {}},
        [=](auto& e) {
          if (gelu)
            gelu_forward(e["out"], e["inp"], n);
          else
            tanh_forward(e["out"], e["inp"], n);
        },
        [=](auto& e) {
          if (gelu)
            gelu_backward(e.grad("inp"), e["inp"], e.grad("out"), n);
          else
            tanh_backward(e.grad("inp"), e["out"], e.grad("out"), n);
        }));
    if (gelu) {  // bf16: input and output in bf16 (a GEMM writes one and reads the other)
      set_forward16(rows.back(), [=](auto h, Env<float>& e) {
        using H = decltype(h);
        std::vector<H> out(n);
        gelu_forward(out.data(), rounded<H>(e["inp"], n).data(), n);
        to_float(e["out"], out.data(), n);
      });
      set_backward16(rows.back(), [=](auto h, Env<float>& e) {
        using H = decltype(h);
        gelu_backward(e.grad("inp"), rounded<H>(e["inp"], n).data(), e.grad("out"), n);
      });
    }
    set_ops(
        rows.back(),
        [=](const Backend& be, DType h, auto& e) {
          using T = env_type<decltype(e)>;
          const Stored<T> in(e, "inp", 1, n, h), out(e, "out", 1, n, h);
          if (gelu)
            be.gelu_forward(out, in);
          else
            be.tanh_forward(out, in);
          out.widen();
        },
        [=](const Backend& be, DType h, auto& e) {
          using T = env_type<decltype(e)>;
          if (gelu)
            be.gelu_backward(View::vector(e.grad("inp"), n), View(), Stored<T>(e, "inp", 1, n, h),
                             View::vector(e.grad("out"), n), kAdd);
          else
            be.tanh_backward(View::vector(e.grad("inp"), n), View::vector(e["out"], n),
                             View::vector(e.grad("out"), n));
        },
        gelu);
  }
  {  // GeGLU (ModernBERT's MLP): in [N, 2I] -> out [N, I]; 16-bit in and out, as a GEMM writes
     // and reads them
    const int N = s.integer("geglu", "N"), I = s.integer("geglu", "I");
    const size_t ni = static_cast<size_t>(N) * 2 * I, no = static_cast<size_t>(N) * I;
    rows.push_back(row(
        {"geglu", "geglu", {{"inp", ni, 2.0}}, {{"out", no}}, {}},
        [=](auto& e) { geglu_forward(e["out"], e["inp"], N, I); },
        [=](auto& e) { geglu_backward(e.grad("inp"), e["inp"], e.grad("out"), N, I); }));
    set_forward16(rows.back(), [=](auto h, Env<float>& e) {
      using H = decltype(h);
      std::vector<H> out(no);
      geglu_forward(out.data(), rounded<H>(e["inp"], ni).data(), N, I);
      to_float(e["out"], out.data(), no);
    });
    set_backward16(rows.back(), [=](auto h, Env<float>& e) {
      using H = decltype(h);
      geglu_backward(e.grad("inp"), rounded<H>(e["inp"], ni).data(), e.grad("out"), N, I);
    });
    set_ops(
        rows.back(),
        [=](const Backend& be, DType h, auto& e) {
          using T = env_type<decltype(e)>;
          const Stored<T> in(e, "inp", N, 2 * I, h), out(e, "out", N, I, h);
          be.geglu_forward(out, in);
          out.widen();
        },
        [=](const Backend& be, DType h, auto& e) {
          using T = env_type<decltype(e)>;
          be.geglu_backward(View(e.grad("inp"), N, 2 * I), Stored<T>(e, "inp", N, 2 * I, h),
                            View(e.grad("out"), N, I), kAdd);
        },
        true);
  }
  {  // rotary embedding over heads of a packed batch, positions restarting in each sequence
    const int N = s.integer("rotary", "N"), H = s.integer("rotary", "heads"),
              D = s.integer("rotary", "D");
    const double theta = s.integer("rotary", "theta");
    const size_t n = static_cast<size_t>(N) * H * D;
    KernelCase c{"rotary", "rotary", {{"inp", n}}, {{"out", n}}, {}};
    c.ints["pos"] = s.ints("rotary", "pos");
    rows.push_back(row(
        std::move(c),
        [=](auto& e) { rotary_forward(e["out"], e["inp"], e.ints("pos"), N, H, D, theta); },
        [=](auto& e) {
          rotary_backward(e.grad("inp"), e.grad("out"), e.ints("pos"), N, H, D, theta);
        }));
    set_forward16(rows.back(), [=](auto h, Env<float>& e) {
      using H16 = decltype(h);
      std::vector<H16> out(n);
      rotary_forward(out.data(), rounded<H16>(e["inp"], n).data(), e.ints("pos"), N, H, D, theta);
      to_float(e["out"], out.data(), n);
    });
    set_backward16(rows.back(), [=](auto, Env<float>& e) {  // (backward stays fp32)
      rotary_backward(e.grad("inp"), e.grad("out"), e.ints("pos"), N, H, D, theta);
    });
    set_ops(
        rows.back(),
        [=](const Backend& be, DType h, auto& e) {
          using T = env_type<decltype(e)>;
          const Stored<T> in(e, "inp", N, H * D, h), out(e, "out", N, H * D, h);
          be.rotary_forward(out, in, e.ints("pos"), H, theta);
          out.widen();
        },
        [=](const Backend& be, DType, auto& e) {
          be.rotary_backward(View(e.grad("inp"), N, H * D), View(e.grad("out"), N, H * D),
                             e.ints("pos"), H, theta, kAdd);
        },
        true);
  }
  {
    const int N = s.integer("linear", "N"), C = s.integer("linear", "C"),
              OC = s.integer("linear", "OC");
    const size_t nx = static_cast<size_t>(N) * C, nw = static_cast<size_t>(OC) * C,
                 no = static_cast<size_t>(N) * OC;
    rows.push_back(row(
        {"linear",
         "linear",
         {{"inp", nx}, {"weight", nw}, {"bias", size_t(OC)}},
         {{"out", no}},
         {}},
        [=](auto& e) { linear_forward(e["out"], e["inp"], e["weight"], e["bias"], N, C, OC); },
        [=](auto& e) {
          linear_backward(e.grad("inp"), e.grad("weight"), e.grad("bias"), e.grad("out"), e["inp"],
                          e["weight"], N, C, OC);
        }));
    // bf16: input and weight rounded to bf16, fp32 accumulation, output and gradients.
    set_forward16(rows.back(), [=](auto h, Env<float>& e) {
      using H = decltype(h);
      linear_forward(e["out"], rounded<H>(e["inp"], nx).data(), rounded<H>(e["weight"], nw).data(),
                     e["bias"], N, C, OC);
    });
    set_backward16(rows.back(), [=](auto h, Env<float>& e) {
      using H = decltype(h);
      std::vector<H> dout16(no);
      linear_backward(e.grad("inp"), e.grad("weight"), e.grad("bias"), e.grad("out"), dout16.data(),
                      rounded<H>(e["inp"], nx).data(), rounded<H>(e["weight"], nw).data(), N, C,
                      OC);
    });
    // Through the seam; with_bias false: the same without a bias.
    auto linear_ops_backward = [=](bool with_bias) {
      return [=](const Backend& be, DType h, auto& e) {
        using T = env_type<decltype(e)>;
        be.linear_backward(View(e.grad("inp"), N, C), View(e.grad("weight"), OC, C),
                           with_bias ? View::vector(e.grad("bias"), OC) : View(),
                           View(e.grad("out"), N, OC), Stored<T>(e, "inp", N, C, h),
                           Stored<T>(e, "weight", OC, C, h), nullptr, kAdd, View());
      };
    };
    // out_in_h: the output stored in the operands' dtype (the 16-bit-output form).
    auto linear_ops_forward = [=](bool with_bias, bool out_in_h) {
      return [=](const Backend& be, DType h, auto& e) {
        using T = env_type<decltype(e)>;
        const Stored<T> out(e, "out", N, OC, out_in_h ? h : dtype_of<T>);
        be.linear_forward(out, Stored<T>(e, "inp", N, C, h), Stored<T>(e, "weight", OC, C, h),
                          with_bias ? View::vector(e["bias"], OC) : View(), nullptr, View());
        out.widen();
      };
    };
    set_ops(rows.back(), linear_ops_forward(true, false), linear_ops_backward(true), true);
    const double gemm = 2.0 * N * C * OC;  // one product's flops
    rows.back().flops_forward = gemm, rows.back().flops_backward = 2 * gemm;
    // The 16-bit-output form (q | k | v, GELU's input): bias added in fp32, rounded once.
    rows.push_back(rows.back());
    rows.back().name = "linear, 16-bit output";
    rows.back().golden = "";
    set_forward16(rows.back(), [=](auto h, Env<float>& e) {
      using H = decltype(h);
      std::vector<H> out(no);
      linear_forward(out.data(), rounded<H>(e["inp"], nx).data(),
                     rounded<H>(e["weight"], nw).data(), e["bias"], N, C, OC);
      to_float(e["out"], out.data(), static_cast<int64_t>(no));
    });
    set_ops(rows.back(), linear_ops_forward(true, true), linear_ops_backward(true), true);
    rows.push_back(row(
        {"linear without bias", "", {{"inp", nx}, {"weight", nw}}, {{"out", no}}, {}},
        [=](auto& e) {
          linear_forward(e["out"], e["inp"], e["weight"], decltype(e["out"])(nullptr), N, C, OC);
        },
        [=](auto& e) {
          linear_backward(e.grad("inp"), e.grad("weight"), decltype(e["out"])(nullptr),
                          e.grad("out"), e["inp"], e["weight"], N, C, OC);
        }));
    set_forward16(rows.back(), [=](auto h, Env<float>& e) {
      using H = decltype(h);
      linear_forward(e["out"], rounded<H>(e["inp"], nx).data(), rounded<H>(e["weight"], nw).data(),
                     nullptr, N, C, OC);
    });
    set_backward16(rows.back(), [=](auto h, Env<float>& e) {
      using H = decltype(h);
      std::vector<H> dout16(no);
      linear_backward(e.grad("inp"), e.grad("weight"), nullptr, e.grad("out"), dout16.data(),
                      rounded<H>(e["inp"], nx).data(), rounded<H>(e["weight"], nw).data(), N, C,
                      OC);
    });
    set_ops(rows.back(), linear_ops_forward(false, false), linear_ops_backward(false), true);
    rows.back().flops_forward = gemm, rows.back().flops_backward = 2 * gemm;
  }
  {
    const int V = s.integer("embedding", "V"), P = s.integer("embedding", "P"),
              Y = s.integer("embedding", "Y"), C = s.integer("embedding", "C");
    const std::vector<int32_t> ids = s.ints("embedding", "ids");
    const int T = static_cast<int>(ids.size());
    rows.push_back(row(
        {"embedding",
         "embedding",
         {{"word", size_t(V * C)}, {"position", size_t(P * C)}, {"token_type", size_t(Y * C)}},
         {{"out", size_t(T * C)}},
         {},
         {{"ids", ids},
          {"pos", s.ints("embedding", "pos")},
          {"types", s.ints("embedding", "types")}}},
        [=](auto& e) {
          embedding_forward(e["out"], e.ints("ids"), e.ints("pos"), e.ints("types"), e["word"],
                            e["position"], e["token_type"], T, C);
        },
        [=](auto& e) {
          embedding_backward(e.grad("word"), e.grad("position"), e.grad("token_type"),
                             e.grad("out"), e.ints("ids"), e.ints("pos"), e.ints("types"), T, C);
        }));
    set_ops(
        rows.back(),
        [=](const Backend& be, DType, auto& e) {
          be.embedding_forward(View(e["out"], T, C), e.ints("ids"), e.ints("pos"), e.ints("types"),
                               View(e["word"], V, C), View(e["position"], P, C),
                               View(e["token_type"], Y, C));
        },
        [=](const Backend& be, DType, auto& e) {
          be.embedding_backward(View(e.grad("word"), V, C), View(e.grad("position"), P, C),
                                View(e.grad("token_type"), Y, C), View(e.grad("out"), T, C),
                                e.ints("ids"), e.ints("pos"), e.ints("types"));
        },
        false);
  }
  {
    const int N = s.integer("cross_entropy", "N"), V = s.integer("cross_entropy", "V");
    const size_t nz = static_cast<size_t>(N) * V;
    rows.push_back(row(
        {"cross_entropy, logits kept",
         "cross_entropy",
         {{"logits", nz, 2.0}},
         {{"losses", size_t(N)}},
         {{"lse", size_t(N)}},
         {{"targets", s.ints("cross_entropy", "targets")}}},
        [=](auto& e) {
          cross_entropy_logits_forward(e["losses"], e["lse"], e["logits"], e.ints("targets"), N, V);
        },
        [=](auto& e) {
          cross_entropy_logits_backward(e.grad("logits"), e["logits"], e["lse"], e.ints("targets"),
                                        e.grad("losses"), N, V);
        }));
    set_ops(
        rows.back(),
        [=](const Backend& be, DType, auto& e) {
          be.cross_entropy_forward(View::vector(e["losses"], N), View::vector(e["lse"], N),
                                   View(e["logits"], N, V), e.ints("targets"));
        },
        [=](const Backend& be, DType, auto& e) {
          be.cross_entropy_backward(View(e.grad("logits"), N, V), View(), View(e["logits"], N, V),
                                    View::vector(e["lse"], N), e.ints("targets"),
                                    View::vector(e.grad("losses"), N), kAdd);
        },
        false);
  }
  // Global attention ("attention") and sliding-window attention ("attention_local": sequences
  // longer than the band, a short one seen whole, one a single masked tile).
  for (const std::string kernel : {"attention", "attention_local"}) {
    const int C = s.integer(kernel, "C"), NH = s.integer(kernel, "NH");
    const int W = kernel == "attention" ? kGlobalAttention : s.integer(kernel, "window");
    const std::vector<int32_t> cu = s.ints(kernel, "cu_seqlens");
    const int n_seq = static_cast<int>(cu.size()) - 1, T = cu.back();
    const size_t nq = static_cast<size_t>(T) * 3 * C, no = static_cast<size_t>(T) * C;
    const size_t np = static_cast<size_t>(probs_size(cu, NH, W));
    for (const double p : {0.0, 0.3})
      for (const bool keep : {true, false}) {
        const std::string name =
            (W == kGlobalAttention ? "attention varlen" : "attention sliding window") +
            std::string(p > 0 ? ", dropout" : "") + (keep ? "" : ", probabilities recomputed");
        const AttentionDropout drop{p, 99, 5};
        rows.push_back(row(
            {name,
             p == 0 ? kernel : "",
             {{"qkv", nq}},
             {{"out", no}},
             {{"probs", np}},
             {{"cu_seqlens", cu}}},
            [=](auto& e) {
              attention_forward(e["out"], keep ? e["probs"] : nullptr, e["qkv"],
                                e.ints("cu_seqlens"), n_seq, C, NH, W, drop);
            },
            [=](auto& e) {
              attention_backward(e.grad("qkv"), e.grad("out"), e["qkv"],
                                 keep ? e["probs"] : nullptr, e.ints("cu_seqlens"), n_seq, C, NH, W,
                                 drop);
            }));
        // bf16: the output exists only in bf16 (its reader is a GEMM); backward stays fp32.
        // bf16: q | k | v and the output in bf16 (both are GEMM products/operands there).
        set_forward16(rows.back(), [=](auto h, Env<float>& e) {
          using H = decltype(h);
          std::vector<H> out(no);
          std::vector<H> probs(np);
          attention_forward(out.data(), keep ? probs.data() : nullptr,
                            rounded<H>(e["qkv"], nq).data(), e.ints("cu_seqlens"), n_seq, C, NH, W,
                            drop);
          to_float(e["out"], out.data(), static_cast<int64_t>(no));
          to_float(e["probs"], probs.data(), static_cast<int64_t>(np));
        });
        set_backward16(rows.back(), [=](auto h, Env<float>& e) {
          using H = decltype(h);
          attention_backward(e.grad("qkv"), e.grad("out"), rounded<H>(e["qkv"], nq).data(),
                             keep ? rounded<H>(e["probs"], np).data() : nullptr,
                             e.ints("cu_seqlens"), n_seq, C, NH, W, drop);
        });
        set_ops(
            rows.back(),
            [=](const Backend& be, DType h, auto& e) {
              using E = env_type<decltype(e)>;
              const Stored<E> out(e, "out", T, C, h), probs(e, "probs", 1, int64_t(np), h);
              be.attention_forward(out, keep ? probs.view : View(),
                                   Stored<E>(e, "qkv", T, 3 * C, h), e.ints("cu_seqlens"), n_seq,
                                   NH, W, drop, nullptr, View());
              out.widen();
              probs.widen();
            },
            [=](const Backend& be, DType h, auto& e) {
              using E = env_type<decltype(e)>;
              const Stored<E> probs(e, "probs", 1, int64_t(np), h);
              be.attention_backward(View(e.grad("qkv"), T, 3 * C), View(e.grad("out"), T, C),
                                    Stored<E>(e, "qkv", T, 3 * C, h), keep ? probs.view : View(),
                                    e.ints("cu_seqlens"), n_seq, NH, W, drop, nullptr, View(),
                                    kAdd);
            },
            true);
        rows.back().exact16 = false;
      }
  }
  {
    const int N = s.integer("gather_rows", "N"), C = s.integer("gather_rows", "C");
    const std::vector<int32_t> r = s.ints("gather_rows", "rows");
    const int n = static_cast<int>(r.size());
    rows.push_back(row(
        {"gather_rows",
         "gather_rows",
         {{"inp", size_t(N * C)}},
         {{"out", size_t(n * C)}},
         {},
         {{"rows", r}}},
        [=](auto& e) { gather_rows_forward(e["out"], e["inp"], e.ints("rows"), n, C); },
        [=](auto& e) {
          gather_rows_backward(e.grad("inp"), e.grad("out"), e.ints("rows"), n, C);
        }));
    set_ops(
        rows.back(),
        [=](const Backend& be, DType, auto& e) {
          be.gather_rows_forward(View(e["out"], n, C), View(e["inp"], N, C), e.ints("rows"));
        },
        [=](const Backend& be, DType, auto& e) {
          be.gather_rows_backward(View(e.grad("inp"), N, C), View(e.grad("out"), n, C),
                                  e.ints("rows"));
        },
        false);
  }
  {
    const std::vector<int32_t> cu = s.ints("span_cross_entropy", "cu_seqlens");
    const int n_seq = static_cast<int>(cu.size()) - 1, T = cu.back();
    rows.push_back(row(
        {"span_cross_entropy",
         "span_cross_entropy",
         {{"logits", size_t(2 * T), 2.0}},
         {{"losses", size_t(n_seq)}},
         {{"probs", size_t(2 * T)}},
         {{"cu_seqlens", cu}, {"targets", s.ints("span_cross_entropy", "targets")}}},
        [=](auto& e) {
          span_cross_entropy_forward(e["losses"], e["probs"], e["logits"], e.ints("cu_seqlens"),
                                     e.ints("targets"), n_seq);
        },
        [=](auto& e) {
          span_cross_entropy_backward(e.grad("logits"), e["probs"], e.ints("cu_seqlens"),
                                      e.ints("targets"), e.grad("losses"), n_seq);
        }));
    set_ops(
        rows.back(),
        [=](const Backend& be, DType, auto& e) {
          be.span_cross_entropy_forward(View::vector(e["losses"], n_seq), View(e["probs"], T, 2),
                                        View(e["logits"], T, 2), e.ints("cu_seqlens"),
                                        e.ints("targets"), n_seq);
        },
        [=](const Backend& be, DType, auto& e) {
          be.span_cross_entropy_backward(View(e.grad("logits"), T, 2), View(e["probs"], T, 2),
                                         e.ints("cu_seqlens"), e.ints("targets"),
                                         View::vector(e.grad("losses"), n_seq), n_seq);
        },
        false);
  }
  {
    const int N = s.integer("squared_error", "N");
    rows.push_back(row(
        {"squared_error",
         "squared_error",
         {{"pred", size_t(N), 2.0}, {"target", size_t(N), 2.0}},
         {{"losses", size_t(N)}}},
        [=](auto& e) { squared_error_forward(e["losses"], e["pred"], e["target"], N); },
        [=](auto& e) {
          squared_error_backward(e.grad("pred"), e.grad("target"), e["pred"], e["target"],
                                 e.grad("losses"), N);
        }));
    set_ops(
        rows.back(),
        [=](const Backend& be, DType, auto& e) {
          be.squared_error_forward(View::vector(e["losses"], N), View::vector(e["pred"], N),
                                   View::vector(e["target"], N));
        },
        [=](const Backend& be, DType, auto& e) {
          be.squared_error_backward(View::vector(e.grad("pred"), N),
                                    View::vector(e.grad("target"), N), View::vector(e["pred"], N),
                                    View::vector(e["target"], N),
                                    View::vector(e.grad("losses"), N));
        },
        false);
  }
  for (const int B : {1, 4, 8, 16}) {
    // Block-sparse linear: PyTorch's golden is F.linear on the masked dense weight.
    const std::string key = "sparse_linear_b" + std::to_string(B);
    const int N = s.integer(key.c_str(), "N");
    BlockPattern p;
    p.rows = s.integer(key.c_str(), "OC");
    p.cols = s.integer(key.c_str(), "C");
    p.block = B;
    p.slot_row = s.ints(key.c_str(), "slot_row");
    p.slot_col = s.ints(key.c_str(), "slot_col");
    p.index();
    const size_t nx = static_cast<size_t>(N) * p.cols, no = static_cast<size_t>(N) * p.rows;
    rows.push_back(row(
        {key,
         key,
         {{"inp", nx}, {"values", size_t(p.values_size())}, {"bias", size_t(p.rows)}},
         {{"out", no}},
         {{"scratch", size_t(sparse_linear_scratch(p, N))}}},
        [=](auto& e) {
          sparse_linear_forward(e["out"], e["inp"], p, e["values"], e["bias"], N, e["scratch"]);
        },
        [=](auto& e) {
          sparse_linear_backward(e.grad("inp"), e.grad("values"), e.grad("bias"), e.grad("out"),
                                 e["inp"], p, e["values"], N, e["scratch"]);
        }));
    const int64_t nv = p.values_size();
    set_ops(
        rows.back(),
        [=](const Backend& be, DType h, auto& e) {
          using T = env_type<decltype(e)>;
          be.linear_forward(View(e["out"], N, p.rows), Stored<T>(e, "inp", N, p.cols, h),
                            View::vector(e["values"], nv), View::vector(e["bias"], p.rows), &p,
                            View());
        },
        [=](const Backend& be, DType h, auto& e) {
          using T = env_type<decltype(e)>;
          be.linear_backward(View(e.grad("inp"), N, p.cols), View::vector(e.grad("values"), nv),
                             View::vector(e.grad("bias"), p.rows), View(e.grad("out"), N, p.rows),
                             Stored<T>(e, "inp", N, p.cols, h), View::vector(e["values"], nv), &p,
                             kAdd, View());
        },
        true);
    // (the kept blocks' products only)
    rows.back().flops_forward = 2.0 * N * static_cast<double>(nv);
    rows.back().flops_backward = 2 * rows.back().flops_forward;
  }
  {
    const int64_t n = s.integer("dropout", "n");
    for (const double p : {0.0, 0.25}) {
      rows.push_back(row(
          {p > 0 ? "dropout" : "dropout off", "", {{"inp", size_t(n)}}, {{"out", size_t(n)}}, {}},
          [=](auto& e) { dropout_forward(e["out"], e["inp"], n, p, 3, 11); },
          [=](auto& e) { dropout_backward(e.grad("inp"), e.grad("out"), n, p, 3, 11); }));
      set_ops(
          rows.back(),
          [=](const Backend& be, DType, auto& e) {
            be.dropout_forward(View::vector(e["out"], n), View::vector(e["inp"], n), p, 3, 11, 0);
          },
          [=](const Backend& be, DType, auto& e) {
            be.dropout_backward(View::vector(e.grad("inp"), n), View::vector(e.grad("out"), n), p,
                                3, 11, 0);
          },
          false);
    }
  }
  return rows;
}
#pragma GCC diagnostic pop

}  // namespace packbert::kernels::harness
