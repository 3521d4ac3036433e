#include "kernels/device.h"

#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

namespace packbert::kernels {

namespace {

class HostDevice final : public Device {
 public:
  const char* name() const override { return "host"; }
  // operator new's block, 64 bytes more than asked, with the aligned start 8 to 64 bytes in and
  // the block's address just before it.
  void* allocate(size_t bytes) override {
    void* block = ::operator new(bytes + 64);
    const uintptr_t start = (reinterpret_cast<uintptr_t>(block) + 64) & ~uintptr_t{63};
    void* p = reinterpret_cast<void*>(start);
    static_cast<void**>(p)[-1] = block;
    std::memset(p, 0, bytes);
    return p;
  }
  void release(void* p) override { ::operator delete(static_cast<void**>(p)[-1]); }
};

}  // namespace

Device& host_device() {
  static HostDevice device;
  return device;
}

Buffer::Buffer(Device& device, DType dtype, int64_t n) : dtype_(dtype) {
  if (n <= 0) return;
  data_ = device.allocate(static_cast<size_t>(n) * traits(dtype).bytes);
  device_ = &device;
  n_ = n;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = std::exchange(o.device_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    dtype_ = o.dtype_;
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

void Buffer::reset() {
  if (data_) device_->release(data_);
  device_ = nullptr;
  data_ = nullptr;
  n_ = 0;
}

View Buffer::view() const {
  View v;
  v.data = data_;
  v.dtype = dtype_;
  v.rows = 1;
  v.cols = v.ld = n_;
  return v;
}

}  // namespace packbert::kernels
