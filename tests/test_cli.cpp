// The packbert binary as a user meets it: exit codes, one-line errors, no half-written outputs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "cli/demo_plan.h"
#include "cli_runner.h"
#include "data/sequences.h"
#include "io/safetensors.h"
#include "kernels/cpu_features.h"
#include "text.h"

namespace fs = std::filesystem;

namespace {

using packbert::testing::Result;
using packbert::testing::slurp;
using Cli = packbert::testing::CliTest;

const std::string kWiki = std::string(PACKBERT_SOURCE_DIR) + "/data/wikipedia_512.hist";

// --help on every subcommand, and every option in it has a description (CLI11 prints it after
// the option on the same line, from column 30, or on the next line indented 30 columns).
TEST_F(Cli, HelpOnEverySubcommandDescribesEveryOption) {
  for (const char* sub :
       {"", "pack", "demo", "check-golden", "tokenize", "prepare", "inspect", "gcide-text",
        "pretrain", "eval", "predict", "export", "finetune", "plan", "convert", "plot"}) {
    Result r = run(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub;
    std::vector<std::string> lines;
    std::istringstream in(r.out);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i];
      if (l.rfind("  -", 0) != 0) continue;  // option lines start "  -" / "  --"
      const bool same_line = l.size() > 30 && l.compare(28, 2, "  ") == 0;
      const bool next_line =
          i + 1 < lines.size() && lines[i + 1].rfind(std::string(30, ' '), 0) == 0;
      EXPECT_TRUE(same_line || next_line) << sub << ": no description for '" << l << "'";
    }
  }
}

TEST_F(Cli, PackPrintsTableAndWritesJsonPlan) {
  fs::path out = dir_ / "plan.json";
  Result r = run("pack " + kWiki + " --algo all --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* col : {"algo", "packs", "efficiency %", "lower bound", "gap", "seconds"})
    EXPECT_NE(r.out.find(col), std::string::npos) << col;
  EXPECT_NE(r.out.find("8,166,708"), std::string::npos) << r.out;  // SPFHP
  EXPECT_NE(r.out.find("8,138,483"), std::string::npos) << r.out;  // LPFHP
  auto plan = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(plan["algo"], "optimal");
  EXPECT_EQ(plan["lower_bound"], 8135727);
  int64_t packs = 0, sequences = 0;
  for (auto& rec : plan["recipes"]) {
    packs += rec["count"].get<int64_t>();
    sequences += rec["count"].get<int64_t>() * static_cast<int64_t>(rec["lengths"].size());
  }
  EXPECT_EQ(packs, plan["packs"].get<int64_t>());
  EXPECT_EQ(sequences, 16279552);
  for (auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "temp file left behind";
}

TEST_F(Cli, BadHistogramIsOneLineErrorExit2AndNoOutput) {
  struct Case {
    std::string text, expect;
  } cases[] = {
      {"5 10\n7 x\n", "bad.hist:2: count 'x' is not an integer"},
      {"5 -3\n", "bad.hist:1: count -3 is negative"},
      {"0 4\n", "bad.hist:1: length 0 is outside [1, 512]"},
      {"600 4\n", "bad.hist:1: length 600 is outside [1, 512]"},
      {"5 1\n5 2\n", "bad.hist:2: length 5 appears again"},
      {"", "bad.hist: histogram holds no sequences"},
  };
  for (const Case& c : cases) {
    fs::path in = write("bad.hist", c.text);
    fs::path out = dir_ / "plan.json";
    Result r = run("pack " + in.string() + " --out " + out.string());
    EXPECT_EQ(r.code, 2) << c.expect;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
}

TEST_F(Cli, BadFlagsExit2) {
  EXPECT_EQ(run("pack /nonexistent.hist").code, 2);
  Result r = run("pack " + kWiki + " --algo fastest");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown packer 'fastest'"), std::string::npos) << r.err;
  EXPECT_EQ(run("pack " + kWiki + " --algo nnlshp").code, 2);  // needs a depth cap of 1-3
  EXPECT_EQ(run("pack " + kWiki + " --max-per-pack -1").code, 2);
  EXPECT_EQ(run("pack " + kWiki + " --max-seq-len -5").code, 2);
  EXPECT_EQ(run("pack " + kWiki + " --max-seq-len 256").code, 2);  // lengths above 256 inside
  EXPECT_EQ(run("pack " + kWiki + " --bogus").code, 2);
  EXPECT_EQ(run("frobnicate").code, 2);
  r = run("pack " + kWiki + " --algo lpfhp --out /nonexistent-dir/plan.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/nonexistent-dir/plan.json"), std::string::npos) << r.err;
}

TEST_F(Cli, PrepareTrainEvalExportAndTheirErrors) {
  std::string text;
  for (int d = 0; d < 30; ++d) {
    for (int s = 0; s < 4; ++s)
      text +=
          "The quick brown fox number " + std::to_string(d * 4 + s) + " jumps over the lazy dog.\n";
    text += "\n";
  }
  fs::path corpus = write("corpus.txt", text);
  std::string seqs = (dir_ / "c.seqs").string(), run_dir = (dir_ / "run").string();
  Result prep =
      run("prepare " + corpus.string() + " --out " + seqs + " --max-seq-len 32 --pack optimal");
  ASSERT_EQ(prep.code, 0) << prep.err;
  EXPECT_TRUE(fs::exists(dir_ / "c.packs"));
  EXPECT_TRUE(fs::exists(dir_ / "c.hist"));
  Result ins = run("inspect " + seqs);
  EXPECT_EQ(ins.code, 0);
  EXPECT_NE(ins.out.find("[CLS]"), std::string::npos) << ins.out;
  Result tr =
      run("pretrain --data " + seqs + " --packs " + (dir_ / "c.packs").string() + " --out " +
          run_dir + " --preset tiny --steps 3 --batch-rows 2 --eval-fraction 0.2");
  ASSERT_EQ(tr.code, 0) << tr.err;
  EXPECT_TRUE(fs::exists(run_dir + "/checkpoint.safetensors"));
  EXPECT_NE(slurp(run_dir + "/metrics.jsonl").find("\"type\":\"eval\""), std::string::npos);
  Result ev = run("eval --model " + run_dir + "/checkpoint.safetensors --data " + seqs);
  EXPECT_EQ(ev.code, 0) << ev.err;
  EXPECT_NE(ev.out.find("MLM accuracy"), std::string::npos);
  Result ex = run("export --checkpoint " + run_dir + "/checkpoint.safetensors --out " +
                  (dir_ / "hf").string());
  EXPECT_EQ(ex.code, 0) << ex.err;
  EXPECT_TRUE(fs::exists(dir_ / "hf" / "config.json"));
  EXPECT_TRUE(fs::exists(dir_ / "hf" / "vocab.txt"));
  // Dynamic loss scaling from a scale past fp32's range: the first steps overflow and are
  // skipped, the metrics carry the scale, the summary counts the skips; resuming needs the same
  // --loss-scale.
  const std::string scaled_dir = (dir_ / "scaled").string();
  Result scaled = run("pretrain --data " + seqs + " --out " + scaled_dir +
                      " --preset tiny --steps 3 --batch-rows 2 --eval-fraction 0.2"
                      " --loss-scale dynamic --loss-scale-init 1e45");
  ASSERT_EQ(scaled.code, 0) << scaled.err;
  const std::string scaled_metrics = slurp(scaled_dir + "/metrics.jsonl");
  EXPECT_NE(scaled_metrics.find("\"loss_scale\":1e+45"), std::string::npos) << scaled_metrics;
  EXPECT_NE(scaled_metrics.find("\"skip_reason\":\"loss-scale overflow\""), std::string::npos)
      << scaled_metrics;
  EXPECT_NE(scaled.err.find("3 steps skipped for loss-scale overflow; scale 1.25e+44"),
            std::string::npos)
      << scaled.err;
  Result rescaled = run("pretrain --data " + seqs + " --out " + scaled_dir +
                        " --preset tiny --steps 4 --batch-rows 2 --eval-fraction 0.2 --resume");
  EXPECT_EQ(rescaled.code, 2);
  EXPECT_NE(rescaled.err.find("was trained with --loss-scale dynamic"), std::string::npos)
      << rescaled.err;
  // --precision fp16 scales the loss dynamically unless told otherwise, from 2^16.
  const std::string fp16_dir = (dir_ / "fp16").string();
  Result fp16 = run("pretrain --data " + seqs + " --out " + fp16_dir +
                    " --preset tiny --steps 2 --batch-rows 2 --eval-fraction 0.2 --precision fp16");
  ASSERT_EQ(fp16.code, 0) << fp16.err;
  EXPECT_NE(slurp(fp16_dir + "/metrics.jsonl").find("\"loss_scale\":65536"), std::string::npos)
      << slurp(fp16_dir + "/metrics.jsonl");
  Result fp16_off = run("pretrain --data " + seqs + " --out " + fp16_dir + "_off" +
                        " --preset tiny --steps 2 --batch-rows 2 --eval-fraction 0.2"
                        " --precision fp16 --loss-scale off");
  ASSERT_EQ(fp16_off.code, 0) << fp16_off.err;
  EXPECT_EQ(slurp(fp16_dir + "_off/metrics.jsonl").find("\"loss_scale\""), std::string::npos);
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--loss-scale sometimes", "--loss-scale: sometimes: expected off, dynamic or a scale"},
           {"--loss-scale 64 --loss-scale-init 8", "--loss-scale-init needs --loss-scale dynamic"},
           {"--loss-scale dynamic --loss-scale-window 0", "--loss-scale-window"}}) {
    Result bad = run("pretrain --data " + seqs + " --out " + (dir_ / "r5").string() + " " + flags);
    EXPECT_EQ(bad.code, 2) << flags;
    EXPECT_NE(bad.err.find(says), std::string::npos) << bad.err;
  }
  // Bad input: one line, exit 2, nothing lost.
  Result nan_lr = run("pretrain --data " + seqs + " --out " + (dir_ / "r2").string() + " --lr nan");
  EXPECT_EQ(nan_lr.code, 2) << nan_lr.err;
  EXPECT_NE(nan_lr.err.find("--lr"), std::string::npos) << nan_lr.err;
  // The library names the options field it refuses; the CLI says the flag.
  Result adjust = run("pretrain --data " + seqs + " --out " + (dir_ / "r2").string() +
                      " --packing-adjust sideways");
  EXPECT_EQ(adjust.code, 2);
  EXPECT_NE(adjust.err.find("error: --packing-adjust expected none|ga|beta, got 'sideways'"),
            std::string::npos)
      << adjust.err;
  Result rows =
      run("pretrain --data " + seqs + " --out " + (dir_ / "r2").string() + " --one-per-row");
  EXPECT_EQ(rows.code, 2);
  EXPECT_NE(rows.err.find("error: --one-per-row lays out the packs of --packs: give --packs"),
            std::string::npos)
      << rows.err;
  fs::path other = write("other.txt", "Another text entirely.\nWith two sentences.\n");
  ASSERT_EQ(run("prepare " + other.string() + " --out " + (dir_ / "o.seqs").string() +
                " --max-seq-len 32 --pack lpfhp")
                .code,
            0);
  Result mismatch = run("pretrain --data " + seqs + " --packs " + (dir_ / "o.packs").string() +
                        " --out " + (dir_ / "r3").string() + " --preset tiny --steps 1");
  EXPECT_EQ(mismatch.code, 2);
  EXPECT_NE(mismatch.err.find("another sequences file"), std::string::npos) << mismatch.err;
  Result resume_nothing =
      run("pretrain --data " + seqs + " --out " + (dir_ / "r4").string() + " --resume");
  EXPECT_EQ(resume_nothing.code, 2);
  Result missing = run("eval --model " + (dir_ / "nope").string() + " --data " + seqs);
  EXPECT_EQ(missing.code, 2);
  Result cut = run("inspect " + write("cut.seqs", slurp(seqs).substr(0, 100)).string());
  EXPECT_EQ(cut.code, 2);
  EXPECT_EQ(std::count(cut.err.begin(), cut.err.end(), '\n'), 1) << cut.err;
}

