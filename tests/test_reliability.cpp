// Crash-and-abuse suite (docs/RELIABILITY.md): every defect of the QA pass reproduced, then held
// fixed; kill -9 during a step and during a checkpoint write, SIGINT and SIGTERM mid-run, each
// followed by --resume and a bitwise comparison of every tensor with an uninterrupted run.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "cli_runner.h"
#include "data/pretraining.h"
#include "data/sequences.h"
#include "data/utf8.h"
#include "error.h"
#include "io/checksum.h"
#include "io/safetensors.h"
#include "train/model_files.h"
#include "train/trainer.h"

extern char** environ;

namespace packbert {
namespace {

using testing::Result;
using testing::slurp;
namespace fs = std::filesystem;
using json = nlohmann::json;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// Random sentences over common words (all in bert-base-uncased's vocabulary), 1-8 sentences a
// document, blank lines between documents.
std::string corpus_text(int documents, unsigned seed) {
  static const char* words[] = {
      "the",  "of",    "and",   "to",    "in",    "is",     "was",  "for",   "on",   "that",
      "with", "as",    "by",    "at",    "from",  "his",    "her",  "it",    "an",   "be",
      "this", "which", "or",    "are",   "were",  "had",    "not",  "but",   "have", "one",
      "city", "known", "state", "world", "war",   "people", "name", "first", "new",  "two",
      "time", "years", "three", "music", "river", "house",  "king", "film",  "game", "school"};
  std::mt19937 rng(seed);
  std::string text;
  for (int d = 0; d < documents; ++d) {
    for (int s = 0, n = 1 + static_cast<int>(rng() % 8); s < n; ++s) {
      for (int w = 0, m = 4 + static_cast<int>(rng() % 16); w < m; ++w)
        text += std::string(w ? " " : "") + words[rng() % std::size(words)];
      text += " .\n";
    }
    text += "\n";
  }
  return text;
}

class Reliability : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    corpus_ = write("corpus.txt", corpus_text(300, 7)).string();
    seqs_ = (dir_ / "d.seqs").string();
    packs_ = (dir_ / "d.packs").string();
    Result r = run("prepare " + corpus_ + " --out " + seqs_ +
                   " --max-seq-len 64 --pack optimal --eval-fraction 0.1");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  // A short tiny-model run; `extra` adds or overrides flags.
  std::string train_args(const std::string& out, const std::string& extra = "") const {
    std::string args = "pretrain --data " + seqs_ + " --packs " + packs_ + " --out " +
                       (dir_ / out).string() + " --dynamic-masking " + extra;
    for (const char* d : {"--preset tiny", "--steps 12", "--batch-rows 8", "--checkpoint-every 4",
                          "--eval-every 6"}) {
      const std::string flag = std::string(d).substr(0, std::string(d).find(' ') + 1);
      if (extra.find(flag) == std::string::npos) args += std::string(" ") + d;
    }
    return args;
  }
  // 48 sentences with decimal scores (a regression task: STS-B's layout).
  std::string regression_tsv() {
    std::string tsv = "sentence\tscore\n";
    for (int i = 0; i < 48; ++i)
      tsv.append(i % 2 ? "the king of city " : "the war of ")
          .append(std::to_string(i))
          .append(i % 2 ? "\t4.25" : "\t1.5")
          .append(i % 3 ? "\n" : "0\n");
    return write("s.tsv", tsv).string();
  }
  std::string checkpoint(const std::string& out) const {
    return (dir_ / out / "checkpoint.safetensors").string();
  }
  std::vector<json> metrics(const std::string& out) const {
    std::vector<json> rows;
    std::istringstream in(slurp(dir_ / out / "metrics.jsonl"));
    for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
    return rows;
  }
  // Starts the binary without waiting; stdout/stderr go to files in the test directory.
  pid_t spawn(const std::string& args, const std::string& env = "") {
    std::vector<std::string> argv_s = {PACKBERT_BINARY};
    std::istringstream in(args);
    for (std::string a; in >> a;) argv_s.push_back(a);
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) env_s.push_back(*e);
    if (!env.empty()) env_s.push_back(env);
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, (dir_ / "bg.out").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, (dir_ / "bg.err").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, PACKBERT_BINARY, &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
  }
  // Waits until `out`/metrics.jsonl holds a step record with step >= `step` (or 120 s pass).
  void wait_for_step(const std::string& out, int64_t step) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      std::istringstream in(slurp(dir_ / out / "metrics.jsonl"));
      for (std::string line; std::getline(in, line);) {
        json r = json::parse(line, nullptr, false);
        if (!r.is_discarded() && r.value("type", "") == "step" && r.value("step", 0) >= step)
          return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    FAIL() << "no step " << step << " in " << out;
  }
  static int wait_exit(pid_t pid, bool* signalled = nullptr) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (signalled) *signalled = WIFSIGNALED(status);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string corpus_, seqs_, packs_;
};

// Every tensor (weights and Adam moments) of two checkpoints, byte for byte.
void expect_same_tensors(const std::string& a, const std::string& b) {
  io::SafetensorsFile fa = io::SafetensorsFile::read(a), fb = io::SafetensorsFile::read(b);
  ASSERT_EQ(fa.tensors().size(), fb.tensors().size());
  int compared = 0;
  for (const auto& [name, entry] : fa.tensors()) {
    ASSERT_TRUE(fb.has(name)) << name;
    std::vector<float> x = fa.floats(name), y = fb.floats(name);
    ASSERT_EQ(x.size(), y.size()) << name;
    ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << name;
    ++compared;
  }
  EXPECT_GT(compared, 40);
  json sa = json::parse(fa.metadata().at("packbert")),
       sb = json::parse(fb.metadata().at("packbert"));
  EXPECT_EQ(sa["step"], sb["step"]);
  EXPECT_EQ(sa["cursor_epoch"], sb["cursor_epoch"]);
  EXPECT_EQ(sa["cursor_row"], sb["cursor_row"]);
}

// 1a. An earlier run's directory is never overwritten by a run that forgot --resume.
TEST_F(Reliability, ExistingRunIsRefusedWithoutResumeOrOverwrite) {
  ASSERT_EQ(run(train_args("run", "--steps 4")).code, 0);
  const std::string ckpt = slurp(checkpoint("run")), log = slurp(dir_ / "run" / "metrics.jsonl");
  Result again = run(train_args("run", "--steps 4"));
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.err.find("checkpoint.safetensors"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--resume"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--overwrite"), std::string::npos) << again.err;
  EXPECT_EQ(std::count(again.err.begin(), again.err.end(), '\n'), 1) << again.err;
  EXPECT_EQ(slurp(checkpoint("run")), ckpt);
  EXPECT_EQ(slurp(dir_ / "run" / "metrics.jsonl"), log);
  Result over = run(train_args("run", "--steps 2 --overwrite"));
  ASSERT_EQ(over.code, 0) << over.err;
  std::vector<json> m = metrics("run");
  EXPECT_EQ(m.front()["step"], 1);  // a new log, not appended to the old one
  EXPECT_EQ(std::count_if(m.begin(), m.end(), [](const json& r) { return r["type"] == "step"; }),
            2);
}

