#include "model/workspace.h"

#include <algorithm>
#include <new>
#include <sstream>

#include "error.h"
#include "io/memory.h"
#include "kernels/attention_layout.h"
#include "model/sparse.h"

namespace packbert::model {

std::string Recompute::name() const {
  if (automatic) return "auto";
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : ",") + part; };
  if (every == 1) add("layer");
  if (every > 1) add("every:" + std::to_string(every));
  if (gelu) add("gelu");
  if (ln) add("ln");
  if (residual) add("residual");
  if (attention) add("attention");
  return s.empty() ? "none" : s;
}

Recompute parse_recompute(const std::string& text) {
  Recompute r;
  auto bad = [&](const std::string& why) {
    return InputError("`recompute` " + text + ": " + why +
                      " (expected none, gelu, gelu,ln, attention, layer, every:K or auto, or a "
                      "comma list of gelu, ln, residual, attention with layer or every:K)");
  };
  if (text == "none") return r;
  if (text == "auto") {
    r.automatic = true;
    return r;
  }
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    if (part == "gelu") {
      r.gelu = true;
    } else if (part == "ln") {
      r.ln = true;
    } else if (part == "attention") {
      r.attention = true;
    } else if (part == "residual") {
      r.residual = true;
    } else if (part == "layer" && r.every == 0) {
      r.every = 1;
    } else if (part.rfind("every:", 0) == 0 && r.every == 0) {
      const std::string k = part.substr(6);
      if (k.empty() || k.size() > 4 || k.find_first_not_of("0123456789") != std::string::npos ||
          std::stoi(k) < 1)
        throw bad("every:K needs a whole number K >= 1");
      r.every = std::stoi(k);
    } else {
      throw bad("unknown or repeated part '" + part + "'");
    }
  }
  if (text.empty() || text.back() == ',') throw bad("empty part");
  return r;
}

StepShape shape_of(const TokenLayout& tl, int threads, int local_window) {
  StepShape s;
  s.tokens = tl.tokens();
  s.sequences = tl.sequences();
  s.masked = static_cast<int64_t>(tl.mlm_token.size());
  for (int i = 0; i < tl.sequences(); ++i) {
    const int64_t L = tl.cu_seqlens[i + 1] - tl.cu_seqlens[i];
    s.attention += L * L;
    s.attention_local += L * (local_window ? kernels::attention_band(L, local_window) : L);
    s.max_len = std::max(s.max_len, L);
  }
  s.threads = threads;
  return s;
}

void size_kernel_scratch(StepShape& shape, const ParamLayout& layout, const kernels::Backend& be) {
  const BertConfig& c = layout.config();
  shape.attention_scratch = be.attention_scratch_elems(
      static_cast<int>(shape.max_len), shape.threads, c.hidden_size / c.num_attention_heads);
  shape.sparse_layers = layout.sparsity().on();
  shape.sparse_scratch = sparse_scratch_elems(layout, shape.tokens, be);
}

