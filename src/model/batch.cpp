#include "model/batch.h"

#include <algorithm>
#include <cassert>

#include "error.h"

namespace packbert::model {

PackedBatch empty_batch(int B, int S, int K, int32_t pad_id) {
  PackedBatch b;
  b.B = B;
  b.S = S;
  b.K = K;
  const size_t n = static_cast<size_t>(B) * S;
  b.input_ids.assign(n, pad_id);
  b.token_type_ids.assign(n, 0);
  b.position_ids.assign(n, 0);
  b.sequence_ids.assign(n, 0);
  b.mlm_labels.assign(n, -100);
  b.nsp_labels.assign(static_cast<size_t>(B) * K, -100);
  return b;
}

BatchBuilder::BatchBuilder(int B, int S, int K, int32_t pad_id)
    : b_(empty_batch(B, S, K, pad_id)),
      used_(static_cast<size_t>(B), 0),
      sequences_(static_cast<size_t>(B), 0) {}

size_t BatchBuilder::add(int row, std::span<const int32_t> tokens, int b_start, int32_t nsp_label) {
  const int L = static_cast<int>(tokens.size()), k = sequences_[static_cast<size_t>(row)]++;
  int& used = used_[static_cast<size_t>(row)];
  assert(used + L <= b_.S && k < b_.K);
  const size_t first = static_cast<size_t>(row) * b_.S + used;
  for (int i = 0; i < L; ++i) {
    b_.input_ids[first + i] = tokens[static_cast<size_t>(i)];
    b_.token_type_ids[first + i] = i >= b_start;
    b_.position_ids[first + i] = i;
    b_.sequence_ids[first + i] = k + 1;
  }
  b_.nsp_labels[static_cast<size_t>(row) * b_.K + k] = nsp_label;
  used += L;
  return first;
}

void BatchBuilder::compute_padding(int row) {
  for (int i = used_[static_cast<size_t>(row)]; i < b_.S; ++i) {
    const size_t slot = static_cast<size_t>(row) * b_.S + i;
    b_.sequence_ids[slot] = kComputedPadding;
    b_.position_ids[slot] = i;
  }
  used_[static_cast<size_t>(row)] = b_.S;
}

namespace {

// Every per-slot array of b holds B x S entries, nsp_labels B x K.
void check_sizes(const PackedBatch& b) {
  const size_t slots = static_cast<size_t>(b.B) * b.S;
  auto check_size = [&](const std::vector<int32_t>& v, size_t n, const char* name) {
    if (v.size() != n)
      throw InputError(std::string("batch: ") + name + " has " + std::to_string(v.size()) +
                       " entries, expected " + std::to_string(n));
  };
  check_size(b.input_ids, slots, "input_ids");
  check_size(b.token_type_ids, slots, "token_type_ids");
  check_size(b.position_ids, slots, "position_ids");
  check_size(b.sequence_ids, slots, "sequence_ids");
  check_size(b.mlm_labels, slots, "mlm_labels");
  check_size(b.nsp_labels, static_cast<size_t>(b.B) * b.K, "nsp_labels");
}

[[noreturn]] void fail_at(int p, int s, const std::string& what) {
  throw InputError("batch: pack " + std::to_string(p) + " slot " + std::to_string(s) + ": " + what);
}

// The id, token type and position of slot i (pack p, slot s) that the engine computes, real or
// computed padding.
void check_computed(const PackedBatch& b, const BertConfig& c, int p, int s, size_t i) {
  if (b.input_ids[i] < 0 || b.input_ids[i] >= c.vocab_size)
    fail_at(p, s,
            "input id " + std::to_string(b.input_ids[i]) + " outside the vocabulary of " +
                std::to_string(c.vocab_size));
  // (a family without token types, ModernBERT, reads none)
  if (c.family == Family::bert &&
      (b.token_type_ids[i] < 0 || b.token_type_ids[i] >= c.type_vocab_size))
    fail_at(p, s, "token type " + std::to_string(b.token_type_ids[i]) + " out of range");
  if (b.position_ids[i] < 0 || b.position_ids[i] >= c.max_position_embeddings)
    fail_at(p, s,
            "position " + std::to_string(b.position_ids[i]) + " outside [0, " +
                std::to_string(c.max_position_embeddings) + ")");
}

// Computed padding: each pack's run becomes one more sequence, after all real tokens.
void add_computed_padding(const PackedBatch& b, const BertConfig& c, TokenLayout& t) {
  for (int p = 0; p < b.B; ++p) {
    const int before = t.tokens();
    for (int s = 0; s < b.S; ++s) {
      const size_t i = static_cast<size_t>(p) * b.S + s;
      if (b.sequence_ids[i] != kComputedPadding) continue;
      check_computed(b, c, p, s, i);
      t.slot.push_back(static_cast<int32_t>(i));
    }
    if (t.tokens() > before) {
      t.cu_seqlens.push_back(t.tokens());
      t.nsp_label.push_back(-100);
    }
  }
}

}  // namespace

void token_layout(const PackedBatch& b, const BertConfig& c, TokenLayout& t) {
  check_sizes(b);
  t.slot.clear();
  t.cu_seqlens.assign(1, 0);
  t.nsp_label.clear();
  t.mlm_token.clear();
  t.mlm_label.clear();
  for (int p = 0; p < b.B; ++p) {
    int current = 0;
    bool padding = false;
    for (int s = 0; s < b.S; ++s) {
      const size_t i = static_cast<size_t>(p) * b.S + s;
      auto fail = [&](const std::string& what) { fail_at(p, s, what); };
      int seq = b.sequence_ids[i];
      if (seq == 0 || seq == kComputedPadding) {
        padding = true;
        if (b.mlm_labels[i] != -100) fail("padding slot carries an MLM label");
        continue;
      }
      if (padding) fail("sequence after padding (padding must come last in a pack)");
      if (seq != current && seq != current + 1)
        fail("sequence id " + std::to_string(seq) + " after " + std::to_string(current) +
             " (ids must run 1, 2, ... in contiguous blocks)");
      if (seq > b.K)
        fail("sequence id " + std::to_string(seq) + " exceeds K = " + std::to_string(b.K));
      if (seq == current + 1) {
        if (current > 0) t.cu_seqlens.push_back(t.tokens());
        current = seq;
        t.nsp_label.push_back(b.nsp_labels[static_cast<size_t>(p) * b.K + seq - 1]);
      }
      check_computed(b, c, p, s, i);
      if (b.mlm_labels[i] != -100) {
        if (b.mlm_labels[i] < 0 || b.mlm_labels[i] >= c.vocab_size)
          fail("MLM label " + std::to_string(b.mlm_labels[i]) + " outside the vocabulary");
        t.mlm_token.push_back(t.tokens());
        t.mlm_label.push_back(b.mlm_labels[i]);
      }
      t.slot.push_back(static_cast<int32_t>(i));
    }
    if (current > 0) t.cu_seqlens.push_back(t.tokens());
    for (int k = current; k < b.K; ++k)
      if (b.nsp_labels[static_cast<size_t>(p) * b.K + k] != -100)
        throw InputError("batch: pack " + std::to_string(p) + " has an NSP label for sequence " +
                         std::to_string(k + 1) + ", which it does not hold");
  }
  // cu_seqlens got one push per sequence end; the first entry is the leading 0.
  add_computed_padding(b, c, t);
}

namespace {

// Sequences of row p: the largest sequence id in it (ids run 1, 2, ...).
int sequences_in_row(const PackedBatch& b, int p) {
  int n = 0;
  for (int s = 0; s < b.S; ++s) n = std::max(n, b.sequence_ids[static_cast<size_t>(p) * b.S + s]);
  return n;
}

}  // namespace

std::vector<int64_t> row_tokens(const PackedBatch& b) {
  std::vector<int64_t> out(static_cast<size_t>(b.B), 0);
  for (int p = 0; p < b.B; ++p)
    for (int s = 0; s < b.S; ++s) out[p] += b.sequence_ids[static_cast<size_t>(p) * b.S + s] > 0;
  return out;
}

BatchShare share_of_whole(const PackedBatch& b) {
  BatchShare sh;
  RowPlace at;
  for (int p = 0; p < b.B; ++p) {
    sh.places.push_back(at);
    int64_t len = 0;
    int current = 0;
    for (int s = 0; s < b.S; ++s) {
      const size_t i = static_cast<size_t>(p) * b.S + s;
      const int seq = b.sequence_ids[i];
      if (seq == kComputedPadding)
        throw InputError("batch: pack " + std::to_string(p) +
                         " has computed padding, which a batch split across processes cannot "
                         "hold");
      if (seq != current) {  // a sequence ends (the next starts, or padding)
        at.attention += len * len;
        len = 0;
        current = seq;
      }
      if (seq > 0) ++len, ++at.token;
      sh.mlm += b.mlm_labels[i] != -100;
    }
    at.attention += len * len;
    at.sequence += sequences_in_row(b, p);
    for (int k = 0; k < b.K; ++k) sh.nsp += b.nsp_labels[static_cast<size_t>(p) * b.K + k] >= 0;
  }
  for (int32_t y : b.class_labels) sh.cls += y >= 0;
  sh.cls += static_cast<int64_t>(b.class_targets.size());
  for (int32_t y : b.span_starts) sh.span += y >= 0;
  return sh;
}

PackedBatch take_rows(const PackedBatch& whole, const BatchShare& share,
                      const std::vector<int>& rows) {
  PackedBatch b = empty_batch(static_cast<int>(rows.size()), whole.S, whole.K);
  b.share.mlm = share.mlm, b.share.nsp = share.nsp, b.share.cls = share.cls,
  b.share.span = share.span;
  const size_t S = static_cast<size_t>(whole.S), K = static_cast<size_t>(whole.K);
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t p = static_cast<size_t>(rows[r]);
    auto copy = [&](const std::vector<int32_t>& from, std::vector<int32_t>& to, size_t n) {
      std::copy(from.begin() + static_cast<long>(p * n),
                from.begin() + static_cast<long>(p * n + n), to.begin() + static_cast<long>(r * n));
    };
    copy(whole.input_ids, b.input_ids, S);
    copy(whole.token_type_ids, b.token_type_ids, S);
    copy(whole.position_ids, b.position_ids, S);
    copy(whole.sequence_ids, b.sequence_ids, S);
    copy(whole.mlm_labels, b.mlm_labels, S);
    copy(whole.nsp_labels, b.nsp_labels, K);
    b.share.places.push_back(share.places[p]);
    // Per-sequence labels: the row's sequences, from its first one's place.
    const int n = sequences_in_row(whole, static_cast<int>(p));
    const size_t first = static_cast<size_t>(share.places[p].sequence);
    auto take = [&](const auto& from, auto& to) {
      if (!from.empty())
        to.insert(to.end(), from.begin() + static_cast<long>(first),
                  from.begin() + static_cast<long>(first) + n);
    };
    take(whole.class_labels, b.class_labels);
    take(whole.class_targets, b.class_targets);
    take(whole.span_starts, b.span_starts);
    take(whole.span_ends, b.span_ends);
  }
  return b;
}

