#include "data/pretraining.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "error.h"

namespace packbert::data {

namespace {

uint64_t stream_seed(uint64_t seed, uint64_t a, uint64_t b) {
  SplitMix64 m(seed ^ (a * kGolden64) ^ (b * 0xc2b2ae3d27d4eb4fULL));
  m.next();
  return m.next();
}

}  // namespace

size_t truncate_seq_pair(std::vector<int32_t>& a, std::vector<int32_t>& b, size_t max_tokens,
                         Rng& rng) {
  // The kept ranges [a0, a1) and [b0, b1) shrink one draw at a time; the vectors are cut once.
  size_t a0 = 0, a1 = a.size(), b0 = 0, b1 = b.size();
  while ((a1 - a0) + (b1 - b0) > max_tokens) {
    const bool on_a = a1 - a0 > b1 - b0;
    size_t& front = on_a ? a0 : b0;
    size_t& back = on_a ? a1 : b1;
    if (rng.uniform() < 0.5)
      ++front;
    else
      --back;
  }
  a.resize(a1), b.resize(b1);
  a.erase(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(a0));
  b.erase(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(b0));
  return a.size() + b.size();
}

void mask_example(Example& e, const Vocab& vocab, const PretrainingOptions& o, Rng& rng) {
  e.mlm_positions.clear();
  e.mlm_inputs.clear();
  std::vector<std::vector<int32_t>> cand;
  for (size_t i = 0; i < e.tokens.size(); ++i) {
    int32_t t = e.tokens[i];
    if (t == vocab.cls() || t == vocab.sep()) continue;
    bool continuation = vocab.token(t).rfind("##", 0) == 0;
    if (o.whole_word_mask && continuation && !cand.empty() &&
        cand.back().back() + 1 == static_cast<int32_t>(i))
      cand.back().push_back(static_cast<int32_t>(i));
    else
      cand.push_back({static_cast<int32_t>(i)});
  }
  size_t eligible = 0;
  for (auto& c : cand) eligible += c.size();
  if (eligible == 0) return;
  for (size_t i = cand.size(); i > 1; --i) std::swap(cand[i - 1], cand[rng.g.below(i)]);
  double want = o.masked_lm_prob * static_cast<double>(eligible);
  size_t n = static_cast<size_t>(want) + (rng.uniform() < want - std::floor(want) ? 1 : 0);
  n = std::min<size_t>(std::max<size_t>(n, 1), static_cast<size_t>(o.max_predictions_per_seq));
  std::vector<std::pair<int32_t, int32_t>> picked;
  for (const auto& set : cand) {
    if (picked.size() >= n) break;
    if (picked.size() + set.size() > n) continue;
    for (int32_t i : set) {
      int32_t input;
      if (rng.uniform() < 0.8)
        input = vocab.mask();
      else if (rng.uniform() < 0.5)
        input = e.tokens[i];
      else
        input = static_cast<int32_t>(rng.randint(0, vocab.size() - 1));
      picked.push_back({i, input});
    }
  }
  std::sort(picked.begin(), picked.end());
  for (auto [i, input] : picked) {
    e.mlm_positions.push_back(i);
    e.mlm_inputs.push_back(input);
  }
}

std::vector<Example> document_examples(const std::vector<Document>& docs, size_t doc, int dupe,
                                       const Vocab& vocab, const PretrainingOptions& o,
                                       const std::vector<size_t>& pool) {
  const size_t pool_size = pool.empty() ? docs.size() : pool.size();
  Rng rng(stream_seed(o.seed, static_cast<uint64_t>(dupe), doc));
  const Document& d = docs[doc];
  const int64_t max_tokens = o.max_seq_len - 3;
  int64_t target = max_tokens;
  if (rng.uniform() < o.short_seq_prob) target = rng.randint(2, max_tokens);
  std::vector<Example> out;
  std::vector<const Sentence*> chunk;
  int64_t chunk_len = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(d.size()); ++i) {
    chunk.push_back(&d[i]);
    chunk_len += static_cast<int64_t>(d[i].size());
    if (i + 1 != static_cast<int64_t>(d.size()) && chunk_len < target) continue;
    if (!chunk.empty()) {
      std::vector<int32_t> a, b;
      int nsp = 0;
      const bool random_next = rng.uniform() < 0.5;
      if (o.split_single_sentence && chunk.size() == 1 && !random_next && chunk[0]->size() >= 2) {
        // Google forces a random B whenever the chunk is one sentence, which skews the labels on
        // corpora of short documents (two random B in three on GCIDE); this option splits the
        // sentence instead, so B is still the true continuation and the labels stay 50/50.
        int64_t cut = rng.randint(1, static_cast<int64_t>(chunk[0]->size()) - 1);
        a.assign(chunk[0]->begin(), chunk[0]->begin() + cut);
        b.assign(chunk[0]->begin() + cut, chunk[0]->end());
      } else {
        int64_t a_end =
            chunk.size() >= 2 ? rng.randint(1, static_cast<int64_t>(chunk.size()) - 1) : 1;
        for (int64_t j = 0; j < a_end; ++j) a.insert(a.end(), chunk[j]->begin(), chunk[j]->end());
        if (chunk.size() == 1 || random_next) {
          nsp = 1;
          int64_t target_b = target - static_cast<int64_t>(a.size());
          size_t other = doc;
          for (int tries = 0; tries < 10 && pool_size > 1; ++tries) {
            const size_t pick =
                static_cast<size_t>(rng.randint(0, static_cast<int64_t>(pool_size) - 1));
            other = pool.empty() ? pick : pool[pick];
            if (other != doc) break;
          }
          const Document& r = docs[other];
          int64_t start = rng.randint(0, static_cast<int64_t>(r.size()) - 1);
          for (int64_t j = start; j < static_cast<int64_t>(r.size()); ++j) {
            b.insert(b.end(), r[j].begin(), r[j].end());
            if (static_cast<int64_t>(b.size()) >= target_b) break;
          }
          i -= static_cast<int64_t>(chunk.size()) - a_end;  // unused segments go back in
        } else {
          for (size_t j = a_end; j < chunk.size(); ++j)
            b.insert(b.end(), chunk[j]->begin(), chunk[j]->end());
        }
      }
      truncate_seq_pair(a, b, static_cast<size_t>(max_tokens), rng);
      if (!a.empty() && !b.empty()) {
        Example e;
        e.tokens.push_back(vocab.cls());
        e.tokens.insert(e.tokens.end(), a.begin(), a.end());
        e.tokens.push_back(vocab.sep());
        e.b_start = static_cast<int32_t>(e.tokens.size());
        e.tokens.insert(e.tokens.end(), b.begin(), b.end());
        e.tokens.push_back(vocab.sep());
        e.nsp_label = nsp;
        mask_example(e, vocab, o, rng);
        out.push_back(std::move(e));
      }
    }
    chunk.clear();
    chunk_len = 0;
  }
  return out;
}

