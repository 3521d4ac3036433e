// BertModel's weight copies (model/bert.h): the 16-bit copy a 16-bit step multiplies with, kept
// current by version, and 16-bit master weights (the copy is the weights; an fp32 arena keeps
// only what the fp32 kernels read: fp32_kept_arena).
#include <algorithm>
#include <map>
#include <stdexcept>

#include "model/bert.h"

namespace packbert::model {

using kernels::Buffer;
using kernels::DType;
using kernels::View;

void BertModel::hold_copy16(DType t) {
  if (!copy16_.empty() && copy16_.dtype() == t) return;
  copy16_ = Buffer(backend_->device(), t, static_cast<int64_t>(layout_.total()));
  p16_ = ParamView(layout_, copy16_.view());
  copy16_version_ = ~uint64_t{0};
}

View BertModel::masters() {
  if (masters16_) return copy16_.view();
  ++params_version_;
  return params_.view();
}

View BertModel::copy16_for_optimizer(Precision p) {
  if (masters16_ || !optimizer_writes_copy(p)) return View();
  hold_copy16(storage_dtype(p));
  return copy16_.view();
}

void BertModel::keep_masters16(Masters masters) {
  if (dtype() != DType::f32) throw std::logic_error("16-bit master weights need an f32 model");
  if (masters16_) return;
  if (!patterns_.empty())  // the block-sparse kernels read their values in fp32
    throw std::logic_error("block-sparse layers need fp32 master weights");
  hold_copy16(masters_dtype(masters));
  backend_->convert(copy16_.view(), params_.view());
  const KeptArena arena = fp32_kept_arena(layout_);
  kept_fp32_ = arena.places;
  Buffer kept(backend_->device(), DType::f32, static_cast<int64_t>(arena.total));
  std::map<size_t, size_t> at;  // whole offset -> kept offset
  for (const KeptPlace& k : kept_fp32_) {
    std::copy_n(params_.span<float>().data() + k.whole, k.numel,
                kept.span<float>().data() + k.kept);
    at[k.whole] = k.kept;
  }
  params_ = std::move(kept);
  const View base = params_.view();
  p_ = ParamView(layout_, [&](const TensorSpec& t) {
    auto it = at.find(t.offset);
    return it == at.end()
               ? View()
               : base.slice(static_cast<int64_t>(it->second), static_cast<int64_t>(t.numel));
  });
  masters16_ = true;
  weights16_written();
}

void BertModel::masters_written() {
  if (!masters16_) return;
  const View whole = copy16_.view(), kept = params_.view();
  for (const KeptPlace& k : kept_fp32_) {
    const int64_t n = static_cast<int64_t>(k.numel);
    backend_->convert(kept.slice(static_cast<int64_t>(k.kept), n),
                      whole.slice(static_cast<int64_t>(k.whole), n));
  }
  weights16_written();
}

const float* BertModel::weights_fp32(std::vector<float>& scratch) const {
  if (masters16_) {
    scratch.resize(layout_.total());
    backend_->convert(View(scratch.data(), 1, static_cast<int64_t>(scratch.size())),
                      copy16_.view());
    return scratch.data();
  }
  return params_.span<const float>().data();
}

void BertModel::refresh_copy16(Precision precision) {
  if (masters16_ && storage_dtype(precision) != copy16_.dtype())
    throw std::logic_error("a model with 16-bit master weights runs steps of their type only");
  if (!is_16bit(precision)) return;
  if (dtype() != DType::f32) throw std::logic_error("16-bit precisions need an f32 model");
  hold_copy16(storage_dtype(precision));
  if (!masters16_ && copy16_version_ != params_version_) {  // changed since their copy
    backend_->convert(copy16_.view(), params_.view());
    copy16_version_ = params_version_;
  }
}

}  // namespace packbert::model
