// Hostile input, as a table: every subcommand's file arguments given every kind of bad file, and
// every numeric flag values outside its range (docs/RELIABILITY.md). Each case must end with one
// line on stderr, exit 2, and nothing left behind (no file or directory created). Then hostile
// model files given to the importers, each refused within 10 s and 500 MB.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <thread>

#include "cli_runner.h"

extern char** environ;

namespace packbert {
namespace {

using testing::Result;
using testing::slurp;
namespace fs = std::filesystem;

// Every path under `dir` (the capture files of run() aside), to see what a case created.
std::set<std::string> tree(const fs::path& dir) {
  std::set<std::string> out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string rel = fs::relative(it->path(), dir).string();
    if (rel != "out" && rel != "err") out.insert(rel);
    if (it->is_symlink() || rel.starts_with("fixtures")) it.disable_recursion_pending();
  }
  return out;
}

class Hostile : public testing::CliTest {
 protected:
  // The valid files every case starts from: a corpus, its sequences and packs, a tiny
  // checkpoint, its Hugging Face export and a classification TSV.
  void make_fixtures() {
    fs::create_directories(dir_ / "fixtures");
    std::string text;
    for (int d = 0; d < 40; ++d) {
      for (int s = 0; s < 4; ++s)
        text +=
            "the king of the city was known as the first of " + std::to_string(d * 4 + s) + " .\n";
      text += "\n";
    }
    C = write("fixtures/c.txt", text).string();
    S = (dir_ / "fixtures" / "d.seqs").string();
    P = (dir_ / "fixtures" / "d.packs").string();
    Result r = run("prepare " + C + " --out " + S + " --max-seq-len 64 --pack optimal");
    ASSERT_EQ(r.code, 0) << r.err;
    r = run("pretrain --data " + S + " --packs " + P + " --out " +
            (dir_ / "fixtures/run").string() + " --preset tiny --steps 2 --batch-rows 8");
    ASSERT_EQ(r.code, 0) << r.err;
    CK = (dir_ / "fixtures/run/checkpoint.safetensors").string();
    HF = (dir_ / "fixtures/hf").string();
    r = run("export --checkpoint " + CK + " --out " + HF);
    ASSERT_EQ(r.code, 0) << r.err;
    std::string tsv = "label\tsentence\n";
    for (int i = 0; i < 12; ++i) tsv += (i % 2 ? "pos\tthe king of the city\n" : "neg\tthe war\n");
    T = write("fixtures/t.tsv", tsv).string();
    Q = std::string(PACKBERT_SOURCE_DIR) + "/tests/data/squad_tiny.json";
    G = std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/bert_h40.safetensors";
  }
  // The bad files, by kind.
  void make_bad_files() {
    fs::create_directories(dir_ / "fixtures/bad/adir");
    auto bad = [&](const std::string& kind, const std::string& bytes) {
      kinds[kind] = write("fixtures/bad/" + kind, bytes).string();
    };
    kinds["missing"] = (dir_ / "fixtures/bad/missing").string();
    kinds["directory"] = (dir_ / "fixtures/bad/adir").string();
    fs::create_symlink("/dev/zero", dir_ / "fixtures/bad/zero");
    kinds["zero"] = (dir_ / "fixtures/bad/zero").string();
    bad("empty", "");
    std::string garbage(4096, '\0');
    uint64_t x = 88172645463325252ULL;
    for (char& c : garbage) x ^= x << 13, x ^= x >> 7, x ^= x << 17, c = static_cast<char>(x);
    bad("garbage", garbage);
    bad("text", "hello world\n");
    const std::string seqs = slurp(S), ckpt = slurp(CK);
    bad("half_seqs", seqs.substr(0, seqs.size() / 2));
    bad("half_ckpt", ckpt.substr(0, ckpt.size() / 2));
    bad("pickle", std::string("\x80\x02}q\x00.", 6));
    bad("bad_utf8", "caf\xe9 au lait\nthe end\n");
    bad("json_overflow", "{\"data\": [], \"hidden_size\": 1e999, \"version\": 1}");
    // 40 GiB, sparse: a safetensors header of 8 bytes ("{}" padded) and nothing else written.
    const fs::path huge = dir_ / "fixtures/bad/huge";
    write("fixtures/bad/huge", std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
    fs::resize_file(huge, uint64_t{40} << 30);
    kinds["huge"] = huge.string();
    kinds["seqs"] = S;
    kinds["packs"] = P;
    // #59: a JSONL label nested 100,000 deep (a recursive walk of it overflows the stack), and a
    // FIFO no one writes to (an open before the file's kind is checked blocks forever).
    std::string deep = "{\"label\": " + std::string(100000, '[') + std::string(100000, ']') +
                       ", \"sentence\": \"the war\"}\n";
    kinds["deep.jsonl"] =
        write("fixtures/bad/deep.jsonl", "{\"label\": \"a\", \"sentence\": \"the king\"}\n" + deep)
            .string();
    const fs::path fifo = dir_ / "fixtures/bad/fifo";
    EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    kinds["fifo"] = fifo.string();
  }
  std::string C, S, P, CK, HF, T, Q, G;
  std::map<std::string, std::string> kinds;
};

// One case: `args` with {X} the bad file, {O} an output path that must not appear.
struct Case {
  std::string args;
  std::string kind;
};

TEST_F(Hostile, EveryBadInputIsOneLineExit2AndLeavesNothing) {
  make_fixtures();
  make_bad_files();
  const std::string O = (dir_ / "o").string();
  auto fill = [&](std::string s, const std::string& x) {
    const std::pair<const char*, std::string> vars[] = {
        {"{X}", x},   {"{O}", O},   {"{C}", C}, {"{S}", S}, {"{P}", P},
        {"{CK}", CK}, {"{HF}", HF}, {"{T}", T}, {"{Q}", Q}, {"{G}", G}};
    for (const auto& [k, v] : vars)
      for (size_t at; (at = s.find(k)) != std::string::npos;) s.replace(at, strlen(k), v);
    return s;
  };
  const std::vector<std::string> binary = {"missing", "directory", "empty",     "zero",
                                           "garbage", "text",      "half_seqs", "half_ckpt",
                                           "huge",    "pickle",    "fifo"};
  const std::vector<std::string> text = {"missing", "directory", "zero", "bad_utf8"};
  const std::vector<std::string> json = {"missing", "directory", "zero",         "bad_utf8",
                                         "empty",   "garbage",   "json_overflow"};
  std::vector<Case> cases;
  auto slot = [&](const std::string& args, std::vector<std::string> ks,
                  std::vector<std::string> more = {}) {
    ks.insert(ks.end(), more.begin(), more.end());
    for (const std::string& k : ks) cases.push_back({args, k});
  };
  // Sequences and packs files.
  slot("pack {X} --out {O}", binary, {"packs"});
  slot("inspect {X}", binary);
  slot("pretrain --data {X} --packs {P} --out {O} --preset tiny --steps 1", binary, {"packs"});
  slot("pretrain --data {S} --packs {X} --out {O} --preset tiny --steps 1", binary, {"seqs"});
  slot("eval --model {CK} --data {X}", binary, {"packs"});
  slot("eval --model {CK} --data {S} --packs {X}", binary, {"seqs"});
  // Models: checkpoints, safetensors, Hugging Face directories, PyTorch files.
  slot("export --checkpoint {X} --out {O}", binary, {"seqs"});
  slot("convert {X} --out {O}", binary, {"seqs"});
  slot("eval --model {X} --data {S}", binary, {"seqs"});
  slot("pretrain --data {S} --packs {P} --init {X} --out {O} --steps 1", binary, {"seqs"});
  slot("finetune --init {X} --train {T} --dev {T} --out {O} --epochs 1", binary, {"seqs"});
  slot("eval --task squad --model {X} --data {Q}", binary, {"seqs"});
  slot("check-golden {X}", binary, {"seqs"});
  // Text: corpora, vocabularies, TSV.
  slot("prepare {X} --out {O}", text);
  slot("prepare {C} --out {O} --vocab {X}", text, {"empty"});
  slot("tokenize {X}", text);
  slot("tokenize --vocab {X} {C}", text, {"empty"});
  slot("finetune --init {HF} --train {X} --dev {T} --out {O}", text, {"empty"});
  slot("finetune --init {HF} --train {T} --dev {X} --out {O}", text, {"empty", "deep.jsonl"});
  slot("finetune --init {HF} --train {X} --dev {T} --out {O}", {"deep.jsonl"});
  slot("eval --task classify --model {HF} --data {X}", {"deep.jsonl"});
  slot("export --checkpoint {CK} --out {O} --vocab {X}", text, {"empty", "text"});
  slot("pretrain --data {S} --packs {P} --out {O} --vocab {X} --steps 1", text, {"empty", "text"});
  slot("gcide-text --index {X} --out {O}", text);
  slot("gcide-text --dict {X} --out {O}", text);
  slot("demo --vocab {X} --workdir {O}", text, {"empty", "text"});
  // JSON: configs, SQuAD.
  slot("plan --config {X} --tokens 128 --sequences 2", json);
  slot("pretrain --data {S} --packs {P} --out {O} --config {X} --steps 1", json);
  slot("convert {HF}/model.safetensors --out {O} --config {X}", json);
  slot("eval --task squad --model {HF} --data {X}", json);
  slot("finetune --task squad --init {HF} --train {X} --dev {Q} --out {O}", json);
  slot("plot {X} --out {O}", json);

  // (pack and inspect also take a histogram, which may come down a pipe: a FIFO is read as one,
  // waiting for its writer as `cat` would.)
  std::erase_if(cases, [](const Case& c) {
    return c.kind == "fifo" && (c.args.starts_with("pack ") || c.args.starts_with("inspect "));
  });

  // Every numeric flag of every subcommand (read from its --help), outside its range.
  const std::vector<std::pair<std::string, std::string>> subcommands = {
      {"pretrain", "pretrain --data {S} --out {O}"},
      {"finetune", "finetune --train {T} --dev {T} --init {HF} --out {O}"},
      {"prepare", "prepare {C} --out {O}"},
      {"pack", "pack {S} --out {O}"},
      {"eval", "eval --model {CK} --data {S}"},
      {"plan", "plan --tokens 128 --sequences 2"},
      {"demo", "demo --workdir {O}"},
      {"inspect", "inspect {S}"},
      {"check-golden", "check-golden {G}"}};
  // A numeric option's help line: "  --name TYPE:in [low, high]...".
  auto numeric_flag = [](const std::string& line) -> std::string {
    const size_t dash = line.find_first_not_of(' ');
    if (dash == std::string::npos || line.compare(dash, 2, "--") != 0) return "";
    const size_t space = line.find(' ', dash);
    if (space == std::string::npos) return "";
    const size_t colon = line.find(":in [", space);
    if (colon == std::string::npos || colon == space + 1) return "";
    for (size_t i = space + 1; i < colon; ++i)
      if (line[i] < 'A' || line[i] > 'Z') return "";
    return line.substr(dash, space - dash);
  };
  size_t flags = 0;
  for (const auto& [sub, base] : subcommands) {
    std::istringstream help(run(sub + " --help").out);
    for (std::string line; std::getline(help, line);) {
      const std::string flag = numeric_flag(line);
      if (flag.empty()) continue;
      ++flags;
      for (const char* v : {"nan", "-1e300", "1e300"})
        cases.push_back({base + " " + flag + " " + v, "flag " + flag});
    }
  }
  EXPECT_GE(flags, 60u);

  ASSERT_GE(cases.size(), 350u);
  const std::set<std::string> before = tree(dir_);
  int passed = 0;
  for (const Case& c : cases) {
    const std::string args = fill(c.args, kinds.count(c.kind) ? kinds[c.kind] : "");
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = run(args, "timeout -s KILL 60");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool one_line = std::count(r.err.begin(), r.err.end(), '\n') == 1 &&
                          r.err.find("internal error") == std::string::npos;
    const std::set<std::string> after = tree(dir_);
    EXPECT_EQ(r.code, 2) << c.kind << ": " << args << "\n" << r.err;
    EXPECT_TRUE(one_line) << c.kind << ": " << args << "\n" << r.err;
    EXPECT_EQ(after, before) << c.kind << ": " << args << " left files behind";
    if (c.kind.starts_with("flag ")) {
      EXPECT_NE(r.err.find(c.kind.substr(5)), std::string::npos) << args << "\n" << r.err;
    }
    EXPECT_LT(s, 30) << args;
    passed += r.code == 2 && one_line && after == before;
    if (after != before) {  // clean up so one failure does not fail every later case
      for (const std::string& p : after)
        if (!before.count(p)) fs::remove_all(dir_ / p);
    }
  }
  std::cout << "bad-input matrix: " << passed << " of " << cases.size()
            << " cases one line, exit 2, nothing left\n";
}

// A hostile model file given to convert and eval: refused in under 10 s, in under 500 MB.
TEST_F(Hostile, HostileModelFilesAreRefusedQuicklyInLittleMemory) {
  make_fixtures();
  const std::string torch = std::string(PACKBERT_SOURCE_DIR) + "/tests/data/torch/";
  // name -> directory holding it as model.safetensors or pytorch_model.bin (with a config).
  std::vector<std::pair<std::string, fs::path>> files;
  const std::string config = slurp(HF + "/config.json");
  auto model_dir = [&](const std::string& name, const std::string& file, const std::string& bytes) {
    const fs::path d = dir_ / "hostile" / name;
    fs::create_directories(d);
    std::ofstream(d / file, std::ios::binary) << bytes;
    std::ofstream(d / "config.json") << config;
    files.push_back({name, d});
    return d;
  };
  auto le64 = [](uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i) & 0xff);
    return s;
  };
  auto safetensors = [&](const std::string& header, const std::string& data = "") {
    return le64(header.size()) + header + data;
  };
  model_dir("pickle-rce", "pytorch_model.bin", slurp(torch + "evil.bin"));
  model_dir("legacy-pickle", "pytorch_model.bin", slurp(torch + "legacy.bin"));  // another model's
  {
    const std::string legacy = slurp(torch + "legacy.bin");
    model_dir("legacy-truncated", "pytorch_model.bin", legacy.substr(0, legacy.size() * 2 / 3));
  }
  {  // A zip bomb: the torch file's entries marked deflated (method 8), sizes unchanged.
    std::string zip = slurp(torch + "half/pytorch_model.bin");
    for (size_t at = 0; (at = zip.find("PK\x01\x02", at)) != std::string::npos; at += 4)
      zip[at + 10] = 8;
    model_dir("zip-deflated", "pytorch_model.bin", zip);
  }
  {  // A torch zip cut in half: its directory lies past the end.
    const std::string zip = slurp(torch + "half/pytorch_model.bin");
    model_dir("zip-truncated", "pytorch_model.bin", zip.substr(0, zip.size() / 2));
  }
  model_dir("st-header-length-2^64", "model.safetensors", le64(~uint64_t{0}) + "{}");
  model_dir("st-shape-overflow", "model.safetensors",
            safetensors(R"({"bert.embeddings.word_embeddings.weight": {"dtype": "F32", )"
                        R"("shape": [4611686018427387904, 4], "data_offsets": [0, 16]}})",
                        std::string(16, '\0')));
  model_dir("st-offsets-past-end", "model.safetensors",
            safetensors(R"({"w": {"dtype": "F32", "shape": [2], )"
                        R"("data_offsets": [0, 18446744073709551615]}})"));
  model_dir("st-nested-header", "model.safetensors",
            safetensors(std::string(200000, '[') + std::string(200000, ']')));
  {  // Endless: the weights file is a link to /dev/zero, then to /dev/urandom.
    const fs::path d = model_dir("link-dev-zero", "config.json.tmp", "");
    fs::create_symlink("/dev/zero", d / "model.safetensors");
    const fs::path u = model_dir("link-dev-urandom", "config.json.tmp", "");
    fs::create_symlink("/dev/urandom", u / "pytorch_model.bin");
  }
  {  // Huge and sparse: 40 GiB behind a 16-byte header, and one declaring a 40 GiB embedding.
    const fs::path d = model_dir("sparse-40g-empty-header", "model.safetensors",
                                 safetensors(std::string("{}      ")));
    fs::resize_file(d / "model.safetensors", uint64_t{40} << 30);
    const std::string header =
        R"({"bert.embeddings.word_embeddings.weight": {"dtype": "F32", "shape": [2684354560, 4], )"
        R"("data_offsets": [0, 42949672960]}})";
    const fs::path h = model_dir("sparse-40g-declared", "model.safetensors", safetensors(header));
    fs::resize_file(h / "model.safetensors", 8 + header.size() + (uint64_t{40} << 30));
  }