// A new model's shape from a Hugging Face config.json or from a preset with sizes overridden:
// the checkpoint (exported config.json) has the asked-for shape; a shape beside --resume or
// --init, or --config beside --preset, is refused with one line.
TEST_F(Cli, PretrainShapesAModelFromAConfigOrSizes) {
  const std::string seqs = prepared_corpus("s", 12, 3);
  const std::string common =
      "pretrain --data " + seqs + " --steps 1 --batch-rows 2 --eval-fraction 0.2";
  auto exported = [&](const std::string& run_dir) {
    const std::string hf = run_dir + "_hf";
    Result ex = run("export --checkpoint " + run_dir + "/checkpoint.safetensors --out " + hf);
    EXPECT_EQ(ex.code, 0) << ex.err;
    return nlohmann::json::parse(slurp(hf + "/config.json"));
  };
  const fs::path cfg = write("cfg.json", R"({"hidden_size": 48, "num_hidden_layers": 3,
      "num_attention_heads": 3, "intermediate_size": 100, "hidden_dropout_prob": 0.0,
      "vocab_size": 30522, "max_position_embeddings": 64})");
  const std::string from_cfg = (dir_ / "cfg_run").string();
  Result a = run(common + " --out " + from_cfg + " --config " + cfg.string());
  ASSERT_EQ(a.code, 0) << a.err;
  nlohmann::json c = exported(from_cfg);
  EXPECT_EQ(c["hidden_size"], 48);
  EXPECT_EQ(c["num_hidden_layers"], 3);
  EXPECT_EQ(c["num_attention_heads"], 3);
  EXPECT_EQ(c["intermediate_size"], 100);
  EXPECT_EQ(c["hidden_dropout_prob"], 0.0);
  EXPECT_EQ(c["max_position_embeddings"], 64);  // the file's, not a preset's 512
  // A preset with overrides: --hidden brings BERT's heads (64 wide) and FFN (4x) along.
  const std::string sized = (dir_ / "sized").string();
  Result b = run(common + " --out " + sized + " --preset tiny --layers 3 --hidden 192");
  ASSERT_EQ(b.code, 0) << b.err;
  c = exported(sized);
  EXPECT_EQ(c["num_hidden_layers"], 3);
  EXPECT_EQ(c["hidden_size"], 192);
  EXPECT_EQ(c["num_attention_heads"], 3);
  EXPECT_EQ(c["intermediate_size"], 768);
  // Refusals: exit 2, one line naming what is wrong.
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {" --preset tiny --config " + cfg.string(), "--preset excludes --config"},
           {" --out " + sized + " --resume --layers 5",
            "error: --config/--layers/--hidden/--heads/--intermediate describes a new model, and "
            "--resume continues one with a shape of its own"},
           {" --init " + sized + "/checkpoint.safetensors --hidden 64",
            "and --init starts from one with a shape of its own"},
           {" --preset tiny --hidden 100 --heads 3",
            "bert-tiny (100 hidden, 3 heads): hidden_size 100 is not a multiple of "
            "num_attention_heads 3"},
           {" --config " + (dir_ / "none.json").string(), "none.json: cannot open"},
           {" --config " + write("bad.json", "{\"hidden_size\": 64,").string(),
            "bad.json: not valid JSON"}}) {
    Result bad =
        run(common +
            (flags.find("--out") == std::string::npos ? " --out " + (dir_ / "refused").string()
                                                      : std::string()) +
            flags);
    EXPECT_EQ(bad.code, 2) << flags;
    EXPECT_NE(bad.err.find(says), std::string::npos) << bad.err;
    EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  }
  // Each was refused before the data was read or --out was made.
  EXPECT_FALSE(fs::exists(dir_ / "refused"));
  // plan takes the same flags, and names the model by them.
  Result plan = run("plan --preset mini --layers 8 --tokens 512 --sequences 4 --json");
  ASSERT_EQ(plan.code, 0) << plan.err;
  const nlohmann::json p8 = nlohmann::json::parse(plan.out);
  EXPECT_EQ(p8["model"], "bert-mini (8 layers)");
  const nlohmann::json p4 =
      nlohmann::json::parse(run("plan --preset mini --tokens 512 --sequences 4 --json").out);
  EXPECT_GT(p8["params_bytes"].get<double>(), p4["params_bytes"].get<double>());
}

// The demo end to end on its real corpus, cut short: both runs stop at the step cap without
// reaching an unreachable target, the table and summary.json say so (nulls, no conclusion), and
// the two runs' first losses are the same number (the same sequences and dropout draws).
TEST_F(Cli, DemoRunsBothLayoutsToTheTargetOrCapAndWritesTheSummary) {
  if (!fs::exists("/usr/share/dictd/gcide.index")) GTEST_SKIP() << "dict-gcide not installed";
  const std::string work = (dir_ / "demo").string();
  Result r = run("demo --workdir " + work +
                 " --preset tiny --packs-per-step 4 --max-steps 2 --eval-every 1 --target 0.99");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("not in 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Conclusion: none"), std::string::npos) << r.out;
  const size_t at = r.out.find("step-1 loss ");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::istringstream losses(r.out.substr(at + 12));
  std::string packed, word, padded;
  losses >> packed >> word >> padded;
  EXPECT_EQ(word, "packed,");
  EXPECT_EQ(packed, padded) << "the paired runs' first losses differ";
  auto summary = nlohmann::json::parse(slurp(work + "/summary.json"));
  EXPECT_EQ(summary.at("target_accuracy").get<double>(), 0.99);
  EXPECT_TRUE(summary.at("packed_seconds_to_target").is_null());
  EXPECT_TRUE(summary.at("padded_seconds_to_target").is_null());
  EXPECT_TRUE(summary.at("ratio").is_null());
  EXPECT_TRUE(fs::exists(work + "/pretrain.svg"));

  // A target the frequent-token level passes: both runs stop at the same evaluation.
  r = run("demo --workdir " + work +
          " --preset tiny --packs-per-step 4 --max-steps 60 --eval-every 10 --target 0.05");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Conclusion: packing reached the target in "), std::string::npos) << r.out;
  summary = nlohmann::json::parse(slurp(work + "/summary.json"));
  ASSERT_FALSE(summary.at("packed_steps_to_target").is_null()) << summary.dump();
  EXPECT_EQ(summary.at("packed_steps_to_target"), summary.at("padded_steps_to_target"));
  EXPECT_LT(summary.at("packed_steps_to_target").get<int>(), 60);
  EXPECT_GT(summary.at("ratio").get<double>(), 0);
  // A target given is kept whatever the calibration measured, and the run says what it measured.
  EXPECT_NE(r.out.find("Calibration ("), std::string::npos) << r.out;
  EXPECT_EQ(summary.at("target_accuracy").get<double>(), 0.05);
  EXPECT_FALSE(fs::exists(work + "/calibration"));
}

// At the defaults, a CPU too slow for bert-mini at 0.20 within --budget-minutes trains bert-tiny,
// and lowers the target only where that does not fit either (here nothing fits: bert-tiny at
// 0.18); the run says why.
TEST_F(Cli, DemoShrinksTheModelWhereTheCalibrationSaysItMust) {
  if (!fs::exists("/usr/share/dictd/gcide.index")) GTEST_SKIP() << "dict-gcide not installed";
  const std::string work = (dir_ / "demo").string();
  Result r = run("demo --workdir " + work + " --max-steps 1 --eval-every 1 --budget-minutes 0.1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Nothing fits the 0.1-minute budget"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Pre-training bert-tiny"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("to 0.18 held-out MLM accuracy"), std::string::npos) << r.out;
  const auto summary = nlohmann::json::parse(slurp(work + "/summary.json"));
  EXPECT_EQ(summary.at("target_accuracy").get<double>(), 0.18);
  EXPECT_EQ(summary.at("preset").get<std::string>(), "tiny");
  EXPECT_EQ(summary.at("lr").get<double>(), 0.01);
  EXPECT_NE(summary.at("kernel_isa").get<std::string>(), "");
}

// The demo's choice at step times measured on real CPUs: a bert-mini step of 0.986 s padded /
// 0.555 s packed (the Zen 3 the issue came from) and 1.034 / 0.657 s (this project's Zen 3), with
// bert-tiny's steps at the share of bert-mini's measured on the latter (0.220 padded, 0.228
// packed). Too slow for bert-mini at any target: it shrinks the model, not the target below 0.18,
// and projects within the budget. A fast CPU keeps bert-mini at 0.20 without measuring bert-tiny.
TEST(DemoPlan, ShrinksTheModelBeforeTheTargetAndFitsTheBudgetOnAZen3) {
  using packbert::cli::choose_demo_setting;
  using packbert::cli::DemoSetting;
  using packbert::cli::DemoStepTimes;
  for (const DemoStepTimes mini : {DemoStepTimes{0.986, 0.555}, DemoStepTimes{1.034, 0.657}}) {
    int asked = 0;
    const auto c = choose_demo_setting({15, 1.0}, [&](const DemoSetting& s) {
      ++asked;
      return s.preset == "mini" ? mini : DemoStepTimes{0.220 * mini.padded, 0.228 * mini.packed};
    });
    EXPECT_EQ(asked, 2);
    ASSERT_NE(c.setting, nullptr);
    EXPECT_EQ(c.setting->preset, "tiny") << c.why;
    EXPECT_GE(c.at.accuracy, 0.18 - 1e-9) << c.why;
    EXPECT_TRUE(c.fits) << c.why;
    EXPECT_LE(c.wall_minutes, 15) << c.why;
    EXPECT_NEAR(c.minutes, static_cast<double>(c.at.step) * (c.times.padded + c.times.packed) / 60,
                1e-12);
    EXPECT_GT(c.wall_minutes, 1.0 + c.minutes) << c.why;
    EXPECT_NE(c.why.find("bert-mini (lr 0.005) takes " + packbert::fixed(mini.padded, 3)),
              std::string::npos)
        << c.why;
  }
  // bert-mini at the 0.36 / 0.20 s a step of an AVX-512 machine: 0.20 with bert-mini.
  int asked = 0;
  auto c = choose_demo_setting({15, 1.0}, [&](const DemoSetting&) {
    ++asked;
    return DemoStepTimes{0.36, 0.20};
  });
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(c.setting->preset, "mini");
  EXPECT_DOUBLE_EQ(c.at.accuracy, 0.20);
  EXPECT_TRUE(c.fits);
  // Nothing fits: the smallest model at the lowest target, said to be over.
  c = choose_demo_setting({0.1, 0}, [](const DemoSetting&) { return DemoStepTimes{1, 1}; });
  EXPECT_EQ(c.setting->preset, "tiny");
  EXPECT_DOUBLE_EQ(c.at.accuracy, 0.18);
  EXPECT_FALSE(c.fits);
  EXPECT_NE(c.why.find("Nothing fits the 0.1-minute budget; the demo trains bert-tiny to 0.18"),
            std::string::npos)
      << c.why;
}

TEST_F(Cli, SquadBadInputIsOneLineErrorExit2) {
  const std::string tiny = std::string(PACKBERT_SOURCE_DIR) + "/tests/data/squad_tiny.json";
  fs::path bad = write("bad.json", "{\"data\": [{\"paragraphs\": [{\"context\": \"x\"}]}]}");
  Result r = run("finetune --task squad --train " + bad.string() + " --dev " + tiny + " --init " +
                 (dir_ / "none").string() + " --out " + (dir_ / "o").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("data[0].paragraphs[0]: missing 'qas'"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = run("eval --task squad --model " + (dir_ / "none").string() + " --data " + tiny);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("none"), std::string::npos) << r.err;
  r = run("finetune --task qa --train a --dev b --init c --out d");
  EXPECT_EQ(r.code, 2);
}

TEST_F(Cli, CheckGoldenPassesFailsAndRejectsBadFiles) {
  const std::string golden =
      std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/bert_h40.safetensors";
  Result ok = run("check-golden " + golden);
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("mlm_loss"), std::string::npos);
  EXPECT_NE(ok.out.find("0 outside tolerance"), std::string::npos) << ok.out;
  Result strict = run("check-golden " + golden + " --rtol-grad 1e-12 --rtol-loss 1e-12");
  EXPECT_EQ(strict.code, 1) << strict.out;
  std::string bytes = slurp(golden);
  fs::path cut = write("cut.safetensors", bytes.substr(0, bytes.size() / 2));
  Result bad = run("check-golden " + cut.string());
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("cut.safetensors: tensor '"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
}

// --backend ref runs the step on the reference backend: the goldens pass there too (under a
// recompute policy as well), a pretrain run records the backend, and an unknown name is one
// line, exit 2.
TEST_F(Cli, BackendRefPassesTheGoldensAndUnknownBackendsAreRefused) {
  const std::string golden =
      std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/bert_h40.safetensors";
  for (const char* extra : {"", " --recompute gelu,ln,attention"}) {
    Result r = run("check-golden " + golden + " --backend ref" + extra);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("62 gradient tensors (0 outside tolerance)"), std::string::npos) << r.out;
  }
  Result bad = run("check-golden " + golden + " --backend cuda");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--backend: unknown backend 'cuda' (expected cpu or ref)"),
            std::string::npos)
      << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  for (const char* sub : {"pretrain", "finetune", "eval"})
    EXPECT_NE(run(std::string(sub) + " --help").out.find("--backend"), std::string::npos) << sub;
}

// The held-out parity holds under every recompute policy, at the same tolerances.
TEST_F(Cli, CheckGoldenPassesUnderEveryRecomputePolicy) {
  const std::string golden =
      std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/bert_h64.safetensors";
  for (const char* policy :
       {"none", "gelu", "gelu,ln", "attention", "layer", "every:2", "layer,gelu,ln,attention"}) {
    Result r = run("check-golden " + golden + " --recompute " + policy);
    EXPECT_EQ(r.code, 0) << policy << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("46 gradient tensors (0 outside tolerance)"), std::string::npos)
        << policy << r.out;
  }
}

