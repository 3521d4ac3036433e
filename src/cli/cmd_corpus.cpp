// `packbert gcide-text`: builds the demo corpus from Debian's dict-gcide.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/table.h"
#include "data/gcide.h"
#include "io/atomic_file.h"
#include "io/paths.h"
#include "stopwatch.h"

namespace packbert::cli {

namespace {

struct GcideArgs {
  std::string index = "/usr/share/dictd/gcide.index", dict = "/usr/share/dictd/gcide.dict.dz", out,
              pos;
};

void run_gcide(const GcideArgs& a) {
  const std::vector<io::NamedPath> inputs = {{a.index, "--index"}, {a.dict, "--dict"}};
  io::refuse_outputs_over_inputs({{a.out, "--out"},
                                  {a.pos.empty() ? "" : a.pos + ".train.tsv", "--pos-tsv"},
                                  {a.pos.empty() ? "" : a.pos + ".dev.tsv", "--pos-tsv"}},
                                 inputs);
  const Stopwatch clock;
  size_t entries = 0;
  std::string text = data::gcide_to_text(a.index, a.dict, &entries);
  io::write_file_atomic(a.out, text);
  if (!a.pos.empty()) {
    std::string train, dev;
    data::gcide_pos_tsv(text, train, dev);
    io::write_file_atomic(a.pos + ".train.tsv", train);
    io::write_file_atomic(a.pos + ".dev.tsv", dev);
    std::cout << "wrote " << a.pos << ".{train,dev}.tsv (part of speech from the definition)\n";
  }
  size_t words = 0;
  bool in_word = false;
  for (char c : text) {
    bool space = c == ' ' || c == '\n';
    words += !space && !in_word;
    in_word = !space;
  }
  std::cout << "wrote " << a.out << ": " << with_commas(static_cast<int64_t>(entries))
            << " entries (documents), " << with_commas(static_cast<int64_t>(words)) << " words in "
            << fixed(clock.seconds(), 2) << " s\n";
}

}  // namespace

void register_gcide(CLI::App& app) {
  auto a = std::make_shared<GcideArgs>();
  CLI::App* cmd = app.add_subcommand(
      "gcide-text",
      "Convert Debian's dict-gcide dictionary into the demo corpus (one entry a document)");
  cmd->add_option("--out", a->out, "Text file to write")->required();
  cmd->add_option(
      "--pos-tsv", a->pos,
      "Also write PREFIX.train.tsv / PREFIX.dev.tsv: part of speech from the definition");
  cmd->add_option("--index", a->index, "The dictd index of GCIDE (Debian package dict-gcide)")
      ->capture_default_str();
  cmd->add_option("--dict", a->dict, "The dictzip-compressed GCIDE text it indexes")
      ->capture_default_str();
  cmd->callback([a] { run_gcide(*a); });
}

}  // namespace packbert::cli
