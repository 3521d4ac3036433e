// Fault injection for the crash tests (tests/test_reliability.cpp, tests/crash_trials.sh): with
// PACKBERT_CRASH_AT=<site>:<n> in the environment the process kills itself with SIGKILL the
// n-th time it passes crash_point(<site>), exactly as `kill -9` would at that point. Sites:
// "step" (after a training step's metrics record, before its checkpoint), "forward" (after each
// micro-batch's forward, mid-step: on a pipeline stage, with its neighbours waiting), "write"
// (halfway through writing the bytes of an atomic file write, before fsync and rename) and "eval"
// (after each batch of an evaluation). Unset: a no-op.
#pragma once

namespace packbert::io {

void crash_point(const char* site);

}  // namespace packbert::io