// bf16 passes the goldens at its documented tolerances (losses 1e-2, gradients 5e-2 normwise)
// under recompute too, and really runs in bf16: it fails fp32's gradient tolerance.
TEST_F(Cli, CheckGoldenPassesUnderBf16AtItsTolerances) {
  if (!packbert::kernels::bf16_unavailable_reason().empty())
    GTEST_SKIP() << packbert::kernels::bf16_unavailable_reason();
  for (const auto& [name, tensors] : {std::pair{"bert_h64", 46}, std::pair{"bert_h40", 62}}) {
    const std::string golden =
        std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/" + name + ".safetensors";
    for (const char* policy : {"none", "layer,gelu,ln,attention"}) {
      Result r = run("check-golden " + golden + " --precision bf16 --recompute " + policy);
      EXPECT_EQ(r.code, 0) << name << " " << policy << "\n" << r.out << r.err;
      EXPECT_NE(r.out.find(std::to_string(tensors) + " gradient tensors (0 outside tolerance)"),
                std::string::npos)
          << r.out;
      EXPECT_NE(r.out.find("5e-02"), std::string::npos) << "bf16's tolerance not shown\n" << r.out;
    }
    Result strict = run("check-golden " + golden + " --precision bf16 --rtol-grad 1e-4");
    EXPECT_EQ(strict.code, 1) << name << ": bf16 gradients within fp32's tolerance\n" << strict.out;
  }
}

