// `packbert inspect FILE`: summary and a few decoded examples of a sequences or packs file.
#include <algorithm>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/table.h"
#include "data/sequences.h"
#include "data/vocab.h"
#include "error.h"

namespace packbert::cli {

namespace {

struct InspectArgs {
  std::string file, vocab, sequences;
  bool vocab_given = false;  // --vocab named on the command line (not the default)
  int examples = 3;
};

std::string decode(const data::SequencesFile& f, size_t i, const data::Vocab* vocab) {
  // Masked input as the model sees it, with each masked slot shown as input{label}.
  std::vector<int32_t> input(f.tokens.begin() + static_cast<long>(f.token_offsets[i]),
                             f.tokens.begin() + static_cast<long>(f.token_offsets[i + 1]));
  std::vector<int> masked(input.size(), 0);
  for (uint64_t k = f.mlm_offsets[i]; k < f.mlm_offsets[i + 1]; ++k) {
    masked[f.mlm_positions[k]] = 1;
    input[f.mlm_positions[k]] = f.mlm_inputs[k];
  }
  std::string out;
  for (size_t t = 0; t < input.size(); ++t) {
    auto text = [&](int32_t id) { return vocab ? vocab->token(id) : std::to_string(id); };
    if (!out.empty()) out += ' ';
    out += text(input[t]);
    if (masked[t]) out += "{" + text(f.tokens[f.token_offsets[i] + t]) + "}";
  }
  return out;
}

void inspect_sequences(const InspectArgs& a) {
  data::SequencesFile f = data::read_sequences(a.file);
  // A vocabulary named with --vocab must be the file's; the default one is only used when it is
  // (otherwise ids are shown).
  std::unique_ptr<data::Vocab> vocab;
  if (a.vocab_given) {
    vocab = std::make_unique<data::Vocab>(data::Vocab::load(a.vocab));
    if (!f.made_with(*vocab))
      throw InputError(a.vocab + ": not the vocabulary " + a.file + " was made with");
  } else {
    try {
      vocab = std::make_unique<data::Vocab>(data::Vocab::load(a.vocab));
      if (!f.made_with(*vocab)) {
        std::cout << "(the default vocabulary is not the one this file was made with; ids "
                     "shown: pass its --vocab to decode)\n";
        vocab.reset();
      }
    } catch (const InputError&) {
      vocab.reset();
    }
  }
  std::vector<int> lengths = f.lengths();
  std::vector<int> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  int64_t nsp = 0, eligible = 0;
  for (int8_t v : f.nsp_label) nsp += v;
  for (size_t i = 0; i < f.size(); ++i) eligible += lengths[i] - 3;
  auto pct = [&](double q) {
    return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()))];
  };
  Table t({"field", "value"});
  t.add_row({"sequences", with_commas(static_cast<int64_t>(f.size()))});
  t.add_row({"tokens", with_commas(static_cast<int64_t>(f.tokens.size()))});
  t.add_row({"max length", std::to_string(f.max_seq_len)});
  t.add_row({"length p10 / p50 / p90 / max",
             std::to_string(pct(0.1)) + " / " + std::to_string(pct(0.5)) + " / " +
                 std::to_string(pct(0.9)) + " / " + std::to_string(sorted.back())});
  t.add_row({"padding if unpacked %",
             fixed(100.0 * (1.0 - static_cast<double>(f.tokens.size()) /
                                      (static_cast<double>(f.size()) * f.max_seq_len)),
                   2)});
  t.add_row(
      {"masked tokens % of eligible",
       fixed(100.0 * static_cast<double>(f.mlm_positions.size()) / std::max<int64_t>(eligible, 1),
             2)});
  t.add_row({"NSP random-next %",
             fixed(100.0 * static_cast<double>(nsp) / std::max<size_t>(f.size(), 1), 2)});
  t.add_row({"vocabulary size", std::to_string(f.vocab_size)});
  t.add_row({"held-out sequences",
             f.has_heldout_split() ? with_commas(static_cast<int64_t>(f.size() - f.heldout_begin)) +
                                         " (from held-out documents, the file's last)"
                                   : "none recorded"});
  t.add_row({"format version", std::to_string(f.format_version)});
  t.print(std::cout);
  for (int i = 0; i < a.examples && i < static_cast<int>(f.size()); ++i)
    std::cout << "\n#" << i << " (" << lengths[i] << " tokens, B from " << f.b_start[i] << ", NSP "
              << (f.nsp_label[i] ? "random" : "next") << "): " << decode(f, i, vocab.get()) << '\n';
}

void inspect_packs(const InspectArgs& a) {
  data::PacksFile p = data::read_packs(a.file);
  Table t({"field", "value"});
  t.add_row({"packs", with_commas(static_cast<int64_t>(p.packs()))});
  t.add_row({"sequences", with_commas(static_cast<int64_t>(p.ids.size()))});
  t.add_row({"packing factor",
             fixed(static_cast<double>(p.ids.size()) / std::max<size_t>(p.packs(), 1), 4)});
  t.add_row({"packer", p.algo});
  t.add_row({"max length", std::to_string(p.max_seq_len)});
  t.add_row({"max per pack", p.max_per_pack ? std::to_string(p.max_per_pack) : "unlimited"});
  t.add_row({"lower bound", p.lower_bound >= 0 ? with_commas(p.lower_bound) : "-"});
  t.print(std::cout);
  std::unique_ptr<data::SequencesFile> seqs;
  if (!a.sequences.empty()) {
    if (data::sequences_checksum(a.sequences) != p.sequences_checksum)
      throw InputError(a.file + ": was built for another sequences file than " + a.sequences);
    seqs = std::make_unique<data::SequencesFile>(data::read_sequences(a.sequences));
  }
  for (int i = 0; i < a.examples && i < static_cast<int>(p.packs()); ++i) {
    std::cout << "pack " << i << ": sequences";
    int total = 0;
    for (uint64_t k = p.offsets[i]; k < p.offsets[i + 1]; ++k) {
      std::cout << ' ' << p.ids[k];
      if (seqs) std::cout << " (" << seqs->length(p.ids[k]) << ")", total += seqs->length(p.ids[k]);
    }
    if (seqs) std::cout << " = " << total << " tokens";
    std::cout << '\n';
  }
}

void run_inspect(const InspectArgs& a) {
  std::string kind = data::file_kind(a.file);
  if (kind == "sequences") return inspect_sequences(a);
  if (kind == "packs") return inspect_packs(a);
  throw InputError(a.file + ": not a packbert sequences or packs file");
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Summarise a sequences or packs file and decode a few examples");
  cmd->add_option("file", a->file, "Sequences (.seqs) or packs (.packs) file")->required();
  CLI::Option* vocab =
      vocab_option(cmd, a->vocab, "vocab.txt the file was made with, for decoding");
  number(cmd, "--examples", a->examples, "How many to show", 0, kMaxCount);
  cmd->add_option("--sequences", a->sequences,
                  "For a packs file: its sequences file (shows lengths)");
  cmd->callback([a, vocab] {
    a->vocab_given = vocab->count() > 0;
    run_inspect(*a);
  });
}

}  // namespace packbert::cli
