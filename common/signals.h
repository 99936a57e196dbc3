// The stop signals of a daemon: every daemon blocks SIGINT and SIGTERM before its first thread
// starts (threads inherit the mask), then its main thread waits for one with sigwait and drains.
#pragma once

#include <signal.h>

namespace pd {

// Blocks SIGINT and SIGTERM in the calling thread and returns the set to sigwait on.
inline sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

}  // namespace pd
