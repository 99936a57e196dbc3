// KV transfer throughput between two processes over UCX (or in-process, --transport inproc):
// the parent is the decode node (receiver), a forked child the prefill node (sender). For each
// prompt length and wire dtype, the child pushes every layer of a sequence from a real KvCache
// (CPU backend) as fast as it can, completes, and waits for the receiver's acknowledgement
// (sent once every layer arrived and passed its checksum); time = first Push -> ACK, measured in
// the sender. The receiver's owner drops the payloads (import into a cache is a memcpy per block,
// outside the transport).
//
// Prints one line per configuration:
//   RESULT tokens=<n> wire=<f16|int8> bytes=<total> layer_msg_bytes=<n> median_ms=<t> best_ms=<t>
//          gbps=<bytes / median> best_gbps=<bytes / best>
// bench/kv_transfer/run.sh puts them next to ucx_perftest at the same message size.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
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

// The sender process: one cache of `cache_tokens` positions (as a serving node's cache is many
// prompts long, its layer tensors sit on huge pages), the sequence's `max_tokens` of them filled
// with random finite f16 values; for each descriptor read from `in`, push all layers, complete,
// wait, write the elapsed ns to `out`.
[[noreturn]] void Sender(const Args& a, int in, int out) {
  auto backend = engine::CreateCpuBackend({1});
  engine::KvCacheOptions o;
  o.n_layer = a.n_layer;
  o.n_kv_heads = a.n_kv_heads;
  o.head_dim = a.head_dim;
  o.block_size = a.block_size;
  o.n_blocks = (std::max(a.cache_tokens, a.max_tokens) + a.block_size - 1) / a.block_size;
  o.dtype = KvDType::kF16;
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
    const int64_t t0 = NowNs();
    auto s = (*tx)->Connect(*d, KvDType::kF16);
    absl::Status st = s.status();
    for (int l = 0; st.ok() && l < o.n_layer; ++l) st = (*s)->Push(l, spans[l]);
    if (st.ok()) st = (*s)->Complete();
    if (st.ok()) st = (*s)->Wait(absl::Seconds(60));
    int64_t dt = NowNs() - t0;
    if (!st.ok()) {
      std::fprintf(stderr, "sender: %s\n", std::string(st.ToString()).c_str());
      dt = -1;
    }
    if (!WriteAll(out, &dt, sizeof(dt))) _exit(7);
  }
}

int Main(int argc, char** argv) {
  CLI::App app{"KV transfer throughput between two processes"};
  Args a;
  std::string model, tokens_list = "1024,4096,16384", wire_list = "f16,int8";
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
  CLI11_PARSE(app, argc, argv);

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
  for (int n_tokens : tokens) {
    for (KvDType wire : wires) {
      TransferGeometry g{a.n_layer,  a.n_kv_heads,
                         a.head_dim, a.block_size,
                         n_tokens,   wire == KvDType::kI8 ? KvDType::kI8 : KvDType::kF16,
                         wire};
      std::vector<double> ms;
      for (int r = 0; r < warmup + reps; ++r) {
        absl::Mutex mu;
        bool done = false;
        absl::Status final;
        ReceiveCallbacks cb;
        cb.on_layer = [](LayerPayload) {};  // dropped: the buffer goes back to the pool
        cb.on_done = [&](uint64_t, absl::Status s) {
          absl::MutexLock lock(&mu);
          final = s;
          done = true;
        };
        auto d = (*rx)->Reserve(g, absl::Now() + absl::Seconds(60), std::move(cb));
        if (!d.ok()) return 1;
        const std::string bytes = d->Serialize();
        const uint32_t len = static_cast<uint32_t>(bytes.size());
        int64_t dt = 0;
        if (!WriteAll(p2c[1], &len, 4) || !WriteAll(p2c[1], bytes.data(), len) ||
            !ReadAll(c2p[0], &dt, sizeof(dt))) {
          std::fprintf(stderr, "sender process died\n");
          return 1;
        }
        {
          absl::MutexLock lock(&mu);
          mu.Await(absl::Condition(&done));
        }
        if (dt < 0 || !final.ok()) {
          std::fprintf(stderr, "transfer failed: %s\n", std::string(final.ToString()).c_str());
          return 1;
        }
        if (r >= warmup) ms.push_back(static_cast<double>(dt) / 1e6);
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2], best = ms.front();
      const double bytes = static_cast<double>(g.TotalBytes());
      std::printf(
          "RESULT tokens=%d wire=%s bytes=%.0f layer_msg_bytes=%zu median_ms=%.3f best_ms=%.3f "
          "gbps=%.3f best_gbps=%.3f\n",
          n_tokens, std::string(engine::KvDTypeName(wire)).c_str(), bytes,
          g.LayerBytes() + kHeaderBytes, median, best, bytes / median / 1e6, bytes / best / 1e6);
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
