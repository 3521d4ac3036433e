// `packbert prepare`: text → sequences file (Google BERT's create_pretraining_data semantics),
// its length histogram, and optionally the packs file in the same run.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/pack_report.h"
#include "data/corpus.h"
#include "data/sequences.h"
#include "error.h"
#include "stopwatch.h"
#include "io/atomic_file.h"
#include "pack/histogram.h"

namespace packbert::cli {

namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string out, vocab = PACKBERT_DEFAULT_VOCAB, pack_algo;
  bool cased = false, split = false;
  int max_per_pack = 0;
  uint64_t pack_seed = 1;
  data::PretrainingOptions o;
};

std::string sibling(const std::string& path, const std::string& ext) {
  const std::string seqs = ".seqs";
  if (path.size() > seqs.size() && path.compare(path.size() - seqs.size(), seqs.size(), seqs) == 0)
    return path.substr(0, path.size() - seqs.size()) + ext;
  return path + ext;
}

void run_prepare(const PrepareArgs& a) {
  const data::PretrainingOptions& o = a.o;
  if (o.max_seq_len < 8 || o.max_seq_len > 65536)
    throw InputError("--max-seq-len: " + std::to_string(o.max_seq_len) + " is outside [8, 65536]");
  if (!(o.short_seq_prob >= 0 && o.short_seq_prob <= 1))
    throw InputError("--short-seq-prob must be in [0, 1]");
  if (!(o.masked_lm_prob > 0 && o.masked_lm_prob < 1))
    throw InputError("--masked-lm-prob must be in (0, 1)");
  if (o.max_predictions_per_seq < 1) throw InputError("--max-predictions must be at least 1");
  if (o.dupe_factor < 1) throw InputError("--dupe-factor must be at least 1");
  std::optional<pack::Algo> algo;
  if (!a.pack_algo.empty()) algo = pack::parse_algo(a.pack_algo);

  const Stopwatch total;
  data::Vocab vocab = data::Vocab::load(a.vocab);
  data::Tokenizer tok(vocab, !a.cased);
  std::vector<data::Document> docs = data::read_corpus(a.inputs, tok, a.split);
  size_t sentences = 0, tokens = 0;
  for (const auto& d : docs)
    for (const auto& s : d) ++sentences, tokens += s.size();
  std::cerr << "prepare: " << with_commas(static_cast<int64_t>(docs.size())) << " documents, "
            << with_commas(static_cast<int64_t>(sentences)) << " sentences, "
            << with_commas(static_cast<int64_t>(tokens)) << " tokens read and tokenized in "
            << fixed(total.seconds(), 2) << " s\n";
  const Stopwatch packing;
  data::SequencesFile f = data::create_pretraining_data(docs, vocab, o);
  std::cerr << "prepare: " << with_commas(static_cast<int64_t>(f.size())) << " sequences ("
            << with_commas(static_cast<int64_t>(f.tokens.size())) << " tokens, "
            << with_commas(static_cast<int64_t>(f.mlm_positions.size())) << " masked) in "
            << fixed(packing.seconds(), 2) << " s\n";
  data::write_sequences(a.out, f);
  pack::Histogram h = pack::histogram_of(f.lengths(), o.max_seq_len);
  std::string hist = "# Sequence-length histogram of " + a.out + " (packbert prepare)\n";
  for (int l = 1; l <= h.max_len; ++l)
    if (h.count[l]) hist += std::to_string(l) + " " + std::to_string(h.count[l]) + "\n";
  io::write_file_atomic(sibling(a.out, ".hist"), hist);
  std::cout << "wrote " << a.out << " and " << sibling(a.out, ".hist") << '\n';
  if (algo) {
    pack::PackOptions po;
    po.max_len = o.max_seq_len;
    po.max_per_pack = a.max_per_pack;
    pack::PackPlan plan;
    data::PacksFile p =
        data::make_packs(f, data::sequences_checksum(a.out), *algo, po, a.pack_seed, &plan);
    data::write_packs(sibling(a.out, ".packs"), p);
    pack::PackBound bound = plan.lower_bound >= 0 ? pack::PackBound{plan.lp_value, plan.lower_bound}
                                                  : pack::packing_lower_bound(h, po);
    plan_table({plan}, bound).print(std::cout);
    std::cout << "wrote " << sibling(a.out, ".packs") << '\n';
  }
  std::cerr << "prepare: done in " << fixed(total.seconds(), 2) << " s\n";
}

}  // namespace

void register_prepare(CLI::App& app) {
  auto a = std::make_shared<PrepareArgs>();
  CLI::App* cmd = app.add_subcommand(
      "prepare", "Text files -> pre-training sequences file (NSP pairs, masking) + histogram");
  cmd->add_option("inputs", a->inputs, "Text: one sentence per line, blank line between documents")
      ->required();
  cmd->add_option("--out", a->out, "Sequences file to write (e.g. data.seqs)")->required();
  cmd->add_option("--vocab", a->vocab, "vocab.txt")->capture_default_str();
  cmd->add_flag("--cased", a->cased, "Keep case and accents (cased models)");
  cmd->add_flag("--split-sentences", a->split,
                "Input is raw text: split documents (blank-line separated) into sentences");
  cmd->add_option("--max-seq-len", a->o.max_seq_len)->capture_default_str();
  cmd->add_option("--short-seq-prob", a->o.short_seq_prob)->capture_default_str();
  cmd->add_option("--masked-lm-prob", a->o.masked_lm_prob)->capture_default_str();
  cmd->add_option("--max-predictions", a->o.max_predictions_per_seq,
                  "Max masked tokens per sequence")
      ->capture_default_str();
  cmd->add_option("--dupe-factor", a->o.dupe_factor, "Passes over the corpus with new masks/pairs")
      ->capture_default_str();
  cmd->add_flag("--whole-word-mask", a->o.whole_word_mask, "Mask whole words (all their pieces)");
  cmd->add_option("--seed", a->o.seed)->capture_default_str();
  cmd->add_option("--pack", a->pack_algo,
                  "Also pack: none|spfhp|lpfhp|nnlshp|optimal (writes <out>.packs)");
  cmd->add_option("--max-per-pack", a->max_per_pack,
                  "With --pack: most sequences per pack (0 = unlimited)")
      ->capture_default_str();
  cmd->callback([a] { run_prepare(*a); });
}

}  // namespace packbert::cli
