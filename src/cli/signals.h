// SIGINT/SIGTERM as a request to stop training after the current step (pretrain, finetune).
#pragma once

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <thread>

namespace packbert::cli {

// SIGINT/SIGTERM ask training to stop after the current step. No asynchronous handler runs: the
// signals are blocked in every thread (the mask is set before any thread exists, and threads
// inherit it) and one watcher thread takes them with sigwait. So a signal never interrupts a
// compute thread (no EINTR inside a kernel, no handler on a thread in the middle of a GEMM),
// and the only shared state is one atomic flag.
class StopOnSignals {
 public:
  StopOnSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGUSR1);  // the destructor's wake-up call
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    watcher_ = std::thread([this] {
      int sig = 0;
      while (sigwait(&set_, &sig) == 0) {
        if (sig == SIGUSR1 && done_) return;
        if (sig == SIGINT || sig == SIGTERM) {
          signal_ = sig;
          stop_ = true;
        }
      }
    });
  }
  ~StopOnSignals() {
    done_ = true;
    pthread_kill(watcher_.native_handle(), SIGUSR1);
    watcher_.join();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  const std::atomic<bool>& stop() const { return stop_; }
  int signal() const { return signal_; }

 private:
  sigset_t set_, old_;
  std::atomic<bool> stop_{false}, done_{false};
  std::atomic<int> signal_{0};
  std::thread watcher_;
};

}  // namespace packbert::cli
