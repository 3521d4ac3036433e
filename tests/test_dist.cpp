// Data parallelism end to end: `mpirun -np N packbert pretrain` against one process with N times
// the rows: the same final weights (to float summation order), bit-identical reruns, ZeRO-1,
// resume on another number of processes, the TCP path, agreement checks and a killed rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_runner.h"
#include "io/safetensors.h"
#include "kernels/cpu_features.h"
#include "model/params.h"
#include "train/trainer.h"

namespace packbert {
namespace {

using testing::Result;
using testing::slurp;
namespace fs = std::filesystem;

// mpirun with what every test here passes it: run as root too, one OpenMP thread a process, no
// binding (Open MPI binds each of <= 2 processes to one core by default), and no LeakSanitizer
// in the processes under the sanitizer build: Open MPI leaves its own allocations (in plugins it
// has unloaded by then, so they cannot even be attributed) at exit. Leak checking of the same
// training code runs in one process in test_train. Shared memory copies through a buffer, not
// cross-memory attach, which containers without ptrace permission refuse. Each test process
// gives Open MPI a session directory of its own: two mpiruns that start at the same moment
// (ctest -j runs two tests at once) otherwise race to create the same one under /tmp, and one
// fails with "ORTE_ERROR_LOG ... session_dir.c: File exists" (seen on a fresh clone's make test).
fs::path mpi_session_base() {
  return fs::temp_directory_path() / ("pbmpi" + std::to_string(::getpid()));
}
const std::string kMpiEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";
const std::string kMpiArgs =
    std::string(PACKBERT_MPIRUN) +
    " --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none"
    " -x OMP_NUM_THREADS=1 -x LSAN_OPTIONS=detect_leaks=0";
std::string mpi_env() {
  return kMpiEnv + "OMPI_MCA_orte_tmpdir_base=" + mpi_session_base().string() + " ";
}
std::string mpirun() {
  return mpi_env() + kMpiArgs;
}

// A corpus, prepared once for the suite: sequences of up to 32 tokens and their packs.
class Dist : public testing::CliTest {
 protected:
  void SetUp() override {
    if (std::string(PACKBERT_MPIRUN).empty()) GTEST_SKIP() << "built without MPI";
    CliTest::SetUp();
    fs::create_directories(mpi_session_base());
    std::string text;
    for (int d = 0; d < 60; ++d) {
      for (int s = 0; s < 3 + d % 4; ++s)
        text += "Document " + std::to_string(d) + " says the " +
                std::string(d % 2 ? "quick brown fox" : "lazy dog") + " number " +
                std::to_string(d * 7 + s) + (s % 2 ? " jumps over it." : " sleeps all day.") + "\n";
      text += "\n";
    }
    const fs::path corpus = write("corpus.txt", text);
    seqs_ = (dir_ / "c.seqs").string();
    packs_ = (dir_ / "c.packs").string();
    const Result prep =
        run("prepare " + corpus.string() + " --out " + seqs_ + " --max-seq-len 32 --pack lpfhp");
    ASSERT_EQ(prep.code, 0) << prep.err;
  }
  void TearDown() override {
    CliTest::TearDown();
    std::error_code ignored;
    fs::remove_all(mpi_session_base(), ignored);
  }

  // `np` processes of pretrain into dir_/out (1: still under mpirun), one OpenMP thread each.
  Result pretrain(int np, const std::string& out, const std::string& args,
                  const std::string& mpi_args = "", const std::string& env = "") {
    const std::string cmd =
        mpirun() + " " + mpi_args + " -np " + std::to_string(np) + " " + env + " " +
        PACKBERT_BINARY + " pretrain --data " + seqs_ + " --packs " + packs_ + " --out " +
        (dir_ / out).string() + " --preset tiny --seed 3 --eval-fraction 0.1 " + args + " >" +
        (dir_ / "out").string() + " 2>" + (dir_ / "err").string() + " </dev/null";
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir_ / "out"), slurp(dir_ / "err")};
  }

