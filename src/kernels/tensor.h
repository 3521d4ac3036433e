// The engine's element types and the view every op takes.
// - DType: f32 (training), f64 (the finite-difference tests), and the two 16-bit storage formats,
//   bf16 and f16, with one traits row per type (ggml's type_traits): its size, its name, and how
//   a row of it widens to fp32 and narrows from it.
// - View: a strided matrix of one DType (data, rows, cols, leading dimension), batched where
//   attention needs one matrix per (sequence, head).
// The 16-bit formats are converted with round-to-nearest-even; arithmetic always happens in
// fp32 (or double):
// - bfloat16: the top 16 bits of an IEEE fp32 (8 exponent bits, 7 mantissa bits), the storage
//   type of the `bf16` precision (what the AVX512-BF16 VCVTNEPS2BF16 instruction and oneDNN do).
// - IEEE binary16 (5 exponent bits, 10 mantissa bits, largest finite 65504, subnormals below
//   2^-14), the storage type of the `fp16` precision: 8x finer than bf16, but a range narrow
//   enough that gradients need loss scaling.
#pragma once

#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace packbert::kernels {

struct bf16 {
  uint16_t bits = 0;
};

inline float to_float(bf16 x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16);
}

// Round to nearest, ties to even; NaN stays NaN (quiet), infinities and overflow to infinity
// as in IEEE rounding.
inline bf16 to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(rounded >> 16)};
}

// Stochastic rounding (Gupta et al. 2015): x rounds to one of its two bf16 neighbours, up with
// probability equal to its distance from the lower one in units of the gap, so the rounding is
// unbiased on average. `random` supplies 16 uniform bits: added below the 16 bits bf16 keeps,
// the sum is truncated. Infinities and NaN round to nearest; a finite x within a gap of the
// largest bf16 may round up to infinity, as it would by any rounding of a larger value.
inline bf16 to_bf16_stochastic(float x, uint16_t random) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return to_bf16(x);
  return bf16{static_cast<uint16_t>((u + random) >> 16)};
}

// True when x is neither infinite nor NaN, in integer operations on the exponent bits (which
// vectorise, unlike std::isfinite).
inline bool is_finite(bf16 x) {
  return (x.bits & 0x7f80u) != 0x7f80u;
}
inline bool is_finite(float x) {
  return (std::bit_cast<uint32_t>(x) & 0x7f800000u) != 0x7f800000u;
}

struct f16 {
  uint16_t bits = 0;
};

// Exact (every binary16 value is an fp32 value), subnormals included, in integer operations and
// one float subtraction (which vectorise). Needs fp32 subnormals (no flush-to-zero), as the
// engine never sets it.
inline float to_float(f16 x) {
  const uint32_t magnitude = static_cast<uint32_t>(x.bits & 0x7fffu) << 13;
  const uint32_t exponent = magnitude & (0x7c00u << 13);
  uint32_t u = magnitude + ((127u - 15u) << 23);
  if (exponent == (0x7c00u << 13)) {
    u += (128u - 16u) << 23;   // infinity, NaN
  } else if (exponent == 0) {  // zero, subnormal: renormalise by one float subtraction
    u += 1u << 23;
    u = std::bit_cast<uint32_t>(std::bit_cast<float>(u) - std::bit_cast<float>(113u << 23));
  }
  return std::bit_cast<float>(u | (static_cast<uint32_t>(x.bits & 0x8000u) << 16));
}

