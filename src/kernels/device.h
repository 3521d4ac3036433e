// Where a backend's tensors live (ggml-backend's buffer type): a Device hands out and takes back
// memory, and a Buffer is n elements of one DType on one Device. The model's parameters,
// gradients and 16-bit weight copy, the optimizer's moments and the step's workspace arena all
// come from the Device of the backend they run on; cpu and ref share the host's (64-byte
// aligned, zero-filled). A GPU backend adds its own Device beside its kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>

#include "kernels/tensor.h"

namespace packbert::kernels {

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;
  // `bytes` of zero-filled memory aligned to 64 bytes; std::bad_alloc when there is not enough.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
};

// The host's memory: what the cpu and ref backends compute in. It allocates through operator new
// (the binary's records a failure's size for the one-line out-of-memory error).
Device& host_device();

// n elements of one DType on one Device, zero at the start; moves, never copies.
class Buffer {
 public:
  Buffer() = default;
  // Throws std::bad_alloc when the device has not got the bytes.
  Buffer(Device& device, DType dtype, int64_t n);
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  DType dtype() const { return dtype_; }
  int64_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  size_t bytes() const { return static_cast<size_t>(n_) * traits(dtype_).bytes; }
  // The whole buffer as a vector View (empty for an empty buffer).
  View view() const;
  // The elements as T, which must be the buffer's DType (std::logic_error otherwise).
  template <typename T>
  std::span<T> span() const {
    if (n_ && dtype_of<std::remove_const_t<T>> != dtype_)
      throw std::logic_error(std::string("a ") + dtype_name(dtype_) + " buffer read as " +
                             dtype_name(dtype_of<std::remove_const_t<T>>));
    return {static_cast<T*>(data_), static_cast<size_t>(n_)};
  }
  void reset();

 private:
  Device* device_ = nullptr;
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  int64_t n_ = 0;
};

}  // namespace packbert::kernels
