// `pdctl up`: a local pdserve cluster on loopback. Starts N pd-prefill and M pd-decode nodes and a
// pd-router in front of them as child processes (found next to pdctl, or in $PD_BIN_DIR), waits
// until every one printed its ready line and the router sees the decode nodes healthy, prints the
// endpoints, and stops everything on SIGINT / SIGTERM: SIGTERM to the router, then to the nodes,
// SIGKILL after a grace, every child waited for. Children also get SIGTERM if pdctl dies
// (PR_SET_PDEATHSIG), so no daemon outlives it. With --chat it sends one chat message through the
// router's gRPC API, prints the streamed answer and shuts down; with --complete it continues a
// prompt through the router's OpenAI /v1/completions (streamed, greedy), prints it with the time
// to the first token and the tokens/s, and shuts down. With --pin-cores each node runs on
// one CPU of its own (round robin over pdctl's allowed CPUs, prefill nodes first; one engine
// thread unless --threads says otherwise); the router is not pinned. With --prefill-idle every
// node may use every CPU and the prefill nodes run under SCHED_IDLE (the kernel gives them a CPU
// only when nothing else wants it), so a decode node's steps take the cores ahead of a prompt's
// chunks; they still share memory bandwidth and the caches.
//
// Exit codes: 0 (stopped by a signal, or --chat / --complete answered); 1 a daemon failed to start
// or the request failed; 2 bad flags.
#pragma once

#include <string>

#include "CLI/CLI.hpp"

namespace pd::tools {

struct UpFlags {
  int prefill = 1;
  int decode = 1;
  std::string config;  // passed to every daemon
  std::string model;   // passed to every daemon
  int grpc_port = -1;  // router; -1 = the config's (0 with --chat)
  int http_port = -1;
  int threads = 0;         // per node; 0 = the config's (1 with pin_cores)
  std::string backend;     // passed to every engine node; "" = the config's
  std::string gpu_layers;  // likewise
  bool pin_cores = false;  // each node on its own CPU (round robin over pdctl's allowed CPUs)
  // Prefill nodes under SCHED_IDLE on every CPU: decode nodes keep all cores for their steps,
  // prefill nodes run in what the decode nodes leave. Excludes pin_cores.
  bool prefill_idle = false;
  // A throwaway CA in <log dir>/tls: mutual TLS between the daemons, TLS on the router's APIs.
  bool tls = false;
  bool cluster_tls = false;  // mutual TLS between the daemons only (--tls implies it)
  std::string chat;        // one chat message (gRPC), then shut down
  std::string complete;    // one prompt to continue (OpenAI /v1/completions), then shut down
  int max_tokens = 128;
  std::string log_dir;  // daemons' stderr; "" = a new directory under $TMPDIR
  double start_timeout_s = 180;
};

CLI::App* AddUpCommand(CLI::App& app, UpFlags* flags);
int RunUp(const UpFlags& flags);

}  // namespace pd::tools