// Round to nearest, ties to even (as F16C's VCVTPS2PH and a GPU do); beyond 65504 (from 65520
// on) to infinity; below 2^-24 to zero, through binary16's subnormals; NaN stays NaN (quiet).
// Needs the FPU's default rounding (nearest even), which the engine never changes.
inline f16 to_f16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint32_t h;
  if (u >= (127u + 16u) << 23) {  // |x| >= 65536, infinity or NaN
    h = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < (113u << 23)) {  // |x| < 2^-14: binary16 subnormal or zero
    // Adding 2^-1 aligns the 10 subnormal mantissa bits at the bottom of the float; the FPU's
    // rounding of the sum is the rounding wanted.
    const float magic = std::bit_cast<float>(((127u - 15u) + (23u - 10u) + 1u) << 23);
    h = std::bit_cast<uint32_t>(std::bit_cast<float>(u) + magic) - std::bit_cast<uint32_t>(magic);
  } else {  // normal: rebias, round on the 13 dropped bits (a carry may reach infinity)
    const uint32_t odd = (u >> 13) & 1u;
    h = (u + ((15u - 127u) << 23) + 0xfffu + odd) >> 13;
  }
  return f16{static_cast<uint16_t>(h | sign)};
}

inline bool is_finite(f16 x) {
  return (x.bits & 0x7c00u) != 0x7c00u;
}

// The 16-bit storage formats, for the kernels and model code templated on one (H).
template <typename H>
inline constexpr bool is_half_v = std::is_same_v<H, bf16> || std::is_same_v<H, f16>;

// x rounded to nearest even into H (H = bf16 or f16); to_half<float> is x itself.
template <typename H>
inline H to_half(float x) {
  if constexpr (std::is_same_v<H, bf16>)
    return to_bf16(x);
  else if constexpr (std::is_same_v<H, f16>)
    return to_f16(x);
  else
    return static_cast<H>(x);
}

// x as element type O: itself when O is its type, else widened (a 16-bit x to fp32 or double)
// or rounded to nearest even (a float to a 16-bit O).
template <typename O, typename T>
inline O convert_to(T x) {
  if constexpr (std::is_same_v<O, T>)
    return x;
  else if constexpr (is_half_v<T>)
    return static_cast<O>(to_float(x));
  else
    return to_half<O>(static_cast<float>(x));
}

// out[i] = to_bf16(in[i]) / to_f16(in[i]), [n]; in parallel over chunks for large n.
void to_bf16(bf16* out, const float* in, int64_t n);
void to_f16(f16* out, const float* in, int64_t n);
template <typename H>
inline void to_half(H* out, const float* in, int64_t n) {
  if constexpr (std::is_same_v<H, bf16>)
    to_bf16(out, in, n);
  else
    to_f16(out, in, n);
}
// out[i] = to_float(in[i]), [n].
void to_float(float* out, const bf16* in, int64_t n);
void to_float(float* out, const f16* in, int64_t n);

// ---- DType and its traits -------------------------------------------------------------------

enum class DType : uint8_t { f32, f64, bf16, f16 };
inline constexpr DType kDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

// One row per DType. widen/narrow convert n consecutive elements to and from fp32 (narrowing
// rounds to nearest even; f64 narrows to the fp32 value widened, so a round trip through f64 is
// exact); both run in parallel over chunks for large n.
struct DTypeTraits {
  const char* name;         // "f32", "f64", "bf16", "f16"
  const char* safetensors;  // the type's name in a safetensors header: "F32", ...
  const char* torch;  // its torch dtype, as config.json's torch_dtype names it: "float32", ...
  size_t bytes;
  bool is_16bit;
  void (*widen)(float* out, const void* in, int64_t n);
  void (*narrow)(void* out, const float* in, int64_t n);
};
const DTypeTraits& traits(DType t);
inline const char* dtype_name(DType t) {
  return traits(t).name;
}

