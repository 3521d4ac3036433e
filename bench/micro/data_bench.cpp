// Data pipeline benchmark on the demo corpus (Debian dict-gcide): tokenizer throughput on one
// core, `prepare` of the whole corpus at max length 128, and the batch loader against the
// engine's step time (bert-mini, 32 packs of 128). Median of --runs.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <sstream>

#include "cli/flags.h"
#include "cli/table.h"
#include "data/corpus.h"
#include "data/gcide.h"
#include "data/sequences.h"
#include "kernels/cpu_features.h"
#include "model/bert.h"
#include "stopwatch.h"
#include "train/loader.h"

using namespace packbert;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"data_bench: tokenizer, prepare and loader speed on the demo corpus"};
  int runs = 3;
  std::string vocab_path;
  app.add_option("--runs", runs)->capture_default_str();
  cli::vocab_option(&app, vocab_path, "vocab.txt");
  CLI11_PARSE(app, argc, argv);
  std::cout << "CPU: " << kernels::cpu_features().model << " (" << kernels::cpu_features().isa()
            << ")\n";

  std::string text =
      data::gcide_to_text("/usr/share/dictd/gcide.index", "/usr/share/dictd/gcide.dict.dz");
  std::string path = "/tmp/packbert_data_bench.txt";
  { std::ofstream(path) << text; }
  data::Vocab vocab = data::Vocab::load(vocab_path);
  data::Tokenizer tok(vocab, true);
  cli::Table t({"measure", "value", "target"});

  // 1. Tokenizer, one thread, line by line over the whole corpus.
  std::vector<std::string> lines;
  {
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  std::vector<double> rate;
  size_t ids = 0;
  for (int r = 0; r < runs; ++r) {
    double t0 = now_seconds();
    ids = 0;
    for (const std::string& l : lines) ids += tok.encode(l).size();
    rate.push_back(text.size() / (now_seconds() - t0) / 1e6);
  }
  t.add_row({"tokenizer MB/s (1 thread, " +
                 cli::with_commas(static_cast<int64_t>(text.size() / 1000000)) + " MB)",
             cli::fixed(median(rate), 1), ">= 10"});

  // 2. prepare of the whole corpus, max length 128, all threads (read + tokenize + examples +
  // write).
  std::vector<double> secs;
  data::SequencesFile f;
  for (int r = 0; r < runs; ++r) {
    double t0 = now_seconds();
    auto docs = data::read_corpus({path}, tok, {});
    data::PretrainingOptions o;
    f = data::create_pretraining_data(docs, vocab, o);
    data::write_sequences("/tmp/packbert_data_bench.seqs", f);
    secs.push_back(now_seconds() - t0);
  }
  t.add_row({"prepare whole corpus @128, s (" + std::to_string(omp_get_max_threads()) +
                 " threads, " + cli::with_commas(static_cast<int64_t>(f.size())) + " sequences)",
             cli::fixed(median(secs), 2), "< 30"});

  // 3. Loader batch build time vs a bert-mini training step on the same batches.
  pack::PackOptions po;
  po.max_len = 128;
  data::PacksFile p = data::make_packs(f, 1, pack::Algo::optimal, po, 1, nullptr);
  train::LoaderOptions lo;
  lo.rows_per_batch = 32;
  train::BatchLoader loader(f, 1, &p, &vocab, lo, {});
  model::BertConfig c = model::bert_preset("mini");
  model::BertModel m(c, model::Heads{});
  model::init_params(m.layout(), m.params().data(), 1);
  std::vector<double> build, step, wait;
  train::Cursor after;
  for (int r = 0; r < 2 * runs + 1; ++r) {
    double t0 = now_seconds();
    model::PackedBatch b = loader.build({0, static_cast<uint64_t>(r) * 32}, &after);
    build.push_back(now_seconds() - t0);
    t0 = now_seconds();
    model::PackedBatch q = loader.next();  // what training sees: prefetched while it computed
    wait.push_back(now_seconds() - t0);
    t0 = now_seconds();
    m.forward(q, {true, 1, static_cast<uint64_t>(r), {}});
    m.zero_grads();
    m.backward();
    step.push_back(now_seconds() - t0);
  }
  build.erase(build.begin()), step.erase(step.begin()), wait.erase(wait.begin());
  t.add_row({"loader: build one batch of 32 packs, ms", cli::fixed(1e3 * median(build), 2), "-"});
  t.add_row({"engine: bert-mini step on it, ms", cli::fixed(1e3 * median(step), 1), "-"});
  t.add_row({"loader share of step time %", cli::fixed(100 * median(build) / median(step), 2),
             "< 100 (prefetched)"});
  t.add_row({"trainer wait for next batch, ms", cli::fixed(1e3 * median(wait), 3), "~0"});
  t.print(std::cout);
  std::cout << "\n";
  t.print_markdown(std::cout);
  return 0;
}
