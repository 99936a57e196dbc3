// KV transfer throughput between two processes over UCX (or in-process, --transport inproc):
// the parent is the decode node (receiver), a forked child the prefill node (sender). For each
// prompt length and wire dtype, the child pushes every layer of a sequence from a real KvCache
// (CPU backend) as fast as it can, completes, and waits for the receiver's acknowledgement
// (sent once every layer arrived and passed its checksum); time = first Push -> ACK, measured in
// the sender. The receiver's owner drops the payloads, or with --import puts them in its own
// KvCache: `land` gives the transport the reserved blocks (a ReceiveTarget), so that its delivery
// thread writes each layer in place as pd-decode's does on a CPU cache; `engine` imports each
// payload with ImportLayer on an importer thread (pd-decode's engine thread, for a device cache).
// The line then also gives the importer's busy time and when the last layer was in the cache.
//
// Prints one line per configuration:
//   RESULT tokens=<n> wire=<f16|int8> bytes=<total> layer_msg_bytes=<n> median_ms=<t> best_ms=<t>
//          gbps=<bytes / median> best_gbps=<bytes / best>
//          [import=<land|engine> receiver_kv=<dtype> import_ms=<importer busy, median>
//           landed_ms=<first Push -> last layer in the cache, median>]
// bench/kv_transfer/run.sh puts them next to ucx_perftest at the same message size.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "kvtransfer/kv_codec.h"
#include "kvtransfer/kv_transport.h"

namespace pd::kvtransfer {
namespace {

constexpr size_t kHeaderBytes = 48;  // MsgHeader (transport_base.h)

bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Args {
  std::string transport = "ucx";
  std::string tls;
  bool peer_failure = true;
  bool zero_copy = true;
  int n_layer = 18, n_kv_heads = 1, head_dim = 256, block_size = 16;
  int max_tokens = 0;
  int cache_tokens = 16384;
};

// What the sender reports per transfer: when its first Push began (steady clock, which is
// CLOCK_MONOTONIC and so comparable between the two processes) and how long until the ACK
// (-1: failed).
struct Timing {
  int64_t t0_ns = 0;
  int64_t dt_ns = -1;
};

// --import: the receiver's stand-in for pd-decode's engine thread. on_layer (transport delivery
// thread) queues each verified layer; this thread imports them into its own KvCache in order (a
// landed layer is already there) and records its busy time and the moment the last layer of the
// transfer was in the cache.
class Importer {
 public:
  Importer(engine::KvCache& kv, int64_t seq) : kv_(kv), seq_(seq), th_([this] { Run(); }) {}
  ~Importer() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    th_.join();
  }
  void Add(LayerPayload p) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(p));
  }
  // Blocks until `n_layers` layers were imported since the last call; returns {busy ns, the
  // steady-clock ns when the last one was done}, or the first import error.
  absl::StatusOr<std::pair<int64_t, int64_t>> Wait(int n_layers) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return imported_ >= n_layers || !error_.ok();
    };
    mu_.Await(absl::Condition(&ready));
    if (!error_.ok()) return error_;
    const std::pair<int64_t, int64_t> r{busy_ns_, last_ns_};
    imported_ = 0;
    busy_ns_ = 0;
    return r;
  }

 private:
  void Run() {
    for (;;) {
      std::optional<LayerPayload> p;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        p.emplace(std::move(queue_.front()));
        queue_.pop_front();
      }
      const int64_t t = NowNs();
      const absl::Status st = p->landed ? absl::OkStatus() : ImportLayer(*p, kv_, seq_);
      const int64_t end = NowNs();
      absl::MutexLock lock(&mu_);
      if (!st.ok() && error_.ok()) error_ = st;
      busy_ns_ += end - t;
      last_ns_ = end;
      ++imported_;
    }
  }
  engine::KvCache& kv_;
  const int64_t seq_;
  absl::Mutex mu_;
  std::deque<LayerPayload> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int imported_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t busy_ns_ ABSL_GUARDED_BY(mu_) = 0, last_ns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread th_;
};

// Both ends' caches: `cache_tokens` positions (at least the longest prompt) of `dtype`.
engine::KvCacheOptions CacheOptions(const Args& a, KvDType dtype) {
  engine::KvCacheOptions o;
  o.n_layer = a.n_layer;
  o.n_kv_heads = a.n_kv_heads;
  o.head_dim = a.head_dim;
  o.block_size = a.block_size;
  o.n_blocks = (std::max(a.cache_tokens, a.max_tokens) + a.block_size - 1) / a.block_size;
  o.dtype = dtype;
  return o;
}