// The DType of a C++ element type.
template <typename T>
inline constexpr DType dtype_of = [] {
  if constexpr (std::is_same_v<T, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::f64;
  else if constexpr (std::is_same_v<T, bf16>)
    return DType::bf16;
  else {
    static_assert(std::is_same_v<T, f16>, "not an engine element type");
    return DType::f16;
  }
}();

// x rounded to `t` and back, in double: what storing x in a tensor of DType t keeps (f64 keeps
// x, f32 rounds to nearest float, the 16-bit types round through fp32, as the engine narrows).
inline double round_to(DType t, double x) {
  switch (t) {
    case DType::f64:
      return x;
    case DType::f32:
      return static_cast<float>(x);
    case DType::bf16:
      return to_float(to_bf16(static_cast<float>(x)));
    case DType::f16:
      return to_float(to_f16(static_cast<float>(x)));
  }
  return x;
}

// ---- View -----------------------------------------------------------------------------------

// A matrix of `rows` x `cols` elements of one DType, row r starting ld elements after row r - 1,
// and `batch` such matrices `batch_stride` elements apart. A vector is one row. An empty View
// (data null) stands for "no such tensor" (a linear layer without bias).
struct View {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0, ld = 0;
  int64_t batch = 1, batch_stride = 0;

  View() = default;
  template <typename T>
  View(T* p, int64_t rows_, int64_t cols_, int64_t ld_ = 0)
      : data(const_cast<std::remove_const_t<T>*>(p)),
        dtype(dtype_of<std::remove_const_t<T>>),
        rows(rows_),
        cols(cols_),
        ld(ld_ ? ld_ : cols_) {}
  // n elements as one row.
  template <typename T>
  static View vector(T* p, int64_t n) {
    return View(p, 1, n);
  }

  explicit operator bool() const { return data != nullptr; }
  // The first rows_ x cols_ elements of a contiguous View, as that matrix (a workspace record or
  // a parameter as the op at hand reads it). An empty View stays empty.
  View shaped(int64_t rows_, int64_t cols_) const {
    assert(!data || (contiguous() && rows_ * cols_ <= numel()));
    View v = *this;
    v.rows = rows_, v.cols = cols_, v.ld = cols_, v.batch = 1, v.batch_stride = 0;
    return v;
  }
  // Elements [first, first + n) of a contiguous View, as a vector.
  View slice(int64_t first, int64_t n) const {
    assert(!data || (contiguous() && first + n <= numel()));
    View v = shaped(1, 0);
    if (data) v.data = static_cast<std::byte*>(data) + first * static_cast<int64_t>(traits(dtype).bytes);
    v.cols = v.ld = n;
    return v;
  }
  bool is_16bit() const { return traits(dtype).is_16bit; }
  int64_t numel() const { return batch * rows * cols; }
  bool contiguous() const { return ld == cols && (batch == 1 || batch_stride == rows * cols); }
  // The typed pointer; the caller names the type it expects, checked in debug builds.
  template <typename T>
  T* as() const {
    assert(!data || dtype == dtype_of<std::remove_const_t<T>>);
    return static_cast<T*>(data);
  }
  // Element (r, c) of matrix b widened to double, and set, which rounds to the View's dtype; at
  // and put index a contiguous View's elements in order. For code that reads for clarity, not
  // speed (the reference backend, tests).
  double get(int64_t r, int64_t c, int64_t b = 0) const {
    return load(b * batch_stride + r * ld + c);
  }
  void set(int64_t r, int64_t c, double x, int64_t b = 0) const {
    store(b * batch_stride + r * ld + c, x);
  }
  double at(int64_t i) const { return load(i); }
  void put(int64_t i, double x) const { store(i, x); }

 private:
  double load(int64_t i) const {
    switch (dtype) {
      case DType::f32:
        return static_cast<const float*>(data)[i];
      case DType::f64:
        return static_cast<const double*>(data)[i];
      case DType::bf16:
        return to_float(static_cast<const struct bf16*>(data)[i]);
      case DType::f16:
        return to_float(static_cast<const struct f16*>(data)[i]);
    }
    return 0;
  }
  void store(int64_t i, double x) const {
    switch (dtype) {
      case DType::f32:
        static_cast<float*>(data)[i] = static_cast<float>(x);
        return;
      case DType::f64:
        static_cast<double*>(data)[i] = x;
        return;
      case DType::bf16:
        static_cast<struct bf16*>(data)[i] = to_bf16(static_cast<float>(x));
        return;
      case DType::f16:
        static_cast<struct f16*>(data)[i] = to_f16(static_cast<float>(x));
        return;
    }
  }
};

}  // namespace packbert::kernels