  // The checkpoint of run `out`, or the model file of a fine-tuned model directory.
  io::SafetensorsFile checkpoint(const std::string& out) {
    const fs::path model = dir_ / out / "model.safetensors";
    return io::SafetensorsFile::read(
        fs::exists(model) ? model.string() : (dir_ / out / "checkpoint.safetensors").string());
  }

  // The worst difference between a's and b's tensors of `prefix` (weights: "", moments:
  // "optimizer.m."), normwise per tensor relative to b's norm. The attention key biases are
  // held to an absolute 1e-6 instead: their true gradient is zero (softmax ignores a shift of
  // every score of a row), so the optimizer moves them by float noise only, different noise
  // for another summation order, and they stay near 1e-7.
  double worst_difference(const std::string& a, const std::string& b, const std::string& prefix,
                          model::Heads heads = {}) {
    io::SafetensorsFile fa = checkpoint(a), fb = checkpoint(b);
    const fs::path config = dir_ / a / "config.json";
    model::ParamLayout layout(
        fs::exists(config)
            ? model::config_from_json(nlohmann::json::parse(slurp(config)), config.string())
            : model::config_from_json(nlohmann::json::parse(fa.metadata().at("config")), a),
        heads);
    double worst = 0;
    for (const model::TensorSpec& t : layout.tensors()) {
      const std::vector<float> x = fa.floats(prefix + t.name), y = fb.floats(prefix + t.name);
      double diff = 0, norm = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
        norm += double(y[i]) * y[i];
      }
      if (t.name.find("attention.self.key.bias") != std::string::npos) {
        for (size_t i = 0; i < x.size(); ++i)
          worst = std::max(worst, std::abs(double(x[i]) - y[i]) / 1e-6 * 1e-5);
        continue;
      }
      if (norm > 0) worst = std::max(worst, std::sqrt(diff / norm));
    }
    return worst;
  }

  // The same weights and moments, bit for bit (the metadata records the run's own time).
  bool identical(const std::string& a, const std::string& b) {
    io::SafetensorsFile fa = checkpoint(a), fb = checkpoint(b);
    model::ParamLayout layout(
        model::config_from_json(nlohmann::json::parse(fa.metadata().at("config")), a),
        model::Heads{});
    for (const std::string prefix : {"", "optimizer.m.", "optimizer.v."})
      for (const model::TensorSpec& t : layout.tensors())
        if (fa.floats(prefix + t.name) != fb.floats(prefix + t.name)) return false;
    return true;
  }

  std::string seqs_, packs_;
};

const std::string kSteps = "--steps 20 --warmup 4 ";

// 2 processes x 4 rows and 3 x 4 (plain and with ZeRO-1) end where one process with 8 and 12
// rows ends, dropout on: the same packs in the same order, split by real tokens, with each
// share dividing by the whole step's counts and drawing the whole step's dropout masks.
TEST_F(Dist, RanksTimesRowsEqualsOneProcessAndRerunsAreBitIdentical) {
  ASSERT_EQ(pretrain(1, "one8", kSteps + "--batch-rows 8").code, 0) << slurp(dir_ / "err");
  Result two = pretrain(2, "two4", kSteps + "--batch-rows 4");
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_NE(two.err.find("2 processes x 4 rows"), std::string::npos) << two.err;
  EXPECT_LT(worst_difference("two4", "one8", ""), 1e-5);
  // Rank 0 alone writes: one metrics line per step, with the processes and their imbalance.
  const std::string metrics = slurp(dir_ / "two4" / "metrics.jsonl");
  // 20 steps, the evaluation, best.safetensors and the checkpoint
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 23) << metrics;
  EXPECT_NE(metrics.find("\"processes\":2"), std::string::npos);
  EXPECT_NE(metrics.find("\"imbalance\""), std::string::npos);

  ASSERT_EQ(pretrain(2, "two4again", kSteps + "--batch-rows 4").code, 0);
  EXPECT_TRUE(identical("two4", "two4again")) << "two runs with 2 processes differ";

  ASSERT_EQ(pretrain(1, "one12", kSteps + "--batch-rows 12").code, 0);
  ASSERT_EQ(pretrain(3, "three4", kSteps + "--batch-rows 4").code, 0) << slurp(dir_ / "err");
  EXPECT_LT(worst_difference("three4", "one12", ""), 1e-5);
  Result zero = pretrain(3, "three4zero", kSteps + "--batch-rows 4 --zero 1");
  ASSERT_EQ(zero.code, 0) << zero.err;
  EXPECT_LT(worst_difference("three4zero", "one12", ""), 1e-5);
  // The consolidated checkpoint holds every shard's moments.
  EXPECT_LT(worst_difference("three4zero", "one12", "optimizer.m."), 1e-5);
  EXPECT_LT(worst_difference("three4zero", "one12", "optimizer.v."), 1e-5);
  // ZeRO-1 with AdamW (no trust ratio to sum across shards) too.
  ASSERT_EQ(pretrain(1, "one8adamw", kSteps + "--batch-rows 8 --optimizer adamw").code, 0);
  ASSERT_EQ(pretrain(2, "two4adamw", kSteps + "--batch-rows 4 --optimizer adamw --zero 1").code, 0);
  EXPECT_LT(worst_difference("two4adamw", "one8adamw", ""), 1e-5);
}