// The sender process: one cache of `cache_tokens` positions (as a serving node's cache is many
// prompts long, its layer tensors sit on huge pages), the sequence's `max_tokens` of them filled
// with random finite f16 values; for each descriptor read from `in`, push all layers, complete,
// wait, write its Timing to `out`.
[[noreturn]] void Sender(const Args& a, int in, int out) {
  auto backend = engine::CreateCpuBackend({1});
  const engine::KvCacheOptions o = CacheOptions(a, KvDType::kF16);
  auto kv = engine::KvCache::Create(o, *backend);
  if (!kv.ok() || !(*kv)->Reserve(1, a.max_tokens).ok()) _exit(3);
  uint32_t x = 12345;
  for (int l = 0; l < o.n_layer; ++l) {
    const std::vector<engine::KvSpan> layer_spans = *(*kv)->ExportSpans(1, l);
    for (const engine::KvSpan& s : layer_spans) {
      uint16_t* h = static_cast<uint16_t*>(s.data);
      for (size_t i = 0; i < s.bytes / 2; ++i) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        h[i] = static_cast<uint16_t>(x & 0xbbff);  // finite halves in (-1, 1)
      }
    }
  }
  std::vector<std::vector<engine::KvSpan>> spans;
  for (int l = 0; l < o.n_layer; ++l) spans.push_back(*(*kv)->ExportSpans(1, l));
  TransportOptions topt;
  topt.kind = a.transport;
  topt.ucx_tls = a.tls;
  topt.ucx_peer_failure = a.peer_failure;
  topt.zero_copy_send = a.zero_copy;
  topt.inproc_name = "bench-sender";
  auto tx = KvTransport::Create(topt);
  if (!tx.ok()) {
    std::fprintf(stderr, "sender: %s\n", std::string(tx.status().ToString()).c_str());
    _exit(4);
  }
  for (;;) {
    uint32_t len = 0;
    if (!ReadAll(in, &len, 4) || len == 0) _exit(0);
    std::string bytes(len, '\0');
    if (!ReadAll(in, bytes.data(), len)) _exit(5);
    auto d = TransferDescriptor::Parse(bytes);
    if (!d.ok()) _exit(6);
    Timing tm;
    const int64_t t0 = tm.t0_ns = NowNs();
    auto s = (*tx)->Connect(*d, KvDType::kF16);
    absl::Status st = s.status();
    for (int l = 0; st.ok() && l < o.n_layer; ++l) st = (*s)->Push(l, spans[l]);
    if (st.ok()) st = (*s)->Complete();
    if (st.ok()) st = (*s)->Wait(absl::Seconds(60));
    tm.dt_ns = NowNs() - t0;
    if (!st.ok()) {
      std::fprintf(stderr, "sender: %s\n", std::string(st.ToString()).c_str());
      tm.dt_ns = -1;
    }
    if (!WriteAll(out, &tm, sizeof(tm))) _exit(7);
  }
}

