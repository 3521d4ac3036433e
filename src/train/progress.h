// The progress line of a long command (pretrain, finetune, eval): the step, the command's own
// fields, the rate and the ETA. On a terminal one line rewritten in place; otherwise a line every
// `every` steps (and at the last), so logs of unattended runs stay readable.
#pragma once

#include <cstdint>
#include <string>

namespace packbert::train {

class ProgressLine {
 public:
  // `what` counts the work ("step", "batch"); `unit` is what the rate counts ("tok", "seq").
  ProgressLine(std::string command, std::string what, int64_t first, int64_t total,
               std::string unit, int64_t every = 10);
  // After work item `done` (1-based, of `total`), `amount` more units in `seconds`.
  void update(int64_t done, double amount, double seconds, const std::string& fields);
  // Ends an in-place line (on a terminal) so the next output starts on its own line.
  void finish();

 private:
  std::string command_, what_, unit_;
  int64_t first_, total_, last_ = 0;
  int64_t every_;
  bool tty_;
  bool open_ = false;
  double amount_ = 0, seconds_ = 0;
};

// "1:02:03"
std::string clock_text(double seconds);

}  // namespace packbert::train
