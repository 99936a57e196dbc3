#include "tools/pdctl/up_cmd.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_tls.h"
#include "common/strings.h"
#include "common/tls_certs.h"
#include "frontend/openai_stream.h"
#include "pdserve/v1/chat.grpc.pb.h"

namespace pd::tools {
namespace {

// One daemon: its pid, its stdout (for the ready line), its stderr in a log file.
struct Child {
  std::string name;  // "router", "p0", "d1"
  std::string role;
  std::string log;
  pid_t pid = -1;
  int out = -1;
  std::string out_buf;
  std::string ready;  // the ready line
  std::string grpc, http;
  bool exited = false;
  int status = 0;
};

std::string BinDir() {
  if (const char* d = std::getenv("PD_BIN_DIR")) return d;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

// The CPUs this process may run on, in increasing order.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) cpus.push_back(i);
  }
  return cpus;
}

// Starts args[0] as c; with cpu >= 0 the child is pinned to that CPU before exec, with `idle` it
// runs under SCHED_IDLE (inherited by every thread it starts).
bool Spawn(Child& c, const std::vector<std::string>& args, int cpu = -1, bool idle = false) {
  int out[2];
  if (pipe(out) != 0) return false;
  const int log = open(c.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return false;
  const pid_t parent = getpid();
  c.pid = fork();
  if (c.pid < 0) return false;
  if (c.pid == 0) {
    // No orphans: the child gets SIGTERM when pdctl dies, however it dies.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    // Ctrl-C reaches pdctl only; pdctl stops the children in order.
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], 1);
    dup2(log, 2);
    close(out[0]);
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      if (sched_setaffinity(0, sizeof set, &set) != 0) {
        std::fprintf(stderr, "cannot pin %s to CPU %d\n", args[0].c_str(), cpu);
        _exit(126);
      }
    }
    if (idle) {
      // Lowering one's own policy to SCHED_IDLE needs no privilege.
      const sched_param none{};
      if (sched_setscheduler(0, SCHED_IDLE, &none) != 0) {
        std::fprintf(stderr, "cannot run %s under SCHED_IDLE: %s\n", args[0].c_str(),
                     std::strerror(errno));
        _exit(126);
      }
    }
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s\n", args[0].c_str());
    _exit(127);
  }
  close(out[1]);
  close(log);
  c.out = out[0];
  return true;
}

// Reads c's stdout until a ready line or the deadline; false if the child died or timed out.
bool WaitReady(Child& c, absl::Time deadline) {
  static const std::regex kReady(R"(ready: grpc=(\S+) http=(\S+))");
  while (absl::Now() < deadline) {
    size_t nl;
    while ((nl = c.out_buf.find('\n')) != std::string::npos) {
      const std::string line = c.out_buf.substr(0, nl);
      c.out_buf.erase(0, nl + 1);
      std::smatch m;
      if (std::regex_search(line, m, kReady)) {
        c.ready = line;
        c.grpc = m[1].str();
        c.http = m[2].str();
        return true;
      }
    }
    pollfd p{c.out, POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      char buf[4096];
      const ssize_t n = read(c.out, buf, sizeof buf);
      if (n <= 0) return false;  // closed: the child died
      c.out_buf.append(buf, n);
    }
  }
  return false;
}

std::string Tail(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  if (s.size() > 2000) s = "..." + s.substr(s.size() - 2000);
  return s;
}

void Reap(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.pid <= 0 || c.exited) continue;
    if (waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.exited = true;
  }
}

// SIGTERM to the router first (it drains its streams), then to the nodes; SIGKILL what is left
// after `grace`; every child is waited for.
void StopAll(std::vector<Child>& children, absl::Duration grace) {
  auto stop = [&](bool router) {
    for (Child& c : children) {
      if (c.pid > 0 && !c.exited && (c.role == "router") == router) kill(c.pid, SIGTERM);
    }
    const absl::Time end = absl::Now() + grace;
    while (absl::Now() < end) {
      Reap(children);
      bool left = false;
      for (Child& c : children) left |= c.pid > 0 && !c.exited && (c.role == "router") == router;
      if (!left) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    for (Child& c : children) {
      if (c.pid > 0 && !c.exited && (c.role == "router") == router) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &c.status, 0);
        c.exited = true;
      }
    }
  };
  stop(true);
  stop(false);
  for (Child& c : children) {
    if (c.out >= 0) close(c.out);
    c.out = -1;
  }
}