// On a CPU without AVX512-BF16 or AMX-BF16, --precision bf16 is refused up front on one line
// naming the missing feature (exit 2), on every command that computes; plan still plans it.
TEST_F(Cli, Bf16IsRefusedOnACpuWithoutItsInstructions) {
  const std::string golden =
      std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/bert_h64.safetensors";
  for (const std::string& args :
       std::vector<std::string>{"check-golden " + golden + " --precision bf16",
                                "pretrain --data x.seqs --out run --precision bf16",
                                "eval --model m --data x.seqs --precision bf16",
                                "finetune --train t.tsv --init m --out o --precision bf16"}) {
    Result r = run(args, "PACKBERT_CPU_NO_BF16=1");
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("needs a CPU with AVX512-BF16 or AMX-BF16"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  Result plan = run("plan --preset base --tokens 4096 --sequences 8 --precision bf16",
                    "PACKBERT_CPU_NO_BF16=1");
  EXPECT_EQ(plan.code, 0) << plan.err;
  EXPECT_NE(plan.out.find("bf16"), std::string::npos) << plan.out;
  // fp16 needs no bf16 instruction: its GEMMs widen to fp32.
  Result fp16 = run("check-golden " + golden + " --precision fp16", "PACKBERT_CPU_NO_BF16=1");
  EXPECT_EQ(fp16.code, 0) << fp16.out << fp16.err;
  Result bad = run("check-golden " + golden + " --precision fp8");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--precision fp8: expected fp32, bf16 or fp16"), std::string::npos)
      << bad.err;
}

// PACKBERT_MAX_ISA=avx2 runs the AVX2 build of the kernels and oneDNN's AVX2 code on any newer
// CPU: they pass the PyTorch goldens, the run says what it ran, bf16 is refused where the cap
// hides its instructions, and a cap that names no instruction set is one line, exit 2.
TEST_F(Cli, MaxIsaCapRunsTheAvx2KernelsAndRefusesWhatItHides) {
  const std::string golden =
      std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/bert_h64.safetensors";
  Result capped = run("check-golden " + golden + " --recompute layer", "PACKBERT_MAX_ISA=avx2");
  EXPECT_EQ(capped.code, 0) << capped.out << capped.err;
  EXPECT_NE(capped.out.find("46 gradient tensors (0 outside tolerance)"), std::string::npos)
      << capped.out;
  EXPECT_NE(capped.out.find("backend cpu (kernels avx2, oneDNN avx2)"), std::string::npos)
      << capped.out;
  Result bf16 = run("check-golden " + golden + " --precision bf16", "PACKBERT_MAX_ISA=avx2");
  EXPECT_EQ(bf16.code, 2) << bf16.err;
  EXPECT_NE(bf16.err.find("needs a CPU with AVX512-BF16 or AMX-BF16"), std::string::npos)
      << bf16.err;
  if (packbert::kernels::cpu_features().avx512_bf16) {
    EXPECT_NE(bf16.err.find("PACKBERT_MAX_ISA=avx2"), std::string::npos) << bf16.err;
  }
  Result bad = run("check-golden " + golden, "PACKBERT_MAX_ISA=avx3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err,
            "packbert: error: PACKBERT_MAX_ISA: unknown instruction set 'avx3' (expected avx2, "
            "avx512, avx512_bf16 or amx)\n");
}

// fp16 passes the goldens at its documented tolerances (losses 2e-3, gradients 1e-2 normwise,
// backward under GradScaler's first scale, 2^16) under recompute too, and really runs in fp16:
// it fails fp32's gradient tolerance. The scale is divided out: 2^12 gives the same table; 2^20
// overflows fp16's range (65504) in the MLM logits' gradient, and the report says so.
TEST_F(Cli, CheckGoldenPassesUnderFp16AtItsTolerances) {
  for (const auto& [name, tensors] : {std::pair{"bert_h64", 46}, std::pair{"bert_h40", 62}}) {
    const std::string golden =
        std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/" + name + ".safetensors";
    for (const char* policy : {"none", "layer,gelu,ln,attention"}) {
      Result r = run("check-golden " + golden + " --precision fp16 --recompute " + policy);
      EXPECT_EQ(r.code, 0) << name << " " << policy << "\n" << r.out << r.err;
      EXPECT_NE(r.out.find(std::to_string(tensors) + " gradient tensors (0 outside tolerance)"),
                std::string::npos)
          << r.out;
      EXPECT_NE(r.out.find("1e-02"), std::string::npos) << "fp16's tolerance not shown\n" << r.out;
    }
    Result strict = run("check-golden " + golden + " --precision fp16 --rtol-grad 1e-4");
    EXPECT_EQ(strict.code, 1) << name << ": fp16 gradients within fp32's tolerance\n" << strict.out;
    Result base = run("check-golden " + golden + " --precision fp16 --all"),
           scaled = run("check-golden " + golden + " --precision fp16 --all --loss-scale 4096");
    EXPECT_EQ(base.out, scaled.out) << "a power-of-two loss scale changed fp16's gradients";
    Result over = run("check-golden " + golden + " --precision fp16 --loss-scale 1048576");
    EXPECT_EQ(over.code, 1) << over.out;
    EXPECT_NE(over.out.find("non-finite gradients"), std::string::npos) << over.out;
  }
}

// plan: the table, the JSON keys, what auto picks, and bad values refused on one line.
TEST_F(Cli, PlanPredictsWhatFitsAndRefusesBadValues) {
  Result t = run("plan --preset large --tokens 8192 --sequences 16 --memory-limit 16G");
  EXPECT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("auto picks: gelu,ln,attention"), std::string::npos) << t.out;
  Result j = run("plan --preset base --tokens 2048 --sequences 4 --recompute layer --json");
  EXPECT_EQ(j.code, 0) << j.err;
  for (const char* key : {"params_bytes", "grads_bytes", "optimizer_bytes", "activation_bytes",
                          "workspace_bytes", "total_bytes", "flops_per_step"})
    EXPECT_NE(j.out.find(std::string("\"") + key + "\":"), std::string::npos) << key;
  EXPECT_NE(j.out.find("\"recompute\":\"layer\""), std::string::npos) << j.out;
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--recompute every:0", "--recompute every:0: every:K needs a whole number K >= 1"},
           {"--recompute sometimes", "--recompute sometimes: unknown"},
           {"--memory-limit lots", "--memory-limit lots: expected a size"},
           {"--memory-limit 1G", "smaller than the parameters, gradients and optimizer state"},
           {"--precision bf16 --master-weights bf16 --sparsity 0.9",
            "--sparsity needs fp32 master weights"}}) {
    Result r = run("plan --preset base --tokens 2048 --sequences 4 " + args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// plan --pipeline-stages: a stage per row and in the JSON, layers that tile the model (balanced,
// or as --stage-layers gives them), the forwards in flight of 1F1B and its bubble; stage flags
// that do not describe the model are refused on one line naming the flag.
TEST_F(Cli, PlanSplitsThePipelineStages) {
  Result j =
      run("plan --preset base --tokens 512 --sequences 4 --pipeline-stages 3 --accumulation 8 "
          "--memory-limit 64G --json");
  ASSERT_EQ(j.code, 0) << j.err;
  const nlohmann::json p = nlohmann::json::parse(j.out).at("pipeline");
  EXPECT_DOUBLE_EQ(p.at("bubble").get<double>(), 2.0 / 10);
  ASSERT_EQ(p.at("stages").size(), 3u);
  int next = 0;
  for (size_t s = 0; s < 3; ++s) {
    const nlohmann::json& st = p.at("stages")[s];
    EXPECT_EQ(st.at("first_layer"), next);
    next = st.at("end_layer").get<int>();
    EXPECT_EQ(st.at("forwards_in_flight"), static_cast<int>(3 - s));
    EXPECT_GT(st.at("params_bytes").get<double>(), 0);
  }
  EXPECT_EQ(next, 12);
  Result t =
      run("plan --preset base --tokens 512 --sequences 4 --stage-layers 5,7 "
          "--accumulation 4 --memory-limit 64G");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("2 pipeline stages"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("0-4 + embeddings"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("5-11 + heads"), std::string::npos) << t.out;
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--stage-layers 5,5",
            "--stage-layers: the stages' layers sum to 10, not the model's 12"},
           {"--stage-layers 0,12", "--stage-layers: every stage needs at least one layer"},
           {"--pipeline-stages 3 --stage-layers 6,6", "--stage-layers names 2 stages"},
           {"--pipeline-stages 13", "--pipeline-stages 13: expected 1 to the 12 layers"}}) {
    Result r = run("plan --preset base --tokens 512 --sequences 4 --memory-limit 64G " + args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// --master-weights: plan counts bf16 masters (weights + moments under 0.55x of fp32 masters);
// bf16 masters without bf16 compute, a bad name, or with --zero 1 are refused on one line
// naming the flags.
TEST_F(Cli, MasterWeightsArePlannedAndCheckedAgainstTheOtherFlags) {
  auto state = [&](const std::string& masters) {
    Result r =
        run("plan --preset base --tokens 2048 --sequences 4 --precision bf16 --json "
            "--master-weights " +
            masters);
    EXPECT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("master_weights"), masters);
    return j.at("params_bytes").get<double>() + j.at("optimizer_bytes").get<double>();
  };
  EXPECT_LE(state("bf16") / state("fp32"), 0.55);
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"plan --preset base --tokens 2048 --sequences 4 --master-weights bf16",
            "--master-weights bf16 needs --precision bf16"},
           {"pretrain --data x.seqs --out run --master-weights bf16",
            "--master-weights bf16 needs --precision bf16"},
           {"pretrain --data x.seqs --out run --master-weights fp16",
            "--master-weights: expected fp32|bf16|bf16-rn, got 'fp16'"},
           {"finetune --train t.tsv --dev d.tsv --init m --out o --master-weights bf16-rn",
            "--master-weights bf16-rn needs --precision bf16"}}) {
    Result r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// Block sparsity shrinks what plan counts for weights, gradients and moments by about the kept
// share, and its flags are checked before any work (one line, exit 2).
TEST_F(Cli, SparseFlagsArePlannedAndChecked) {
  auto state = [&](const std::string& flags) {
    Result r = run("plan --preset base --tokens 2048 --sequences 4 --json " + flags);
    EXPECT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    return j.at("params_bytes").get<double>() + j.at("optimizer_bytes").get<double>();
  };
  const double dense = state(""), sparse = state("--sparsity 0.9 --block 16");
  // BERT-base's encoder linear weights are 85M of its 110M parameters: 10% of them remain.
  EXPECT_LT(sparse / dense, 0.35);
  EXPECT_GT(sparse / dense, 0.25);
  std::vector<std::pair<std::string, std::string>> cases = {
      {"pretrain --data x.seqs --out run --sparsity 0.9 --block 3", "--block: 3 not in {1,4,8,16}"},
      {"pretrain --data x.seqs --out run --sparsity 0.9 --sparse-lr-scale fast",
       "--sparse-lr-scale"},
      {"pretrain --data x.seqs --out run --sparsity 0.9 --sparse-init wide",
       "--sparse-init wide: expected dense or fan-in"},
      {"pretrain --data x.seqs --out run --sparsity 0.9 --sparse-init fan-in --init model",
       "--sparse-init fan-in sets how new sparse weights start"},
      {"pretrain --data x.seqs --out run --sparsity 1.5", "--sparsity"},
      {"pretrain --data x.seqs --out run --block 4", "--block requires --sparsity"}};
  if (packbert::kernels::bf16_unavailable_reason().empty())
    cases.push_back(
        {"pretrain --data x.seqs --out run --sparsity 0.9 --precision bf16 --master-weights bf16",
         "--sparsity needs fp32 master weights"});
  for (const auto& [args, needle] : cases) {
    Result r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// A sparse run says up front what its pattern will do (how often it moves, how much, how blocks
// regrow, the learning rate's factor, how the kept blocks start), and does it: the update steps'
// records carry the churn; with --prune-ratio 0 it says the pattern is fixed.
TEST_F(Cli, SparsePretrainSaysWhatItsPatternWillDo) {
  const std::string seqs = prepared_corpus("c", 12, 4);
  const std::string common = "pretrain --data " + seqs + " --packs " + (dir_ / "c.packs").string() +
                             " --preset tiny --steps 6 --batch-rows 2 --sparsity 0.5 --block 1 ";
  Result moving = run(common + "--out " + (dir_ / "moving").string() +
                      " --sparse-updates 3 --sparse-lr-scale 2 --sparse-init fan-in");
  ASSERT_EQ(moving.code, 0) << moving.err;
  EXPECT_NE(moving.err.find("pretrain: block-sparse encoder weights, 1 x 1 blocks at s = 0.5; "
                            "pattern updated every 2 steps (2 updates), the first moving 38% of "
                            "each weight's blocks, regrown at random; learning rate x 2; kept "
                            "blocks start N(0, initializer_range / sqrt(kept fraction)) "
                            "(--sparse-init fan-in)\n"),
            std::string::npos)
      << moving.err;
  const std::string log = slurp(dir_ / "moving" / "metrics.jsonl");
  size_t churns = 0;
  for (size_t at = log.find("\"churn\""); at != std::string::npos;
       at = log.find("\"churn\"", at + 1))
    ++churns;
  EXPECT_EQ(churns, 2u) << log;
  Result fixed = run(common + "--out " + (dir_ / "fixed").string() + " --prune-ratio 0");
  ASSERT_EQ(fixed.code, 0) << fixed.err;
  EXPECT_NE(fixed.err.find("1 x 1 blocks at s = 0.5; pattern fixed (--prune-ratio 0); learning "
                           "rate x 1.89 (auto); kept blocks start N(0, initializer_range) "
                           "(--sparse-init dense)\n"),
            std::string::npos)
      << fixed.err;
}

// `cmake --install` gives a binary that finds its vocabulary next to itself, wherever the
// prefix is moved, without the source tree's copy (--help says where it was found).
TEST_F(Cli, InstalledBinaryFindsItsVocabularyWhereverThePrefixMoves) {
  const fs::path build = fs::path(PACKBERT_BINARY).parent_path();
  const fs::path prefix = dir_ / "prefix", moved = dir_ / "moved";
  const std::string install = "cmake --install " + build.string() + " --prefix " + prefix.string() +
                              " >" + (dir_ / "install.log").string() + " 2>&1";
  ASSERT_EQ(std::system(install.c_str()), 0) << slurp(dir_ / "install.log");
  // The man page is built with the binary wherever help2man is (scripts/setup.sh installs it).
  if (fs::exists(build / "packbert.1")) {
    const std::string page = slurp(prefix / "share" / "man" / "man1" / "packbert.1");
    EXPECT_NE(page.find(".TH PACKBERT"), std::string::npos) << page.substr(0, 200);
    EXPECT_NE(page.find("finetune"), std::string::npos);
  }
  fs::rename(prefix, moved);
  const std::string bin = "env -u PACKBERT_VOCAB " + (moved / "bin" / "packbert").string();
  auto shell = [&](const std::string& cmd) {
    const int status = std::system((cmd + " >" + (dir_ / "o").string() + " 2>&1").c_str());
    return std::pair{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir_ / "o")};
  };
  const fs::path vocab = moved / "share" / "packbert" / "bert-base-uncased-vocab.txt";
  auto [help_code, help] = shell(bin + " tokenize --help");
  EXPECT_EQ(help_code, 0);
  EXPECT_NE(help.find("installed with the executable: " + vocab.string()), std::string::npos)
      << help;
  auto [code, ids] = shell("echo 'Hello world' | " + bin + " tokenize");
  EXPECT_EQ(code, 0) << ids;
  EXPECT_EQ(ids, "7592 2088\n");
  const fs::path corpus = write("corpus.txt",
                                "The cat sat on the mat.\nIt was warm.\n\n"
                                "Dogs bark at night.\nThe moon is up.\n");
  auto [prep_code, prep] = shell(bin + " prepare " + corpus.string() + " --out " +
                                 (dir_ / "c.seqs").string() + " --max-seq-len 32");
  EXPECT_EQ(prep_code, 0) << prep;
  EXPECT_TRUE(fs::exists(dir_ / "c.seqs"));
}

}  // namespace

namespace packbert {
namespace {

using testing::Result;
using testing::slurp;
namespace fs = std::filesystem;
using json = nlohmann::json;

// #45: fine-tuning from a Hugging Face classifier keeps its labels, matched by name; a model
// without named labels gets the data's labels sorted (numerically for numbers), never in the
// order the data happens to name them.
class Labels : public testing::CliTest {
 protected:
  // A tiny HF classifier whose config names its outputs positive, negative, neutral (not sorted).
  std::string classifier() {
    const std::string seqs = prepared_corpus("c", 20, 4);
    const std::string run_dir = (dir_ / "run").string();
    Result r = run("pretrain --data " + seqs + " --out " + run_dir +
                   " --preset tiny --steps 2 --batch-rows 4");
    EXPECT_EQ(r.code, 0) << r.err;
    const std::string hf = (dir_ / "hf").string();
    EXPECT_EQ(run("export --checkpoint " + run_dir + "/checkpoint.safetensors --out " + hf).code,
              0);
    tsv("first.tsv", {"negative", "neutral", "positive"});
    const std::string cls = (dir_ / "cls").string();
    r = run("finetune --init " + hf + " --train " + (dir_ / "first.tsv").string() + " --dev " +
            (dir_ / "first.tsv").string() + " --out " + cls + " --epochs 1 --seed 3");
    EXPECT_EQ(r.code, 0) << r.err;
    json config = json::parse(slurp(cls + "/config.json"));
    config["id2label"] = {{"0", "positive"}, {"1", "negative"}, {"2", "neutral"}};
    config["label2id"] = {{"positive", 0}, {"negative", 1}, {"neutral", 2}};
    std::ofstream(cls + "/config.json") << config.dump(2);
    fs::remove(cls + "/labels.json");
    return cls;
  }
  // A TSV cycling through `labels` (the first row has the first), each label with its own words.
  fs::path tsv(const std::string& name, const std::vector<std::string>& labels, int rows = 24) {
    std::string text = "label\tsentence\n";
    for (int i = 0; i < rows; ++i) {
      const std::string& l = labels[static_cast<size_t>(i) % labels.size()];
      text += l + "\tthe " + l + " king of the city number " + std::to_string(i) + "\n";
    }
    return write(name, text);
  }
  // A tiny pre-trained checkpoint (no classifier): where a new head starts.
  std::string pretrained() {
    const std::string seqs = prepared_corpus("c", 20, 4);
    EXPECT_EQ(run("pretrain --data " + seqs + " --out " + (dir_ / "run").string() +
                  " --preset tiny --steps 2 --batch-rows 4")
                  .code,
              0);
    return (dir_ / "run" / "checkpoint.safetensors").string();
  }
  // A tiny SQuAD model fine-tuned from pretrained() on tests/data/squad_tiny.json, in dir_/qa.
  std::string squad_model() {
    const std::string squad = std::string(PACKBERT_SOURCE_DIR) + "/tests/data/squad_tiny.json";
    const std::string qa = (dir_ / "qa").string();
    const Result r = run("finetune --task squad --model " + pretrained() + " --train " + squad +
                         " --dev " + squad + " --out " + qa + " --epochs 1 --max-seq-len 128");
    EXPECT_EQ(r.code, 0) << r.err;
    return qa;
  }
  // A dev file whose labels are one off the training rule of tsv() (a "negative" sentence
  // labelled neutral, ...): the better a model learns the training data, the worse it scores.
  fs::path mixed_dev() {
    std::string dev = "label\tsentence\n";
    const char* names[] = {"negative", "neutral", "positive"};
    for (int i = 0; i < 30; ++i)
      dev.append(names[(i + 1) % 3])
          .append("\tthe ")
          .append(names[i % 3])
          .append(" king of the city number " + std::to_string(i) + "\n");
    return write("dev_mixed.tsv", dev);
  }
  std::vector<float> tensor(const std::string& dir, const std::string& name) {
    return io::SafetensorsFile::read(dir + "/model.safetensors").floats(name);
  }
};

TEST_F(Labels, AClassifiersLabelsAreKeptByNameAndItsOutputsUnchanged) {
  const std::string cls = classifier();
  // The data names "neutral" first: the model's order (positive, negative, neutral) stays.
  const fs::path data = tsv("d.tsv", {"neutral", "negative", "positive"});
  const std::string out = (dir_ / "tuned").string();
  Result r = run("finetune --init " + cls + " --train " + data.string() + " --dev " +
                 data.string() + " --out " + out + " --epochs 1 --lr 1e-12 --warmup 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("0 positive, 1 negative, 2 neutral"), std::string::npos) << r.err;
  const json config = json::parse(slurp(out + "/config.json"));
  EXPECT_EQ(config["id2label"], json::parse(slurp(cls + "/config.json"))["id2label"]);
  EXPECT_EQ(config["label2id"]["neutral"], 2);
  // Row by row, the classifier is the one it started from (a learning rate of 1e-12 moves
  // nothing a float can see): no row was given to another label.
  const std::vector<float> before = tensor(cls, "classifier.weight"),
                           after = tensor(out, "classifier.weight");
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) ASSERT_NEAR(after[i], before[i], 1e-6) << i;
  // eval reads the mapping from config.json (no labels.json): the same predictions, the same
  // accuracy, for the starting model and the fine-tuned one.
  fs::remove(out + "/labels.json");
  Result a = run("eval --task classify --model " + cls + " --data " + data.string());
  Result b = run("eval --task classify --model " + out + " --data " + data.string());
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
}

// #45 item 8: a fine-tuned classifier exports as the classifier it is, and a masked-LM model
// (no pooler, no NSP head) is evaluated on MLM.
TEST_F(Labels, EveryHeadExportsAndAMaskedLmModelEvaluates) {
  const std::string cls = classifier();
  const std::string x = (dir_ / "exported").string();
  Result r = run("export --checkpoint " + cls + " --out " + x);
  ASSERT_EQ(r.code, 0) << r.err;
  const json config = json::parse(slurp(x + "/config.json"));
  EXPECT_EQ(config["architectures"][0], "BertForSequenceClassification");
  EXPECT_EQ(config["id2label"], json::parse(slurp(cls + "/config.json"))["id2label"]);
  io::SafetensorsFile a = io::SafetensorsFile::read(cls + "/model.safetensors"),
                      b = io::SafetensorsFile::read(x + "/model.safetensors");
  EXPECT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& [name, e] : a.tensors()) EXPECT_EQ(a.raw(name), b.raw(name)) << name;
  EXPECT_FALSE(b.has("cls.predictions.transform.dense.weight"));

  // A BertForMaskedLM: the pre-training export less its pooler and NSP head.
  const std::string hf = (dir_ / "hf").string(), mlm = (dir_ / "mlm").string();
  fs::create_directories(mlm);
  io::SafetensorsFile full = io::SafetensorsFile::read(hf + "/model.safetensors");
  std::vector<io::TensorToWrite> kept;
  for (const auto& [name, e] : full.tensors()) {
    if (name.starts_with("bert.pooler.") || name.starts_with("cls.seq_relationship.")) continue;
    const std::string_view raw = full.raw(name);
    kept.push_back({name, e.dtype, e.shape, raw.data(), raw.size()});
  }
  io::write_safetensors(mlm + "/model.safetensors", kept, {{"format", "pt"}});
  json mc = json::parse(slurp(hf + "/config.json"));
  mc["architectures"] = {"BertForMaskedLM"};
  std::ofstream(mlm + "/config.json") << mc.dump(2);
  const std::string seqs = (dir_ / "c.seqs").string();
  Result ev = run("eval --model " + mlm + " --data " + seqs);
  ASSERT_EQ(ev.code, 0) << ev.err;
  EXPECT_NE(ev.out.find("absent (a masked-LM model)"), std::string::npos) << ev.out;
  Result full_ev = run("eval --model " + hf + " --data " + seqs);
  ASSERT_EQ(full_ev.code, 0) << full_ev.err;
  // The same MLM numbers as the full model it was cut from.
  auto value = [](const std::string& table, const std::string& row) {
    std::istringstream in(table.substr(table.find(row) + row.size()));
    std::string v;
    in >> v;
    return v;
  };
  EXPECT_EQ(value(ev.out, "MLM loss"), value(full_ev.out, "MLM loss"));
  EXPECT_EQ(value(ev.out, "MLM accuracy"), value(full_ev.out, "MLM accuracy"));

  // It exports as the BertForMaskedLM it is: the same tensors bit for bit (no pooler, no NSP
  // head added), its config fields kept.
  const std::string mx = (dir_ / "mlm_exported").string();
  Result mr = run("export --model " + mlm + " --out " + mx);
  ASSERT_EQ(mr.code, 0) << mr.err;
  const json mxc = json::parse(slurp(mx + "/config.json"));
  EXPECT_EQ(mxc["architectures"], json::array({"BertForMaskedLM"}));
  for (const auto& [key, value] : mc.items()) {
    if (key != "architectures" && key != "torch_dtype") {
      EXPECT_EQ(mxc[key], value) << key;
    }
  }
  io::SafetensorsFile before = io::SafetensorsFile::read(mlm + "/model.safetensors"),
                      after = io::SafetensorsFile::read(mx + "/model.safetensors");
  EXPECT_EQ(before.tensors().size(), after.tensors().size());
  for (const auto& [name, e] : before.tensors())
    EXPECT_EQ(before.raw(name), after.raw(name)) << name;
  EXPECT_FALSE(after.has("bert.pooler.dense.weight"));
}

// #45: --save-best METRIC writes the model of the best dev epoch: metrics.jsonl records each new
// best (a strictly higher value), the written model scores exactly that epoch's dev accuracy, and
// the best weights' file goes once the model is written. A metric the task lacks is refused.
TEST_F(Labels, SaveBestWritesTheBestDevEpochsModel) {
  const std::string cls = classifier();
  // Dev labels one off the training rule (a "negative" sentence labelled neutral, ...): the
  // better the model learns the training data, the worse it scores on dev, so the best dev
  // epoch comes before the last.
  const fs::path dev_path = mixed_dev();
  const fs::path train = tsv("train_best.tsv", {"negative", "neutral", "positive"}, 48);
  const std::string out = (dir_ / "best").string();
  Result r =
      run("finetune --init " + cls + " --train " + train.string() + " --dev " + dev_path.string() +
          " --out " + out + " --epochs 4 --seed 5 --lr 2e-2 " + "--save-best accuracy");
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<double> acc;
  std::vector<int> best_epochs;
  std::istringstream log(slurp(out + "/metrics.jsonl"));
  for (std::string line; std::getline(log, line);) {
    const json j = json::parse(line);
    if (j["type"] == "eval") acc.push_back(j["dev_acc"].get<double>());
    if (j["type"] == "best") {
      best_epochs.push_back(j["epoch"].get<int>());
      EXPECT_EQ(j["metric"], "accuracy");
      EXPECT_EQ(j["value"].get<double>(), acc.back());
    }
  }
  ASSERT_EQ(acc.size(), 4u);
  const size_t best = static_cast<size_t>(std::max_element(acc.begin(), acc.end()) - acc.begin());
  std::cout << "  dev accuracy by epoch:";
  for (double a : acc) std::cout << " " << a;
  std::cout << "; best epoch " << best + 1 << "\n";
  // The data is made so that learning the training rule costs dev accuracy: on the CPUs seen
  // the last epoch scores below the best (4 epochs at 2e-2: 1/3, 1/3, 1/3, 0), so writing the last
  // epoch's model fails the eval check below. Where the dynamics land otherwise, it is said.
  if (!(acc.back() < acc[best]))
    std::cout << "  (this run's last epoch is as good as its best: best and last not told apart)\n";
  ASSERT_FALSE(best_epochs.empty());
  EXPECT_EQ(best_epochs.front(), 1);
  EXPECT_EQ(best_epochs.back(), static_cast<int>(best) + 1);
  for (size_t k = 1; k < best_epochs.size(); ++k)
    EXPECT_GT(acc[best_epochs[k] - 1], acc[best_epochs[k - 1] - 1]);
  Result ev = run("eval --task classify --model " + out + " --data " + dev_path.string());
  ASSERT_EQ(ev.code, 0) << ev.err;
  char want[32];
  std::snprintf(want, sizeof want, "%.4f", acc[best]);
  EXPECT_NE(ev.out.find(want), std::string::npos) << ev.out << " best epoch " << best + 1;
  EXPECT_FALSE(fs::exists(out + ".best.safetensors"));
  Result bad = run("finetune --init " + cls + " --train " + train.string() + " --dev " +
                   dev_path.string() + " --out " + (dir_ / "x").string() + " --save-best loss");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--save-best 'loss' is not a dev metric of classify"), std::string::npos)
      << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
}

TEST_F(Labels, AnUnknownLabelIsRefusedUnlessANewHeadIsAskedFor) {
  const std::string cls = classifier();
  const fs::path data = tsv("d.tsv", {"neutral", "mixed", "positive"});
  Result r = run("finetune --init " + cls + " --train " + data.string() + " --dev " +
                 data.string() + " --out " + (dir_ / "o").string() + " --epochs 1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("label 'mixed' is not one of the model's labels"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--new-head"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "o"));
  r = run("finetune --init " + cls + " --train " + data.string() + " --dev " + data.string() +
          " --out " + (dir_ / "o").string() + " --epochs 1 --new-head");
  ASSERT_EQ(r.code, 0) << r.err;
  const json config = json::parse(slurp((dir_ / "o" / "config.json").string()));
  EXPECT_EQ(config["id2label"], (json{{"0", "mixed"}, {"1", "neutral"}, {"2", "positive"}}));
}

TEST_F(Labels, WithoutAClassifierTheLabelsAreSortedNumericallyWhenTheyAreNumbers) {
  const std::string init = pretrained();
  for (const auto& [labels, want] : std::vector<std::pair<std::vector<std::string>, json>>{
           {{"10", "2", "1"}, {{"0", "1"}, {"1", "2"}, {"2", "10"}}},
           {{"1", "0"}, {{"0", "0"}, {"1", "1"}}},
           {{"pos", "neg"}, {{"0", "neg"}, {"1", "pos"}}}}) {
    const fs::path data = tsv("d.tsv", labels);
    const std::string out = (dir_ / ("o" + labels[0])).string();
    Result r = run("finetune --init " + init + " --train " + data.string() + " --dev " +
                   data.string() + " --out " + out + " --epochs 1");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(json::parse(slurp(out + "/config.json"))["id2label"], want) << labels[0];
    EXPECT_NE(r.err.find("a new classifier; the data's labels, sorted"), std::string::npos)
        << r.err;
  }
}

// #45: decimal labels (STS-B's 3.800) train a regression head, as run_glue decides; its table
// and eval say Pearson and Spearman; --classification makes them classes; --regression and
// --classification together are refused.
TEST_F(Labels, DecimalLabelsTrainARegressionHeadUnlessClassesAreAskedFor) {
  const std::string init = pretrained();
  const fs::path data = tsv("d.tsv", {"3.500", "1.250", "0.500"});
  const std::string common = "finetune --init " + init + " --train " + data.string() + " --dev " +
                             data.string() + " --epochs 1";
  const std::string reg = (dir_ / "reg").string();
  Result r = run(common + " --out " + reg);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("a new regression head (one output, mean squared error)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("dev Pearson"), std::string::npos) << r.out;
  const json config = json::parse(slurp(reg + "/config.json"));
  EXPECT_EQ(config["problem_type"], "regression");
  EXPECT_EQ(config["num_labels"], 1);
  Result ev = run("eval --task classify --model " + reg + " --data " + data.string());
  ASSERT_EQ(ev.code, 0) << ev.err;
  EXPECT_NE(ev.out.find("Spearman"), std::string::npos) << ev.out;
  EXPECT_EQ(ev.out.find("accuracy"), std::string::npos) << ev.out;
  const std::string cls = (dir_ / "cls").string();
  r = run(common + " --out " + cls + " --classification");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(slurp(cls + "/config.json"))["id2label"],
            (json{{"0", "0.500"}, {"1", "1.250"}, {"2", "3.500"}}));
  r = run(common + " --out " + (dir_ / "x").string() + " --regression --classification");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--regression and --classification contradict"), std::string::npos) << r.err;
  r = run(common + " --out " + (dir_ / "x").string() + " --task-name stsb --classification");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--task-name stsb is a regression task; --classification contradicts it"),
            std::string::npos)
      << r.err;
  // Labels that are not numbers cannot be a regression's targets.
  const fs::path words = tsv("w.tsv", {"pos", "neg"});
  r = run("finetune --init " + init + " --train " + words.string() + " --dev " + words.string() +
          " --epochs 1 --regression --out " + (dir_ / "y").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("label 'neg' is not a number"), std::string::npos) << r.err;
}

// #45: each GLUE task's metric leads its scores (MRPC's F1, shown by its header; CoLA's MCC,
// named with --task-name as run_glue's --task_name), in finetune's table and in eval's.
TEST_F(Labels, TheGlueTasksMetricLeadsTheScores) {
  const std::string init = pretrained();
  std::string mrpc = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n";
  for (int i = 0; i < 24; ++i)
    mrpc += std::to_string(i % 2) + "\t" + std::to_string(i) + "\t" + std::to_string(i + 100) +
            "\tthe king of city " + std::to_string(i) + "\tthe war of " + std::to_string(i) + "\n";
  const fs::path data = write("mrpc.tsv", mrpc);
  const std::string out = (dir_ / "mrpc").string();
  Result r = run("finetune --init " + init + " --train " + data.string() + " --dev " +
                 data.string() + " --out " + out + " --epochs 1");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_NE(r.out.find("dev F1"), std::string::npos) << r.out;
  EXPECT_LT(r.out.find("dev F1"), r.out.find("dev accuracy")) << r.out;
  EXPECT_NE(r.out.find("GLUE task mrpc, scored by F1"), std::string::npos) << r.out;
  const fs::path sst = tsv("sst.tsv", {"0", "1"});
  Result ev =
      run("eval --task classify --model " + out + " --data " + sst.string() + " --task-name cola");
  ASSERT_EQ(ev.code, 0) << ev.err;
  ASSERT_NE(ev.out.find("MCC"), std::string::npos) << ev.out;
  EXPECT_LT(ev.out.find("MCC"), ev.out.find("accuracy")) << ev.out;
  EXPECT_NE(ev.out.find("cola (MCC)"), std::string::npos) << ev.out;
  Result bad =
      run("eval --task classify --model " + out + " --data " + sst.string() + " --task-name colaa");
  EXPECT_EQ(bad.code, 2) << bad.err;
}

// #45: the casing a model was trained with is the casing it is fine-tuned and evaluated with:
// the flag, else tokenizer_config.json, else the vocabulary; contradictions are warned about.
class Casing : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    const std::string seqs = prepared_corpus("c", 20, 4);
    ASSERT_EQ(run("pretrain --data " + seqs + " --out " + (dir_ / "run").string() +
                  " --preset tiny --steps 2 --batch-rows 4")
                  .code,
              0);
    hf_ = (dir_ / "hf").string();
    ASSERT_EQ(run("export --checkpoint " + (dir_ / "run/checkpoint.safetensors").string() +
                  " --out " + hf_)
                  .code,
              0);
    std::string tsv = "label\tsentence\n";
    for (int i = 0; i < 16; ++i) tsv += (i % 2 ? "a\tThe King of Paris\n" : "b\tthe war\n");
    tsv_ = write("t.tsv", tsv).string();
    // The same size as the default vocabulary, 60 of its [unusedN] entries capitalised words.
    std::string vocab = slurp(PACKBERT_SOURCE_VOCAB);
    for (int i = 0; i < 60; ++i) {
      const std::string from = "[unused" + std::to_string(i) + "]\n";
      vocab.replace(vocab.find(from), from.size(), "Word" + std::to_string(i) + "\n");
    }
    cased_vocab_ = write("cased.txt", vocab).string();
  }
  Result finetune(const std::string& extra) {
    return run("finetune --init " + hf_ + " --train " + tsv_ + " --dev " + tsv_ + " --out " +
               (dir_ / "tuned").string() + " --overwrite --epochs 1 " + extra);
  }
  std::string hf_, tsv_, cased_vocab_;
};

