// Pipeline parallelism's schedule: PipeDream-Flush ("1F1B", Narayanan et al. 2021; Megatron-LM's
// non-interleaved schedule). A step's M micro-batches flow through P stages (model::Stage):
// stage s first runs min(P - 1 - s, M) warm-up forwards, then alternates one forward and one
// backward, then runs the backwards left. The last stage runs each micro-batch's backward right
// after its forward; a stage holds at most P - s forwards in flight (one model pass each), not
// M as GPipe's all-forwards-then-all-backwards does. Backwards run in micro-batch order on every
// stage, so the gradients accumulate in the order one process accumulates them.
#pragma once

#include <cstddef>
#include <vector>

#include "dist/comm.h"
#include "kernels/tensor.h"
#include "model/encoder_layer.h"

namespace packbert::train {

struct PipelineAction {
  bool backward = false;
  int micro = 0;  // the micro-batch, from 0
  bool operator==(const PipelineAction&) const = default;
};

// Stage s's actions for one step of M micro-batches over P stages, in order.
std::vector<PipelineAction> one_f_one_b(int stages, int stage, int micro_batches);

// The forwards stage s holds at most (its model passes): min(P - s, M). Micro-batch j uses pass
// j % in_flight: the pass's previous micro-batch (j - in_flight) has finished its backward by
// the time j's forward starts.
int forwards_in_flight(int stages, int stage, int micro_batches);

// The share of a step the pipeline idles when every stage's forward and backward take the same
// time: (P - 1) / (M + P - 1).
double bubble_fraction(int stages, int micro_batches);

// A stage's messages to its neighbours over `pipe` (a replica's stages, ranked by stage): the
// activations of micro-batch j going up and their gradients coming down, and the MLM decoder's
// input going from the last stage to the first (the word table, tied to the decoder, lives on
// both: the first forms the decoder's share of its gradient, so it alone sums the table's
// gradient, in the whole model's order: model::BertModel::hand_decoder_to_first_stage). Every
// stage reads the same batches, so each knows a micro-batch's token and masked counts without
// being sent them. A send is started from a
// buffer of its own that stays until finish() (the step's end: waiting mid-step could wait on a
// neighbour that waits on this stage); a receive blocks, and its wait counts in waited() (the
// stage's share of the bubble).
class StageLinks {
 public:
  // hidden: the model's width; activations: how the layers hold their inputs (16 bits under a
  // 16-bit precision); the gradients are f32.
  StageLinks(dist::Comm& pipe, int hidden, kernels::DType activations);
  // The stage below's output for micro-batch j ([tokens, hidden]), into the buffer of `pass`
  // (valid until that pass's next receive).
  kernels::View receive_input(int micro, int pass, int64_t tokens);
  // To the stage above: a copy of this stage's output for micro-batch j.
  void send_output(int micro, const kernels::View& output);
  // The stage above's gradient of its input for micro-batch j (valid until the next call).
  kernels::View receive_output_grad(int micro, int64_t tokens);
  // To the stage below: a copy of d loss / d this stage's input for micro-batch j.
  void send_input_grad(int micro, const kernels::View& grad);
  // The last stage, to the first: a copy of micro-batch j's MLM decoder input and bias
  // (BertModel::decoder_input after its forward).
  void send_decoder_input(int micro, const model::DecoderInput& d);
  // The first stage: micro-batch j's decoder input ([masked, hidden] as the layers hold
  // activations) and bias ([vocab] f32) from the last, valid until the next call.
  model::DecoderInput receive_decoder_input(int micro, int64_t masked, int64_t vocab);
  // The tied word table's gradient (n floats), whole on the first stage after its replicas' sum:
  // sent from there to the last stage, which receives it over its own (untouched by its
  // backward), so both copies of the table take the same gradient bit for bit. The other stages
  // do nothing.
  void share_tied(float* grad, size_t n);
  // Waits for the sends started since the last finish().
  void finish();
  double waited() const { return waited_; }
  void reset_waited() { waited_ = 0; }

 private:
  // The next send's buffer (kept, with its capacity, across steps: steady-state steps allocate
  // nothing).
  std::vector<std::byte>& next_sent(size_t bytes);
  // A View of `rows` x `cols` `dtype` elements at `at`.
  static kernels::View view_of(void* at, kernels::DType dtype, int64_t rows, int64_t cols);

  dist::Comm& pipe_;
  int hidden_;
  kernels::DType activations_;
  std::vector<std::vector<std::byte>> inputs_, sent_;
  size_t sent_used_ = 0;  // sent_'s buffers in use since the last finish()
  std::vector<float> output_grad_;
  std::vector<std::byte> decoder_;
  double waited_ = 0;
};

}  // namespace packbert::train
