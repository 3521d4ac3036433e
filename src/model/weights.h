// Model weights <-> safetensors under Hugging Face names (BertForPreTraining layout), so
// checkpoints move both ways between packbert and `transformers`.
#pragma once

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/bert.h"
#include "model/params.h"

namespace packbert::model {

// Fills `params` (laid out by `layout`) from the file. Every tensor of the layout must be
// present with the shape the arena holds (TensorSpec::stored_shape); the tied decoder
// (cls.predictions.decoder.*) is accepted and ignored. Throws InputError naming the tensor
// otherwise.
void load_weights(const ParamLayout& layout, float* params, const io::SafetensorsFile& file);

// The model's weights from the file, for a dense or block-sparse model. Dense tensors as
// load_weights. A sparse weight comes from its kept blocks and pattern (a packbert checkpoint of
// the same sparsity: the values under the weight's name, the pattern under pattern_name), or
// from a dense tensor of the weight's full shape, pruned to its blocks of largest L1 norm
// (`--init` from a dense model). With `fresh`, a tensor outside the embeddings and encoder that
// the file lacks (a task head, the pooler, the pre-training heads of a BertForMaskedLM) keeps the
// value the model holds (the caller initialised it) and its name is appended to `fresh`, as
// transformers does for newly initialised weights; without, it is an error. `new_heads`: the task
// heads (classifier, qa_outputs) are taken as absent even when the file has them.
void load_model_weights(BertModel& m, const io::SafetensorsFile& file,
                        std::vector<std::string>* fresh = nullptr, bool new_heads = false);

// The checkpoint names of a sparse weight's pattern: its blocks' rows and columns (I32, [kept]).
std::string pattern_name(const std::string& tensor, const char* part);

// The tensors to write for these parameters (F32, HF names, in layout order, as the arena holds
// them). `prefix` is prepended to every name (e.g. "grad.").
std::vector<io::TensorToWrite> weight_tensors(const ParamLayout& layout, const float* params,
                                              const std::string& prefix = "");

// Tensors whose data a caller keeps alive while writing them.
struct OwnedTensors {
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<int32_t>> ints;
  std::vector<io::TensorToWrite> tensors;
};
// The weights in Hugging Face's dense layout: weight_tensors, with every sparse weight expanded
// to its full shape (zeros outside the pattern): what an export writes.
OwnedTensors dense_weight_tensors(const BertModel& m, const float* params);
// Each sparse weight's pattern (pattern_name's rows and cols): what a checkpoint adds.
OwnedTensors pattern_tensors(const BertModel& m);

}  // namespace packbert::model