// Recompute policies do not change training: the same run under `layer,attention` writes the
// same weights and optimizer moments bit for bit (dropout on). A step predicted not to fit is
// refused up front.
TEST_F(Reliability, RecomputeLeavesTrainingBitIdenticalAndTooSmallLimitsAreRefused) {
  ASSERT_EQ(run(train_args("none", "--steps 3 --checkpoint-every 0")).code, 0);
  Result r = run(train_args("layer", "--steps 3 --checkpoint-every 0 --recompute layer,attention"));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_tensors(checkpoint("layer"), checkpoint("none"));
  Result small = run(train_args("small", "--recompute none --memory-limit 64M"));
  EXPECT_EQ(small.code, 2);
  EXPECT_NE(small.err.find("more than the --memory-limit of 64.0 MiB"), std::string::npos)
      << small.err;
  EXPECT_EQ(std::count(small.err.begin(), small.err.end(), '\n'), 1) << small.err;
  EXPECT_FALSE(fs::exists(checkpoint("small")));
  Result bad = run(train_args("bad", "--recompute every:0"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--recompute every:0"), std::string::npos) << bad.err;
}

// 1b. A run that aborts writes nothing over the last good checkpoint.
TEST_F(Reliability, AbortingRunLeavesTheLastGoodCheckpointByteForByte) {
  ASSERT_EQ(run(train_args("run", "--steps 4")).code, 0);
  const std::string good = slurp(checkpoint("run"));
  train::PretrainOptions o;
  o.sequences = seqs_;
  o.packs = packs_;
  o.vocab = PACKBERT_SOURCE_VOCAB;
  o.out_dir = (dir_ / "run").string();
  o.loop.rows_per_batch = 8;
  o.max_steps = 12;
  o.checkpoint_every = 100;
  o.loop.nan_abort = 3;
  {  // Non-finite loss: weights poisoned after a step (as an overflow would).
    train::Trainer t(o, true);
    std::atomic<bool> stop{false};
    EXPECT_THROW(
        {
          try {
            t.run(stop,
                  [&](const train::StepMetrics& s) {
                    if (s.step == 5) t.model().params()[0] = NAN;
                  },
                  {});
          } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find("non-finite loss for 3 steps"), std::string::npos)
                << e.what();
            EXPECT_NE(std::string(e.what()).find("no checkpoint written"), std::string::npos);
            throw;
          }
        },
        InputError);
  }
  EXPECT_EQ(slurp(checkpoint("run")), good);
  {  // An update that makes the weights non-finite (weight decay NaN reaches the library).
    o.loop.optimizer.weight_decay = NAN;
    train::Trainer t(o, true);
    std::atomic<bool> stop{false};
    try {
      t.run(stop, {}, {});
      ADD_FAILURE() << "a NaN weight decay trained on";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("made parameters non-finite"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("the one of step 4"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(slurp(checkpoint("run")), good);
}

// 1c + 9. Fine-tuning and export: outputs appear whole or not at all, and replace nothing
// without --overwrite.
TEST_F(Reliability, FinetuneAndExportOutputsAreWholeOrAbsent) {
  ASSERT_EQ(run(train_args("run", "--steps 2")).code, 0);
  const std::string init = (dir_ / "init").string();
  ASSERT_EQ(run("export --checkpoint " + checkpoint("run") + " --out " + init).code, 0);
  std::string tsv = "label\tsentence\n";
  for (int i = 0; i < 24; ++i) tsv += (i % 2 ? "pos\tthe king of the city\n" : "neg\tthe war\n");
  const std::string train_tsv = write("train.tsv", tsv).string();
  const std::string ft = (dir_ / "ft").string();
  const std::string common =
      "finetune --train " + train_tsv + " --init " + init + " --epochs 1 --max-seq-len 16";
  const std::string args = common + " --out " + ft;
  Result ok = run(args + " --dev " + train_tsv);
  ASSERT_EQ(ok.code, 0) << ok.err;
  const std::string model = slurp(ft + "/model.safetensors");
  // Into a directory that holds a model: refused without --overwrite.
  Result again = run(args + " --dev " + train_tsv);
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.err.find("--overwrite"), std::string::npos) << again.err;
  // A failing run (dev has a label training never saw) with --overwrite: the earlier model
  // stays, and no partial directory is left.
  const std::string bad_dev = write("dev.tsv", "label\tsentence\nother\tthe city\n").string();
  Result failed = run(args + " --dev " + bad_dev + " --overwrite");
  EXPECT_EQ(failed.code, 2);
  EXPECT_EQ(slurp(ft + "/model.safetensors"), model);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".partial."), std::string::npos) << e.path();
  // Export never replaces a directory that holds something other than a model.
  fs::create_directories(dir_ / "notes");
  write("notes/todo.txt", "mine");
  Result ex = run("export --checkpoint " + checkpoint("run") + " --out " +
                  (dir_ / "notes").string() + " --overwrite");
  EXPECT_EQ(ex.code, 2);
  EXPECT_NE(ex.err.find("no model"), std::string::npos) << ex.err;
  EXPECT_EQ(slurp(dir_ / "notes" / "todo.txt"), "mine");
  // An --out that cannot be a directory: one line, exit 2.
  write("afile", "x");
  Result not_dir = run(train_args("afile"));
  EXPECT_EQ(not_dir.code, 2);
  EXPECT_NE(not_dir.err.find("--out"), std::string::npos) << not_dir.err;
  Result ft_not_dir = run(common + " --dev " + train_tsv + " --out " + (dir_ / "afile").string());
  EXPECT_EQ(ft_not_dir.code, 2) << ft_not_dir.err;
  EXPECT_EQ(std::count(ft_not_dir.err.begin(), ft_not_dir.err.end(), '\n'), 1) << ft_not_dir.err;
}

// 3. Every numeric flag has a range; values outside it (NaN, negative, wrapped) are refused
// naming the flag, before any work.
TEST_F(Reliability, NumericFlagsOutsideTheirRangeNameTheFlag) {
  const std::string pre = "pretrain --data " + seqs_ + " --out " + (dir_ / "x").string() + " ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {pre + "--weight-decay nan", "--weight-decay"},
      {pre + "--warmup -3", "--warmup"},
      {pre + "--clip -1", "--clip"},
      {pre + "--decay-power -2", "--decay-power"},
      {pre + "--nan-abort 0", "--nan-abort"},
      {pre + "--checkpoint-every -1", "--checkpoint-every"},
      {pre + "--max-minutes -1", "--max-minutes"},
      {pre + "--seed -1", "--seed"},
      {pre + "--lr inf", "--lr"},
      {pre + "--steps 1.5", "--steps"},
      {pre + "--eval-fraction 0.7", "--eval-fraction"},
      {pre + "--skip-outliers -1", "--skip-outliers"},
      {"pack " + seqs_ + " --max-seq-len 0", "--max-seq-len"},
      {"prepare " + corpus_ + " --out x.seqs --masked-lm-prob 1", "--masked-lm-prob"},
      {"prepare " + corpus_ + " --out x.seqs --dupe-factor 0", "--dupe-factor"},
      {"finetune --train a --dev b --init c --out d --epochs 0", "--epochs"},
      {"finetune --train a --dev b --init c --out d --lr -1", "--lr"},
      {"eval --model a --data b --batch-rows 0", "--batch-rows"},
      {"inspect " + seqs_ + " --examples -1", "--examples"},
      {"check-golden x --rtol-grad nan", "--rtol-grad"},
  };
  for (const auto& [args, flag] : cases) {
    Result r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_NE(r.err.find(flag + ":"), std::string::npos) << args << " -> " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "x"));  // refused before any work
  Result help = run("pretrain --help");
  EXPECT_NE(help.out.find("--warmup INT:in [0, "), std::string::npos) << help.out;
}