// bf16 master weights across processes: the stochastic rounding bits are keyed by arena index,
// so ZeRO-1's sharded update writes the very bits the unsharded one does (AdamW without
// clipping: no norm is summed in another order), and both stay near one process's run.
TEST_F(Dist, Bf16MastersShardUnderZeroBitForBit) {
  if (!kernels::bf16_unavailable_reason().empty())
    GTEST_SKIP() << kernels::bf16_unavailable_reason();
  const std::string args =
      kSteps + "--batch-rows 4 --optimizer adamw --clip 0 --precision bf16 --master-weights bf16 ";
  ASSERT_EQ(pretrain(2, "plain16", args).code, 0) << slurp(dir_ / "err");
  Result zero = pretrain(2, "zero16", args + "--zero 1");
  ASSERT_EQ(zero.code, 0) << zero.err;
  EXPECT_TRUE(identical("plain16", "zero16"));
  ASSERT_EQ(pretrain(1, "one16",
                     kSteps + "--batch-rows 8 --optimizer adamw --clip 0 --precision bf16 "
                              "--master-weights bf16")
                .code,
            0);
  // Summation order moves a gradient by float noise, which a rounding may turn into one bf16
  // gap (2^-8 relative) of a weight now and then: close, not equal.
  EXPECT_LT(worst_difference("zero16", "one16", ""), 2e-2);
}

// Dynamic loss scaling across processes: every rank judges the same reduced gradient norm (summed
// across shards under ZeRO-1), so all skip the same overflowing steps and halve the scale
// together, and they end where one process with all the rows ends. A rank that skipped alone
// would miss a collective (the run would hang) or drift from the others.
TEST_F(Dist, DynamicLossScalingSkipsTheSameStepsOnEveryRank) {
  const std::string scaling = "--loss-scale dynamic --loss-scale-init 1e42 ";
  auto state = [&](const std::string& out) {
    return nlohmann::json::parse(checkpoint(out).metadata().at("packbert"));
  };
  ASSERT_EQ(pretrain(1, "one8scaled", kSteps + "--batch-rows 8 " + scaling).code, 0)
      << slurp(dir_ / "err");
  const nlohmann::json one = state("one8scaled");
  EXPECT_GE(one.at("loss_scale_overflows").get<int64_t>(), 10);
  EXPECT_LE(one.at("loss_scale_overflows").get<int64_t>(), 15);
  for (const std::string zero : {"0", "1"}) {
    const std::string out = "two4scaled" + zero;
    Result two = pretrain(2, out, kSteps + "--batch-rows 4 --zero " + zero + " " + scaling);
    ASSERT_EQ(two.code, 0) << two.err;
    EXPECT_EQ(state(out).at("loss_scale_overflows"), one.at("loss_scale_overflows")) << zero;
    EXPECT_EQ(state(out).at("loss_scale"), one.at("loss_scale")) << zero;
    EXPECT_LT(worst_difference(out, "one8scaled", ""), 1e-5) << zero;
  }
}