TEST_F(Casing, TokenizerConfigDecidesAndAContradictingFlagIsWarnedAbout) {
  std::ofstream(hf_ + "/tokenizer_config.json") << R"({"do_lower_case": false})";
  Result r = finetune("");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("tokenising cased (do_lower_case false in"), std::string::npos) << r.err;
  // (the vocabulary here is bert-base-uncased's: said so, too)
  EXPECT_NE(r.err.find("warning: keeping case with an uncased vocabulary"), std::string::npos)
      << r.err;
  // The fine-tuned model says its casing where transformers' tokenizer looks for it.
  EXPECT_EQ(json::parse(slurp(dir_ / "tuned/tokenizer_config.json"))["do_lower_case"], false);
  r = finetune("--uncased");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: --uncased contradicts"), std::string::npos) << r.err;
  EXPECT_EQ(json::parse(slurp(dir_ / "tuned/tokenizer_config.json"))["do_lower_case"], true);
  Result e = run("eval --task classify --model " + (dir_ / "tuned").string() + " --data " + tsv_);
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.err.find("tokenising uncased (do_lower_case true"), std::string::npos) << e.err;
  Result both = finetune("--cased --uncased");
  EXPECT_EQ(both.code, 2) << both.err;
}

TEST_F(Casing, WithoutATokenizerConfigTheVocabularyDecides) {
  fs::remove(hf_ + "/tokenizer_config.json");  // (export writes one; a model may come without)
  Result r = finetune("");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("tokenising uncased ("), std::string::npos) << r.err;
  r = finetune("--vocab " + cased_vocab_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("tokenising cased (" + cased_vocab_ + " has 60 entries with capitals"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(json::parse(slurp(dir_ / "tuned/tokenizer_config.json"))["do_lower_case"], false);
  r = finetune("--cased");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: keeping case with an uncased vocabulary"), std::string::npos)
      << r.err;
}

TEST_F(Casing, TokenizeAndPrepareWarnWhenTheCasingContradictsTheVocabulary) {
  Result t = run("tokenize --cased " + tsv_);
  EXPECT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.err.find("warning: keeping case with an uncased vocabulary"), std::string::npos)
      << t.err;
  t = run("tokenize --vocab " + cased_vocab_ + " " + tsv_);
  EXPECT_NE(t.err.find("warning: lowercasing for a cased vocabulary"), std::string::npos) << t.err;
  t = run("tokenize --vocab " + cased_vocab_ + " --cased " + tsv_);
  EXPECT_EQ(t.err.find("warning"), std::string::npos) << t.err;
  Result p = run("prepare " + tsv_ + " --out " + (dir_ / "p.seqs").string() + " --cased");
  EXPECT_NE(p.err.find("warning: keeping case with an uncased vocabulary"), std::string::npos)
      << p.err;
}