std::vector<SequenceSpan> sequences_of(const PackedBatch& b) {
  std::vector<SequenceSpan> out;
  for (int p = 0; p < b.B; ++p) {
    int current = 0;
    for (int s = 0; s < b.S; ++s) {
      const size_t i = static_cast<size_t>(p) * b.S + s;
      const int seq = b.sequence_ids[i];
      if (seq <= 0) {
        current = 0;
        continue;
      }
      if (seq != current) out.push_back({p, s, 0, 0}), current = seq;
      ++out.back().length;
      out.back().masked += b.mlm_labels[i] != -100;
    }
  }
  return out;
}

PackedBatch take_sequences(const PackedBatch& whole, const BatchShare& share,
                           const std::vector<SequenceSpan>& spans, const std::vector<int>& seqs) {
  PackedBatch b = empty_batch(static_cast<int>(seqs.size()), whole.S, whole.K);
  b.share.mlm = share.mlm, b.share.nsp = share.nsp, b.share.cls = share.cls,
  b.share.span = share.span;
  const size_t S = static_cast<size_t>(whole.S), K = static_cast<size_t>(whole.K);
  // Each sequence's place: its row's, advanced over the row's sequences before it.
  std::vector<RowPlace> places;
  places.reserve(spans.size());
  for (size_t q = 0; q < spans.size(); ++q) {
    const SequenceSpan& at = spans[q];
    RowPlace place = share.places[static_cast<size_t>(at.row)];
    if (q > 0 && spans[q - 1].row == at.row) {
      const RowPlace& before = places.back();
      const int64_t len = spans[q - 1].length;
      place = {before.token + len, before.sequence + 1, before.attention + len * len};
    }
    places.push_back(place);
  }
  for (size_t r = 0; r < seqs.size(); ++r) {
    const size_t q = static_cast<size_t>(seqs[r]);
    const SequenceSpan& at = spans[q];
    const size_t from = static_cast<size_t>(at.row) * S + static_cast<size_t>(at.start);
    const size_t n = static_cast<size_t>(at.length);
    for (auto field : {&PackedBatch::input_ids, &PackedBatch::token_type_ids,
                       &PackedBatch::position_ids, &PackedBatch::mlm_labels})
      std::copy_n((whole.*field).begin() + static_cast<long>(from), n,
                  (b.*field).begin() + static_cast<long>(r * S));
    std::fill_n(b.sequence_ids.begin() + static_cast<long>(r * S), n, 1);
    const int k = whole.sequence_ids[from] - 1;  // the sequence's index in its row
    b.nsp_labels[r * K] =
        whole.nsp_labels[static_cast<size_t>(at.row) * K + static_cast<size_t>(k)];
    b.share.places.push_back(places[q]);
    const size_t global = static_cast<size_t>(places[q].sequence);
    auto take = [&](const auto& from_labels, auto& to) {
      if (!from_labels.empty()) to.push_back(from_labels[global]);
    };
    take(whole.class_labels, b.class_labels);
    take(whole.class_targets, b.class_targets);
    take(whole.span_starts, b.span_starts);
    take(whole.span_ends, b.span_ends);
  }
  return b;
}

TokenLayout token_layout(const PackedBatch& b, const BertConfig& c) {
  TokenLayout t;
  token_layout(b, c, t);
  return t;
}

}  // namespace packbert::model