// A checkpoint written at step 10 by 2 processes x 6 rows resumes on 1 x 12 and on 3 x 4 (ZeRO-1)
// and reaches the step-20 weights of an uninterrupted run. The run is killed (as kill -9) right
// after step 11, so the step-10 checkpoint is the one on disk.
TEST_F(Dist, ResumesOnAnotherNumberOfProcesses) {
  ASSERT_EQ(pretrain(2, "whole", kSteps + "--batch-rows 6").code, 0) << slurp(dir_ / "err");
  const std::string cut = kSteps + "--checkpoint-every 10 ";
  for (const char* to : {"one", "three"}) {
    Result killed = pretrain(2, to, cut + "--batch-rows 6", "-x PACKBERT_CRASH_AT=step:11");
    ASSERT_NE(killed.code, 0);
    const nlohmann::json state = nlohmann::json::parse(checkpoint(to).metadata().at("packbert"));
    ASSERT_EQ(state.at("step"), 10);
    EXPECT_EQ(state.at("rows_per_batch"), 12);
  }
  Result one = pretrain(1, "one", cut + "--batch-rows 12 --resume");
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_LT(worst_difference("one", "whole", ""), 1e-5);
  Result three = pretrain(3, "three", cut + "--batch-rows 4 --zero 1 --resume");
  ASSERT_EQ(three.code, 0) << three.err;
  EXPECT_LT(worst_difference("three", "whole", ""), 1e-5);
  // Another number of rows per step would change the data stream: refused, naming both.
  Result rows = pretrain(2, "one", cut + "--batch-rows 4 --resume");
  EXPECT_EQ(rows.code, 2);
  EXPECT_NE(rows.err.find("12 rows per micro-batch"), std::string::npos) << rows.err;
}

// Over TCP only (no shared memory), the network code path: the same weights as one process.
TEST_F(Dist, TcpTransportGivesTheSameResult) {
  ASSERT_EQ(pretrain(1, "one8", "--steps 6 --batch-rows 8").code, 0);
  Result tcp = pretrain(2, "tcp", "--steps 6 --batch-rows 4",
                        "--mca btl tcp,self --mca btl_tcp_if_include lo");
  ASSERT_EQ(tcp.code, 0) << tcp.err;
  EXPECT_LT(worst_difference("tcp", "one8", ""), 1e-5);
}

// The gradient sums and weight gathers run as rings of point-to-point messages (dist/comm.cpp):
// on 2, 3 and 4 ranks, over shared memory and over TCP, every rank's all-reduced buckets,
// reduce-scattered shard and gathered shards hold what it works out alone, and every rank holds
// the same bits (tests/comm_check.cpp). A ring that loses its place hangs: the timeout ends it.
TEST_F(Dist, RingSumsAndGathersHoldWhatEachRankWorksOutAlone) {
  for (const std::string transport : {"", "--mca btl tcp,self --mca btl_tcp_if_include lo"})
    for (int np : {2, 3, 4}) {
      if (!transport.empty() && np != 3) continue;
      const std::string cmd = mpi_env() + "timeout 120 " + kMpiArgs + " " + transport + " -np " +
                              std::to_string(np) + " " + PACKBERT_COMM_CHECK + " >" +
                              (dir_ / "out").string() + " 2>" + (dir_ / "err").string();
      const int status = std::system(cmd.c_str());
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << np << " ranks " << transport << ": " << slurp(dir_ / "err");
      const std::string out = slurp(dir_ / "out");
      EXPECT_TRUE(out.starts_with("ok " + std::to_string(np) + " ranks\n")) << out;
    }
}

