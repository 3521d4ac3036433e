// Model weights <-> safetensors under Hugging Face names (BertForPreTraining layout), so
// checkpoints move both ways between packbert and `transformers`.
#pragma once

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/params.h"

namespace packbert::model {

// Fills `params` (laid out by `layout`) from the file. Every tensor of the layout must be
// present with the layout's shape; the tied decoder (cls.predictions.decoder.*) is accepted
// and ignored. Throws InputError naming the tensor otherwise.
void load_weights(const ParamLayout& layout, float* params, const io::SafetensorsFile& file);

// The tensors to write for these parameters (F32, HF names, in layout order). `prefix` is
// prepended to every name (e.g. "grad.").
std::vector<io::TensorToWrite> weight_tensors(const ParamLayout& layout, const float* params,
                                              const std::string& prefix = "");

}  // namespace packbert::model