// #45: an unknown subcommand or flag gets the nearest real one, and Hugging Face's flag names
// get packbert's.
class Suggest : public testing::CliTest {};

TEST_F(Suggest, UnknownNamesGetASuggestion) {
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"pretrian", "unknown subcommand 'pretrian'; did you mean 'pretrain'?"},
           {"finetnue --epochs 1", "did you mean 'finetune'?"},
           {"pretrain --learning_rate 1e-4",
            "unknown flag '--learning_rate' for pretrain; "
            "packbert's is --lr"},
           {"finetune --num_train_epochs 3", "packbert's is --epochs"},
           {"finetune --per_device_train_batch_size 8", "packbert's is --batch-rows"},
           {"finetune --model_name_or_path x", "packbert's is --init"},
           {"pretrain --fp16", "packbert's is --precision fp16"},
           {"pretrain --stpes 10", "did you mean '--steps'?"},
           {"pretrain --num_train_epochs 3", "unknown flag '--num_train_epochs' for pretrain"},
           {"prepare x --out y --max_seq_length 64", "packbert's is --max-seq-len"},
           {"finetune --save_total_limit 2", "packbert's is --keep-checkpoints"},
           {"finetune --max_steps 100", "packbert's is --steps"},
           {"finetune --warmup_ratio 0.1", "did you mean '--warmup-ratio'?"},
           {"finetune --report_to tensorboard", "did you mean '--report-to'?"},
           {"finetune --eval_strategy steps", "packbert's is --eval-steps N"},
           {"finetune --logging_dir runs", "packbert's is --report-to tensorboard"},
           {"pretrain --eval_steps 100", "packbert's is --eval-every"}}) {
    Result r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_NE(r.err.find(says), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  Result r = run("pretrain --num_train_epochs 3");  // pretrain counts steps, not epochs
  EXPECT_EQ(r.err.find("--epochs"), std::string::npos) << r.err;
}

// #45 item 7: finetune and eval say what they do while they do it; eval scores a file's
// held-out split, not its training sequences, unless asked.
TEST_F(Labels, FinetuneAndEvalShowProgressAndEvalScoresTheHeldOutSplit) {
  const std::string init = pretrained();
  const fs::path data = tsv("d.tsv", {"a", "b"}, 48);
  Result r = run("finetune --init " + init + " --train " + data.string() + " --dev " +
                 data.string() + " --out " + (dir_ / "ft").string() +
                 " --epochs 2 --batch-rows 2 --no-pack --logging-steps 5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("finetune: step 5/48  epoch 1/2  loss "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("finetune: step 48/48  epoch 2/2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" tok/s  ETA "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("step 6/48"), std::string::npos) << r.err;  // every 5, not every step

  // A sequences file with a held-out split: that split is scored, or all with --all.
  const std::string split = (dir_ / "s.seqs").string();
  std::string text;
  for (int d = 0; d < 40; ++d)
    text += "the king of the city number " + std::to_string(d) + " .\nthe war .\n\n";
  ASSERT_EQ(run("prepare " + write("s.txt", text).string() + " --out " + split +
                " --max-seq-len 32 --eval-fraction 0.25")
                .code,
            0);
  const data::SequencesFile f = data::read_sequences(split);
  ASSERT_TRUE(f.has_heldout_split());
  const std::string held = std::to_string(f.size() - f.heldout_begin),
                    all = std::to_string(f.size());
  Result e = run("eval --model " + init + " --data " + split);
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.err.find("eval: scoring " + held + " of " + all + " sequences (the held-out"),
            std::string::npos)
      << e.err;
  EXPECT_NE(e.out.find(" " + held + "\n"), std::string::npos) << e.out;  // the sequences row
  e = run("eval --model " + init + " --data " + split + " --all --max-sequences 7");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.err.find("eval: scoring 7 of " + all + " sequences\n"), std::string::npos) << e.err;
}

// #45 item 10: packbert plot draws any metric of any runs' metrics.jsonl, one line per run.
TEST_F(Labels, PlotDrawsEveryRunsCurve) {
  const std::string seqs = prepared_corpus("c", 20, 4);
  for (const char* run_name : {"first", "second"})
    ASSERT_EQ(run("pretrain --data " + seqs + " --out " + (dir_ / run_name).string() +
                  " --preset tiny --steps 4 --batch-rows 4 --eval-every 2")
                  .code,
              0);
  const std::string svg = (dir_ / "c.svg").string();
  Result r =
      run("plot " + (dir_ / "first").string() + " " + (dir_ / "second/metrics.jsonl").string() +
          " --metric eval.mlm_loss --x seconds --out " + svg);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string text = slurp(svg);
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  size_t lines = 0;
  for (size_t at = 0; (at = text.find("<polyline", at)) != std::string::npos; ++at) ++lines;
  EXPECT_EQ(lines, 2u);
  EXPECT_NE(text.find(">first<"), std::string::npos);
  EXPECT_NE(text.find(">second<"), std::string::npos);
  // #59 item 6: 200,000 records draw a few thousand points (the first, lowest, highest and last
  // of each pixel column), not 200,000: the file stays small, the extremes stay drawn.
  std::string big;
  for (int step = 1; step <= 200000; ++step)
    big += "{\"type\": \"step\", \"step\": " + std::to_string(step) + ", \"loss\": " +
           (step == 123457 ? std::string("9.5") : std::to_string(2.0 + (step % 7) * 0.01)) + "}\n";
  const std::string long_run = write("long.jsonl", big).string();
  r = run("plot " + long_run + " --metric loss --out " + svg);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string drawn = slurp(svg);
  EXPECT_LT(drawn.size(), 200000u);
  // The polyline's points: a few per pixel column, the one spike among them (y 9.5 on an axis to
  // 10 is 58 px from the top of a 460 px plot with 40 and 60 px margins).
  const size_t from = drawn.find("points=\"") + 8;
  std::istringstream pts(drawn.substr(from, drawn.find('"', from) - from));
  double x = 0, y = 0, top = 1e9;
  char comma = 0;
  size_t n = 0;
  while (pts >> x >> comma >> y) top = std::min(top, y), ++n;
  EXPECT_LE(n, 4u * 700);
  EXPECT_GT(n, 700u);
  EXPECT_NEAR(top, 58, 0.5);
  // #59 item 8: a fine-tuning run's dev scores plot by training seconds too; records that lack
  // the x axis are named as such, not as records without the metric.
  const std::string tuned = (dir_ / "tuned").string();
  const fs::path data = tsv("d.tsv", {"neg", "pos"});
  r = run("finetune --model " + (dir_ / "first/checkpoint.safetensors").string() + " --train " +
          data.string() + " --dev " + data.string() + " --out " + tuned + " --epochs 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("finetune: epoch 1/2 (step "), std::string::npos) << r.err;  // when measured
  r = run("plot " + tuned + " --metric eval.dev_acc --x seconds --out " + svg);
  EXPECT_EQ(r.code, 0) << r.err;
  write("old.jsonl", "{\"type\": \"eval\", \"step\": 3, \"dev_acc\": 0.5}\n");
  r = run("plot " + (dir_ / "old.jsonl").string() + " --metric eval.dev_acc --x seconds --out " +
          svg);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("have no 'elapsed'"), std::string::npos) << r.err;
  Result bad = run("plot " + (dir_ / "first").string() + " --metric accuracy --out " + svg);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("no record has 'accuracy' (numbers its records have: "), std::string::npos)
      << bad.err;
}

// #45 item 10: --model names the model on every command that reads one (the older names stay).
TEST_F(Labels, EveryCommandTakesTheModelAsModel) {
  const std::string seqs = prepared_corpus("c", 20, 4);
  ASSERT_EQ(run("pretrain --data " + seqs + " --out " + (dir_ / "run").string() +
                " --preset tiny --steps 2 --batch-rows 4")
                .code,
            0);
  const std::string ckpt = (dir_ / "run/checkpoint.safetensors").string();
  Result r = run("export --model " + ckpt + " --out " + (dir_ / "hf").string());
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("eval --model " + (dir_ / "hf").string() + " --data " + seqs);
  ASSERT_EQ(r.code, 0) << r.err;
  const fs::path data = tsv("d.tsv", {"a", "b"});
  r = run("finetune --model " + (dir_ / "hf").string() + " --train " + data.string() + " --dev " +
          data.string() + " --out " + (dir_ / "ft").string() + " --epochs 1");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string pred = (dir_ / "pred.tsv").string();
  r = run("eval --task classify --model " + (dir_ / "ft").string() + " --data " + data.string() +
          " --predictions " + pred);
  ASSERT_EQ(r.code, 0) << r.err;
  // run_glue's predict_results: a header, then each example's index and predicted label.
  std::istringstream lines(slurp(pred));
  std::string line;
  ASSERT_TRUE(std::getline(lines, line));
  EXPECT_EQ(line, "index\tprediction");
  int n = 0;
  for (; std::getline(lines, line); ++n) {
    EXPECT_EQ(line.substr(0, line.find('\t')), std::to_string(n));
    const std::string label = line.substr(line.find('\t') + 1);
    EXPECT_TRUE(label == "a" || label == "b") << line;
  }
  EXPECT_EQ(n, 24);
}

// A Hugging Face directory of another architecture is refused by its model_type, in one line, by
// every command that reads a model, not by the first BERT tensor its weights lack.
TEST_F(Labels, AnotherModelTypeIsRefusedByName) {
  const std::string hf = (dir_ / "hf").string();
  ASSERT_EQ(run("export --checkpoint " + pretrained() + " --out " + hf).code, 0);
  const fs::path data = tsv("d.tsv", {"a", "b"});
  const std::string seqs = prepared_corpus("c", 20, 4);
  ASSERT_EQ(json::parse(slurp(hf + "/config.json"))["model_type"], "bert");
  for (const char* type : {"roberta", "distilbert"}) {
    json config = json::parse(slurp(hf + "/config.json"));
    config["model_type"] = type;
    std::ofstream(hf + "/config.json") << config.dump(2);
    for (const std::string& cmd :
         {"eval --model " + hf + " --data " + seqs,
          "export --model " + hf + " --out " + (dir_ / "x").string(),
          "finetune --init " + hf + " --train " + data.string() + " --dev " + data.string() +
              " --out " + (dir_ / "ft").string(),
          "predict --model " + hf + " --data " + data.string() + " --out " +
              (dir_ / "p.tsv").string()}) {
      const Result r = run(cmd);
      EXPECT_EQ(r.code, 2) << cmd;
      EXPECT_NE(r.err.find("model_type \"" + std::string(type) + "\" is not BERT"),
                std::string::npos)
          << cmd << ": " << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << cmd << ": " << r.err;
    }
    EXPECT_FALSE(fs::exists(dir_ / "x"));
    EXPECT_FALSE(fs::exists(dir_ / "ft"));
    EXPECT_FALSE(fs::exists(dir_ / "p.tsv"));
  }
}