// `ca`: the router's public API speaks TLS with a certificate this CA signed ("" = plaintext).
int Chat(const std::string& address, const std::string& message, int max_tokens,
         const std::string& ca) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      GrpcChannelCredentials({"", "", ca});
  if (!creds.ok()) {
    std::fprintf(stderr, "pdctl up: %s\n", std::string(creds.status().message()).c_str());
    return 1;
  }
  auto stub = pdserve::v1::Chat::NewStub(grpc::CreateChannel(address, *creds));
  pdserve::v1::GenerateRequest req;
  auto* m = req.mutable_messages()->add_messages();
  m->set_role("user");
  m->set_content(message);
  req.set_max_tokens(max_tokens);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
  auto reader = stub->Generate(&ctx, req);
  pdserve::v1::GenerateResponse r;
  std::string finish;
  while (reader->Read(&r)) {
    if (r.has_delta()) {
      std::fputs(r.delta().text().c_str(), stdout);
      std::fflush(stdout);
    }
    if (r.has_finish()) {
      finish = StrCat("(", r.finish().reason(), ", ", r.finish().usage().completion_tokens(),
                      " tokens, first token after ", r.finish().time_to_first_token_s(), " s)");
    }
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const grpc::Status s = reader->Finish();
  if (!s.ok()) {
    std::fprintf(stderr, "pdctl up: chat failed: %d %s\n", s.error_code(),
                 s.error_message().c_str());
    return 1;
  }
  std::fprintf(stderr, "%s\n", finish.c_str());
  return 0;
}

// POST /v1/completions with stream=true (the path an OpenAI client takes), the continuation
// printed as it arrives after the prompt; then its length, the time to the first token and the
// decode rate (tokens after the first / the time since it), as a user would time it.
int Complete(const std::string& http_url, const std::string& prompt, int max_tokens,
             const std::string& ca) {
  httplib::Client client(http_url);
  if (!ca.empty()) {
    client.set_ca_cert_path(ca.c_str());
    client.enable_server_certificate_verification(true);
  }
  client.set_read_timeout(300, 0);
  const nlohmann::json body = {{"prompt", prompt},
                               {"max_tokens", max_tokens},
                               {"temperature", 0},
                               {"stream", true},
                               {"stream_options", {{"include_usage", true}}}};
  std::printf("\n%s", prompt.c_str());
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first{};
  std::string error;
  int completion_tokens = -1, chunks = 0;
  frontend::SseParser sse;
  const auto on_event = [&](const frontend::SseEvent& ev) {
    absl::StatusOr<frontend::OpenAiChunk> c = frontend::ParseOpenAiData(ev.data);
    if (!c.ok()) {
      error = std::string(c.status().message());
      return;
    }
    if (c->error) error = c->error_message;
    if (c->completion_tokens) completion_tokens = *c->completion_tokens;
    if (c->text.empty()) return;
    if (chunks++ == 0) first = std::chrono::steady_clock::now();
    std::fputs(c->text.c_str(), stdout);
    std::fflush(stdout);
  };
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    sse.Feed(std::string_view(data, n), on_event);
    return true;
  };
  const httplib::Result res = client.send(req);
  sse.Finish(on_event);
  const auto done = std::chrono::steady_clock::now();
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (!res) {
    std::fprintf(stderr, "pdctl up: completion failed: %s\n",
                 httplib::to_string(res.error()).c_str());
    return 1;
  }
  if (res->status != 200 || !error.empty()) {
    std::fprintf(stderr, "pdctl up: completion failed: HTTP %d %s\n", res->status,
                 error.empty() ? res->body.c_str() : error.c_str());
    return 1;
  }
  const auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
  const int tokens = completion_tokens >= 0 ? completion_tokens : chunks;
  const double ttft = chunks > 0 ? secs(first - start) : secs(done - start);
  const double rate = tokens > 1 && chunks > 0 ? (tokens - 1) / secs(done - first) : 0;
  std::printf("(%d tokens; first token after %.0f ms; %.1f tokens/s after it)\n", tokens,
              ttft * 1e3, rate);
  std::fflush(stdout);
  return 0;
}

}  // namespace