int Main(int argc, char** argv) {
  CLI::App app{"KV transfer throughput between two processes"};
  Args a;
  std::string model, tokens_list = "1024,4096,16384", wire_list = "f16,int8", receiver_kv;
  std::string import = "none";
  int reps = 20, warmup = 5;
  app.add_option("--model", model, "GGUF file to take n_layer / n_kv_heads / head_dim from");
  app.add_option("--n-layer", a.n_layer, "layers (without --model)");
  app.add_option("--n-kv-heads", a.n_kv_heads, "KV heads (without --model)");
  app.add_option("--head-dim", a.head_dim, "head dimension (without --model)");
  app.add_option("--block-size", a.block_size, "KV block size");
  app.add_option("--tokens", tokens_list, "prompt lengths, comma-separated");
  app.add_option("--wire", wire_list, "wire dtypes, comma-separated (f16, int8)");
  app.add_option("--cache-tokens", a.cache_tokens,
                 "the sender's KV cache capacity in tokens (at least the longest prompt), like a "
                 "serving node's cache that holds many prompts");
  app.add_option("--reps", reps, "timed transfers per configuration (after the warm-up ones)");
  app.add_option("--warmup", warmup,
                 "untimed transfers first: the first few of a fresh process (receive buffer pool, "
                 "page tables) are 2-5x slower than a long-running node's");
  app.add_option("--transport", a.transport, "ucx or inproc");
  app.add_option("--tls", a.tls, "UCX_TLS for both sides ('' = UCX default)");
  app.add_flag("!--no-peer-failure", a.peer_failure,
               "UCP_ERR_HANDLING_MODE_NONE: lets UCX use shared memory + CMA (same host)");
  app.add_flag("!--staged", a.zero_copy,
               "copy every layer into a staging buffer (default: f16 layers go in place, as the "
               "prefill node sends them)");
  app.add_option("--import", import,
                 "none: drop the payloads; land: the transport writes every layer into the "
                 "receiver's own KvCache itself (a ReceiveTarget, as pd-decode on a CPU cache); "
                 "engine: ImportLayer on an importer thread (pd-decode's engine thread, for a "
                 "device cache). Reports the importer's busy time and when the last layer was in "
                 "the cache")
      ->check(CLI::IsMember({"none", "land", "engine"}));
  app.add_option("--receiver-kv", receiver_kv,
                 "the receiver's KV dtype (f16 or int8; default: the wire's, so import is a copy)");
  CLI11_PARSE(app, argc, argv);
  std::optional<KvDType> receiver_dtype;
  if (!receiver_kv.empty()) {
    receiver_dtype = engine::ParseKvDType(receiver_kv);
    if (!receiver_dtype || (*receiver_dtype != KvDType::kF16 && *receiver_dtype != KvDType::kI8)) {
      std::fprintf(stderr, "--receiver-kv must be f16 or int8, not %s\n", receiver_kv.c_str());
      return 1;
    }
  }

  if (!model.empty()) {
    auto f = engine::GgufFile::Open(model);
    if (!f.ok()) {
      std::fprintf(stderr, "%s\n", std::string(f.status().ToString()).c_str());
      return 1;
    }
    auto cfg = engine::ModelConfig::FromGguf(**f);
    if (!cfg.ok()) {
      std::fprintf(stderr, "%s\n", std::string(cfg.status().ToString()).c_str());
      return 1;
    }
    a.n_layer = cfg->n_layer;
    a.n_kv_heads = cfg->n_head_kv;
    a.head_dim = cfg->head_dim;
  }
  std::vector<int> tokens;
  for (auto& t : absl::StrSplit(tokens_list, ',')) tokens.push_back(std::stoi(std::string(t)));
  std::vector<KvDType> wires;
  for (auto& w : absl::StrSplit(wire_list, ',')) {
    auto t = engine::ParseKvDType(std::string(w));
    if (!t) {
      std::fprintf(stderr, "unknown wire dtype %s\n", std::string(w).c_str());
      return 1;
    }
    wires.push_back(*t);
  }
  a.max_tokens = *std::max_element(tokens.begin(), tokens.end());
  std::printf(
      "geometry: n_layer=%d n_kv_heads=%d head_dim=%d block_size=%d cache_tokens=%d transport=%s "
      "tls=%s peer_failure=%d zero_copy=%d\n",
      a.n_layer, a.n_kv_heads, a.head_dim, a.block_size, std::max(a.cache_tokens, a.max_tokens),
      a.transport.c_str(),
      a.tls.empty() ? "(default)" : a.tls.c_str(), a.peer_failure ? 1 : 0, a.zero_copy ? 1 : 0);
  std::fflush(stdout);

  int p2c[2], c2p[2];
  if (::pipe(p2c) != 0 || ::pipe(c2p) != 0) return 1;
  pid_t pid = -1;
  if (a.transport == "ucx") {
    pid = ::fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      ::close(p2c[1]);
      ::close(c2p[0]);
      Sender(a, p2c[0], c2p[1]);
    }
    ::close(p2c[0]);
    ::close(c2p[1]);
  } else {
    std::thread([a, in = p2c[0], out = c2p[1]] { Sender(a, in, out); }).detach();
  }

  TransportOptions topt;
  topt.kind = a.transport;
  topt.ucx_tls = a.tls;
  topt.ucx_peer_failure = a.peer_failure;
  auto rx = KvTransport::Create(topt);
  if (!rx.ok()) {
    std::fprintf(stderr, "receiver: %s\n", std::string(rx.status().ToString()).c_str());
    return 1;
  }
  auto backend = engine::CreateCpuBackend({1});
  for (int n_tokens : tokens) {
    for (KvDType wire : wires) {
      TransferGeometry g{a.n_layer,  a.n_kv_heads,
                         a.head_dim, a.block_size,
                         n_tokens,   receiver_dtype.value_or(wire),
                         wire};
      // --import: the receiver's cache, as large as the sender's, with the prompt reserved.
      std::unique_ptr<engine::KvCache> kv;
      std::unique_ptr<Importer> importer;
      if (import != "none") {
        auto c = engine::KvCache::Create(CacheOptions(a, g.receiver_dtype), *backend);
        if (!c.ok() || !(*c)->Reserve(1, n_tokens).ok()) {
          std::fprintf(stderr, "receiver cache: %s\n",
                       c.ok() ? "cannot reserve" : std::string(c.status().ToString()).c_str());
          return 1;
        }
        kv = *std::move(c);
        importer = std::make_unique<Importer>(*kv, 1);
      }
      std::vector<double> ms, import_ms, landed_ms;
      for (int r = 0; r < warmup + reps; ++r) {
        absl::Mutex mu;
        bool done = false;
        absl::Status final;
        ReceiveCallbacks cb;
        cb.on_layer = [&importer](LayerPayload p) {
          if (importer) importer->Add(std::move(p));  // else dropped: back to the pool
        };
        cb.on_done = [&](uint64_t, absl::Status s) {
          absl::MutexLock lock(&mu);
          final = s;
          done = true;
        };
        ReceiveTarget target;
        if (import == "land") {
          for (int l = 0; l < g.n_layer; ++l) target.layers.push_back(*kv->ExportSpans(1, l));
          target.fence = std::make_shared<engine::KvWriteFence>();
        }
        auto d = (*rx)->Reserve(g, absl::Now() + absl::Seconds(60), std::move(cb),
                                std::move(target));
        if (!d.ok()) {
          std::fprintf(stderr, "receiver: %s\n", std::string(d.status().ToString()).c_str());
          return 1;
        }
        const std::string bytes = d->Serialize();
        const uint32_t len = static_cast<uint32_t>(bytes.size());
        Timing tm;
        if (!WriteAll(p2c[1], &len, 4) || !WriteAll(p2c[1], bytes.data(), len) ||
            !ReadAll(c2p[0], &tm, sizeof(tm))) {
          std::fprintf(stderr, "sender process died\n");
          return 1;
        }
        {
          absl::MutexLock lock(&mu);
          mu.Await(absl::Condition(&done));
        }
        if (tm.dt_ns < 0 || !final.ok()) {
          std::fprintf(stderr, "transfer failed: %s\n", std::string(final.ToString()).c_str());
          return 1;
        }
        std::pair<int64_t, int64_t> imp{0, 0};
        if (importer) {
          auto w = importer->Wait(a.n_layer);
          if (!w.ok()) {
            std::fprintf(stderr, "import failed: %s\n", std::string(w.status().ToString()).c_str());
            return 1;
          }
          imp = *w;
        }
        if (r >= warmup) {
          ms.push_back(static_cast<double>(tm.dt_ns) / 1e6);
          import_ms.push_back(static_cast<double>(imp.first) / 1e6);
          landed_ms.push_back(static_cast<double>(imp.second - tm.t0_ns) / 1e6);
        }
      }
      auto median_of = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double median = median_of(ms), best = *std::min_element(ms.begin(), ms.end());
      const double bytes = static_cast<double>(g.TotalBytes());
      std::string imported;
      if (importer) {
        imported = pd::StrCat(" import=", import, " receiver_kv=", engine::KvDTypeName(g.receiver_dtype),
                              " import_ms=", absl::StrFormat("%.3f", median_of(import_ms)),
                              " landed_ms=", absl::StrFormat("%.3f", median_of(landed_ms)));
      }
      std::printf(
          "RESULT tokens=%d wire=%s bytes=%.0f layer_msg_bytes=%zu median_ms=%.3f best_ms=%.3f "
          "gbps=%.3f best_gbps=%.3f%s\n",
          n_tokens, std::string(engine::KvDTypeName(wire)).c_str(), bytes,
          g.LayerBytes() + kHeaderBytes, median, best, bytes / median / 1e6, bytes / best / 1e6,
          imported.c_str());
      std::fflush(stdout);
    }
  }
  const uint32_t zero = 0;
  WriteAll(p2c[1], &zero, 4);
  if (pid > 0) ::waitpid(pid, nullptr, 0);
  return 0;
}

}  // namespace
}  // namespace pd::kvtransfer

int main(int argc, char** argv) { return pd::kvtransfer::Main(argc, argv); }
