// `packbert check-golden FILE`: run packbert's forward and backward on a golden file made by a
// PyTorch model (docs/FORMATS.md) and report the largest relative error per quantity.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/table.h"
#include "model/golden.h"

namespace packbert::cli {

namespace {

struct GoldenArgs {
  std::string file;
  double rtol_loss = 1e-5, rtol_grad = 1e-4;
  bool all = false;
  model::Recompute recompute;
  model::Precision precision = model::Precision::fp32;
};

int run_check_golden(const GoldenArgs& a) {
  model::GoldenReport report =
      model::check_golden(a.file, a.rtol_loss, a.rtol_grad, a.recompute, a.precision);
  Table t({"quantity", "rel. error", "tolerance", "ok"});
  auto add = [&](const model::GoldenRow& r) {
    char err[32], tol[32];
    std::snprintf(err, sizeof err, "%.2e", r.error);
    std::snprintf(tol, sizeof tol, "%.0e", r.tolerance);
    t.add_row({r.quantity, err, tol, r.ok() ? "yes" : "NO"});
  };
  size_t grads = 0, failing_grads = 0, losses = 0, failing_losses = 0;
  for (const model::GoldenRow& r : report.rows) {
    const bool is_grad = r.quantity.rfind("grad.", 0) == 0;
    (is_grad ? grads : losses) += 1;
    (is_grad ? failing_grads : failing_losses) += !r.ok();
    if (!is_grad || a.all || !r.ok()) add(r);
  }
  if (!a.all) add(report.worst_grad());
  t.print(std::cout);
  std::cout << a.file << ": " << losses << " losses (" << failing_losses << " outside tolerance), "
            << grads << " gradient tensors (" << failing_grads << " outside tolerance)"
            << (a.all ? "" : "; worst gradient shown, --all lists every tensor") << '\n';
  return report.ok() ? 0 : 1;
}

}  // namespace

void register_check_golden(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<GoldenArgs>();
  CLI::App* cmd = app.add_subcommand(
      "check-golden", "Compare packbert's losses and gradients with a PyTorch golden file");
  cmd->add_option("file", args->file, "Golden safetensors file (tools/make_model_golden.py)")
      ->required();
  number(cmd, "--rtol-loss", args->rtol_loss,
         "Relative tolerance on losses (default 1e-5; 1e-2 under --precision bf16)", 0, 1);
  number(cmd, "--rtol-grad", args->rtol_grad,
         "Tolerance on gradients per tensor: max |ours - theirs| / max |theirs| (default 1e-4); "
         "under --precision bf16 ||ours - theirs|| / ||theirs|| (default 5e-2)",
         0, 1);
  cmd->add_flag("--all", args->all, "List every gradient tensor, not only the worst");
  recompute_flags(cmd, args->recompute, nullptr);
  precision_flag(cmd, args->precision);
  cmd->callback([args, cmd, &exit_code] {
    if (args->precision == model::Precision::bf16) {  // bf16's documented tolerances
      if (cmd->count("--rtol-loss") == 0) args->rtol_loss = 1e-2;
      if (cmd->count("--rtol-grad") == 0) args->rtol_grad = 5e-2;
    }
    exit_code = run_check_golden(*args);
  });
}

}  // namespace packbert::cli
