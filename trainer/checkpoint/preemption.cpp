#include "trainer/checkpoint/preemption.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace trainer::app {
namespace {

volatile sig_atomic_t g_signal = 0;

// Async-signal-safe only: write(2) and _exit(2), no stdio, no allocation.
void on_stop_signal(int signal) {
  if (g_signal != 0) {
    static const char kMessage[] = "\ntrainer: second signal, stopping now without a checkpoint\n";
    ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    (void)ignored;
    _exit(128 + signal);
  }
  g_signal = signal;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a signal during a read or an MPI wait must not fail the call
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGXFSZ, SIG_IGN);
}

int stop_signal_received() { return g_signal; }

}  // namespace trainer::app
