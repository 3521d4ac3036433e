#include "data/pretraining.h"

#include <algorithm>
#include <cmath>

#include "error.h"

namespace packbert::data {

namespace {

uint64_t stream_seed(uint64_t seed, uint64_t a, uint64_t b) {
  pack::SplitMix64 m(seed ^ (a * 0x9e3779b97f4a7c15ULL) ^ (b * 0xc2b2ae3d27d4eb4fULL));
  m.next();
  return m.next();
}

void truncate_pair(std::vector<int32_t>& a, std::vector<int32_t>& b, size_t max_tokens, Rng& rng) {
  while (a.size() + b.size() > max_tokens) {
    std::vector<int32_t>& t = a.size() > b.size() ? a : b;
    if (rng.uniform() < 0.5)
      t.erase(t.begin());
    else
      t.pop_back();
  }
}

}  // namespace

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
                                       const Vocab& vocab, const PretrainingOptions& o) {
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
      if (chunk.size() == 1 && !random_next && chunk[0]->size() >= 2) {
        // Google forces a random B whenever the chunk is one sentence, which skews the labels on
        // corpora of short documents (two random B in three on GCIDE); we split the sentence
        // instead, so B is still the true continuation and the labels stay 50/50.
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
          for (int tries = 0; tries < 10 && docs.size() > 1; ++tries) {
            other = static_cast<size_t>(rng.randint(0, static_cast<int64_t>(docs.size()) - 1));
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
      truncate_pair(a, b, static_cast<size_t>(max_tokens), rng);
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
  if (o.max_seq_len < 8) throw InputError("--max-seq-len must be at least 8");
  if (docs.empty()) throw InputError("the corpus holds no document (empty input?)");
  const int64_t jobs = static_cast<int64_t>(docs.size()) * o.dupe_factor;
  std::vector<std::vector<Example>> per_job(jobs);
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t j = 0; j < jobs; ++j)
    per_job[j] =
        document_examples(docs, static_cast<size_t>(j % static_cast<int64_t>(docs.size())),
                          static_cast<int>(j / static_cast<int64_t>(docs.size())), vocab, o);
  std::vector<std::pair<int64_t, int32_t>> order;  // (job, example) in a seeded shuffle
  for (int64_t j = 0; j < jobs; ++j)
    for (size_t k = 0; k < per_job[j].size(); ++k) order.push_back({j, static_cast<int32_t>(k)});
  pack::SplitMix64 shuffle_rng(stream_seed(o.seed, 0xfeed, 0));
  pack::shuffle(order, shuffle_rng);
  SequencesFile f;
  f.max_seq_len = o.max_seq_len;
  f.vocab_size = vocab.size();
  f.vocab_fingerprint = vocab.fingerprint();
  for (auto [j, k] : order) f.append(per_job[j][k]);
  if (f.size() == 0) throw InputError("the corpus produced no example (documents too short?)");
  return f;
}

}  // namespace packbert::data