CLI::App* AddUpCommand(CLI::App& app, UpFlags* f) {
  CLI::App* up = app.add_subcommand(
      "up",
      "start a local cluster (pd-prefill, pd-decode nodes and a pd-router) on loopback; "
      "Ctrl-C stops it");
  up->add_option("--prefill", f->prefill, "prefill nodes")->check(CLI::NonNegativeNumber);
  up->add_option("--decode", f->decode, "decode nodes")->check(CLI::PositiveNumber);
  up->add_option("--config", f->config,
                 "YAML config for every daemon (configs/cluster-local.yaml)");
  up->add_option("-m,--model", f->model,
                 "GGUF model or Hugging Face checkpoint folder (default: the default model)");
  up->add_option("--grpc-port", f->grpc_port,
                 "router gRPC port (0 = a free one; default: the config's; a free one with --chat "
                 "or --complete)");
  up->add_option("--http-port", f->http_port,
                 "router HTTP port (0 = a free one; default: the config's; a free one with --chat "
                 "or --complete)");
  up->add_option("--backend", f->backend,
                 "compute backend of the prefill and decode nodes: cpu or cuda (default: the "
                 "config's model.backend)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  up->add_option("--gpu-layers", f->gpu_layers,
                 "with --backend cuda: all, auto or N layers on the GPU, the rest on the CPU");
  up->add_option("-t,--threads", f->threads,
                 "CPU threads per node (0 = the config's; 1 with --pin-cores)");
  up->add_flag("--tls", f->tls,
               "make a throwaway CA (in the log dir): mutual TLS between router and nodes, TLS on "
               "the router's gRPC and HTTP APIs");
  up->add_flag("--cluster-tls", f->cluster_tls,
               "like --tls, but only between the daemons: mutual TLS between router and nodes, "
               "the router's gRPC and HTTP APIs stay plaintext");
  auto* pin = up->add_flag("--pin-cores", f->pin_cores,
                           "pin each node to one CPU of those pdctl may use, round robin, "
                           "prefill nodes first (sched_setaffinity); the router is not pinned");
  up->add_flag("--prefill-idle", f->prefill_idle,
               "run the prefill nodes under SCHED_IDLE: every node may use every CPU, the decode "
               "nodes' steps take the cores first and the prefill nodes run in what they leave "
               "(one machine shared by both pools)")
      ->excludes(pin);
  auto* chat = up->add_option("--chat", f->chat,
                              "send this chat message through the router's gRPC API, print the "
                              "answer, stop");
  auto* complete = up->add_option(
      "--complete", f->complete,
      "continue this text through the router's OpenAI /v1/completions (greedy, streamed), print "
      "it with the time to first token and tokens/s, stop");
  chat->excludes(complete);
  up->add_option("-n,--max-tokens", f->max_tokens, "--chat / --complete: most tokens generated");
  up->add_option("--log-dir", f->log_dir, "where the daemons' logs go (default: a new temp dir)");
  up->add_option("--start-timeout", f->start_timeout_s, "seconds each daemon gets to be ready");
  return up;
}

