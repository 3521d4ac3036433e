// Reading a PyTorch state_dict saved by torch.save (pytorch_model.bin) without Python and
// without executing anything: the zip container (io/zip.h) holding `<archive>/data.pkl`, a
// pickle, and one entry `<archive>/data/<key>` per storage; or the legacy (pre-1.6) format, five
// pickles in a row (magic number, protocol 1001, sys_info, the object, the storage keys) and then
// each storage as an 8-byte element count and its bytes.
//
// The pickle is run by a small machine that knows only the subset torch.save uses for a
// state_dict: protocol 2 (and the protocol 4 opcodes that name things), dicts, lists, tuples,
// numbers and strings, memo gets and puts, persistent ids ('storage', <type>, key, location,
// numel), and these globals, each resolved by name to what it means here, never imported:
//   collections.OrderedDict, torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter,
//   torch.{Float,Half,BFloat16,Double,Long,Int}Storage.
// Anything else (another global, an unknown opcode, a legacy storage view) is refused with
// an InputError naming the construct and where it is. A tensor is a view of a storage: offset,
// sizes and strides are checked to stay inside the storage, and the view is copied out
// contiguous, so tensors that share a storage (the tied decoder, q/k/v cut from one buffer)
// each come out whole.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/input_file.h"

namespace packbert::io {

struct TorchTensor {
  std::string name;
  std::string dtype;  // safetensors' names: F32, F16, BF16, F64, I64, I32
  std::vector<int64_t> shape;
  std::string data;  // contiguous, little-endian (row-major over `shape`)
};

// The file's tensors in the state_dict's order. The pickled object must be a dict of tensors,
// or a dict holding one under "state_dict" or "model" (training-loop checkpoints). Throws
// InputError "<path>: ..." otherwise.
std::vector<TorchTensor> read_torch_file(const std::string& path);
std::vector<TorchTensor> parse_torch_file(FileBytes bytes, const std::string& source);

}  // namespace packbert::io
