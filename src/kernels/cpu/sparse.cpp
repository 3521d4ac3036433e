// The block-sparse linear layer (cpu/sparse.h): the scratch each layout needs, and which family
// of kernels runs a call (cpu/sparse_lanes.h: token-major in sparse_token.cpp, row-major in
// sparse_rows.cpp).
#include "kernels/cpu/sparse.h"

#include <type_traits>

#include "kernels/cpu/sparse_lanes.h"

namespace packbert::kernels::inline PACKBERT_CPU_ISA {

using namespace sparse_kernels;

int64_t sparse_linear_scratch(int rows, int cols, int block, int64_t nnz, int N) {
  const int64_t sides = rows + cols;
  // Token-major: both sides transposed, then the bias's sums per tile (every block size in
  // double, 1 in float), then (1 x 1) the weight gradient's sums per slot.
  const int64_t token = sides * token_tiles(N) * kTokenTile +
                        static_cast<int64_t>(token_tiles(N)) * rows + (block == 1 ? nnz : 0);
  if (!row_major(block)) return token;
  // Row-major (4, 8 and 16 in float): both sides packed, then the blocks transposed or the
  // bias's sums. Sized for the tiles of the AVX-512 and the AVX2 builds both (cpu/isa.h): the
  // caller sizes its scratch once, whichever build then runs.
  int64_t room = token;
  for (const bool avx512 : {true, false}) {
    const int vectors = row_tile_vectors(block, avx512);
    const int64_t tiles = row_tiles(N, block, vectors),
                  packed = sides * tiles * vectors * (16 / block);
    room = std::max(room, packed + std::max(nnz * block * block, tiles * rows));
  }
  return room;
}

int64_t sparse_linear_scratch(const BlockPattern& p, int N) {
  return sparse_linear_scratch(p.rows, p.cols, p.block, p.nnz(), N);
}

namespace {

template <typename T, typename S>
void forward_from(T* out, const S* inp, const BlockPattern& p, const T* values, const T* bias,
                  int N, T* scratch) {
  if constexpr (std::is_same_v<T, float>)
    if (row_major(p.block)) return row_forward(out, inp, p, values, bias, N, scratch);
  token_forward(out, inp, p, values, bias, N, scratch);
}

template <typename T, typename S>
void backward_from(T* dinp, T* dvalues, T* dbias, const T* dout, const S* inp,
                   const BlockPattern& p, const T* values, int N, T* scratch) {
  if constexpr (std::is_same_v<T, float>)
    if (row_major(p.block))
      return row_backward(dinp, dvalues, dbias, dout, inp, p, values, N, scratch);
  token_backward(dinp, dvalues, dbias, dout, inp, p, values, N, scratch);
}

}  // namespace

template <typename T>
void sparse_linear_forward(T* out, const T* inp, const BlockPattern& p, const T* values,
                           const T* bias, int N, T* scratch) {
  forward_from(out, inp, p, values, bias, N, scratch);
}
template <typename T>
void sparse_linear_backward(T* dinp, T* dvalues, T* dbias, const T* dout, const T* inp,
                            const BlockPattern& p, const T* values, int N, T* scratch) {
  backward_from(dinp, dvalues, dbias, dout, inp, p, values, N, scratch);
}

#define PACKBERT_SPARSE_16(H)                                                                      \
  void sparse_linear_forward(float* out, const H* inp, const BlockPattern& p, const float* values, \
                             const float* bias, int N, float* scratch) {                           \
    forward_from(out, inp, p, values, bias, N, scratch);                                           \
  }                                                                                                \
  void sparse_linear_backward(float* dinp, float* dvalues, float* dbias, const float* dout,        \
                              const H* inp, const BlockPattern& p, const float* values, int N,     \
                              float* scratch) {                                                    \
    backward_from(dinp, dvalues, dbias, dout, inp, p, values, N, scratch);                         \
  }
PACKBERT_SPARSE_16(bf16)
PACKBERT_SPARSE_16(f16)
#undef PACKBERT_SPARSE_16

#define PACKBERT_SPARSE(T)                                                                      \
  template void sparse_linear_forward<T>(T*, const T*, const BlockPattern&, const T*, const T*, \
                                         int, T*);                                              \
  template void sparse_linear_backward<T>(T*, T*, T*, const T*, const T*, const BlockPattern&,  \
                                          const T*, int, T*);
PACKBERT_SPARSE(float)
PACKBERT_SPARSE(double)
#undef PACKBERT_SPARSE

}  // namespace packbert::kernels::inline PACKBERT_CPU_ISA
