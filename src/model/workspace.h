// The per-step workspace: every tensor a training step holds between forward and backward (an
// activation record) or only while it computes (scratch) is declared once, in the table of
// workspace.cpp, with its shape as a function of the step's shape and the config. The arena's
// size, its layout, the bytes the engine reports and `packbert plan`'s prediction all come from
// that table, and a recompute policy only decides where each record lives: kept per layer, in
// one shared slot rebuilt in backward, or in the scratch of a re-run segment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "model/batch.h"
#include "model/params.h"
#include "model/precision.h"

namespace packbert::model {

// What backward rebuilds instead of keeping (docs/DESIGN.md §7). The flags combine; `every`
// re-runs whole layers: the input of every K-th layer is kept, and backward re-runs each
// segment of K layers from it (K = 1 is the policy `layer`). Gradients do not depend on it.
struct Recompute {
  bool gelu = false;       // keep GELU's input, rebuild its output
  bool ln = false;         // rebuild LayerNorm outputs from their inputs + saved mean/rstd:
                           // LN1's, and LN2's where it is the next layer's input
  bool attention = false;  // rebuild the attention probabilities per (sequence, head) block
  bool residual = false;   // rebuild the attention block's residual sum (one C x C GEMM)
  int every = 0;           // 0 = keep every layer's records
  bool automatic = false;  // `auto`: the cheapest policy that fits, resolved by the planner
  std::string name() const;
  bool operator==(const Recompute&) const = default;
};

// Whether the inner layers' inputs (LN2's outputs of the layer below) are rebuilt rather than
// kept: under `ln` when whole layers are not re-run (every:K keeps its checkpoints as they are).
// The first layer's input (the embeddings' dropout output) and the encoder's output stay kept.
// A pre-LN family's layer input is the residual stream, which no LayerNorm rebuilds: kept.
inline bool rebuilds_layer_inputs(const Recompute& p, Family family = Family::bert) {
  return p.ln && p.every == 0 && family == Family::bert;
}

// "none", "gelu", "gelu,ln", "attention", "layer", "every:K", "auto", or a comma list of the
// flags gelu, ln, residual, attention with at most one of layer / every:K (e.g.
// "gelu,ln,attention", "layer,attention"). Throws InputError naming the text.
Recompute parse_recompute(const std::string& text);

// The sizes a step's records are functions of.
struct StepShape {
  int64_t tokens = 0;           // real tokens T
  int64_t sequences = 0;        // n_seq
  int64_t masked = 0;           // MLM positions M
  int64_t attention = 0;        // sum over sequences of L^2
  int64_t attention_local = 0;  // sum over sequences of L x band(L, local window) (ModernBERT)
  int64_t max_len = 0;          // longest sequence
  int threads = 1;              // OpenMP threads (attention scratch is per thread)
  // The backend's scratch needs (kernels/ops.h; set by model::size_kernel_scratch): attention's,
  // and the block-sparse linear layers' (0 when dense, or for a backend that needs none).
  int64_t attention_scratch = 0, sparse_scratch = 0;
  bool sparse_layers = false;  // the encoder's linear layers are block-sparse
};
// local_window: the local layers' attention window (ModernBERT; 0: none).
StepShape shape_of(const TokenLayout& tl, int threads, int local_window = 0);
// Sets what backend `be`'s kernels need as scratch for a step of `shape` (its tokens, longest
// sequence and threads) over `layout`: attention's, and the block-sparse linear layers'.
void size_kernel_scratch(StepShape& shape, const ParamLayout& layout, const kernels::Backend& be);

// Where a record lives.
enum class Storage { activation, scratch };

// One declared tensor at its size for a shape, policy and precision: copies x elements each, of
// `scalar` bytes (4 for fp32, 2 under a 16-bit precision).
struct RecordSize {
  const char* name;
  Storage storage;
  int64_t copies, elements;
  size_t scalar;
  size_t bytes() const { return static_cast<size_t>(copies * elements) * scalar; }
};

// Every record of the model under a policy and precision, in arena order, for the fp32 engine.
std::vector<RecordSize> workspace_records(const BertConfig& c, const Heads& heads,
                                          const Recompute& policy, const StepShape& shape,
                                          Precision precision = Precision::fp32);

// Records by id, for the engine (the names in workspace.cpp's table).
enum class Rec : uint8_t {
  // embeddings and layer inputs
  emb_sum,
  emb_mean,
  emb_rstd,
  hidden,
  hidden_rebuilt,
  top,
  // per layer
  qkv,
  probs,
  probs_local,  // a local layer's attention probabilities, [L, band] per head (ModernBERT)
  att,
  r1,
  ln1_mean,
  ln1_rstd,
  h1,
  inter,
  gelu,
  r2,
  ln2_mean,
  ln2_rstd,
  attn_in,  // a pre-LN layer's attention norm output (ModernBERT)
  // a pre-LN encoder's final norm (ModernBERT): its statistics and output, in the scalar and, under
  // a 16-bit precision, in 16 bits (the heads' GEMM operand)
  final_mean,
  final_rstd,
  final_out,
  final16,
  // ModernBERT's task heads: the pooled sequences [n_seq, C] (classifier), and the prediction
  // head's transform (dense, GELU, norm) on them or on every token (QA): [T, C] records
  task_in,
  task_t1,
  task_t2,
  task_mean,
  task_rstd,
  task_t3,
  // heads
  cls_in,
  pooled,
  mlm_in,
  mlm_t1,
  mlm_t2,
  mlm_mean,
  mlm_rstd,
  mlm_logits,
  mlm_lse,
  mlm_t3,
  nsp_logits,
  nsp_lse,
  cls_drop,
  cls_logits,
  cls_lse,
  span_logits,
  span_probs,
  // scratch: forward temporaries and gradients
  tmp,
  attn_work,
  dh,
  dx,
  dres,
  dh1,
  dtmp,
  datt,
  dqkv,
  dinter,
  dgelu,
  dglu,
  head_dloss,
  head_losses,
  seg_hidden,
  dout16,
  sparse,
  sparse_out,
  dpooled,
  dpre,
  dcls,
  mlm_d3,
  mlm_d2,
  mlm_d1,
  mlm_din,
  task_d2,
  task_d1,
  mlm_dlogits,
  nsp_dlogits,
  cls_dlogits,
  cls_ddrop,
  span_dlogits,
  count
};

// One layer's records (a record a policy does not keep points to the shared slot the backward
// rebuilds it into; probs is empty when the attention probabilities are recomputed), each a
// vector View in the DType the workspace holds it in: the step's scalar, or under a 16-bit
// precision every record but the LayerNorm statistics in that 16-bit type.
// A ModernBERT layer: attn_in = attention norm(in) (layer 0: in itself, no record), qkv after
// rotary, r1 = in + attention's projection, h1 = MLP norm(r1) with ln2's statistics, inter the
// Wi projection [T, 2I], gelu the GeGLU's output [T, I]; r2 not held (the output is the next
// layer's input).
struct LayerRecord {
  kernels::View qkv, probs, att, r1, ln1_mean, ln1_rstd, h1, inter, gelu, r2, ln2_mean, ln2_rstd;
  kernels::View attn_in;
};

// The arena: one 64-byte-aligned allocation from the backend's Device, grown to the largest step
// seen and never shrunk, so a steady-state step allocates nothing. Each record holds the step's
// scalar DType (f32, or f64 in the finite-difference tests) or the 16-bit type of a 16-bit
// precision, as the table says.
class Workspace {
 public:
  // Lays the records out for this step, holding `scalar` elements (f32 or f64) and, under a
  // 16-bit precision, its 16-bit type; reallocates (on `device`) only when the step needs more
  // than the arena holds.
  void prepare(const BertConfig& c, const Heads& heads, const Recompute& policy,
               const StepShape& shape, Precision precision = Precision::fp32,
               kernels::DType scalar = kernels::DType::f32,
               kernels::Device& device = kernels::host_device());
  // Record id, copy (a layer index, a segment slot, or 0), as one copy's matrix in the DType it is
  // held in, shaped as the table declares it ([T, C], [T, 3C], [1, T], ...; a vector for the
  // probabilities and scratch sized for several uses); empty when the record is not held.
  kernels::View get(Rec r, int64_t copy = 0) const;
  int64_t copies(Rec r) const { return copies_[static_cast<int>(r)]; }
  LayerRecord layer(int64_t copy) const {
    return {get(Rec::qkv, copy),    get(Rec::probs, copy),    get(Rec::att, copy),
            get(Rec::r1, copy),     get(Rec::ln1_mean, copy), get(Rec::ln1_rstd, copy),
            get(Rec::h1, copy),     get(Rec::inter, copy),    get(Rec::gelu, copy),
            get(Rec::r2, copy),     get(Rec::ln2_mean, copy), get(Rec::ln2_rstd, copy),
            get(Rec::attn_in, copy)};
  }
  size_t activation_bytes() const { return activation_bytes_; }
  size_t scratch_bytes() const { return scratch_bytes_; }
  size_t capacity_bytes() const { return capacity_; }

 private:
  struct Release {
    kernels::Device* device;
    void operator()(void* p) const { device->release(p); }
  };
  std::unique_ptr<void, Release> arena_{nullptr, Release{&kernels::host_device()}};
  size_t capacity_ = 0;                               // bytes
  size_t offset_[static_cast<int>(Rec::count)] = {};  // bytes
  size_t stride_[static_cast<int>(Rec::count)] = {};  // bytes between copies
  int64_t copies_[static_cast<int>(Rec::count)] = {};
  int64_t rows_[static_cast<int>(Rec::count)] = {};  // one copy's shape
  int64_t cols_[static_cast<int>(Rec::count)] = {};
  kernels::DType dtype_[static_cast<int>(Rec::count)] = {};
  size_t activation_bytes_ = 0, scratch_bytes_ = 0;
};

}  // namespace packbert::model
