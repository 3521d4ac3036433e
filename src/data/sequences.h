// Pre-training examples and the sequences file (docs/FORMATS.md, "sequences file").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/vocab.h"
#include "pack/plan.h"

namespace packbert::data {

// One pre-training example: [CLS] A [SEP] B [SEP] with its masking. `tokens` holds the ORIGINAL
// ids; the masked input replaces tokens[mlm_positions[k]] by mlm_inputs[k] ([MASK], a random
// id, or the original), and the MLM label at that position is the original token.
struct Example {
  std::vector<int32_t> tokens;
  int32_t b_start = 0;    // index of B's first token (segment 1 from here on)
  int32_t nsp_label = 0;  // 1 = B is a random sentence (is_random_next), 0 = the real next
  std::vector<int32_t> mlm_positions;
  std::vector<int32_t> mlm_inputs;
};

// The sequences file in memory: flat arrays (CSR), so it can be read back with one pass and
// sliced without copies.
struct SequencesFile {
  static constexpr uint64_t kNoSplit = ~uint64_t{0};
  uint32_t format_version = 2;  // of the file it was read from (2 when made here)
  int32_t max_seq_len = 0;
  int32_t vocab_size = 0;
  uint64_t vocab_fingerprint = 0;
  std::vector<uint64_t> token_offsets{0};  // [n + 1]
  std::vector<int32_t> tokens;             // original ids
  std::vector<int32_t> b_start;            // [n]
  std::vector<int8_t> nsp_label;           // [n]
  std::vector<uint64_t> mlm_offsets{0};    // [n + 1]
  std::vector<int32_t> mlm_positions, mlm_inputs;
  // Sequences [heldout_begin, n) come from held-out documents (prepare --eval-fraction), which
  // no training sequence shares; kNoSplit: the file records no split.
  uint64_t heldout_begin = kNoSplit;

  size_t size() const { return b_start.size(); }
  bool has_heldout_split() const { return heldout_begin < size(); }
  // True when `vocab` is the vocabulary the file was made with.
  bool made_with(const Vocab& vocab) const {
    return vocab.fingerprint(format_version) == vocab_fingerprint;
  }
  int32_t length(size_t i) const {
    return static_cast<int32_t>(token_offsets[i + 1] - token_offsets[i]);
  }
  void append(const Example& e);
  std::vector<int> lengths() const;
};

// Little-endian, versioned, checksummed (docs/FORMATS.md). write_* is atomic (temp + rename);
// read_* throws InputError naming the file and what is wrong (bad magic, version, truncation,
// checksum mismatch, inconsistent offsets).
void write_sequences(const std::string& path, const SequencesFile& f);
SequencesFile read_sequences(const std::string& path);

// Packs over a sequences file: pack p holds sequence ids ids[offsets[p] .. offsets[p+1]).
struct PacksFile {
  int32_t max_seq_len = 0;
  int32_t max_per_pack = 0;
  std::string algo;
  uint64_t sequences_checksum = 0;  // of the sequences file the ids refer to
  uint64_t n_sequences = 0;
  int64_t lower_bound = 0;
  std::vector<uint64_t> offsets{0};
  std::vector<uint64_t> ids;
  size_t packs() const { return offsets.size() - 1; }
};
void write_packs(const std::string& path, const PacksFile& f);
PacksFile read_packs(const std::string& path);
// The checksum read_sequences verified (stored in the file's header).
uint64_t sequences_checksum(const std::string& path);

// What kind of packbert file this is, from its magic ("sequences", "packs", or "" if neither).
std::string file_kind(const std::string& path);

// Packs the sequences of `f` with a packer and assigns concrete ids (shuffled by seed).
// `checksum` identifies the sequences file (sequences_checksum()). The plan is returned too, for
// reporting.
PacksFile make_packs(const SequencesFile& f, uint64_t checksum, pack::Algo algo,
                     const pack::PackOptions& options, uint64_t seed, pack::PackPlan* plan);

}  // namespace packbert::data
