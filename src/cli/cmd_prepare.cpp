// `packbert prepare`: text → sequences file (Google BERT's create_pretraining_data semantics),
// its length histogram, and optionally the packs file in the same run.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/pack_report.h"
#include "data/casing.h"
#include "data/corpus.h"
#include "data/sequences.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/paths.h"
#include "pack/histogram.h"
#include "stopwatch.h"

namespace packbert::cli {

namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string out, vocab, pack_algo;
  bool cased = false, split = false, skip_invalid_utf8 = false;
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
  std::optional<pack::Algo> algo;
  if (!a.pack_algo.empty()) algo = pack::parse_algo(a.pack_algo);

  std::vector<io::NamedPath> inputs = {{a.vocab, "--vocab"}};
  for (const std::string& in : a.inputs) inputs.push_back({in, "input"});
  io::refuse_outputs_over_inputs({{a.out, "--out"},
                                  {sibling(a.out, ".hist"), "--out's histogram"},
                                  {algo ? sibling(a.out, ".packs") : "", "--out's packs"}},
                                 inputs);
  const Stopwatch total;
  data::Vocab vocab = data::Vocab::load(a.vocab);
  // (a tokenizer.json decides its own casing: only an explicit --cased contradicts it)
  const std::optional<bool> flag =
      vocab.json() && !a.cased ? std::nullopt : std::optional<bool>(!a.cased);
  const data::Casing casing = data::decide_casing(flag, "", vocab, a.vocab);
  if (const data::Casing& c = casing; !c.warning.empty())
    std::cerr << "prepare: warning: " << with_flags(c.warning) << '\n';
  data::Tokenizer tok(vocab, casing.lower_case);
  size_t skipped = 0;
  std::vector<data::Document> docs = data::read_corpus(
      a.inputs, tok, {.split_sentences = a.split, .skip_invalid_utf8 = a.skip_invalid_utf8},
      &skipped);
  if (skipped)
    std::cerr << "prepare: skipped " << with_commas(static_cast<int64_t>(skipped))
              << " lines that are not valid UTF-8\n";
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
            << fixed(packing.seconds(), 2) << " s";
  if (f.has_heldout_split())
    std::cerr << "; the last " << with_commas(static_cast<int64_t>(f.size() - f.heldout_begin))
              << " come from held-out documents";
  std::cerr << '\n';
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
  vocab_option(cmd, a->vocab, "vocab.txt, or a Hugging Face tokenizer.json, to tokenise with");
  cmd->add_flag("--cased", a->cased, "Keep case and accents (cased models)");
  cmd->add_flag("--split-sentences", a->split,
                "Input is raw text: split documents (blank-line separated) into sentences");
  number(cmd, "--max-seq-len", a->o.max_seq_len, "Tokens per sequence, [CLS] and [SEP]s included",
         8, 65536);
  number(cmd, "--short-seq-prob", a->o.short_seq_prob,
         "Probability of a shorter target length (Google's short_seq_prob)", 0, 1);
  number(cmd, "--masked-lm-prob", a->o.masked_lm_prob, "Share of tokens masked", 1e-6, 1 - 1e-6);
  number(cmd, "--max-predictions", a->o.max_predictions_per_seq, "Max masked tokens per sequence",
         1, 65536);
  number(cmd, "--dupe-factor", a->o.dupe_factor, "Passes over the corpus with new masks/pairs", 1,
         1000);
  number(cmd, "--eval-fraction", a->o.heldout_fraction,
         "Share of documents held out for evaluation, split before duplication (pretrain uses it)",
         0, 0.49);
  cmd->add_flag("--whole-word-mask", a->o.whole_word_mask, "Mask whole words (all their pieces)");
  cmd->add_flag("--split-single-sentence", a->o.split_single_sentence,
                "Split a one-sentence chunk into A and B when its coin says real next (keeps NSP "
                "50/50 on short documents; Google's rule, the default, gives it a random B)");
  cmd->add_flag("--skip-invalid-utf8", a->skip_invalid_utf8,
                "Drop lines that are not valid UTF-8 (counted) instead of stopping at the first");
  number(cmd, "--seed", a->o.seed, "Seed for pairs, masks and order", 0, kMaxSeed);
  cmd->add_option("--pack", a->pack_algo,
                  "Also pack: none|spfhp|lpfhp|nnlshp|optimal (writes <out>.packs)");
  number(cmd, "--max-per-pack", a->max_per_pack,
         "With --pack: most sequences per pack (0 = unlimited)", 0, 65536);
  cmd->callback([a] { run_prepare(*a); });
}

}  // namespace packbert::cli