namespace {

// Which records a policy may move out of the per-layer set.
enum class Role {
  model,     // embeddings and heads' records: one copy, kept
  hidden,    // layer inputs: L + 1 (every:K: the kept checkpoints; `ln`: the first and the last)
  layer,     // one copy per layer (every:K: one per layer of a re-run segment, scratch)
  gelu,      // per layer unless rebuilt (`gelu`)
  ln,        // per layer unless rebuilt (`ln`)
  residual,  // per layer unless rebuilt (`residual`)
  probs,     // per layer unless recomputed (`attention`)
  scratch,   // one copy, scratch
  segment,   // every:K's K layer outputs of a re-run segment, scratch
  // `ln` without every:K: two shared slots the inner layers' inputs alternate between
  rebuilt_input,
};

// Which heads a record belongs to (encoder records: all), or which family's layers hold it.
enum class Need {
  encoder,
  pooler,
  pooled,  // BERT's pooler, or ModernBERT's classifier
  pretraining,
  classifier,
  span,
  bert,
  modernbert,
  modern_task
};

// A record's number format, which Workspace::get's View carries: the step's scalar (f32, or f64
// in the finite-difference tests); the scalar under fp32 and 16 bits under a 16-bit precision
// (every activation kept between layers); a 16-bit twin held only under a 16-bit precision (the
// rounded GEMM operand of a tensor that stays in the scalar); or a scalar twin held only under a
// 16-bit precision (the encoder's output, which the heads read in the scalar while the layers'
// copy of it is 16-bit); or the scalar held only under fp32 (under a 16-bit precision its kernel
// writes the 16-bit form straight into scratch.grad16). Every 16-bit type holds the same records.
enum class Dtype { scalar, narrowed, twin, wide_twin, fp32_only };

// One copy of a record as the ops read it: [rows, cols] (a vector: one row).
struct Dims {
  int64_t rows, cols;
  constexpr int64_t elements() const { return rows * cols; }
};

struct RecordSpec {
  Rec id;
  const char* name;
  Role role;
  Need need;
  Dims (*dims)(const StepShape&, const BertConfig&, const Heads&);  // one copy's [rows, cols]
  Dtype dtype = Dtype::scalar;
};

using S = const StepShape&;
using B = const BertConfig&;
using H = const Heads&;
// One copy's [rows, cols]: a row per token, sequence or MLM position, or a vector.
constexpr Dims TC(S s, B c, H) {
  return {s.tokens, c.hidden_size};
}
constexpr Dims TI(S s, B c, H) {
  return {s.tokens, c.intermediate_size};
}
// The up-projection's output: [T, I], or ModernBERT's GeGLU input [T, 2I].
constexpr Dims TU(S s, B c, H) {
  return {s.tokens, (c.family == Family::modernbert ? 2 : 1) * int64_t{c.intermediate_size}};
}
constexpr Dims T3C(S s, B c, H) {
  return {s.tokens, 3 * int64_t{c.hidden_size}};
}
constexpr Dims T1(S s, B, H) {
  return {1, s.tokens};
}
constexpr Dims NC(S s, B c, H) {
  return {s.sequences, c.hidden_size};
}
constexpr Dims N1(S s, B, H) {
  return {1, s.sequences};
}
constexpr Dims MC(S s, B c, H) {
  return {s.masked, c.hidden_size};
}
constexpr Dims M1(S s, B, H) {
  return {1, s.masked};
}
constexpr Dims MV(S s, B c, H) {
  return {s.masked, c.vocab_size};
}
// The classifier's logits: [n_seq, labels] (regression: one output).
constexpr Dims NL(S s, B c, H) {
  return {s.sequences, c.num_labels};
}
// The span head's start and end logits per token.
constexpr Dims T2(S s, B, H) {
  return {s.tokens, 2};
}
// ModernBERT's task head transform runs on the pooled sequences (classifier) or on every token
// (QA): [rows, C], and its LayerNorm statistics [1, rows].
constexpr int64_t task_rows(S s, H h) {
  return h.span ? s.tokens : s.sequences;
}
constexpr Dims TaskC(S s, B c, H h) {
  return {task_rows(s, h), c.hidden_size};
}
constexpr Dims Task1(S s, B, H h) {
  return {1, task_rows(s, h)};
}

// The table. Arena order is table order; the names are what `plan` prints.
const RecordSpec kRecords[] = {
    {Rec::emb_sum, "embeddings.sum", Role::model, Need::encoder, TC},
    {Rec::emb_mean, "embeddings.ln_mean", Role::model, Need::encoder, T1},
    {Rec::emb_rstd, "embeddings.ln_rstd", Role::model, Need::encoder, T1},
    {Rec::hidden, "layer.input", Role::hidden, Need::encoder, TC, Dtype::narrowed},
    {Rec::hidden_rebuilt, "layer.input_rebuilt", Role::rebuilt_input, Need::encoder, TC,
     Dtype::narrowed},
    {Rec::top, "encoder.output", Role::model, Need::bert, TC, Dtype::wide_twin},
    {Rec::qkv, "layer.qkv", Role::layer, Need::encoder, T3C, Dtype::narrowed},
    {Rec::probs, "layer.attention_probs", Role::probs, Need::encoder,
     [](S s, B c, H) {
       return Dims{1, c.num_attention_heads * s.attention};
     },
     Dtype::narrowed},
    {Rec::probs_local, "layer.attention_probs_local", Role::probs, Need::modernbert,
     [](S s, B c, H) {
       return Dims{1, c.num_attention_heads * s.attention_local};
     },
     Dtype::narrowed},
    {Rec::att, "layer.attention_out", Role::layer, Need::encoder, TC, Dtype::narrowed},
    {Rec::r1, "layer.residual1", Role::residual, Need::encoder, TC, Dtype::narrowed},
    {Rec::ln1_mean, "layer.ln1_mean", Role::layer, Need::encoder, T1},
    {Rec::ln1_rstd, "layer.ln1_rstd", Role::layer, Need::encoder, T1},
    {Rec::h1, "layer.ln1_out", Role::ln, Need::encoder, TC, Dtype::narrowed},
    {Rec::inter, "layer.gelu_in", Role::layer, Need::encoder, TU, Dtype::narrowed},
    {Rec::gelu, "layer.gelu_out", Role::gelu, Need::encoder, TI, Dtype::narrowed},
    {Rec::r2, "layer.residual2", Role::layer, Need::bert, TC, Dtype::narrowed},
    {Rec::ln2_mean, "layer.ln2_mean", Role::layer, Need::encoder, T1},
    {Rec::ln2_rstd, "layer.ln2_rstd", Role::layer, Need::encoder, T1},
    {Rec::attn_in, "layer.attn_norm_out", Role::ln, Need::modernbert, TC, Dtype::narrowed},
    {Rec::final_mean, "encoder.final_norm_mean", Role::model, Need::modernbert, T1},
    {Rec::final_rstd, "encoder.final_norm_rstd", Role::model, Need::modernbert, T1},
    {Rec::final_out, "encoder.final_norm_out", Role::model, Need::modernbert, TC},
    {Rec::final16, "encoder.final_norm_out16", Role::model, Need::modernbert, TC, Dtype::twin},
    {Rec::task_in, "task_head.pooled", Role::model, Need::modern_task, NC},
    {Rec::task_t1, "task_head.gelu_in", Role::model, Need::modern_task, TaskC},
    {Rec::task_t2, "task_head.ln_in", Role::model, Need::modern_task, TaskC},
    {Rec::task_mean, "task_head.ln_mean", Role::model, Need::modern_task, Task1},
    {Rec::task_rstd, "task_head.ln_rstd", Role::model, Need::modern_task, Task1},
    {Rec::task_t3, "task_head.ln_out", Role::model, Need::modern_task, TaskC},
    {Rec::cls_in, "pooler.cls", Role::model, Need::pooler, NC},
    {Rec::pooled, "pooler.out", Role::model, Need::pooler, NC},
    {Rec::mlm_in, "mlm.in", Role::model, Need::pretraining, MC, Dtype::narrowed},
    {Rec::mlm_t1, "mlm.gelu_in", Role::model, Need::pretraining, MC},
    {Rec::mlm_t2, "mlm.ln_in", Role::model, Need::pretraining, MC},
    {Rec::mlm_mean, "mlm.ln_mean", Role::model, Need::pretraining, M1},
    {Rec::mlm_rstd, "mlm.ln_rstd", Role::model, Need::pretraining, M1},
    {Rec::mlm_t3, "mlm.ln_out", Role::model, Need::pretraining, MC, Dtype::narrowed},
    {Rec::mlm_logits, "mlm.logits", Role::model, Need::pretraining, MV},
    {Rec::mlm_lse, "mlm.logsumexp", Role::model, Need::pretraining, M1},
    {Rec::nsp_logits, "nsp.logits", Role::model, Need::pretraining,
     [](S s, B, H) {
       return Dims{s.sequences, 2};
     }},
    {Rec::nsp_lse, "nsp.logsumexp", Role::model, Need::pretraining, N1},
    {Rec::cls_drop, "classifier.in", Role::model, Need::classifier, NC},
    {Rec::cls_logits, "classifier.logits", Role::model, Need::classifier, NL},
    {Rec::cls_lse, "classifier.logsumexp", Role::model, Need::classifier, N1},
    {Rec::span_logits, "span.logits", Role::model, Need::span, T2},
    {Rec::span_probs, "span.probs", Role::model, Need::span, T2},
    // Scratch.
    {Rec::tmp, "scratch.linear_out", Role::scratch, Need::encoder, TC},
    {Rec::attn_work, "scratch.attention_blocks", Role::scratch, Need::encoder,
     [](S s, B, H) {
       return Dims{1, s.attention_scratch};
     }},
    {Rec::seg_hidden, "scratch.segment_outputs", Role::segment, Need::encoder, TC, Dtype::narrowed},
    // A linear layer's output gradient rounded to 16 bits for its two GEMMs (the widest: MLM
    // logits).
    {Rec::dout16, "scratch.grad16", Role::scratch, Need::encoder,
     [](S s, B c, H h) {
       return Dims{
           1, std::max({T3C(s, c, h).elements(), TU(s, c, h).elements(), MV(s, c, h).elements()})};
     },
     Dtype::twin},
    // The block-sparse linear layers' packed activations (0 when dense).
    {Rec::sparse, "scratch.sparse_linear", Role::scratch, Need::encoder,
     [](S s, B, H) {
       return Dims{1, s.sparse_scratch};
     }},
    // Under a 16-bit precision, for the block-sparse layers (fp32 kernels that read the 16-bit
    // input): the fp32 output of one whose output the step keeps in 16 bits (q | k | v, GELU's
    // input), rounded from here, and GELU's fp32 input gradient for a sparse up-projection (0
    // when dense).
    {Rec::sparse_out, "scratch.sparse_output", Role::scratch, Need::encoder,
     [](S s, B c, H) {
       return Dims{
           1, s.sparse_layers ? s.tokens * std::max(3 * c.hidden_size, c.intermediate_size) : 0};
     },
     Dtype::wide_twin},
    {Rec::dh, "grad.layer_out", Role::scratch, Need::encoder, TC},
    {Rec::dx, "grad.layer_in", Role::scratch, Need::encoder, TC},
    {Rec::dres, "grad.residual", Role::scratch, Need::encoder, TC},
    {Rec::dh1, "grad.ln1_out", Role::scratch, Need::encoder, TC},
    {Rec::dtmp, "grad.linear_out", Role::scratch, Need::encoder, TC},
    {Rec::datt, "grad.attention_out", Role::scratch, Need::encoder, TC},
    {Rec::dqkv, "grad.qkv", Role::scratch, Need::encoder, T3C},
    // Under 16 bits GELU's backward writes the FFN up-projection's 16-bit operand straight into
    // scratch.grad16 (ffn_up_backward_16; a sparse up-projection takes it in fp32 from
    // scratch.sparse_output).
    {Rec::dinter, "grad.gelu_in", Role::scratch, Need::bert, TI, Dtype::fp32_only},
    {Rec::dgelu, "grad.gelu_out", Role::scratch, Need::encoder, TI},
    // ModernBERT's GeGLU input gradient [T, 2I], in the scalar under every precision.
    {Rec::dglu, "grad.geglu_in", Role::scratch, Need::modernbert, TU},
    {Rec::head_dloss, "grad.losses", Role::scratch, Need::encoder,
     [](S s, B, H) {
       return Dims{1, std::max(s.masked, s.sequences)};
     }},
    {Rec::head_losses, "scratch.losses", Role::scratch, Need::encoder,
     [](S s, B, H) {
       return Dims{1, std::max(s.masked, s.sequences)};
     }},
    // (BERT's pooler; ModernBERT's classifier: the task head's output and input gradients)
    {Rec::dpooled, "grad.pooler_out", Role::scratch, Need::pooled, NC},
    {Rec::dpre, "grad.pooler_pre", Role::scratch, Need::pooled, NC},
    {Rec::dcls, "grad.pooler_cls", Role::scratch, Need::pooler, NC},
    {Rec::mlm_d3, "grad.mlm_ln_out", Role::scratch, Need::pretraining, MC},
    {Rec::mlm_d2, "grad.mlm_ln_in", Role::scratch, Need::pretraining, MC},
    {Rec::mlm_d1, "grad.mlm_gelu_in", Role::scratch, Need::pretraining, MC},
    {Rec::mlm_din, "grad.mlm_in", Role::scratch, Need::pretraining, MC},
    // ModernBERT's task head transform: its norm's and GELU's input gradients
    {Rec::task_d2, "grad.task_head_ln_in", Role::scratch, Need::modern_task, TaskC},
    {Rec::task_d1, "grad.task_head_gelu_in", Role::scratch, Need::modern_task, TaskC},
    {Rec::mlm_dlogits, "grad.mlm_logits", Role::scratch, Need::pretraining, MV, Dtype::fp32_only},
    {Rec::nsp_dlogits, "grad.nsp_logits", Role::scratch, Need::pretraining,
     [](S s, B, H) {
       return Dims{s.sequences, 2};
     }},
    {Rec::cls_dlogits, "grad.classifier_logits", Role::scratch, Need::classifier, NL},
    {Rec::cls_ddrop, "grad.classifier_in", Role::scratch, Need::classifier, NC},
    {Rec::span_dlogits, "grad.span_logits", Role::scratch, Need::span, T2},
};

bool needed(Need n, const Heads& h, Family family) {
  switch (n) {
    case Need::pooler:
    case Need::bert:
      return family == Family::bert;
    case Need::modernbert:
      return family == Family::modernbert;
    case Need::modern_task:
      return family == Family::modernbert && (h.classifier || h.span);
    case Need::pooled:
      return family == Family::bert || h.classifier;
    case Need::pretraining:
      return h.pretraining;
    case Need::classifier:
      return h.classifier;
    case Need::span:
      return h.span;
    default:
      return true;
  }
}

// Whether the policy's flag moves a per-layer record of this role into one shared slot that
// backward rebuilds.
bool rebuilt(Role role, const Recompute& p) {
  return (role == Role::gelu && p.gelu) || (role == Role::ln && p.ln) ||
         (role == Role::residual && p.residual);
}

// Copies and storage of one record under a policy (copies 0: not held at all).
std::pair<int64_t, Storage> placement(const RecordSpec& r, const BertConfig& c,
                                      const Recompute& p) {
  const int64_t L = c.num_hidden_layers;
  const int64_t K = std::min<int64_t>(p.every, L);
  const Storage layer_storage = p.every ? Storage::scratch : Storage::activation;
  const int64_t layer_copies = p.every ? K : L;
  switch (r.role) {
    case Role::model:
      return {1, Storage::activation};
    case Role::hidden:
      if (rebuilds_layer_inputs(p, c.family))
        return {std::min<int64_t>(L + 1, 2), Storage::activation};
      return {p.every ? (L + p.every - 1) / p.every + 1 : L + 1, Storage::activation};
    case Role::rebuilt_input:
      return {rebuilds_layer_inputs(p, c.family) ? 2 : 0, Storage::scratch};
    case Role::layer:
      return {layer_copies, layer_storage};
    case Role::gelu:
    case Role::ln:
    case Role::residual:
      return rebuilt(r.role, p) ? std::pair{int64_t{1}, Storage::scratch}
                                : std::pair{layer_copies, layer_storage};
    case Role::probs:
      if (p.attention) return {0, Storage::scratch};
      // ModernBERT: the global layers' squares and the local layers' bands, a copy per layer of
      // the kind (every:K: K of each, a segment may hold either)
      if (c.family == Family::modernbert && !p.every) {
        int64_t global = 0;
        for (int l = 0; l < L; ++l) global += c.modern.global_layer(l);
        return {r.id == Rec::probs_local ? L - global : global, layer_storage};
      }
      return {layer_copies, layer_storage};
    case Role::segment:
      return {p.every ? K : 0, Storage::scratch};
    case Role::scratch:
      return {1, Storage::scratch};
  }
  return {0, Storage::scratch};
}

// Visits every record with its placement for this model, policy and step: visit(spec, copies,
// storage, one copy's dims), copies 0 for a record not held (a head the model lacks, the
// probabilities under `attention`). The arena's layout and `plan`'s records both walk this.
template <typename F>
void for_each_record(const BertConfig& c, const Heads& heads, const Recompute& policy,
                     const StepShape& shape, Precision precision, F visit) {
  const bool b16 = is_16bit(precision);
  for (const RecordSpec& r : kRecords) {
    auto [copies, storage] = placement(r, c, policy);
    const bool only_16 = r.dtype == Dtype::twin || r.dtype == Dtype::wide_twin;
    if (!needed(r.need, heads, c.family) || (only_16 && !b16) ||
        (r.dtype == Dtype::fp32_only && b16))
      copies = 0;
    const bool in16 = b16 && (r.dtype == Dtype::narrowed || r.dtype == Dtype::twin);
    visit(r, copies, storage, copies ? r.dims(shape, c, heads) : Dims{0, 0}, in16);
  }
}

// Rounds an element count up to whole 64-byte lines.
size_t aligned(size_t elements, size_t scalar) {
  const size_t per_line = 64 / scalar;
  return (elements + per_line - 1) / per_line * per_line;
}

}  // namespace

