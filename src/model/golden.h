// Golden checks: hold packbert against a PyTorch model through the golden file format of
// docs/FORMATS.md (tools/make_model_golden.py writes them; anyone can write their own).
#pragma once

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/workspace.h"

namespace packbert::model {

struct GoldenRow {
  std::string quantity;  // "mlm_loss", "nsp_loss", "cls_loss", "span_loss", or "grad.<name>"
  double error = 0;      // relative error (see check_golden)
  double tolerance = 0;
  bool ok() const { return error <= tolerance; }
};

struct GoldenReport {
  std::vector<GoldenRow> rows;
  bool ok() const;
  const GoldenRow& worst_grad() const;
};

// Loads the golden file, runs packbert's forward and backward on its batch (dropout off, under
// the recompute policy and precision given) and compares. Loss error: |ours - expected| /
// |expected|. Gradient error per tensor under fp32, max-norm: max_i |ours_i - expected_i| /
// max(max_i |expected_i|, 1e-3 * largest expected gradient of the model) (element-wise relative
// error is meaningless for entries near zero, and so is a tensor-relative one for a tensor whose
// true gradient is zero); under a 16-bit precision, L2-normwise: ||ours - expected|| /
// max(||expected||, the same floor), since 16-bit rounding (relative 2^-9 per operand with 8
// significant bits, 2^-12 with 11) perturbs every entry a little. Backward starts from the
// losses times loss_scale (fp16's gradients underflow without one) and the gradients are
// divided by it. The model runs on `backend`. Throws InputError for a malformed or inconsistent
// golden file. A golden file's parts: its model config (dropout off) and its batch ([B, S] ids,
// types, positions, sequence ids and MLM labels, [B, K] NSP labels). InputError when malformed.
BertConfig golden_config(const io::SafetensorsFile& f, const std::string& path);
PackedBatch golden_batch(const io::SafetensorsFile& f, const std::string& path);
// The heads a golden checks: the classifier when it holds class_labels, the span head when it
// holds span_starts / span_ends, else pre-training (MLM, and NSP where the model has it).
Heads golden_heads(const io::SafetensorsFile& f);

GoldenReport check_golden(const std::string& path, double rtol_loss, double rtol_grad,
                          const Recompute& recompute = {}, Precision precision = Precision::fp32,
                          double loss_scale = 1,
                          kernels::BackendKind backend = kernels::BackendKind::cpu);

}  // namespace packbert::model
