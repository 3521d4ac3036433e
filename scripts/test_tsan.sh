#!/usr/bin/env bash
# ThreadSanitizer over the runs where packbert's own threads meet: pre-training interrupted by
# SIGINT, SIGTERM and kill -9 (the batch prefetch thread, the signal thread and the step), then
# resumed. OpenMP's team is one thread: libgomp is not instrumented, so its barriers would be
# reported as races. A race makes the run exit 66, which the tests report as a failure with the
# race's report (the run's stderr).
# Usage: scripts/test_tsan.sh BUILD_DIR JOBS
set -euo pipefail
build=$1 jobs=$2
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPACKBERT_TSAN=ON >/dev/null
cmake --build "$build" -j "$jobs" --target packbert test_reliability
export OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 exitcode=66"
# Some kernels lay out memory in a way this ThreadSanitizer cannot run under (high mmap
# randomisation): say so and stop, rather than report packbert's races where none were looked for.
if ! probe=$("./$build/packbert" --version 2>&1); then
  if grep -q "ThreadSanitizer" <<<"$probe"; then
    echo "test-tsan: ThreadSanitizer cannot run on this machine, not run: $(head -n 1 <<<"$probe")"
    exit 0
  fi
  echo "$probe" >&2
  exit 1
fi
"./$build/test_reliability" \
  --gtest_filter='Reliability.SignalsCheckpointExit130Or143AndResumeBitExactly:Reliability.KillDuringAStepResumesBitExactlyWithOneRecordPerStep'
