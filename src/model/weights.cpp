#include "model/weights.h"

#include <algorithm>

namespace packbert::model {

void load_weights(const ParamLayout& layout, float* params, const io::SafetensorsFile& file) {
  for (const TensorSpec& t : layout.tensors()) {
    std::vector<float> v = file.floats(t.name, &t.shape);
    std::copy(v.begin(), v.end(), params + t.offset);
  }
}

std::vector<io::TensorToWrite> weight_tensors(const ParamLayout& layout, const float* params,
                                              const std::string& prefix) {
  std::vector<io::TensorToWrite> out;
  for (const TensorSpec& t : layout.tensors())
    out.push_back({prefix + t.name, "F32", t.shape, params + t.offset, t.numel * sizeof(float)});
  return out;
}

}  // namespace packbert::model