SequencesFile create_pretraining_data(const std::vector<Document>& docs, const Vocab& vocab,
                                      const PretrainingOptions& o) {
  if (o.max_seq_len < 8) throw InputError("`max_seq_len` must be at least 8");
  if (docs.empty()) throw InputError("the corpus holds no document (empty input?)");
  if (!(o.heldout_fraction >= 0 && o.heldout_fraction < 0.5))
    throw InputError("`eval_fraction` must be in [0, 0.5)");
  // The held-out documents: a seeded choice of round(fraction × documents), at least one.
  const size_t n_docs = docs.size();
  std::vector<char> heldout(n_docs, 0);
  std::vector<size_t> train_pool, heldout_pool;
  if (o.heldout_fraction > 0) {
    if (n_docs < 2) throw InputError("`eval_fraction` needs at least two documents");
    std::vector<size_t> order(n_docs);
    for (size_t i = 0; i < n_docs; ++i) order[i] = i;
    SplitMix64 pick_rng(stream_seed(o.seed, 0x5e1d, 0));
    shuffle(order, pick_rng);
    const size_t n_held = std::clamp<size_t>(
        static_cast<size_t>(std::llround(o.heldout_fraction * static_cast<double>(n_docs))), 1,
        n_docs - 1);
    for (size_t i = 0; i < n_held; ++i) heldout[order[i]] = 1;
    for (size_t d = 0; d < n_docs; ++d) (heldout[d] ? heldout_pool : train_pool).push_back(d);
  }
  // Jobs: every (dupe, training document), then one round of each held-out document.
  std::vector<std::pair<int, size_t>> jobs;  // (dupe, document)
  for (int dupe = 0; dupe < o.dupe_factor; ++dupe)
    for (size_t d = 0; d < n_docs; ++d)
      if (!heldout[d]) jobs.push_back({dupe, d});
  const size_t n_train_jobs = jobs.size();
  for (size_t d : heldout_pool) jobs.push_back({0, d});
  std::vector<std::vector<Example>> per_job(jobs.size());
#pragma omp parallel for schedule(dynamic, 64)
  for (size_t j = 0; j < jobs.size(); ++j)
    per_job[j] = document_examples(docs, jobs[j].second, jobs[j].first, vocab, o,
                                   heldout[jobs[j].second] ? heldout_pool : train_pool);
  SequencesFile f;
  f.max_seq_len = o.max_seq_len;
  f.vocab_size = vocab.size();
  f.vocab_fingerprint = vocab.fingerprint();
  // Each part in its own seeded shuffle: training examples first, then the held-out ones.
  for (auto [begin, end, salt] :
       {std::tuple<size_t, size_t, uint64_t>{0, n_train_jobs, 0}, {n_train_jobs, jobs.size(), 1}}) {
    std::vector<std::pair<size_t, int32_t>> order;  // (job, example)
    for (size_t j = begin; j < end; ++j)
      for (size_t k = 0; k < per_job[j].size(); ++k) order.push_back({j, static_cast<int32_t>(k)});
    SplitMix64 shuffle_rng(stream_seed(o.seed, 0xfeed, salt));
    shuffle(order, shuffle_rng);
    if (salt == 1) f.heldout_begin = f.size();
    for (auto [j, k] : order) f.append(per_job[j][k]);
  }
  if (f.heldout_begin == f.size()) f.heldout_begin = SequencesFile::kNoSplit;
  if (f.size() == 0) throw InputError("the corpus produced no example (documents too short?)");
  if (o.heldout_fraction > 0 && !f.has_heldout_split())
    throw InputError("the held-out documents produced no example (raise `eval_fraction`)");
  if (o.heldout_fraction > 0 && f.heldout_begin == 0)
    throw InputError("the training documents produced no example (lower `eval_fraction`)");
  return f;
}

}  // namespace packbert::data
