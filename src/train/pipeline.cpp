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

// Message tags: micro-batch j's activations 2j, its gradients 2j + 1; the tied table's last.
constexpr int kTiedTag = 32767;  // (the largest tag every MPI allows)
int activation_tag(int micro) {
  return 2 * (micro % (kTiedTag / 2));
}
int gradient_tag(int micro) {
  return activation_tag(micro) + 1;
}

}  // namespace

StageLinks::StageLinks(dist::Comm& pipe, int hidden, kernels::DType activations)
    : pipe_(pipe), hidden_(hidden), activations_(activations) {}

kernels::View StageLinks::receive_input(int micro, int pass, int64_t tokens) {
  if (inputs_.size() <= static_cast<size_t>(pass)) inputs_.resize(static_cast<size_t>(pass) + 1);
  std::vector<std::byte>& in = inputs_[static_cast<size_t>(pass)];
  in.resize(static_cast<size_t>(tokens) * static_cast<size_t>(hidden_) *
            kernels::traits(activations_).bytes);
  waited_ += pipe_.recv(in.data(), in.size(), pipe_.rank() - 1, activation_tag(micro));
  kernels::View v;
  v.data = in.data(), v.dtype = activations_;
  v.rows = tokens, v.cols = v.ld = hidden_;
  return v;
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

void StageLinks::sum_tied(float* grad, int64_t vocab, const std::vector<int32_t>& rows) {
  const int P = pipe_.size(), s = pipe_.rank();
  if (P == 1 || (s != 0 && s != P - 1)) return;
  const size_t C = static_cast<size_t>(hidden_), n = static_cast<size_t>(vocab) * C;
  if (s == 0) {  // the decoder's share, whole, added to the embeddings' rows
    std::vector<float>& decoder = tied_;
    decoder.resize(n);
    waited_ += pipe_.recv(decoder.data(), n * sizeof(float), P - 1, kTiedTag);
    std::vector<std::byte>& mine = next_sent(rows.size() * C * sizeof(float));
    for (size_t k = 0; k < rows.size(); ++k)
      std::memcpy(mine.data() + k * C * sizeof(float), grad + static_cast<size_t>(rows[k]) * C,
                  C * sizeof(float));
    pipe_.start_send(mine.data(), mine.size(), P - 1, kTiedTag);
    for (size_t i = 0; i < n; ++i) grad[i] += decoder[i];
    finish();
    return;
  }
  // The last stage: its share goes first (the first stage is still finishing its backwards),
  // then the embeddings' rows come back.
  pipe_.start_send(grad, n * sizeof(float), 0, kTiedTag);
  std::vector<float>& embeddings = tied_;
  embeddings.resize(rows.size() * C);
  waited_ += pipe_.recv(embeddings.data(), embeddings.size() * sizeof(float), 0, kTiedTag);
  finish();
  size_t k = 0;
  for (size_t r = 0; r < static_cast<size_t>(vocab); ++r) {
    float* g = grad + r * C;
    if (k < rows.size() && static_cast<size_t>(rows[k]) == r) {
      const float* e = embeddings.data() + k++ * C;
      for (size_t c = 0; c < C; ++c) g[c] = e[c] + g[c];
    } else {
      for (size_t c = 0; c < C; ++c) g[c] = 0.0f + g[c];  // (as the first stage adds its zeros)
    }
  }
}

void StageLinks::finish() {
  pipe_.wait_sends();
  sent_used_ = 0;
}

}  // namespace packbert::train