std::vector<RecordSize> workspace_records(const BertConfig& c, const Heads& heads,
                                          const Recompute& policy, const StepShape& shape,
                                          Precision precision) {
  std::vector<RecordSize> out;
  for_each_record(
      c, heads, policy, shape, precision,
      [&](const RecordSpec& r, int64_t copies, Storage storage, Dims d, bool in16) {
        if (copies > 0)
          out.push_back(
              {r.name, storage, copies, d.elements(),
               kernels::traits(in16 ? storage_dtype(precision) : kernels::DType::f32).bytes});
      });
  return out;
}

void Workspace::prepare(const BertConfig& c, const Heads& heads, const Recompute& policy,
                        const StepShape& shape, Precision precision, kernels::DType scalar,
                        kernels::Device& device) {
  const kernels::DType narrow = storage_dtype(precision);
  size_t total = 0;
  activation_bytes_ = scratch_bytes_ = 0;
  for_each_record(c, heads, policy, shape, precision,
                  [&](const RecordSpec& r, int64_t copies, Storage storage, Dims d, bool is16) {
                    const int i = static_cast<int>(r.id);
                    const int64_t n = d.elements();
                    dtype_[i] = is16 ? narrow : scalar;
                    const size_t bytes = kernels::traits(dtype_[i]).bytes;
                    copies_[i] = copies;
                    rows_[i] = d.rows;
                    cols_[i] = d.cols;
                    stride_[i] = aligned(static_cast<size_t>(n), bytes) * bytes;
                    offset_[i] = total;
                    total += stride_[i] * static_cast<size_t>(copies);
                    (storage == Storage::activation ? activation_bytes_ : scratch_bytes_) +=
                        static_cast<size_t>(n * copies) * bytes;
                  });
  if (total > capacity_) {
    arena_.reset();
    arena_.get_deleter().device = &device;
    io::AllocationScope scope("the step's activations and scratch (the workspace arena of " +
                              std::to_string(shape.tokens) + " tokens)");
    arena_.reset(device.allocate(total));
    capacity_ = total;
  }
}

kernels::View Workspace::get(Rec r, int64_t copy) const {
  const int i = static_cast<int>(r);
  kernels::View v;
  v.dtype = dtype_[i];
  v.rows = 1;
  if (copies_[i] == 0) return v;
  v.data = static_cast<std::byte*>(arena_.get()) + offset_[i] +
           stride_[i] * static_cast<size_t>(std::min(copy, copies_[i] - 1));
  v.rows = rows_[i];
  v.cols = v.ld = cols_[i];
  return v;
}

}  // namespace packbert::model