// Open MPI's ob1 moves 3 fragments of a large message a progress call unless told otherwise,
// which stalls a pipeline without single-copy shared memory (docs/BENCHMARKS.md, "Pipeline
// training"): dist::Comm makes it 64, and a value the user gives mpirun stands.
TEST_F(Dist, SendPipelineDepthIs64UnlessTheUserSetsIt) {
  for (const auto& [mca, depth] :
       {std::pair<std::string, int>{"", 64}, {"--mca pml_ob1_send_pipeline_depth 5", 5}}) {
    const std::string cmd = mpi_env() + "timeout 120 " + kMpiArgs + " " + mca + " -np 2 " +
                            PACKBERT_COMM_CHECK + " >" + (dir_ / "out").string() + " 2>" +
                            (dir_ / "err").string();
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(dir_ / "err");
    const std::string out = slurp(dir_ / "out");
    if (out.find("pml_ob1_send_pipeline_depth -1") != std::string::npos)
      GTEST_SKIP() << "this Open MPI has no ob1 point-to-point layer";
    EXPECT_NE(out.find("pml_ob1_send_pipeline_depth " + std::to_string(depth) + "\n"),
              std::string::npos)
        << mca << ": " << out;
  }
}

// Processes given different flags or files fail together with one message naming what differs;
// a process that fails alone (its own bad input) takes the run down with exit 2.
TEST_F(Dist, MismatchedProcessesFailTogetherWithOneMessage) {
  const std::string common = mpirun() + " -np 1 " + PACKBERT_BINARY + " pretrain --data " + seqs_ +
                             " --packs " + packs_ + " --preset tiny --steps 2 --out " +
                             (dir_ / "mixed").string();
  const std::string cmd = common + " --batch-rows 4 : -np 1 " + PACKBERT_BINARY +
                          " pretrain --data " + seqs_ + " --packs " + packs_ +
                          " --preset tiny --steps 2 --out " + (dir_ / "mixed").string() +
                          " --batch-rows 5 2>" + (dir_ / "err").string();
  const int status = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  const std::string err = slurp(dir_ / "err");
  EXPECT_NE(err.find("error: rank 1 and rank 0 were given different options: --batch-rows 5 "
                     "against 4;"),
            std::string::npos)
      << err;        // (the field that differs, named by its flag, not the whole option set)
  size_t lines = 0;  // said once (rank 0); the launcher adds its own report of the exit codes
  for (size_t at = err.find("packbert: error:"); at != std::string::npos;
       at = err.find("packbert: error:", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << err;
  EXPECT_FALSE(fs::exists(dir_ / "mixed" / "checkpoint.safetensors"));
}

// finetune runs the same step: 2 processes x 4 rows fine-tune a classifier to the weights one
// process with 8 rows reaches (dropout on, AdamW, two epochs with a short last step each).
TEST_F(Dist, FinetuneOnTwoProcessesEqualsOne) {
  ASSERT_EQ(pretrain(1, "base", "--steps 2 --batch-rows 8").code, 0) << slurp(dir_ / "err");
  std::string train = "label\tsentence\n", dev = train;
  for (int i = 0; i < 70; ++i)
    (i < 50 ? train : dev) += std::string(i % 3 ? "fox" : "dog") + "\tthe " +
                              (i % 3 ? "quick brown fox" : "lazy dog") + " number " +
                              std::to_string(i) + (i % 2 ? " jumps" : " sleeps all day") + "\n";
  const fs::path tr = write("train.tsv", train), dv = write("dev.tsv", dev);
  auto finetune = [&](int np, const std::string& out, int rows) {
    const std::string cmd = mpirun() + " -np " + std::to_string(np) + " " + PACKBERT_BINARY +
                            " finetune --train " + tr.string() + " --dev " + dv.string() +
                            " --init " + (dir_ / "base" / "checkpoint.safetensors").string() +
                            " --out " + (dir_ / out).string() + " --max-seq-len 16 --epochs 2" +
                            " --lr 1e-3 --warmup 2 --batch-rows " + std::to_string(rows) + " >" +
                            (dir_ / "out").string() + " 2>" + (dir_ / "err").string();
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  ASSERT_EQ(finetune(1, "ft1", 8), 0) << slurp(dir_ / "err");
  ASSERT_EQ(finetune(2, "ft2", 4), 0) << slurp(dir_ / "err");
  EXPECT_NE(slurp(dir_ / "out").find("dev accuracy"), std::string::npos);  // rank 0's table once
  model::Heads heads;
  heads.pretraining = false;
  heads.classifier = true;
  EXPECT_LT(worst_difference("ft2", "ft1", "", heads), 1e-5);
}

// kill -9 of one process mid-run: the others end within 30 s, the launcher names the lost rank,
// and the last checkpoint is intact and resumes.
TEST_F(Dist, AKilledProcessEndsTheRunAndKeepsTheCheckpoint) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string args = " pretrain --data " + seqs_ + " --packs " + packs_ +
                           " --preset tiny --seed 3 --steps 20 --checkpoint-every 5 --batch-rows 4"
                           " --out " +
                           (dir_ / "lost").string();
  const std::string cmd = mpi_env() + "timeout 120 " + kMpiArgs + " -np 1 " + PACKBERT_BINARY +
                          args + " : -np 1 env PACKBERT_CRASH_AT=step:8 " + PACKBERT_BINARY + args +
                          " >/dev/null 2>" + (dir_ / "err").string();
  const int status = std::system(cmd.c_str());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_NE(WEXITSTATUS(status), 124) << "the surviving process did not end";
  EXPECT_LT(seconds, 30);
  const std::string err = slurp(dir_ / "err");
  EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
  const nlohmann::json state = nlohmann::json::parse(checkpoint("lost").metadata().at("packbert"));
  EXPECT_EQ(state.at("step"), 5);
  Result resumed = pretrain(1, "lost", "--steps 20 --batch-rows 8 --resume");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
}

// Pipeline stages (docs/DESIGN.md §7c): 2 stages x 1 replica and 2 x 2 end where one process
// with the same global batch ends, 4 micro-batches a step on the 1F1B schedule, dropout on. Not
// bit for bit: every gradient sums in one process's order (the tied word table's on the first
// stage), but the global norm is summed stage by stage, which moves the clipping factor's last
// bits, and the weights follow. Reruns are bit for bit, and both stages' copies of the word
// table stay equal (the checkpoint holds the first stage's; the last stage's predictions use
// its own, so a drift would show in the losses).
TEST_F(Dist, PipelineStagesEqualOneProcessAndRerunBitForBit) {
  const std::string steps = kSteps + "--accumulation 4 ";
  ASSERT_EQ(pretrain(1, "one8", steps + "--batch-rows 8").code, 0) << slurp(dir_ / "err");
  Result two = pretrain(2, "p2", steps + "--batch-rows 8 --pipeline-stages 2");
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_NE(two.err.find("2 pipeline stages of 1,1 layers x 1 replicas x 8 rows"),
            std::string::npos)
      << two.err;
  for (const std::string prefix : {"", "optimizer.m.", "optimizer.v."})
    EXPECT_LT(worst_difference("p2", "one8", prefix), 1e-5) << prefix;
  // Rank 0 (the first stage) writes the metrics, with the last stage's losses.
  auto losses = [&](const std::string& out) {
    std::vector<double> l;
    std::istringstream in(slurp(dir_ / out / "metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("type", "") == "step") l.push_back(j.at("loss").get<double>());
    }
    return l;
  };
  const std::vector<double> one = losses("one8"), piped = losses("p2");
  const std::string metrics = slurp(dir_ / "p2" / "metrics.jsonl");
  EXPECT_NE(metrics.find("\"stage_wait_seconds\":["), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\"bubble\":"), std::string::npos);
  ASSERT_EQ(piped.size(), 20u);
  EXPECT_EQ(piped[0], one[0]);  // the first step's forward is the same, bit for bit
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(piped[i], one[i], 1e-4 * one[i]) << i;

  ASSERT_EQ(pretrain(2, "p2again", steps + "--batch-rows 8 --pipeline-stages 2").code, 0);
  EXPECT_TRUE(identical("p2", "p2again")) << "two pipelined runs differ";

  Result four = pretrain(4, "p2x2", steps + "--batch-rows 4 --pipeline-stages 2");
  ASSERT_EQ(four.code, 0) << four.err;
  EXPECT_LT(worst_difference("p2x2", "one8", ""), 1e-5);
  Result zero = pretrain(4, "p2x2zero", steps + "--batch-rows 4 --pipeline-stages 2 --zero 1");
  ASSERT_EQ(zero.code, 0) << zero.err;
  for (const std::string prefix : {"", "optimizer.m.", "optimizer.v."})
    EXPECT_LT(worst_difference("p2x2zero", "one8", prefix), 1e-5) << prefix;
  // Explicit layers, fp16 with dynamic loss scaling: the activations travel in 16 bits.
  const std::string fp16 = steps + "--batch-rows 8 --precision fp16 --loss-scale dynamic ";
  ASSERT_EQ(pretrain(1, "one8fp16", fp16).code, 0) << slurp(dir_ / "err");
  Result half = pretrain(2, "p2fp16", fp16 + "--pipeline-stages 2 --stage-layers 1,1");
  ASSERT_EQ(half.code, 0) << half.err;
  // (fp16's roundings magnify the summation order's last bits: 2 data-parallel processes x 4
  // rows end 5e-5 from one process here too, measured; a wrong activation type would be far off)
  EXPECT_LT(worst_difference("p2fp16", "one8fp16", ""), 1e-4);
}

// bf16 master weights on 2 stages round stochastically with the bits one process draws for each
// weight (keyed by its place in the whole model, not in the stage's arena): every weight ends
// bit for bit, the tied word table's too (its gradient sums on the first stage in one process's
// order).
// A ModernBERT in 2 pipeline stages (its 3 layers as 2 + 1: the second stage starts at layer 2,
// a local one) ends where one process ends, and the first step's loss is one process's bit for
// bit. (Its kinds across the cut, on sequences longer than a band: ModernBertStage in
// test_modernbert.)
TEST_F(Dist, ModernBertPipelineStagesEqualOneProcess) {
  const std::string args = kSteps + "--accumulation 4 --batch-rows 8 --family modernbert ";
  ASSERT_EQ(pretrain(1, "m1", args).code, 0) << slurp(dir_ / "err");
  Result two = pretrain(2, "m2", args + "--pipeline-stages 2");
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_NE(two.err.find("2 pipeline stages of 2,1 layers"), std::string::npos) << two.err;
  for (const std::string prefix : {"", "optimizer.m.", "optimizer.v."})
    EXPECT_LT(worst_difference("m2", "m1", prefix), 1e-5) << prefix;
  auto first_loss = [&](const std::string& out) {
    std::istringstream in(slurp(dir_ / out / "metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("type", "") == "step") return j.at("loss").get<double>();
    }
    return -1.0;
  };
  EXPECT_EQ(first_loss("m2"), first_loss("m1"));
}

TEST_F(Dist, PipelineStagesRoundBf16MastersAsOneProcess) {
  if (!kernels::bf16_unavailable_reason().empty())
    GTEST_SKIP() << kernels::bf16_unavailable_reason();
  const std::string args =
      kSteps + "--accumulation 4 --batch-rows 8 --precision bf16 --master-weights bf16 ";
  ASSERT_EQ(pretrain(1, "one16", args).code, 0) << slurp(dir_ / "err");
  Result two = pretrain(2, "p2bf16", args + "--pipeline-stages 2");
  ASSERT_EQ(two.code, 0) << two.err;
  io::SafetensorsFile a = checkpoint("p2bf16"), b = checkpoint("one16");
  const model::ParamLayout layout(
      model::config_from_json(nlohmann::json::parse(a.metadata().at("config")), "p2bf16"),
      model::Heads{});
  for (const model::TensorSpec& t : layout.tensors())
    EXPECT_EQ(a.floats(t.name), b.floats(t.name)) << t.name;
}

// A checkpoint of 2 stages resumes on one process, and one process's on 2 stages x 2 replicas,
// each reaching the step-20 weights of the uninterrupted run (killed right after step 11, so
// the step-10 checkpoint is the one on disk).
TEST_F(Dist, PipelineResumesOnAnotherShape) {
  const std::string steps = kSteps + "--accumulation 2 --checkpoint-every 10 ";
  ASSERT_EQ(pretrain(1, "whole", steps + "--batch-rows 8").code, 0) << slurp(dir_ / "err");
  Result cut = pretrain(2, "to1", steps + "--batch-rows 8 --pipeline-stages 2", "",
                        "-x PACKBERT_CRASH_AT=step:11");
  ASSERT_NE(cut.code, 0);
  ASSERT_EQ(nlohmann::json::parse(checkpoint("to1").metadata().at("packbert")).at("step"), 10);
  Result one = pretrain(1, "to1", steps + "--batch-rows 8 --resume");
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_LT(worst_difference("to1", "whole", ""), 1e-5);

  ASSERT_NE(pretrain(1, "to4", steps + "--batch-rows 8", "", "-x PACKBERT_CRASH_AT=step:11").code,
            0);
  Result four = pretrain(4, "to4", steps + "--batch-rows 4 --pipeline-stages 2 --resume");
  ASSERT_EQ(four.code, 0) << four.err;
  EXPECT_LT(worst_difference("to4", "whole", ""), 1e-5);
  for (const std::string prefix : {"optimizer.m.", "optimizer.v."})
    EXPECT_LT(worst_difference("to4", "whole", prefix), 1e-5) << prefix;
}

// Stages that cannot be made are refused before anything is written, naming the flag.
TEST_F(Dist, PipelineStagesThatDoNotFitAreRefused) {
  Result odd = pretrain(3, "odd", "--steps 2 --pipeline-stages 2");
  EXPECT_EQ(odd.code, 2);
  EXPECT_NE(odd.err.find("--pipeline-stages 2 does not divide the 3 processes"), std::string::npos)
      << odd.err;
  Result layers = pretrain(2, "layers", "--steps 2 --pipeline-stages 2 --stage-layers 1,2");
  EXPECT_EQ(layers.code, 2);
  EXPECT_NE(layers.err.find("--stage-layers"), std::string::npos) << layers.err;
  Result deep = pretrain(3, "deep", "--steps 2 --pipeline-stages 3");
  EXPECT_EQ(deep.code, 2);  // (tiny has 2 layers: a stage would hold none)
  EXPECT_FALSE(fs::exists(dir_ / "odd") || fs::exists(dir_ / "layers") ||
               fs::exists(dir_ / "deep"));
}

// kill -9 of the last stage mid-step (after a forward, the first stage waiting on its
// gradient): both ranks end within 30 s, the launcher names the lost rank, and the last
// checkpoint is intact and resumes.
TEST_F(Dist, AKilledStageEndsThePipelineAndKeepsTheCheckpoint) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string args = " pretrain --data " + seqs_ + " --packs " + packs_ +
                           " --preset tiny --seed 3 --steps 20 --checkpoint-every 5 --batch-rows 4"
                           " --accumulation 4 --pipeline-stages 2 --out " +
                           (dir_ / "lost").string();
  // (the 30th forward: step 8's second micro-batch)
  const std::string cmd = mpi_env() + "timeout 120 " + kMpiArgs + " -np 1 " + PACKBERT_BINARY +
                          args + " : -np 1 env PACKBERT_CRASH_AT=forward:30 " + PACKBERT_BINARY +
                          args + " >/dev/null 2>" + (dir_ / "err").string();
  const int status = std::system(cmd.c_str());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_NE(WEXITSTATUS(status), 124) << "the surviving stage did not end";
  EXPECT_LT(seconds, 30);
  const std::string err = slurp(dir_ / "err");
  EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
  const nlohmann::json state = nlohmann::json::parse(checkpoint("lost").metadata().at("packbert"));
  EXPECT_EQ(state.at("step"), 5);
  Result resumed = pretrain(
      2, "lost", "--steps 20 --batch-rows 4 --accumulation 4 --pipeline-stages 2 --resume");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
}

}  // namespace
}  // namespace packbert
