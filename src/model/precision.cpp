#include "model/precision.h"

#include "error.h"

namespace packbert::model {

using kernels::DType;

std::string precision_name(Precision p) {
  switch (p) {
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
    case Precision::fp32:
      break;
  }
  return "fp32";
}

Precision parse_precision(const std::string& text) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    if (text == precision_name(p)) return p;
  throw InputError("`precision` " + text + ": expected fp32, bf16 or fp16");
}

DType storage_dtype(Precision p) {
  switch (p) {
    case Precision::bf16:
      return DType::bf16;
    case Precision::fp16:
      return DType::f16;
    case Precision::fp32:
      break;
  }
  return DType::f32;
}

const char* masters_name(Masters masters) {
  switch (masters) {
    case Masters::fp32:
      return "fp32";
    case Masters::bf16:
      return "bf16";
    case Masters::bf16_rn:
      return "bf16-rn";
  }
  return "?";
}

Masters parse_masters(const std::string& name, const std::string& flag) {
  for (Masters m : {Masters::fp32, Masters::bf16, Masters::bf16_rn})
    if (name == masters_name(m)) return m;
  throw InputError(flag + ": expected fp32|bf16|bf16-rn, got '" + name + "'");
}

DType masters_dtype(Masters masters) {
  return is_16bit(masters) ? DType::bf16 : DType::f32;
}

Precision precision_of(Masters masters) {
  return is_16bit(masters) ? Precision::bf16 : Precision::fp32;
}

bool optimizer_writes_copy(Precision p) {
  return storage_dtype(p) == masters_dtype(Masters::bf16);
}

}  // namespace packbert::model