  for (const auto& [name, d] : files) {
    for (const std::string& args :
         {"convert " + d.string() + " --out " + (dir_ / "out_model").string(),
          "eval --model " + d.string() + " --data " + S}) {
      std::vector<std::string> argv_s = {PACKBERT_BINARY};
      std::istringstream in(args);
      for (std::string a; in >> a;) argv_s.push_back(a);
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_addopen(&fa, 2, (dir_ / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
      posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
      pid_t pid = 0;
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_EQ(posix_spawn(&pid, PACKBERT_BINARY, &fa, nullptr, argv.data(), environ), 0);
      posix_spawn_file_actions_destroy(&fa);
      int status = 0;
      struct rusage ru {};
      bool killed = false;
      while (wait4(pid, &status, WNOHANG, &ru) == 0) {
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
          ::kill(pid, SIGKILL);
          wait4(pid, &status, 0, &ru);
          killed = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string err = slurp(dir_ / "err");
      EXPECT_FALSE(killed) << name << ": " << args << " ran past 10 s";
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << name << ": " << err;
      EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << name << ": " << err;
      EXPECT_LT(ru.ru_maxrss, 500 * 1024) << name << ": " << ru.ru_maxrss << " KB";
      EXPECT_FALSE(fs::exists(dir_ / "out_model")) << name;
      std::cout << name << ": " << s << " s, " << ru.ru_maxrss / 1024 << " MB: " << err;
    }
  }
}

}  // namespace
}  // namespace packbert