// predict on text without labels, as TSV, CSV and JSONL: one line per example, its index and label
// the very ones `eval --predictions` writes for the same text with labels, then every label's
// probability (in the model's id order, summing to 1, the predicted label's the largest). A label
// column in the file is not read: the same output.
TEST_F(Labels, PredictOnUnlabelledTextEqualsEvalsPredictions) {
  const std::string cls = classifier();  // labels positive, negative, neutral (not sorted)
  const fs::path labelled = tsv("d.tsv", {"neutral", "negative", "positive", "neutral"}, 30);
  const std::string evaluated = (dir_ / "eval.tsv").string();
  Result r = run("eval --task classify --model " + cls + " --data " + labelled.string() +
                 " --predictions " + evaluated);
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> sentences;
  {
    std::istringstream in(slurp(labelled.string()));
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) sentences.push_back(line.substr(line.find('\t') + 1));
  }
  std::string t = "sentence\n", csv = "sentence\n", jsonl;
  for (const std::string& s : sentences) {
    t += s + "\n";
    csv += "\"" + s + "\"\n";
    jsonl += json{{"sentence", s}}.dump() + "\n";
  }
  const std::vector<fs::path> inputs = {write("u.tsv", t), write("u.csv", csv),
                                        write("u.jsonl", jsonl), labelled};
  std::string first;
  for (const fs::path& in : inputs) {
    const std::string out = (dir_ / (in.filename().string() + ".pred.tsv")).string();
    r = run("predict --model " + cls + " --data " + in.string() + " --out " + out);
    ASSERT_EQ(r.code, 0) << in << ": " << r.err;
    EXPECT_NE(r.out.find("predict: 30 examples"), std::string::npos) << r.out;
    const std::string got = slurp(out);
    if (first.empty()) first = got;
    EXPECT_EQ(got, first) << in;
  }
  std::istringstream lines(first), expected(slurp(evaluated));
  std::string line, want;
  ASSERT_TRUE(std::getline(lines, line));
  EXPECT_EQ(line, "index\tprediction\tpositive\tnegative\tneutral");
  ASSERT_TRUE(std::getline(expected, want));
  const std::vector<std::string> names = {"positive", "negative", "neutral"};
  int n = 0;
  for (; std::getline(lines, line); ++n) {
    ASSERT_TRUE(std::getline(expected, want));
    std::istringstream cells(line);
    std::string index, label;
    std::getline(cells, index, '\t');
    std::getline(cells, label, '\t');
    EXPECT_EQ(index + "\t" + label, want);
    std::vector<double> p(3);
    for (double& x : p) cells >> x;
    EXPECT_NEAR(p[0] + p[1] + p[2], 1.0, 2e-6) << line;
    EXPECT_EQ(names[static_cast<size_t>(std::max_element(p.begin(), p.end()) - p.begin())], label)
        << line;
  }
  EXPECT_EQ(n, 30);
  EXPECT_FALSE(std::getline(expected, want)) << "eval predicted more examples";
  // The output never replaces an input; a file without text is refused in one line.
  r = run("predict --model " + cls + " --data " + inputs[0].string() + " --out " +
          inputs[0].string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("an output never replaces an input"), std::string::npos) << r.err;
  r = run("predict --model " + cls + " --data " + write("x.tsv", "words\nsome\n").string() +
          " --out " + (dir_ / "x.pred").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// predict on SQuAD questions without answers: the answers `eval --predictions` gives for the same
// questions with answers, with one window per context and with several (--max-seq-len 64
// --doc-stride 16); for v2.0 (unanswerable questions added) with the null odds of every question
// beside them; without --version-2-with-negative a file without answers is read as v1.1.
TEST_F(Labels, PredictOnSquadWithoutAnswersEqualsEvalsPredictions) {
  const std::string qa = squad_model();
  json v2 = json::parse(slurp(std::string(PACKBERT_SOURCE_DIR) + "/tests/data/squad_tiny.json"));
  json& qas = v2["data"][0]["paragraphs"][0]["qas"];
  const std::string question = qas[0]["question"].get<std::string>();
  qas.push_back({{"id", "none-1"},
                 {"question", "who painted the moon"},
                 {"answers", json::array()},
                 {"is_impossible", true}});
  qas.push_back({{"id", "none-2"},
                 {"question", question + " on mars"},
                 {"answers", json::array()},
                 {"is_impossible", true}});
  json bare = v2;  // the same questions, no answers at all
  for (json& article : bare["data"])
    for (json& paragraph : article["paragraphs"])
      for (json& q : paragraph["qas"]) q.erase("answers"), q.erase("is_impossible");
  const fs::path answered = write("v2.json", v2.dump()),
                 unanswered = write("bare.json", bare.dump());
  for (const std::string windows : {"", " --max-seq-len 64 --doc-stride 16"}) {
    const std::string e = (dir_ / "eval.json").string(), p = (dir_ / "p/predictions.json").string();
    fs::create_directories(dir_ / "p");
    Result r = run("eval --task squad --model " + qa + " --data " + answered.string() +
                   " --predictions " + e + windows);
    ASSERT_EQ(r.code, 0) << r.err;
    r = run("predict --model " + qa + " --data " + unanswered.string() + " --out " + p +
            " --version-2-with-negative" + windows);
    ASSERT_EQ(r.code, 0) << r.err;
    const json want = json::parse(slurp(e)), got = json::parse(slurp(p));
    EXPECT_EQ(got, want) << windows;
    EXPECT_EQ(got.size(), 8u);
    const json odds = json::parse(slurp((dir_ / "p/null_odds.json").string()));
    ASSERT_EQ(odds.size(), 8u);
    for (const auto& [id, answer] : got.items()) {
      ASSERT_TRUE(odds.contains(id)) << id;
      // "" exactly where the null score beats the best span's (threshold 0).
      EXPECT_EQ(answer.get<std::string>().empty(), odds[id].get<double>() > 0) << id << windows;
    }
    // v1.1: the same file read without the flag answers every question, as eval of v1.1 does.
    fs::remove_all(dir_ / "p");
    fs::create_directories(dir_ / "p");
    json v1 = v2;
    for (json& q : v1["data"][0]["paragraphs"][0]["qas"])
      if (q.value("is_impossible", false)) q["answers"] = {{{"text", "x"}, {"answer_start", 0}}};
    for (json& q : v1["data"][0]["paragraphs"][0]["qas"]) q.erase("is_impossible");
    r = run("eval --task squad --model " + qa + " --data " + write("v1.json", v1.dump()).string() +
            " --predictions " + e + windows);
    ASSERT_EQ(r.code, 0) << r.err;
    r = run("predict --model " + qa + " --data " + unanswered.string() + " --out " + p + windows);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(json::parse(slurp(p)), json::parse(slurp(e))) << windows;
    EXPECT_FALSE(fs::exists(dir_ / "p/null_odds.json"));
  }
}

// #45: a fine-tuned span (SQuAD) model exports as BertForQuestionAnswering, every tensor
// bit-identical, and imports again (convert) to the same tensors.
TEST_F(Labels, AQuestionAnsweringModelExportsAndImportsBitIdentical) {
  const std::string qa = squad_model();
  Result r{0, "", ""};
  const std::string x = (dir_ / "x").string(), back = (dir_ / "back").string();
  r = run("export --model " + qa + " --out " + x);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(x + "/config.json"))["architectures"][0],
            "BertForQuestionAnswering");
  r = run("convert " + x + " --out " + back);
  ASSERT_EQ(r.code, 0) << r.err;
  io::SafetensorsFile a = io::SafetensorsFile::read(qa + "/model.safetensors"),
                      b = io::SafetensorsFile::read(x + "/model.safetensors"),
                      c = io::SafetensorsFile::read(back + "/model.safetensors");
  EXPECT_TRUE(a.has("qa_outputs.weight"));
  EXPECT_EQ(a.tensors().size(), b.tensors().size());
  EXPECT_EQ(a.tensors().size(), c.tensors().size());
  for (const auto& [name, e] : a.tensors()) {
    EXPECT_EQ(a.raw(name), b.raw(name)) << name;
    EXPECT_EQ(a.raw(name), c.raw(name)) << name;
  }
}

// #59 item 3: a model directory's own vocab.txt is what finetune, eval and export tokenise with
// and write out, without --vocab: here a 30,000-entry vocabulary (bert-base-uncased's first
// 30,000 entries, so every word past them tokenises differently). export and convert write
// tokenizer_config.json and special_tokens_map.json as transformers does; --vocab that differs
// from the model's own is warned about.
TEST_F(Labels, AModelsOwnVocabularyIsTheDefault) {
  std::ifstream full(PACKBERT_SOURCE_VOCAB);
  std::string small, line;
  for (int i = 0; i < 30000 && std::getline(full, line); ++i) small += line + "\n";
  const std::string vocab = write("vocab30k.txt", small).string();
  std::string text;
  for (int d = 0; d < 20; ++d) {
    for (int s = 0; s < 4; ++s)
      text += "the king of the city was known as number " + std::to_string(d * 4 + s) + ".\n";
    text += "\n";
  }
  const std::string seqs = (dir_ / "c.seqs").string();
  Result r = run("prepare " + write("c.txt", text).string() + " --out " + seqs +
                 " --max-seq-len 32 --pack optimal --vocab " + vocab);
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("pretrain --data " + seqs + " --out " + (dir_ / "run").string() +
          " --preset tiny --steps 2 --batch-rows 4 --vocab " + vocab);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string hf = (dir_ / "hf").string();
  r = run("export --model " + (dir_ / "run/checkpoint.safetensors").string() + " --out " + hf +
          " --vocab " + vocab);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(hf + "/vocab.txt"), small);
  const json tc = json::parse(slurp(hf + "/tokenizer_config.json"));
  EXPECT_EQ(tc["do_lower_case"], true);
  EXPECT_EQ(tc["tokenizer_class"], "BertTokenizer");
  EXPECT_EQ(json::parse(slurp(hf + "/special_tokens_map.json"))["mask_token"], "[MASK]");

  // No --vocab: fine-tuning, evaluation and export take the model's own.
  const fs::path data = tsv("d.tsv", {"neg", "pos"});
  const std::string cls = (dir_ / "cls").string();
  r = run("finetune --model " + hf + " --train " + data.string() + " --dev " + data.string() +
          " --out " + cls + " --epochs 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(cls + "/vocab.txt"), small);
  Result e = run("eval --task classify --model " + cls + " --data " + data.string());
  ASSERT_EQ(e.code, 0) << e.err;
  const std::string x = (dir_ / "x").string();
  r = run("export --model " + cls + " --out " + x);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(x + "/vocab.txt"), small);
  EXPECT_TRUE(fs::exists(x + "/special_tokens_map.json"));
  EXPECT_EQ(json::parse(slurp(x + "/tokenizer_config.json"))["do_lower_case"], true);
  // --vocab naming another vocabulary: refused where its size cannot fit, and warned about where
  // it overrides the model's own.
  e = run("eval --task classify --model " + cls + " --data " + data.string() + " --vocab " +
          PACKBERT_SOURCE_VOCAB);
  EXPECT_EQ(e.code, 2) << e.err;
  EXPECT_NE(e.err.find("overrides the model's own"), std::string::npos) << e.err;
  // A model with the default vocabulary (no vocab.txt beside it) keeps the default.
  Result d = run("export --model " + (dir_ / "run/checkpoint.safetensors").string() + " --out " +
                 (dir_ / "nov").string());
  EXPECT_EQ(d.code, 2) << d.err;  // 30,000 entries, and bert-base-uncased's 30,522
  EXPECT_NE(d.err.find("30522"), std::string::npos) << d.err;
}

// #59 item 4: transformers' BertForQuestionAnswering has no pooler: such a checkpoint evaluates
// and exports as it is (the same tensors, none added); a bare BertModel (no heads, its tensors
// named without "bert.") exports as a BertModel, bit for bit.
TEST_F(Labels, HuggingFaceModelsWithoutAPoolerOrHeadsEvaluateAndExportAsTheyAre) {
  const std::string qa = squad_model();
  const std::string squad = std::string(PACKBERT_SOURCE_DIR) + "/tests/data/squad_tiny.json";
  // As transformers saves it: no pooler.
  io::SafetensorsFile a = io::SafetensorsFile::read(qa + "/model.safetensors");
  EXPECT_FALSE(a.has("bert.pooler.dense.weight"));
  EXPECT_TRUE(a.has("qa_outputs.weight"));
  Result r = run("eval --task squad --model " + qa + " --data " + squad + " --max-seq-len 128");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string x = (dir_ / "x").string();
  r = run("export --model " + qa + " --out " + x);
  ASSERT_EQ(r.code, 0) << r.err;
  io::SafetensorsFile b = io::SafetensorsFile::read(x + "/model.safetensors");
  EXPECT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& [name, e] : a.tensors()) EXPECT_EQ(a.raw(name), b.raw(name)) << name;

  // A bare encoder, as transformers' BertModel.save_pretrained writes it.
  const std::string hf = (dir_ / "hf").string(), bare = (dir_ / "bare").string();
  ASSERT_EQ(
      run("export --model " + (dir_ / "run/checkpoint.safetensors").string() + " --out " + hf).code,
      0);
  fs::create_directories(bare);
  io::SafetensorsFile full = io::SafetensorsFile::read(hf + "/model.safetensors");
  std::vector<io::TensorToWrite> kept;
  std::vector<std::string> names;
  names.reserve(full.tensors().size());
  for (const auto& [name, e] : full.tensors()) {
    if (!name.starts_with("bert.")) continue;
    names.push_back(name.substr(5));
    const std::string_view raw = full.raw(name);
    kept.push_back({names.back(), e.dtype, e.shape, raw.data(), raw.size()});
  }
  io::write_safetensors(bare + "/model.safetensors", kept, {{"format", "pt"}});
  json config = json::parse(slurp(hf + "/config.json"));
  config["architectures"] = {"BertModel"};
  std::ofstream(bare + "/config.json") << config.dump(2);
  const std::string bx = (dir_ / "bare_exported").string();
  r = run("export --model " + bare + " --out " + bx);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(slurp(bx + "/config.json"))["architectures"], json::array({"BertModel"}));
  io::SafetensorsFile before = io::SafetensorsFile::read(bare + "/model.safetensors"),
                      after = io::SafetensorsFile::read(bx + "/model.safetensors");
  EXPECT_EQ(before.tensors().size(), after.tensors().size());
  for (const auto& [name, e] : before.tensors()) {
    ASSERT_TRUE(after.has(name)) << name;
    EXPECT_EQ(before.raw(name), after.raw(name)) << name;
  }
}