// 4. Invalid UTF-8 is an error naming file, line and byte, unless asked to skip such lines.
TEST_F(Reliability, InvalidUtf8IsAnErrorNamingFileLineAndByte) {
  const fs::path bad = write("bad.txt", "the city .\nthe king .\n\nCaf\xe9 is here .\nthe war .\n");
  Result r = run("prepare " + bad.string() + " --out " + (dir_ / "b.seqs").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("bad.txt:4: invalid UTF-8 at byte 26 (0xe9)"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "b.seqs"));
  Result skip = run("prepare " + bad.string() + " --out " + (dir_ / "b.seqs").string() +
                    " --skip-invalid-utf8 --max-seq-len 16");
  EXPECT_EQ(skip.code, 0) << skip.err;
  EXPECT_NE(skip.err.find("skipped 1 lines that are not valid UTF-8"), std::string::npos)
      << skip.err;
  Result tsv =
      run("finetune --train " + write("t.tsv", "label\tsentence\na\tgood\nb\tna\xefve\n").string() +
          " --dev x --init y --out " + (dir_ / "ft").string());
  EXPECT_EQ(tsv.code, 2);
  EXPECT_NE(tsv.err.find("t.tsv:3: invalid UTF-8"), std::string::npos) << tsv.err;
  Result tok = run("tokenize " + bad.string());
  EXPECT_EQ(tok.code, 2);
  EXPECT_NE(tok.err.find("bad.txt:4"), std::string::npos) << tok.err;
  // Overlong forms, surrogates and code points past U+10FFFF are ill-formed too.
  for (const char* s : {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"})
    EXPECT_NE(data::invalid_utf8_offset(s), data::kValidUtf8) << s;
  EXPECT_EQ(data::invalid_utf8_offset("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            data::kValidUtf8);
  // The demo corpus repairs its few Windows-1252 bytes instead (GCIDE's 0x92 for ’).
  EXPECT_EQ(data::repair_cp1252_bytes("market\x92s caf\xe9"), "market\xe2\x80\x99s caf\xc3\xa9");
  EXPECT_EQ(data::repair_cp1252_bytes("caf\xc3\xa9"), "caf\xc3\xa9");
}

// 5. The held-out split is by document, before duplication: no held-out 12-gram occurs in the
// training part (it was 88.9% when the split took the file's last sequences).
TEST_F(Reliability, HeldOutSequencesShareNoTextWithTraining) {
  const std::string s5 = (dir_ / "d5.seqs").string();
  ASSERT_EQ(run("prepare " + corpus_ + " --out " + s5 +
                " --max-seq-len 64 --dupe-factor 5 --eval-fraction 0.1")
                .code,
            0);
  data::SequencesFile f = data::read_sequences(s5);
  ASSERT_TRUE(f.has_heldout_split());
  const size_t n = 12;
  auto grams = [&](size_t begin, size_t end) {
    std::set<std::vector<int32_t>> g;
    for (size_t i = begin; i < end; ++i) {
      const int32_t* t = f.tokens.data() + f.token_offsets[i];
      const size_t L = static_cast<size_t>(f.length(i));
      for (size_t k = 0; k + n <= L; ++k) {
        std::vector<int32_t> w(t + k, t + k + n);
        if (std::find(w.begin(), w.end(), 102) == w.end()) g.insert(w);  // not across [SEP]
      }
    }
    return g;
  };
  auto train = grams(0, f.heldout_begin), held = grams(f.heldout_begin, f.size());
  ASSERT_GT(held.size(), 100u);
  size_t shared = 0;
  for (const auto& g : held) shared += train.count(g);
  EXPECT_LT(static_cast<double>(shared) / static_cast<double>(held.size()), 0.01)
      << shared << " of " << held.size();
  // pretrain evaluates on exactly that split, and refuses a second one.
  Result r = run(train_args("run", "--steps 2 --eval-fraction 0.1"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("records its own held-out split"), std::string::npos) << r.err;
}

// 6. packbert loads no BLAS library, starts under a small address-space limit, and reports an
// allocation that does not fit as one line (exit 2), not "std::bad_alloc" (exit 1).
TEST_F(Reliability, SmallMemoryLimitsGiveOneLineErrors) {
  if (kSanitized) GTEST_SKIP() << "address-space limits and ASan's shadow memory do not mix";
  Result version = run("--version", "ulimit -v 300000; timeout 20");
  EXPECT_EQ(version.code, 0) << version.err;
  const std::string libs = (dir_ / "libs").string();
  ASSERT_EQ(std::system(("ldd " + std::string(PACKBERT_BINARY) + " >" + libs).c_str()), 0);
  EXPECT_NE(slurp(libs).find("libdnnl"), std::string::npos);
  EXPECT_EQ(slurp(libs).find("blas"), std::string::npos) << slurp(libs);
  Result big = run(train_args("big", "--preset large"), "ulimit -v 1500000; timeout 120");
  EXPECT_EQ(big.code, 2) << big.err;
  EXPECT_NE(big.err.find("out of memory: could not allocate"), std::string::npos) << big.err;
  EXPECT_NE(big.err.find(" for "), std::string::npos) << big.err;
  EXPECT_EQ(std::count(big.err.begin(), big.err.end(), '\n'), 1) << big.err;
  // A tiny run under ever smaller limits: an error of packbert's names what ran out, with its
  // size when it is memory, never "an allocation failed" or an internal error. (Below some
  // limit libgomp or oneDNN fail inside themselves: exit 1 or a crash, docs/RELIABILITY.md.)
  for (int kb = 400000; kb >= 100000; kb -= 25000) {
    Result r = run(train_args("tiny" + std::to_string(kb), "--steps 2"),
                   "ulimit -v " + std::to_string(kb) + "; timeout 60");
    std::cout << "ulimit -v " << kb << ": exit " << r.code << "\n";
    if (r.code != 2) continue;
    EXPECT_EQ(r.err.find("an allocation failed"), std::string::npos) << kb << ": " << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << kb << ": " << r.err;
    // One error line, the last (the run's header and progress lines may come before it: where
    // the limit bites depends on the machine's load).
    const size_t error = r.err.find("packbert: error: ");
    EXPECT_NE(error, std::string::npos) << kb << ": " << r.err;
    EXPECT_EQ(r.err.find('\n', error), r.err.size() - 1) << kb << ": " << r.err;
    EXPECT_EQ(r.err.find("packbert: error: ", error + 1), std::string::npos) << kb << ": " << r.err;
  }
}

// 7 + kill -9 during a step: resume cuts metrics.jsonl back to the checkpoint and continues
// bit-exactly.
TEST_F(Reliability, KillDuringAStepResumesBitExactlyWithOneRecordPerStep) {
  ASSERT_EQ(run(train_args("full")).code, 0);
  Result killed = run(train_args("run"), "PACKBERT_CRASH_AT=step:6");
  EXPECT_EQ(killed.code, 128 + SIGKILL) << killed.err;
  EXPECT_EQ(metrics("run").back()["step"], 6);  // steps 5 and 6 logged, checkpoint at 4
  Result resumed = run(train_args("run", "--resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  expect_same_tensors(checkpoint("run"), checkpoint("full"));
  std::vector<int64_t> steps;
  for (const json& r : metrics("run"))
    if (r["type"] == "step") steps.push_back(r["step"]);
  std::vector<int64_t> want(12);
  for (int i = 0; i < 12; ++i) want[i] = i + 1;
  EXPECT_EQ(steps, want);
}

// kill -9 halfway through writing a checkpoint: the previous one is intact, the temporary file
// is removed at the next start, and the resumed run is bit-exact.
TEST_F(Reliability, KillDuringACheckpointWriteKeepsThePreviousOne) {
  ASSERT_EQ(run(train_args("full")).code, 0);
  // Atomic writes of a run: checkpoint 4 is the 1st, best.safetensors at the evaluation of step 6
  // the 2nd, checkpoint 8 the 3rd.
  Result killed = run(train_args("run"), "PACKBERT_CRASH_AT=write:3");
  EXPECT_NE(killed.code, 0);
  bool stale = false;
  for (const auto& e : fs::directory_iterator(dir_ / "run"))
    stale |= e.path().filename().string().find(".tmp.") != std::string::npos;
  EXPECT_TRUE(stale) << "the crash was to leave a half-written temporary file";
  // A user's file that merely looks like a temporary is not packbert's to remove.
  write("run/notes.txt.tmp.999999", "mine");
  io::SafetensorsFile c = io::SafetensorsFile::read(checkpoint("run"));
  EXPECT_EQ(json::parse(c.metadata().at("packbert"))["step"], 4);
  Result resumed = run(train_args("run", "--resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  for (const auto& e : fs::directory_iterator(dir_ / "run"))
    if (e.path().filename() != "notes.txt.tmp.999999") {
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
    }
  EXPECT_EQ(slurp(dir_ / "run" / "notes.txt.tmp.999999"), "mine");
  expect_same_tensors(checkpoint("run"), checkpoint("full"));
}

// 11. SIGINT and SIGTERM: a checkpoint of the step reached, exit 130 / 143 (so `pretrain &&
// export` does not export an unfinished model), and --resume continues bit-exactly.
TEST_F(Reliability, SignalsCheckpointExit130Or143AndResumeBitExactly) {
  ASSERT_EQ(run(train_args("full", "--skip-outliers 6")).code, 0);
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  for (int sig : {SIGINT, SIGTERM}) {
    const std::string out = sig == SIGINT ? "int" : "term";
    pid_t pid = spawn(train_args(out, "--skip-outliers 6"));
    wait_for_step(out, 1 + static_cast<int64_t>(rng() % 9));
    ::kill(pid, sig);
    EXPECT_EQ(wait_exit(pid), 128 + sig) << slurp(dir_ / "bg.err");
    EXPECT_NE(
        slurp(dir_ / "bg.err").find(sig == SIGINT ? "stopped by SIGINT" : "stopped by SIGTERM"),
        std::string::npos)
        << slurp(dir_ / "bg.err");
    Result resumed = run(train_args(out, "--skip-outliers 6 --resume"));
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    expect_same_tensors(checkpoint(out), checkpoint("full"));
  }
}

// 8. Checksums are the published FNV-1a 64; version 1 files (the old basis) are still read.
TEST_F(Reliability, ChecksumIsPublishedFnv1aAndVersion1FilesStillRead) {
  EXPECT_EQ(io::fnv1a("a", 1), 0xaf63dc4c8601ec8cULL);  // the FNV-1a 64 test vector
  EXPECT_EQ(io::fnv1a("foobar", 6), 0x85944171f73967e8ULL);
  std::string v2 = slurp(seqs_);
  uint64_t recorded;
  std::memcpy(&recorded, v2.data() + 56, 8);
  EXPECT_EQ(recorded, io::fnv1a(v2.data() + 72, v2.size() - 72));
  // The same data as a version 1 file: 64-byte header, old basis for checksum and vocabulary.
  data::Vocab vocab = data::Vocab::load(PACKBERT_SOURCE_VOCAB);
  std::string v1 = v2.substr(0, 64) + v2.substr(72);
  const uint32_t one = 1, header = 64;
  std::memcpy(v1.data() + 8, &one, 4);
  std::memcpy(v1.data() + 12, &header, 4);
  const uint64_t fp = vocab.fingerprint(1),
                 sum = io::fnv1a(v1.data() + 64, v1.size() - 64, io::kFnvOffsetBasisV1);
  std::memcpy(v1.data() + 48, &fp, 8);
  std::memcpy(v1.data() + 56, &sum, 8);
  const fs::path old = write("old.seqs", v1);
  data::SequencesFile a = data::read_sequences(seqs_), b = data::read_sequences(old.string());
  EXPECT_EQ(b.format_version, 1u);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_TRUE(b.made_with(vocab));
  EXPECT_FALSE(b.has_heldout_split());
  Result ins = run("inspect " + old.string() + " --vocab " + PACKBERT_SOURCE_VOCAB);
  EXPECT_EQ(ins.code, 0) << ins.err;
}

// 10 + 13. Files named wrongly get the real reason.
TEST_F(Reliability, MessagesNameTheRealProblem) {
  fs::path other = write("other_vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n");
  Result ins = run("inspect " + seqs_ + " --vocab " + other.string());
  EXPECT_EQ(ins.code, 2);
  EXPECT_NE(ins.err.find("not the vocabulary"), std::string::npos) << ins.err;
  Result missing = run("inspect " + (dir_ / "nope.seqs").string());
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("nope.seqs: cannot open"), std::string::npos) << missing.err;
  Result magic_only = run("inspect " + write("m.seqs", slurp(seqs_).substr(0, 8)).string());
  EXPECT_EQ(magic_only.code, 2);
  EXPECT_NE(magic_only.err.find("truncated"), std::string::npos) << magic_only.err;
  Result no_data = run("pretrain --data " + (dir_ / "gone.seqs").string() + " --out " +
                       (dir_ / "run").string() + " --preset tiny --steps 1");
  EXPECT_EQ(no_data.code, 2);
  EXPECT_NE(no_data.err.find("gone.seqs: cannot open"), std::string::npos) << no_data.err;
}

// 12. Steps count from 1 everywhere; elapsed is training time on one clock and never goes back.
TEST_F(Reliability, MetricsCountStepsFromOneOnOneClock) {
  ASSERT_EQ(run(train_args("run")).code, 0);
  double last = 0;
  int64_t step = 0;
  for (const json& r : metrics("run")) {
    EXPECT_GE(r["elapsed"].get<double>(), last) << r.dump();
    last = r["elapsed"];
    if (r["type"] == "step") {
      EXPECT_EQ(r["step"], ++step);
    } else {
      EXPECT_EQ(r["step"], step);  // an evaluation after the step of that number
    }
  }
  EXPECT_EQ(step, 12);
}

// Round 3, 1. No command writes over one of its inputs, whatever the path looks like.
TEST_F(Reliability, OutputsNeverReplaceInputs) {
  const std::string text = slurp(corpus_);
  auto refused = [&](const std::string& args, const std::string& flag) {
    Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("an output never replaces an input"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  refused("prepare " + corpus_ + " --out " + corpus_, "--out");
  fs::create_symlink(corpus_, dir_ / "link.seqs");  // the same file under another name
  refused("prepare " + corpus_ + " --out " + (dir_ / "link.seqs").string(), "--out");
  refused("prepare " + corpus_ + " --out " + (dir_ / "corpus.seqs").string() + " --vocab " +
              write("corpus.hist", slurp(PACKBERT_SOURCE_VOCAB)).string(),
          "histogram");  // prepare's .hist beside --out is an output too
  EXPECT_EQ(slurp(corpus_), text);
  const std::string seqs = slurp(seqs_);
  refused("pack " + seqs_ + " --out " + seqs_, "--out");
  EXPECT_EQ(slurp(seqs_), seqs);

  ASSERT_EQ(run(train_args("run", "--steps 4")).code, 0);
  const std::string ckpt = slurp(checkpoint("run"));
  // export and convert replace --out whole: it must not hold what they read.
  refused("export --checkpoint " + checkpoint("run") + " --out " + (dir_ / "run").string() +
              " --overwrite",
          "--out");
  refused("convert " + checkpoint("run") + " --out " + (dir_ / "run").string() + " --overwrite",
          "--out");
  // pretrain: an input that is one of the files the run writes (or rotates away) in --out.
  Result init = run(train_args("run", "--overwrite --init " + checkpoint("run")));
  EXPECT_EQ(init.code, 2) << init.err;
  EXPECT_NE(init.err.find("--init"), std::string::npos) << init.err;
  EXPECT_EQ(slurp(checkpoint("run")), ckpt);
}

// Round 3, 2. A run that diverges stops before it writes; the kept checkpoints and the best one
// are there to go back to, and the best one evaluates as it did.
TEST_F(Reliability, DivergenceStopsTheRunAndKeepsEarlierAndBestCheckpoints) {
  ASSERT_EQ(run(train_args("run")).code, 0);
  const std::string last = slurp(checkpoint("run"));
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoint-8.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "run" / "checkpoint-4.safetensors"));  // --keep-checkpoints 2
  const std::string best_path = (dir_ / "run" / "best.safetensors").string();
  ASSERT_TRUE(fs::exists(best_path));
  int64_t best_step = -1, checkpoints = 0;
  for (const json& r : metrics("run")) {
    if (r["type"] == "best") best_step = r["step"];
    if (r["type"] == "checkpoint") ++checkpoints;
  }
  EXPECT_GT(best_step, 0);
  EXPECT_EQ(checkpoints, 3);  // steps 4, 8 and 12, each a record naming the files kept
  const std::string best = slurp(best_path);
  Result before = run("eval --model " + best_path + " --data " + seqs_);
  ASSERT_EQ(before.code, 0) << before.err;

  Result wild = run(train_args("run", "--resume --steps 60 --lr 10 --clip 0 --skip-outliers 6"));
  EXPECT_EQ(wild.code, 2) << wild.err;
  EXPECT_NE(wild.err.find("diverged"), std::string::npos) << wild.err;
  EXPECT_NE(wild.err.find("no checkpoint written"), std::string::npos) << wild.err;
  EXPECT_NE(wild.err.find("best.safetensors (step " + std::to_string(best_step) + ")"),
            std::string::npos)
      << wild.err;
  EXPECT_EQ(slurp(checkpoint("run")), last);
  EXPECT_EQ(slurp(best_path), best);
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoint-8.safetensors"));
  Result after = run("eval --model " + best_path + " --data " + seqs_);
  ASSERT_EQ(after.code, 0) << after.err;
  EXPECT_EQ(after.out, before.out);
  // #59 item 7: best.safetensors is the whole state at that evaluation (moments and counters
  // too), so a run that drifted off below the divergence factor goes on from its best point.
  const io::SafetensorsFile best_file = io::SafetensorsFile::read(best_path);
  EXPECT_TRUE(best_file.has("optimizer.m.bert.embeddings.word_embeddings.weight"));
  EXPECT_TRUE(best_file.has("optimizer.v.bert.encoder.layer.0.output.dense.weight"));
  EXPECT_EQ(json::parse(best_file.metadata().at("packbert"))["best"]["step"], best_step);
  Result from_best =
      run(train_args("again", "--init " + best_path + " --init-optimizer carry --steps 2"));
  EXPECT_EQ(from_best.code, 0) << from_best.err;
  // The run resumes from the checkpoint it kept, and with the guard off the wild run goes on.
  Result off = run(train_args("run", "--resume --steps 14 --lr 10 --clip 0 --divergence-factor 0"));
  EXPECT_EQ(off.err.find("diverged"), std::string::npos) << off.err;
}

// Round 3, 2b. --keep-checkpoints K keeps the latest K by step; --overwrite clears an earlier
// run's; --resume continues from the latest.
TEST_F(Reliability, KeepsTheLastCheckpointsByStepAndResumesFromTheLatest) {
  ASSERT_EQ(run(train_args("full")).code, 0);
  ASSERT_EQ(run(train_args("run", "--steps 8 --keep-checkpoints 3")).code, 0);
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoint-4.safetensors"));
  Result resumed = run(train_args("run", "--resume --keep-checkpoints 3"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  expect_same_tensors(checkpoint("run"), checkpoint("full"));
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir_ / "run")) files.insert(e.path().filename());
  EXPECT_EQ(files, (std::set<std::string>{"checkpoint.safetensors", "checkpoint-4.safetensors",
                                          "checkpoint-8.safetensors", "best.safetensors",
                                          "metrics.jsonl", "trainer_state.json"}));
  // trainer_state.json speaks for the latest checkpoint.
  const json state = json::parse(slurp(dir_ / "run" / "trainer_state.json"));
  EXPECT_EQ(
      state["global_step"],
      json::parse(io::SafetensorsFile::read(checkpoint("run")).metadata().at("packbert"))["step"]);
  EXPECT_EQ(
      json::parse(io::SafetensorsFile::read((dir_ / "run" / "checkpoint-8.safetensors").string())
                      .metadata()
                      .at("packbert"))["step"],
      8);
  ASSERT_EQ(run(train_args("run", "--steps 2 --overwrite")).code, 0);
  files.clear();
  for (const auto& e : fs::directory_iterator(dir_ / "run")) files.insert(e.path().filename());
  EXPECT_EQ(files, (std::set<std::string>{"checkpoint.safetensors", "best.safetensors",
                                          "metrics.jsonl", "trainer_state.json"}));
  EXPECT_EQ(json::parse(slurp(dir_ / "run" / "trainer_state.json"))["global_step"], 2);
}

// Round 3, 4. A safetensors file whose header length begins with 0x80 (a pickle's first byte) or
// "PK" (a zip's) is read as safetensors: about 1 file in 32 has one of them.
TEST_F(Reliability, SafetensorsWhoseLengthLooksLikeAPickleOrAZipAreRead) {
  ASSERT_EQ(run(train_args("run", "--steps 2")).code, 0);
  const fs::path hf = dir_ / "hf";
  ASSERT_EQ(run("export --checkpoint " + checkpoint("run") + " --out " + hf.string()).code, 0);
  io::SafetensorsFile f = io::SafetensorsFile::read((hf / "model.safetensors").string());
  std::vector<io::TensorToWrite> tensors;
  for (const auto& [name, e] : f.tensors()) {
    const std::string_view raw = f.raw(name);
    tensors.push_back({name, e.dtype, e.shape, raw.data(), raw.size()});
  }
  for (const auto& [low, mask] :
       {std::pair{uint64_t{0x80}, uint64_t{0xff}}, std::pair{uint64_t{0x4b50}, uint64_t{0xffff}}}) {
    // Metadata padding that brings the header's length (8-aligned) to `low` in its low bytes.
    std::string bytes = io::serialize_safetensors(tensors, {{"format", "pt"}, {"pad", ""}});
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    while (bytes[8 + n - 1] == ' ') --n;  // the unpadded header
    const size_t pad = static_cast<size_t>((low - n) & mask);
    bytes = io::serialize_safetensors(tensors, {{"format", "pt"}, {"pad", std::string(pad, 'x')}});
    std::memcpy(&n, bytes.data(), 8);
    ASSERT_EQ(n & mask, low);
    const fs::path d = dir_ / ("m" + std::to_string(low));
    fs::create_directories(d);
    std::ofstream(d / "model.safetensors", std::ios::binary) << bytes;
    fs::copy_file(hf / "config.json", d / "config.json");
    EXPECT_EQ(static_cast<unsigned char>(bytes[0]), low & 0xff);
    Result r = run("convert " + d.string() + " --out " + (d / "out").string());
    EXPECT_EQ(r.code, 0) << r.err;
    Result ev = run("eval --model " + d.string() + " --data " + seqs_);
    EXPECT_EQ(ev.code, 0) << ev.err;
  }
}

// Round 3, 10b. A file system without room for one checkpoint is refused before training (it
// was found only at the end); one without room for the kept ones gets a warning.
TEST_F(Reliability, AFileSystemWithoutRoomForACheckpointIsRefusedBeforeTraining) {
  const fs::path mnt = dir_ / "small_fs";
  fs::create_directories(mnt);
  if (std::system(("mount -t tmpfs -o size=4m tmpfs " + mnt.string() + " 2>/dev/null").c_str()))
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root)";
  struct Unmount {
    std::string at;
    ~Unmount() { (void)std::system(("umount " + at).c_str()); }
  } unmount{mnt.string()};
  const std::string out = (mnt / "run").string();
  Result r = run("pretrain --data " + seqs_ + " --packs " + packs_ + " --out " + out +
                 " --preset tiny --steps 2 --batch-rows 8");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("one checkpoint of this model needs"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

// Round 3, 5. --resume refuses every flag that contradicts the checkpoint, naming it.
TEST_F(Reliability, ResumeRefusesFlagsThatContradictTheCheckpoint) {
  ASSERT_EQ(run(train_args("run")).code, 0);
  const std::string ckpt = slurp(checkpoint("run"));
  const std::string init = (dir_ / "init").string();
  ASSERT_EQ(run("export --checkpoint " + checkpoint("run") + " --out " + init).code, 0);
  for (const auto& [extra, says] : std::vector<std::pair<std::string, std::string>>{
           {"--optimizer adamw --steps 20", "--optimizer lamb"},
           {"--preset mini --steps 20", "--preset"},
           {"--init " + init + " --steps 20", "--init"},
           {"--overwrite --steps 20", "--overwrite"},
           {"--seed 5 --steps 20", "--seed 1"},
           {"--steps 10", "already at step 12"},
           {"--steps 12", "already at step 12"}}) {
    std::string args = train_args("run", "--resume " + extra);
    Result r = run(args);
    EXPECT_EQ(r.code, 2) << extra << ": " << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << extra << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_EQ(slurp(checkpoint("run")), ckpt);
  // The same command line again, --preset included, is no contradiction.
  Result same = run(train_args("run", "--resume --steps 13"));
  EXPECT_EQ(same.code, 0) << same.err;
}

// Round 3, 6. prepare is linear in the length of a line: the one quadratic step (Google's
// truncate_seq_pair dropping tokens off the front of a vector) moves each token at most once,
// and drops the same tokens the reference does.
TEST(Pretraining, TruncatingAPairIsLinearAndDropsWhatGooglesRuleDrops) {
  auto reference = [](std::vector<int32_t> a, std::vector<int32_t> b, size_t max, data::Rng& rng) {
    while (a.size() + b.size() > max) {
      std::vector<int32_t>& t = a.size() > b.size() ? a : b;
      if (rng.uniform() < 0.5)
        t.erase(t.begin());
      else
        t.pop_back();
    }
    return std::pair{a, b};
  };
  for (auto [na, nb, max] : {std::tuple{7, 3, 5}, {100, 250, 61}, {3000, 10, 125}, {0, 40, 9}}) {
    std::vector<int32_t> a(static_cast<size_t>(na)), b(static_cast<size_t>(nb));
    std::iota(a.begin(), a.end(), 0);
    std::iota(b.begin(), b.end(), 100000);
    data::Rng r1(7), r2(7);
    const auto [wa, wb] = reference(a, b, static_cast<size_t>(max), r1);
    data::truncate_seq_pair(a, b, static_cast<size_t>(max), r2);
    EXPECT_EQ(a, wa);
    EXPECT_EQ(b, wb);
  }
  // One line of two million tokens: the work is the kept tokens, not tokens x drops.
  std::vector<int32_t> a(2'000'000, 1), b;
  data::Rng rng(1);
  EXPECT_LE(data::truncate_seq_pair(a, b, 125, rng), 125u);
}

// Round 3, 7. A model with non-finite weights: eval warns, export refuses; export --vocab checks
// the vocabulary's size.
TEST_F(Reliability, NonFiniteWeightsAreWarnedByEvalAndRefusedByExport) {
  ASSERT_EQ(run(train_args("run", "--steps 2")).code, 0);
  io::SafetensorsFile c = io::SafetensorsFile::read(checkpoint("run"));
  std::vector<std::vector<float>> keep;
  std::vector<io::TensorToWrite> tensors;
  for (const auto& [name, e] : c.tensors()) {
    if (e.dtype != "F32") continue;
    keep.push_back(c.floats(name));
    if (name == "bert.encoder.layer.0.output.dense.weight") keep.back()[3] = NAN;
    tensors.push_back({name, "F32", e.shape, keep.back().data(), keep.back().size() * 4});
  }
  const std::string nan = (dir_ / "nan.safetensors").string();
  io::write_safetensors(nan, tensors, c.metadata());
  Result ev = run("eval --model " + nan + " --data " + seqs_);
  EXPECT_NE(ev.err.find("warning"), std::string::npos) << ev.err;
  EXPECT_NE(ev.err.find("bert.encoder.layer.0.output.dense.weight"), std::string::npos) << ev.err;
  Result ex = run("export --checkpoint " + nan + " --out " + (dir_ / "x").string());
  EXPECT_EQ(ex.code, 2) << ex.err;
  EXPECT_NE(ex.err.find("not finite"), std::string::npos) << ex.err;
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  // #59 item 6: pre-training from such weights is refused before a step, nothing written.
  Result init = run("pretrain --data " + seqs_ + " --init " + nan + " --out " +
                    (dir_ / "p").string() + " --steps 2 --batch-rows 4");
  EXPECT_EQ(init.code, 2) << init.err;
  EXPECT_NE(init.err.find("not finite"), std::string::npos) << init.err;
  EXPECT_EQ(init.err.find("step 1"), std::string::npos) << init.err;
  EXPECT_FALSE(fs::exists(dir_ / "p"));
  // A finite weight fp16 cannot hold (above 65,504) is refused by --dtype fp16, not made inf;
  // bf16 holds it.
  for (auto& t : keep)
    for (float& v : t)
      if (std::isnan(v)) v = 1e5f;
  io::write_safetensors(nan, tensors, c.metadata());
  Result f16 =
      run("export --checkpoint " + nan + " --out " + (dir_ / "h").string() + " --dtype fp16");
  EXPECT_EQ(f16.code, 2) << f16.err;
  EXPECT_NE(f16.err.find("bert.encoder.layer.0.output.dense.weight"), std::string::npos) << f16.err;
  EXPECT_FALSE(fs::exists(dir_ / "h"));
  EXPECT_EQ(
      run("export --checkpoint " + nan + " --out " + (dir_ / "b").string() + " --dtype bf16").code,
      0);
  Result vocab =
      run("export --checkpoint " + checkpoint("run") + " --out " + (dir_ / "y").string() +
          " --vocab " + write("short.txt", slurp(PACKBERT_SOURCE_VOCAB).substr(0, 5000)).string());
  EXPECT_EQ(vocab.code, 2) << vocab.err;
  EXPECT_NE(vocab.err.find(" tokens, but the model's vocab_size is 30522"), std::string::npos)
      << vocab.err;
  EXPECT_FALSE(fs::exists(dir_ / "y"));
}

// Round 3, 8. A masked position listed twice (it would count twice in the loss) and a vocabulary
// that is not UTF-8 are refused, naming where.
TEST_F(Reliability, DuplicateMaskedPositionsAndNonUtf8VocabulariesAreRefused) {
  data::SequencesFile f = data::read_sequences(seqs_);
  size_t i = 0;
  while (f.mlm_offsets[i + 1] - f.mlm_offsets[i] < 2) ++i;
  f.mlm_positions[f.mlm_offsets[i] + 1] = f.mlm_positions[f.mlm_offsets[i]];
  const std::string dup = (dir_ / "dup.seqs").string();
  data::write_sequences(dup, f);  // a valid checksum over the bad content
  Result r = run("inspect " + dup);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("sequence " + std::to_string(i) + " masks position"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("twice"), std::string::npos) << r.err;
  // #59 item 6: a masked position's input id outside the vocabulary is refused when the file is
  // read (by inspect too, which makes no batch), naming the file, the sequence and the id.
  f = data::read_sequences(seqs_);
  i = 0;
  while (f.mlm_offsets[i + 1] == f.mlm_offsets[i]) ++i;
  f.mlm_inputs[f.mlm_offsets[i]] = f.vocab_size + 7;
  const std::string wild = (dir_ / "wild.seqs").string();
  data::write_sequences(wild, f);
  for (const std::string& cmd :
       {"inspect " + wild,
        train_args("w", "").replace(train_args("w", "").find(seqs_), seqs_.size(), wild)}) {
    Result m = run(cmd);
    EXPECT_EQ(m.code, 2) << cmd << "\n" << m.err;
    EXPECT_NE(m.err.find("wild.seqs: sequence " + std::to_string(i) + " gives masked position"),
              std::string::npos)
        << m.err;
    EXPECT_NE(m.err.find("the id " + std::to_string(f.vocab_size + 7)), std::string::npos) << m.err;
  }
  std::string vocab = slurp(PACKBERT_SOURCE_VOCAB);
  vocab.insert(vocab.find("\nthe\n") + 1, "\xff");
  Result v = run("tokenize --vocab " + write("v.txt", vocab).string() + " " + corpus_);
  EXPECT_EQ(v.code, 2);
  EXPECT_NE(v.err.find("v.txt:"), std::string::npos) << v.err;
  EXPECT_NE(v.err.find("invalid UTF-8"), std::string::npos) << v.err;
}

// Round 3, 9. JSON numbers out of range are one-line input errors, wherever JSON is read.
TEST_F(Reliability, JsonNumbersOutOfRangeAreInputErrors) {
  const std::string huge(401, '9');
  for (const auto& [args, file] : std::vector<std::pair<std::string, std::string>>{
           {"eval --task squad --model M --data F", "{\"version\": " + huge + ", \"data\": []}"},
           {"eval --task squad --model M --data F", "{\"data\": [], \"x\": 1e999}"},
           {"plan --tokens 128 --sequences 2 --config F", "{\"hidden_size\": " + huge + "}"},
           {"plan --tokens 128 --sequences 2 --config F", "{\"hidden_size\": 1099511627776}"},
           {"pretrain --data S --out O --config F", "{\"num_hidden_layers\": -1e400}"}}) {
    std::string a = args;
    const std::string path = write("f.json", file).string();
    a.replace(a.find(" F"), 2, " " + path);
    if (a.find(" M ") != std::string::npos) a.replace(a.find(" M "), 3, " " + path + " ");
    if (a.find(" S ") != std::string::npos) a.replace(a.find(" S "), 3, " " + seqs_ + " ");
    if (a.find(" O ") != std::string::npos)
      a.replace(a.find(" O "), 3, " " + (dir_ / "o").string() + " ");
    Result r = run(a);
    EXPECT_EQ(r.code, 2) << a << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("f.json"), std::string::npos) << a << ": " << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "o"));
  }
}

// Round 3, 10. Nothing is created before every input is checked.
TEST_F(Reliability, BadInputsLeaveNoOutputDirectory) {
  for (const std::string& args :
       {train_args("a", "--data " + (dir_ / "none.seqs").string()),
        train_args("b", "--vocab " + (dir_ / "none.txt").string()),
        train_args("c", "--packs " + corpus_),
        train_args("d", "--init " + (dir_ / "none").string()), train_args("e", "--resume"),
        "demo --vocab " + (dir_ / "none.txt").string() + " --workdir " + (dir_ / "f").string()}) {
    Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
  }
  for (const char* out : {"a", "b", "c", "d", "e", "f"})
    EXPECT_FALSE(fs::exists(dir_ / out)) << out;
}

// #45: fine-tuning is resumable. kill -9 after a periodic save and SIGTERM mid-run both leave
// <out>.resume.safetensors (no model, no staging directory once resumed), and --resume ends
// with the uninterrupted run's model, byte for byte.
TEST_F(Reliability, FinetuneKilledOrSignalledResumesBitExactly) {
  ASSERT_EQ(run(train_args("run", "--steps 2")).code, 0);
  std::string tsv = "label\tsentence\n";
  for (int i = 0; i < 48; ++i)
    tsv += (i % 2 ? "a\tthe king of city " : "b\tthe war of ") + std::to_string(i) + "\n";
  const std::string data = write("t.tsv", tsv).string();
  auto args = [&](const std::string& out, const std::string& extra) {
    return "finetune --model " + checkpoint("run") + " --train " + data + " --dev " + data +
           " --out " + (dir_ / out).string() +
           " --epochs 2 --batch-rows 4 --no-pack --seed 3 --checkpoint-every 4 " + extra;
  };
  ASSERT_EQ(run(args("full", "")).code, 0);
  EXPECT_FALSE(fs::exists(dir_ / "full.resume.safetensors"));  // removed once the model is out
  const std::string want = slurp(dir_ / "full" / "model.safetensors");

  Result killed = run(args("killed", ""), "PACKBERT_CRASH_AT=step:9");
  EXPECT_EQ(killed.code, 128 + SIGKILL);
  EXPECT_TRUE(fs::exists(dir_ / "killed.resume.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "killed"));
  Result again = run(args("killed", ""));  // forgetting --resume is refused
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.err.find("continue it with --resume"), std::string::npos) << again.err;
  // #59 item 5: every flag that changes the result is refused on resume, naming the flag.
  for (const char* changed : {"--warmup 3", "--weight-decay 0.1", "--clip 0.5", "--decay-power 2",
                              "--cased", "--lr 1e-4", "--loss-scale 128", "--skip-outliers 4"}) {
    Result r = run(args("killed", std::string("--resume ") + changed));
    EXPECT_EQ(r.code, 2) << changed << ": " << r.err;
    const std::string flag = std::string(changed).substr(0, std::string(changed).find(' '));
    EXPECT_NE(r.err.find(flag), std::string::npos) << changed << ": " << r.err;
    EXPECT_TRUE(fs::exists(dir_ / "killed.resume.safetensors"));
  }
  Result resumed = run(args("killed", "--resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(slurp(dir_ / "killed" / "model.safetensors"), want);
  // metrics.jsonl holds the whole run, the records before the kill included: the same records
  // as the uninterrupted run's, its clock fields aside.
  auto records = [&](const std::string& out) {
    std::vector<nlohmann::json> r;
    std::istringstream in(slurp(dir_ / out / "metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      for (const char* clock : {"seconds", "elapsed", "comm_seconds", "eval_seconds"})
        j.erase(clock);
      r.push_back(j);
    }
    return r;
  };
  EXPECT_EQ(records("killed"), records("full"));
  for (const auto& e : fs::directory_iterator(dir_))  // no staging directory left behind
    EXPECT_EQ(e.path().filename().string().find("killed.partial."), std::string::npos);
  Result other = run(args("killed2", "--resume"));
  EXPECT_EQ(other.code, 2) << other.err;  // nothing to resume

  // SIGTERM once a few steps are done: exit 143, the state saved at that step.
  pid_t pid = spawn(args("term", "--logging-steps 1"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (slurp(dir_ / "bg.err").find("finetune: step 6/") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(pid, SIGTERM);
  const int code = wait_exit(pid);
  if (code == 0) GTEST_SKIP() << "the run finished before the signal";
  EXPECT_EQ(code, 128 + SIGTERM) << slurp(dir_ / "bg.err");
  EXPECT_NE(slurp(dir_ / "bg.err").find("stopped by SIGTERM"), std::string::npos);
  Result term = run(args("term", "--resume"));
  ASSERT_EQ(term.code, 0) << term.err;
  EXPECT_EQ(slurp(dir_ / "term" / "model.safetensors"), want);
}

// #59 item 6: a file-size limit (`ulimit -f`) ends a run with one line naming the file, exit 2,
// no temporary file left (not a silent SIGXFSZ); a reader that goes away (`2>&1 | head`) does not
// kill a fine-tuning run halfway: its model is published and no staging directory is left.
TEST_F(Reliability, FileSizeLimitsAndClosedPipesDoNotKillARunSilently) {
  Result r = run(train_args("small"), "ulimit -f 400;");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("packbert: error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  if (fs::exists(dir_ / "small")) {
    for (const auto& e : fs::directory_iterator(dir_ / "small"))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }

  ASSERT_EQ(run(train_args("run", "--steps 2")).code, 0);
  std::string tsv = "label\tsentence\n";
  for (int i = 0; i < 24; ++i)
    tsv += (i % 2 ? "a\tthe king of city " : "b\tthe war of ") + std::to_string(i) + "\n";
  const std::string data = write("t.tsv", tsv).string();
  const std::string out = (dir_ / "piped").string();
  const std::string cmd =
      std::string(PACKBERT_BINARY) + " finetune --model " + checkpoint("run") + " --train " + data +
      " --dev " + data + " --out " + out +
      " --epochs 1 --batch-rows 4 --logging-steps 1 2>&1 | head -c 1 >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find("piped.partial."), std::string::npos) << e.path();
}

// #45: a regression fine-tuning run (decimal labels) with --save-best killed in its second epoch,
// after the first epoch's dev scores and best weights were kept: --resume restores both and
// writes the uninterrupted run's model byte for byte.
TEST_F(Reliability, FinetuneRegressionWithSaveBestResumesBitExactlyAcrossAnEpoch) {
  ASSERT_EQ(run(train_args("run", "--steps 2")).code, 0);
  const std::string data = regression_tsv();
  auto args = [&](const std::string& out, const std::string& extra) {
    return "finetune --model " + checkpoint("run") + " --train " + data + " --dev " + data +
           " --out " + (dir_ / out).string() +
           " --epochs 3 --batch-rows 4 --no-pack --seed 3 --lr 1e-3 --save-best spearman " + extra;
  };
  Result full = run(args("full", ""));
  ASSERT_EQ(full.code, 0) << full.err;
  EXPECT_NE(full.out.find("dev Pearson"), std::string::npos) << full.out;
  const std::string want = slurp(dir_ / "full" / "model.safetensors");
  // 12 steps an epoch: killed after step 15, in the second epoch.
  Result killed = run(args("killed", ""), "PACKBERT_CRASH_AT=step:15");
  EXPECT_EQ(killed.code, 128 + SIGKILL);
  EXPECT_TRUE(fs::exists(dir_ / "killed.resume.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "killed.best.safetensors"));  // epoch 1's, the best so far
  Result resumed = run(args("killed", "--resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(slurp(dir_ / "killed" / "model.safetensors"), want);
  // The resumed run's table has every epoch's scores, the restored one included.
  for (const char* epoch : {"\n1 ", "\n2 ", "\n3 "})
    EXPECT_NE(("\n" + resumed.out).find(epoch), std::string::npos) << resumed.out;
  EXPECT_FALSE(fs::exists(dir_ / "killed.best.safetensors"));
}

// A run counted in steps, scored every few steps, stopping early and keeping checkpoint
// directories: killed between evaluations and resumed, it makes the same evaluations, stops at
// the same step, keeps the same checkpoints and writes the same model as the unbroken run.
TEST_F(Reliability, FinetuneWithEvalStepsAndEarlyStoppingResumesToTheSameDecisions) {
  ASSERT_EQ(run(train_args("run", "--steps 2")).code, 0);
  const std::string data = regression_tsv();
  auto args = [&](const std::string& out, const std::string& extra) {
    return "finetune --model " + checkpoint("run") + " --train " + data + " --dev " + data +
           " --out " + (dir_ / out).string() +
           " --steps 40 --eval-steps 4 --warmup-ratio 0.1 --batch-rows 4 --no-pack --seed 3 " +
           "--lr 1e-3 --save-best spearman --early-stopping-patience 2 --keep-checkpoints 1 " +
           extra;
  };
  Result full = run(args("full", ""));
  ASSERT_EQ(full.code, 0) << full.err;
  auto evaluations = [&](const std::string& out) {
    std::vector<std::pair<int64_t, double>> e;
    std::istringstream in(slurp(dir_ / out / "metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j["type"] == "eval") e.emplace_back(j["step"].get<int64_t>(), j["dev_spearman"]);
    }
    return e;
  };
  auto checkpoints = [&](const std::string& out) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_ / out))
      if (e.path().filename().string().starts_with("checkpoint-"))
        names.insert(e.path().filename());
    return names;
  };
  const auto want = evaluations("full");
  ASSERT_GE(want.size(), 3u);
  // Killed after step 6: after the evaluation of step 4 (and its save), before that of step 8.
  Result killed = run(args("killed", ""), "PACKBERT_CRASH_AT=step:6");
  EXPECT_EQ(killed.code, 128 + SIGKILL);
  EXPECT_TRUE(fs::exists(dir_ / "killed.checkpoints" / "checkpoint-4"));
  Result resumed = run(args("killed", "--resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(evaluations("killed"), want);
  EXPECT_EQ(checkpoints("killed"), checkpoints("full"));
  EXPECT_EQ(slurp(dir_ / "killed" / "model.safetensors"),
            slurp(dir_ / "full" / "model.safetensors"));
  const bool stopped = full.err.find("early stopping at step") != std::string::npos;
  EXPECT_EQ(resumed.err.find("early stopping at step") != std::string::npos, stopped);
  std::cout << "  " << want.size() << " evaluations, the last at step " << want.back().first
            << (stopped ? " (stopped early)" : "") << "\n";
  EXPECT_FALSE(fs::exists(dir_ / "killed.checkpoints"));
}

// 14. Google's rule by default: a chunk of one sentence gets a random B, never a cut sentence
// labelled as its own continuation.
TEST(Pretraining, OneSentenceChunksGetARandomNextUnlessAskedToSplit) {
  data::Vocab vocab = data::Vocab::load(PACKBERT_SOURCE_VOCAB);
  std::vector<data::Document> docs;
  for (int d = 0; d < 200; ++d) docs.push_back({{1996, 2103 + d % 50, 2001, 2312, 1012, 2008}});
  data::PretrainingOptions o;
  o.max_seq_len = 32;
  data::SequencesFile google = data::create_pretraining_data(docs, vocab, o);
  for (size_t i = 0; i < google.size(); ++i) EXPECT_EQ(google.nsp_label[i], 1) << i;
  o.split_single_sentence = true;
  data::SequencesFile split = data::create_pretraining_data(docs, vocab, o);
  int64_t random = 0;
  for (int8_t y : split.nsp_label) random += y;
  EXPECT_NEAR(static_cast<double>(random) / static_cast<double>(split.size()), 0.5, 0.1);
}

// 2. The z-score guard: an outlier against the recent history is skipped; ordinary noise is not.
TEST(GradNormGuard, SkipsOutliersAgainstRecentHistoryOnly) {
  train::GradNormGuard g;
  std::mt19937 rng(1);
  std::normal_distribution<double> noise(1.9, 0.1);
  EXPECT_FALSE(g.is_outlier(1e30, 6));  // no history yet: nothing to judge against
  for (int i = 0; i < 100; ++i) {
    const double x = noise(rng);
    EXPECT_FALSE(g.is_outlier(x, 6)) << x;
    g.accept(x);
  }
  EXPECT_TRUE(g.is_outlier(1.948e30, 6));
  EXPECT_TRUE(g.is_outlier(3.0, 6));
  EXPECT_FALSE(g.is_outlier(2.3, 6));
}

}  // namespace
}  // namespace packbert
