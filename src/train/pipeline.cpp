#include "train/pipeline.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace packbert::train {

namespace {

void check(int stages, int stage, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw std::logic_error("pipeline schedule: stage " + std::to_string(stage) + " of " +
                           std::to_string(stages) + ", " + std::to_string(micro_batches) +
                           " micro-batches");
}

}  // namespace

std::vector<PipelineAction> one_f_one_b(int stages, int stage, int micro_batches) {
  check(stages, stage, micro_batches);
  const int M = micro_batches, warmup = std::min(stages - 1 - stage, M);
  std::vector<PipelineAction> actions;
  int forward = 0, backward = 0;
  for (; forward < warmup; ++forward) actions.push_back({false, forward});
  for (; forward < M; ++forward, ++backward) {
    actions.push_back({false, forward});
    actions.push_back({true, backward});
  }
  for (; backward < M; ++backward) actions.push_back({true, backward});
  return actions;
}

int forwards_in_flight(int stages, int stage, int micro_batches) {
  check(stages, stage, micro_batches);
  return std::min(stages - stage, micro_batches);
}

double bubble_fraction(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

namespace {

// Message tags: micro-batch j's activations 3j, their gradients 3j + 1, its decoder input 3j + 2
// (j modulo what fits below the tied table's tag, the largest every MPI allows).
constexpr int kTiedTag = 32767;
int activation_tag(int micro) {
  return 3 * (micro % (kTiedTag / 3));
}
int gradient_tag(int micro) {
  return activation_tag(micro) + 1;
}
int decoder_tag(int micro) {
  return activation_tag(micro) + 2;
}

}  // namespace

StageLinks::StageLinks(dist::Comm& pipe, int hidden, kernels::DType activations)
    : pipe_(pipe), hidden_(hidden), activations_(activations) {}

kernels::View StageLinks::view_of(void* at, kernels::DType dtype, int64_t rows, int64_t cols) {
  kernels::View v;
  v.data = at, v.dtype = dtype;
  v.rows = rows, v.cols = v.ld = cols;
  return v;
}

kernels::View StageLinks::receive_input(int micro, int pass, int64_t tokens) {
  if (inputs_.size() <= static_cast<size_t>(pass)) inputs_.resize(static_cast<size_t>(pass) + 1);
  std::vector<std::byte>& in = inputs_[static_cast<size_t>(pass)];
  in.resize(static_cast<size_t>(tokens) * static_cast<size_t>(hidden_) *
            kernels::traits(activations_).bytes);
  waited_ += pipe_.recv(in.data(), in.size(), pipe_.rank() - 1, activation_tag(micro));
  return view_of(in.data(), activations_, tokens, hidden_);
}

std::vector<std::byte>& StageLinks::next_sent(size_t bytes) {
  if (sent_used_ == sent_.size()) sent_.emplace_back();
  std::vector<std::byte>& buf = sent_[sent_used_++];
  buf.resize(bytes);
  return buf;
}

void StageLinks::send_output(int micro, const kernels::View& output) {
  std::vector<std::byte>& buf =
      next_sent(static_cast<size_t>(output.numel()) * kernels::traits(output.dtype).bytes);
  std::memcpy(buf.data(), output.data, buf.size());
  pipe_.start_send(buf.data(), buf.size(), pipe_.rank() + 1, activation_tag(micro));
}

kernels::View StageLinks::receive_output_grad(int micro, int64_t tokens) {
  output_grad_.resize(static_cast<size_t>(tokens) * static_cast<size_t>(hidden_));
  waited_ += pipe_.recv(output_grad_.data(), output_grad_.size() * sizeof(float), pipe_.rank() + 1,
                        gradient_tag(micro));
  return kernels::View(output_grad_.data(), tokens, hidden_);
}

void StageLinks::send_input_grad(int micro, const kernels::View& grad) {
  std::vector<std::byte>& buf = next_sent(static_cast<size_t>(grad.numel()) * sizeof(float));
  std::memcpy(buf.data(), grad.data, buf.size());
  pipe_.start_send(buf.data(), buf.size(), pipe_.rank() - 1, gradient_tag(micro));
}

void StageLinks::send_decoder_input(int micro, const model::DecoderInput& d) {
  if (d.input.dtype != activations_ || d.input.cols != hidden_ ||
      d.bias.dtype != kernels::DType::f32)
    throw std::logic_error("send_decoder_input: not [masked, hidden] as held and an f32 bias");
  const size_t input = static_cast<size_t>(d.input.numel()) * kernels::traits(activations_).bytes,
               bias = static_cast<size_t>(d.bias.numel()) * sizeof(float);
  std::vector<std::byte>& buf = next_sent(input + bias);
  std::memcpy(buf.data(), d.input.data, input);
  std::memcpy(buf.data() + input, d.bias.data, bias);
  pipe_.start_send(buf.data(), buf.size(), 0, decoder_tag(micro));
}

model::DecoderInput StageLinks::receive_decoder_input(int micro, int64_t masked, int64_t vocab) {
  const size_t input = static_cast<size_t>(masked * hidden_) * kernels::traits(activations_).bytes;
  decoder_.resize(input + static_cast<size_t>(vocab) * sizeof(float));
  waited_ += pipe_.recv(decoder_.data(), decoder_.size(), pipe_.size() - 1, decoder_tag(micro));
  return {view_of(decoder_.data(), activations_, masked, hidden_),
          view_of(decoder_.data() + input, kernels::DType::f32, 1, vocab)};
}

void StageLinks::share_tied(float* grad, size_t n) {
  const int P = pipe_.size(), s = pipe_.rank();
  if (P == 1 || (s != 0 && s != P - 1)) return;
  if (s == 0) {
    pipe_.start_send(grad, n * sizeof(float), P - 1, kTiedTag);
    finish();
    return;
  }
  waited_ += pipe_.recv(grad, n * sizeof(float), 0, kTiedTag);
  finish();
}

void StageLinks::finish() {
  pipe_.wait_sends();
  sent_used_ = 0;
}

}  // namespace packbert::train
