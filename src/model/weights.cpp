#include "model/weights.h"

#include <algorithm>

#include "error.h"

namespace packbert::model {

void load_weights(const ParamLayout& layout, float* params, const io::SafetensorsFile& file) {
  for (const TensorSpec& t : layout.tensors()) {
    const std::vector<int64_t> shape = t.stored_shape();
    std::vector<float> v = file.floats(t.name, &shape);
    std::copy(v.begin(), v.end(), params + t.offset);
  }
}

std::string pattern_name(const std::string& tensor, const char* part) {
  return "sparse." + std::string(part) + "." + tensor;
}

void load_model_weights(BertModel& m, const io::SafetensorsFile& file,
                        std::vector<std::string>* fresh, bool new_heads) {
  float* params = m.params().data();
  std::vector<SparseTensor> sparse = m.sparse_tensors();
  // The pooler feeds only the classifier and the NSP head: a model with neither (transformers'
  // BertForQuestionAnswering, a BertModel saved without it) loads without one, zeros standing in
  // for weights nothing reads.
  const Heads& heads = m.layout().heads();
  const bool pooler_unread = !heads.classifier && !heads.pretraining;
  for (const TensorSpec& t : m.layout().tensors()) {
    const bool head = t.name.starts_with("classifier.") || t.name.starts_with("qa_outputs.");
    if (fresh && (!file.has(t.name) || (new_heads && head)) && !is_encoder_tensor(t.name)) {
      fresh->push_back(t.name);
      continue;
    }
    if (pooler_unread && t.name.starts_with("bert.pooler.") && !file.has(t.name)) {
      std::fill_n(params + t.offset, t.numel, 0.0f);
      continue;
    }
    if (!t.block) {
      std::vector<float> v = file.floats(t.name, &t.shape);
      std::copy(v.begin(), v.end(), params + t.offset);
      continue;
    }
    const SparseTensor& st = *std::find_if(sparse.begin(), sparse.end(),
                                           [&](const SparseTensor& s) { return s.spec == &t; });
    const std::vector<int64_t> stored = t.stored_shape();
    if (file.has(t.name) && file.entry(t.name).shape == t.shape) {
      const std::vector<float> dense = file.floats(t.name, &t.shape);
      prune_to_l1(st, dense.data(), params + t.offset);
      continue;
    }
    if (!file.has(pattern_name(t.name, "rows")))
      throw InputError(file.source() + ": " + t.name + " is neither dense " +
                       "(its full shape, to prune) nor block-sparse with this run's `block` and " +
                       "`sparsity` (kept blocks and a pattern)");
    const std::vector<float> v = file.floats(t.name, &stored);
    std::copy(v.begin(), v.end(), params + t.offset);
    set_tensor_slots(st, file.ints(pattern_name(t.name, "rows")),
                     file.ints(pattern_name(t.name, "cols")), file.source());
  }
  try {
    index_patterns(m.patterns());
  } catch (const std::invalid_argument& e) {
    throw InputError(file.source() + ": " + e.what());
  }
}

std::vector<io::TensorToWrite> weight_tensors(const ParamLayout& layout, const float* params,
                                              const std::string& prefix) {
  std::vector<io::TensorToWrite> out;
  for (const TensorSpec& t : layout.tensors())
    out.push_back(
        {prefix + t.name, "F32", t.stored_shape(), params + t.offset, t.numel * sizeof(float)});
  return out;
}

OwnedTensors dense_weight_tensors(const BertModel& m, const float* params) {
  OwnedTensors o;
  o.tensors = weight_tensors(m.layout(), params);
  const std::vector<SparseTensor> sparse = sparse_tensors(m.layout(), m.patterns());
  o.floats.reserve(sparse.size());
  for (const SparseTensor& st : sparse) {
    o.floats.push_back(dense_weight(st, params + st.spec->offset));
    for (io::TensorToWrite& w : o.tensors)
      if (w.name == st.spec->name)
        w = {w.name, "F32", st.spec->shape, o.floats.back().data(),
             o.floats.back().size() * sizeof(float)};
  }
  return o;
}

OwnedTensors pattern_tensors(const BertModel& m) {
  OwnedTensors o;
  const std::vector<SparseTensor> sparse = sparse_tensors(m.layout(), m.patterns());
  o.ints.reserve(2 * sparse.size());
  for (const SparseTensor& st : sparse) {
    std::vector<int32_t> rows, cols;
    tensor_slots(st, rows, cols);
    for (auto [part, v] : {std::pair{"rows", &rows}, std::pair{"cols", &cols}}) {
      o.ints.push_back(std::move(*v));
      o.tensors.push_back({pattern_name(st.spec->name, part),
                           "I32",
                           {static_cast<int64_t>(o.ints.back().size())},
                           o.ints.back().data(),
                           o.ints.back().size() * sizeof(int32_t)});
    }
  }
  return o;
}

}  // namespace packbert::model