int RunUp(const UpFlags& f) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string bin = BinDir();
  for (const char* b : {"pd-prefill", "pd-decode", "pd-router"}) {
    if (access(StrCat(bin, "/", b).c_str(), X_OK) != 0) {
      std::fprintf(stderr, "pdctl up: %s/%s not found: build it, or set PD_BIN_DIR\n", bin.c_str(),
                   b);
      return 1;
    }
  }
  std::string log_dir = f.log_dir;
  if (log_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = StrCat(tmp ? tmp : "/tmp", "/pdctl-up.XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::fprintf(stderr, "pdctl up: cannot create a log directory\n");
      return 1;
    }
    log_dir = tmpl;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
  }

  std::vector<std::string> common;
  if (!f.config.empty()) common.insert(common.end(), {"--config", f.config});
  // --tls / --cluster-tls: one CA, a certificate per daemon; the CA's key is not kept.
  const bool mtls = f.tls || f.cluster_tls;
  std::string ca, tls_dir;
  if (mtls) {
    std::vector<std::string> names = {"router"};
    for (int i = 0; i < f.prefill; ++i) names.push_back(StrCat("p", i));
    for (int i = 0; i < f.decode; ++i) names.push_back(StrCat("d", i));
    tls_dir = StrCat(log_dir, "/tls");
    absl::StatusOr<std::string> written = WriteLocalCluster(tls_dir, names);
    if (!written.ok()) {
      std::fprintf(stderr, "pdctl up: --tls: %s\n",
                   std::string(written.status().message()).c_str());
      return 1;
    }
    ca = *written;
  }
  // The daemon `name`'s cluster certificate flags (none without mutual TLS).
  auto tls_args = [&](const std::string& name) -> std::vector<std::string> {
    if (!mtls) return {};
    return {"--cluster-ca",   ca,
            "--cluster-cert", StrCat(tls_dir, "/", name, ".pem"),
            "--cluster-key",  StrCat(tls_dir, "/", name, ".key")};
  };
  if (!f.model.empty()) common.insert(common.end(), {"--model", f.model});

  std::vector<Child> children;
  for (int i = 0; i < f.prefill + f.decode; ++i) {
    Child c;
    c.role = i < f.prefill ? "prefill" : "decode";
    c.name = i < f.prefill ? StrCat("p", i) : StrCat("d", i - f.prefill);
    c.log = StrCat(log_dir, "/", c.name, ".log");
    children.push_back(std::move(c));
  }
  const absl::Duration grace = absl::Seconds(10);
  auto fail = [&](const Child& c, const std::string& what) {
    std::fprintf(stderr, "pdctl up: %s (%s) %s; its log (%s):\n%s\n", c.name.c_str(),
                 c.role.c_str(), what.c_str(), c.log.c_str(), Tail(c.log).c_str());
    StopAll(children, absl::Seconds(2));
    return 1;
  };
  const std::vector<int> cpus = f.pin_cores ? AllowedCpus() : std::vector<int>();
  if (f.pin_cores && cpus.empty()) {
    std::fprintf(stderr, "pdctl up: --pin-cores: cannot read the allowed CPUs\n");
    return 1;
  }
  if (f.pin_cores && children.size() > cpus.size()) {
    std::fprintf(stderr, "pdctl up: --pin-cores: %zu nodes on %zu CPUs; some share a CPU\n",
                 children.size(), cpus.size());
  }
  const int threads = f.threads > 0 ? f.threads : (f.pin_cores ? 1 : 0);
  for (size_t i = 0; i < children.size(); ++i) {
    Child& c = children[i];
    std::vector<std::string> args = {StrCat(bin, "/pd-", c.role)};
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), {"--grpc-host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0"});
    if (threads > 0) args.insert(args.end(), {"--threads", StrCat(threads)});
    if (!f.backend.empty()) args.insert(args.end(), {"--backend", f.backend});
    if (!f.gpu_layers.empty()) args.insert(args.end(), {"--gpu-layers", f.gpu_layers});
    for (std::string& a : tls_args(c.name)) args.push_back(std::move(a));
    const int cpu = f.pin_cores ? cpus[i % cpus.size()] : -1;
    const bool idle = f.prefill_idle && c.role == "prefill";
    if (!Spawn(c, args, cpu, idle)) return fail(c, "could not be started");
    if (cpu >= 0) {
      std::fprintf(stderr, "pdctl up: %s (%s, pid %d) pinned to CPU %d, %d thread(s)\n",
                   c.name.c_str(), c.role.c_str(), c.pid, cpu, threads);
    }
    if (idle) {
      std::fprintf(stderr, "pdctl up: %s (%s, pid %d) runs under SCHED_IDLE\n", c.name.c_str(),
                   c.role.c_str(), c.pid);
    }
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(f.start_timeout_s);
  for (Child& c : children) {
    if (!WaitReady(c, deadline)) return fail(c, "did not get ready");
  }
  Child router;
  router.name = "router";
  router.role = "router";
  router.log = StrCat(log_dir, "/router.log");
  {
    std::vector<std::string> args = {StrCat(bin, "/pd-router")};
    args.insert(args.end(), common.begin(), common.end());
    const bool one_request = !f.chat.empty() || !f.complete.empty();
    const int grpc_port = f.grpc_port >= 0 ? f.grpc_port : (one_request ? 0 : -1);
    const int http_port = f.http_port >= 0 ? f.http_port : (one_request ? 0 : -1);
    if (grpc_port >= 0) args.insert(args.end(), {"--grpc-port", StrCat(grpc_port)});
    if (http_port >= 0) args.insert(args.end(), {"--http-port", StrCat(http_port)});
    for (const Child& c : children) {
      args.insert(args.end(), {"--node", StrCat(c.name, "=", c.role, "@", c.grpc)});
    }
    for (std::string& a : tls_args("router")) args.push_back(std::move(a));
    if (f.tls) {
      args.insert(args.end(), {"--tls-cert", StrCat(tls_dir, "/router.pem"), "--tls-key",
                               StrCat(tls_dir, "/router.key")});
    }
    children.push_back(std::move(router));
    if (!Spawn(children.back(), args)) return fail(children.back(), "could not be started");
    if (!WaitReady(children.back(), deadline)) return fail(children.back(), "did not get ready");
  }
  const Child& r = children.back();
  std::printf("pdctl up ready: grpc=%s http=%s\n", r.grpc.c_str(), r.http.c_str());
  for (const Child& c : children) {
    if (c.role == "router") continue;
    std::printf("  %-7s %-3s pid=%d grpc=%s metrics=%s/metrics\n", c.role.c_str(), c.name.c_str(),
                c.pid, c.grpc.c_str(), c.http.c_str());
  }
  std::printf("  router  pid=%d metrics=%s/metrics logs=%s\n", r.pid, r.http.c_str(),
              log_dir.c_str());
  if (f.tls) {
    std::printf("  tls     mutual TLS between the daemons; clients trust %s\n", ca.c_str());
  } else if (f.cluster_tls) {
    std::printf(
        "  tls     mutual TLS between the daemons (certificates in %s); the router's APIs "
        "are plaintext\n",
        tls_dir.c_str());
  }
  std::fflush(stdout);

  int rc = 0;
  if (!f.chat.empty()) {
    rc = Chat(r.grpc, f.chat, f.max_tokens, f.tls ? ca : "");
  } else if (!f.complete.empty()) {
    rc = Complete(r.http, f.complete, f.max_tokens, f.tls ? ca : "");
  } else {
    std::fprintf(stderr, "pdctl up: running; Ctrl-C stops the cluster\n");
    const timespec tick{0, 200 * 1000 * 1000};
    while (true) {
      const int sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) break;
      Reap(children);
      bool router_gone = false;
      for (Child& c : children) {
        if (c.exited && c.pid > 0) {
          std::fprintf(stderr, "pdctl up: %s (%s, pid %d) exited (status %d); log: %s\n",
                       c.name.c_str(), c.role.c_str(), c.pid, c.status, c.log.c_str());
          router_gone |= c.role == "router";
          c.pid = -1;
        }
      }
      if (router_gone) {
        rc = 1;
        break;
      }
    }
  }
  std::fprintf(stderr, "pdctl up: stopping\n");
  StopAll(children, grace);
  return rc;
}

}  // namespace pd::tools