// #45 item 6: a SQuAD v2.0 file trains and scores its unanswerable questions (they used to be
// given an answer and left out of F1 silently).
TEST_F(Labels, SquadV2TrainsAndScoresUnanswerableQuestions) {
  const std::string seqs = prepared_corpus("c", 20, 4);
  ASSERT_EQ(run("pretrain --data " + seqs + " --out " + (dir_ / "run").string() +
                " --preset tiny --steps 2 --batch-rows 4")
                .code,
            0);
  json squad = json::parse(slurp(std::string(PACKBERT_SOURCE_DIR) + "/tests/data/squad_tiny.json"));
  json& qas = squad["data"][0]["paragraphs"][0]["qas"];
  qas.push_back({{"id", "no1"},
                 {"question", "Who wrote the moon?"},
                 {"answers", json::array()},
                 {"is_impossible", true}});
  qas.push_back({{"id", "no2"},
                 {"question", "Where is the sea?"},
                 {"answers", json::array()},
                 {"is_impossible", true}});
  squad["version"] = "v2.0";
  const std::string v2 = write("v2.json", squad.dump()).string();
  const std::string out = (dir_ / "qa").string();
  Result r =
      run("finetune --task squad --model " + (dir_ / "run/checkpoint.safetensors").string() +
          " --train " + v2 + " --dev " + v2 + " --out " + out + " --epochs 1 --max-seq-len 128");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("NoAns EM %"), std::string::npos) << r.out;
  Result e = run("eval --task squad --model " + out + " --data " + v2 +
                 " --max-seq-len 128 --null-score-diff-threshold -1000");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("NoAns questions"), std::string::npos) << e.out;
  // A threshold of -1000 makes every prediction "": every unanswerable question is right.
  const std::string row = e.out.substr(e.out.find("NoAns exact %"));
  EXPECT_EQ(row.substr(0, row.find('\n')).substr(row.find_last_of(' ', row.find('\n')) + 1),
            "100.00")
      << e.out;
}

// What a Trainer user reaches for: --steps, --warmup-ratio, --eval-steps, early stopping,
// checkpoint-STEP/ directories, TensorBoard. The readers of the files written are Node.js
// scripts under tests/tools/ that share no code with packbert (an event reader that checks the
// CRCs, a reader of the transformers layout).
class TrainerHabits : public Labels {
 protected:
  void SetUp() override {
    Labels::SetUp();
    if (std::system("command -v node >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "Node.js is not installed (scripts/setup.sh installs it): the independent "
                      "readers in tests/tools/ need it";
  }
  // The output lines of `node tests/tools/<script> <arg>`, as JSON; exit status in `code`.
  std::vector<json> node(const std::string& script, const std::string& arg, int* code = nullptr) {
    const std::string cmd = "node " + std::string(PACKBERT_SOURCE_DIR) + "/tests/tools/" + script +
                            " " + arg + " >" + (dir_ / "node.out").string() + " 2>" +
                            (dir_ / "node.err").string();
    const int status = std::system(cmd.c_str());
    const Result r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir_ / "node.out"),
                   slurp(dir_ / "node.err")};
    if (code) *code = r.code;
    EXPECT_TRUE(code || r.code == 0) << r.err;
    std::vector<json> out;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  static std::vector<json> records(const std::string& metrics) {
    std::vector<json> out;
    std::istringstream in(slurp(metrics));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // Every number of every metrics.jsonl record is in the event files with its step.
  void expect_every_scalar(const std::string& run_dir) {
    std::set<std::tuple<std::string, int64_t, float>> events;
    for (const json& e : node("read_tfevents.js", run_dir + "/runs"))
      if (e.contains("tag"))
        events.insert({e["tag"], e["step"].get<int64_t>(), e["value"].get<float>()});
    size_t checked = 0;
    for (const json& r : records(run_dir + "/metrics.jsonl")) {
      const std::string type = r.value("type", std::string("step"));
      for (const auto& [key, value] : r.items()) {
        if (key == "step" || !value.is_number()) continue;
        ++checked;
        const std::string tag = (type == "step" ? std::string("train") : type) + "/" + key;
        EXPECT_TRUE(events.count({tag, r["step"].get<int64_t>(), value.get<float>()}))
            << tag << " at step " << r["step"] << " = " << value;
      }
    }
    EXPECT_GT(checked, 50u);
    std::cout << "  " << checked << " scalars of metrics.jsonl found in " << run_dir << "/runs\n";
  }
};

TEST_F(TrainerHabits, TensorBoardEventsHoldEveryScalarOfMetricsJsonlWithItsStep) {
  const std::string init = pretrained();
  const fs::path data = tsv("d.tsv", {"a", "b"}, 32);
  const std::string ft = (dir_ / "ft").string();
  Result r = run("finetune --model " + init + " --train " + data.string() + " --dev " +
                 data.string() + " --out " + ft + " --steps 6 --eval-steps 2 --batch-rows 4 " +
                 "--no-pack --report-to jsonl,tensorboard");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_every_scalar(ft);
  // Pre-training too, resumed: the second file tells TensorBoard to drop what the first wrote
  // after the checkpoint (a SessionLog START), and the records from there are written again.
  const std::string seqs = prepared_corpus("p", 20, 4), pt = (dir_ / "pt").string();
  const std::string flags = " --preset tiny --batch-rows 4 --eval-every 2 --report-to tensorboard";
  ASSERT_EQ(run("pretrain --data " + seqs + " --out " + pt + " --steps 4" + flags).code, 0);
  r = run("pretrain --data " + seqs + " --out " + pt + " --steps 6 --resume" + flags);
  ASSERT_EQ(r.code, 0) << r.err;
  expect_every_scalar(pt);
  int starts = 0;
  for (const json& e : node("read_tfevents.js", pt + "/runs"))
    if (e.contains("session_log")) {
      EXPECT_EQ(e["step"], 5);
      EXPECT_EQ(e["session_log"], 1);
      ++starts;
    }
  EXPECT_EQ(starts, 1);
  const json state = json::parse(slurp(pt + "/trainer_state.json"));
  EXPECT_EQ(state["global_step"], 6);
  EXPECT_EQ(state["max_steps"], 6);
  EXPECT_FALSE(state["log_history"].empty());
  EXPECT_EQ(state["log_history"].back()["step"], 6);
  EXPECT_TRUE(state["log_history"].back().contains("eval_loss")) << state["log_history"].back();
  EXPECT_TRUE(state["best_metric"].is_number());
  // An unknown reporter is refused in one line.
  r = run("pretrain --data " + seqs + " --out " + pt + " --steps 6 --report-to wandb");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("wandb"), std::string::npos) << r.err;
}

TEST_F(TrainerHabits, StepsWarmupRatioAndEvalStepsSetTheSchedule) {
  const std::string init = pretrained();
  // 24 examples one per row, 8 rows a step: 3 steps an epoch, so 7 steps are 2 epochs and a third.
  const fs::path data = tsv("d.tsv", {"a", "b"}, 24);
  auto finetune = [&](const std::string& name, const std::string& flags) {
    const std::string out = (dir_ / name).string();
    Result r =
        run("finetune --model " + init + " --train " + data.string() + " --dev " + data.string() +
            " --out " + out + " --batch-rows 8 --no-pack --steps 7 " + flags);
    EXPECT_EQ(r.code, 0) << r.err;
    return records(out + "/metrics.jsonl");
  };
  const std::vector<json> by_ratio = finetune("ratio", "--warmup-ratio 0.3 --eval-steps 3");
  const std::vector<json> by_steps = finetune("steps", "--warmup 3 --eval-steps 3");  // ceil(2.1)
  std::vector<int64_t> steps, evals;
  std::vector<double> lr_ratio, lr_steps;
  for (const json& j : by_ratio) {
    if (j["type"] == "step") steps.push_back(j["step"]), lr_ratio.push_back(j["lr"]);
    if (j["type"] == "eval") evals.push_back(j["step"]);
  }
  for (const json& j : by_steps)
    if (j["type"] == "step") lr_steps.push_back(j["lr"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(evals, (std::vector<int64_t>{3, 6, 7}));  // every 3 and after the last
  EXPECT_EQ(lr_ratio, lr_steps);
  EXPECT_LT(lr_ratio[0], lr_ratio[2]);  // warming up over 3 steps
  EXPECT_GT(lr_ratio[2], lr_ratio[6]);  // then decaying
  for (const json& j : by_ratio)
    if (j["type"] == "step" && j["step"] == 7) {
      EXPECT_EQ(j["epoch"], 3);  // the third, cut short
    }
  // Contradicting or incomplete flags: one line, exit 2.
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--warmup 3 --warmup-ratio 0.3", "--warmup and --warmup-ratio contradict"},
           {"--early-stopping-patience 2", "--save-best METRIC"},
           {"--warmup-ratio 1.5", "--warmup-ratio"}}) {
    Result r = run("finetune --model " + init + " --train " + data.string() + " --dev " +
                   data.string() + " --out " + (dir_ / "bad").string() + " " + flags);
    EXPECT_EQ(r.code, 2) << flags;
    EXPECT_NE(r.err.find(says), std::string::npos) << flags << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "bad"));
  }
}

// A dev set that gets worse as the training rule is learnt (each dev label one off the rule):
// patience 2 stops two evaluations after the best, and the best's model is written; the
// checkpoint directories load with an independent reader of the transformers layout.
TEST_F(TrainerHabits, EarlyStoppingStopsWhereDevStopsImprovingAndCheckpointsLoad) {
  const std::string cls = classifier();
  const fs::path dev_path = mixed_dev();
  const fs::path train = tsv("train_best.tsv", {"negative", "neutral", "positive"}, 48);
  const std::string out = (dir_ / "early").string();
  Result r = run("finetune --model " + cls + " --train " + train.string() + " --dev " +
                 dev_path.string() + " --out " + out + " --epochs 10 --seed 5 --lr 2e-2 " +
                 "--save-best accuracy --early-stopping-patience 2 --keep-checkpoints 1");
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<double> acc;
  std::vector<int64_t> at;
  int64_t last_step = 0;
  for (const json& j : records(out + "/metrics.jsonl")) {
    if (j["type"] == "eval") acc.push_back(j["dev_acc"]), at.push_back(j["step"]);
    if (j["type"] == "step") last_step = j["step"];
  }
  // Hugging Face's rule, applied to the logged accuracies: where must the run stop?
  size_t stop_at = acc.size(), best = 0;
  int waited = 0;
  for (size_t e = 1; e < acc.size() && stop_at == acc.size(); ++e) {
    waited = acc[e] > acc[best] ? 0 : waited + 1;
    if (acc[e] > acc[best]) best = e;
    if (waited >= 2) stop_at = e;
  }
  std::cout << "  dev accuracy by epoch:";
  for (double a : acc) std::cout << " " << a;
  std::cout << "\n";
  ASSERT_LT(stop_at, 9u) << "the dev accuracy kept improving: the data no longer tests stopping";
  EXPECT_EQ(acc.size(), stop_at + 1);  // no evaluation after the stop
  EXPECT_EQ(last_step, at.back());     // nor a step
  EXPECT_NE(r.err.find("finetune: early stopping at step " + std::to_string(at.back())),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("the model of step " + std::to_string(at[best]) + " is the one written"),
            std::string::npos)
      << r.err;
  Result ev = run("eval --task classify --model " + out + " --data " + dev_path.string());
  ASSERT_EQ(ev.code, 0) << ev.err;
  EXPECT_NE(ev.out.find(fixed(acc[best], 4)), std::string::npos) << ev.out;

  // checkpoint-STEP/: the latest and the best's, each a transformers directory with its state.
  const std::string best_dir = out + "/checkpoint-" + std::to_string(at[best]);
  const std::string last_dir = out + "/checkpoint-" + std::to_string(at.back());
  int dirs = 0;
  for (const auto& entry : fs::directory_iterator(out))
    dirs += entry.path().filename().string().starts_with("checkpoint-");
  EXPECT_EQ(dirs, best_dir == last_dir ? 1 : 2);
  for (const std::string& d : {best_dir, last_dir}) {
    const std::vector<json> read = node("read_hf_dir.js", d);
    ASSERT_EQ(read.size(), 1u) << d;
    EXPECT_EQ(read[0]["architecture"], "BertForSequenceClassification");
    EXPECT_EQ(read[0]["labels"], 3);
    EXPECT_EQ(read[0]["id2label"], json({{"0", "positive"}, {"1", "negative"}, {"2", "neutral"}}));
    const json state = json::parse(slurp(d + "/trainer_state.json"));
    EXPECT_EQ(state["global_step"], std::stoll(d.substr(d.rfind('-') + 1)));
    EXPECT_TRUE(state["epoch"].is_number());
    EXPECT_EQ(state["best_metric"].get<double>(), acc[best]);
    EXPECT_EQ(state["best_global_step"], at[best]);
    EXPECT_EQ(state["best_model_checkpoint"], best_dir);
    int eval_entries = 0;
    for (const json& e : state["log_history"]) eval_entries += e.contains("eval_accuracy");
    EXPECT_EQ(eval_entries,
              static_cast<int>(state["global_step"] == at.back() ? acc.size() : best + 1));
  }
  // The best checkpoint's weights are the written model's, bit for bit.
  const io::SafetensorsFile written = io::SafetensorsFile::read(out + "/model.safetensors");
  const io::SafetensorsFile kept = io::SafetensorsFile::read(best_dir + "/model.safetensors");
  for (const char* name : {"classifier.weight", "bert.encoder.layer.1.output.dense.weight"})
    EXPECT_EQ(written.floats(name), kept.floats(name)) << name;
  EXPECT_FALSE(fs::exists(out + ".checkpoints"));
  EXPECT_FALSE(fs::exists(out + ".resume.safetensors"));
}

}  // namespace
}  // namespace packbert
