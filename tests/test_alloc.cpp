// A steady-state training step allocates nothing on the heap in the engine or the optimizer: the
// workspace arena, the token layout and the optimizer's buffers are sized by the largest step
// seen and reused. Counted with a replaced global operator new (not under AddressSanitizer,
// which owns operator new there), on one OpenMP thread: oneDNN's multi-threaded sgemm allocates
// its own packing buffers inside the library on each call (seen: about 30 per tiny-model step
// on 2 threads); packbert's own parallel regions take their working memory from the workspace.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>

#include "model/bert.h"
#include "model_batches.h"
#include "train/optimizer.h"

// Defined with the replaced operator new in tests/counting_new.cpp (its own translation unit, so
// the compiler does not pair the inlined malloc with delete).
extern std::atomic<bool> counting;
extern std::atomic<int64_t> allocations;

namespace packbert::model {
namespace {

class SteadyState : public ::testing::TestWithParam<const char*> {};

TEST_P(SteadyState, TrainingStepsMakeNoHeapAllocation) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "operator new belongs to AddressSanitizer in this build";
#endif
  BertConfig c = bert_preset("tiny");
  c.vocab_size = 500;
  c.max_position_embeddings = 64;
  BertModel m(c, Heads{});
  init_params(m.layout(), m.params().data(), 2);
  train::OptimizerConfig lamb, adamw;
  adamw.kind = train::OptimizerKind::adamw;
  train::Optimizer opt_lamb(m.layout(), lamb), opt_adamw(m.layout(), adamw);
  const Recompute policy = parse_recompute(GetParam());
  // Steps of different shapes (tokens, sequences, masked positions, longest sequence); each is
  // seen once before counting, as the arena is sized for the largest step seen.
  std::vector<PackedBatch> batches = {make_batch({{64}, {30, 34}, {60}}, 64, c.vocab_size, 1),
                                      make_batch({{10, 20, 30}, {40}}, 64, c.vocab_size, 2),
                                      make_batch({{5, 5, 5, 5}, {64}}, 64, c.vocab_size, 3)};
  auto step = [&](int i) {
    m.forward(batches[i % batches.size()], {true, 9, static_cast<uint64_t>(i), policy});
    m.zero_grads();
    m.backward();
    train::clip_grad_norm(m.grads().data(), m.grads().size(), 1.0);
    (i % 2 ? opt_lamb : opt_adamw).step(m.params().data(), m.grads().data(), 1e-3);
  };
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (int i = 0; i < 3; ++i) step(i);  // every shape, both optimizers
  allocations = 0;
  counting = true;
  for (int i = 3; i < 9; ++i) step(i);
  counting = false;
  omp_set_num_threads(threads);
  EXPECT_EQ(allocations.load(), 0) << "heap allocations in 6 steady-state steps";

  // The counter works: a vector allocates.
  counting = true;
  std::vector<int> v(10);
  counting = false;
  EXPECT_GE(allocations.load(), 1);
}

INSTANTIATE_TEST_SUITE_P(Policies, SteadyState,
                         ::testing::Values("none", "gelu,ln,attention", "every:2"));

}  // namespace
}  // namespace packbert::model
