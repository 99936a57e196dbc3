#include "engine/runtime/bandwidth.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "engine/backend/device_info.h"

namespace pd::engine {
namespace {

// "model name" of /proc/cpuinfo, or "unknown cpu".
std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t b = line.find_first_not_of(' ', colon + 1);
        return b == std::string::npos ? "unknown cpu" : line.substr(b);
      }
    }
  }
  return "unknown cpu";
}

std::map<std::string, double> ReadCache() {
  std::map<std::string, double> out;
  std::ifstream in(BandwidthCachePath());
  std::string line;
  while (std::getline(in, line)) {
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    char* end = nullptr;
    const double v = std::strtod(line.c_str() + sp + 1, &end);
    if (end != line.c_str() + sp + 1 && v > 0) out[line.substr(0, sp)] = v;
  }
  return out;
}

// Adds `key`; a cache that cannot be written is only a slower next run.
void WriteCache(const std::string& key, double v) {
  std::map<std::string, double> all = ReadCache();
  all[key] = v;
  namespace fs = std::filesystem;
  const fs::path path(BandwidthCachePath());
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    for (const auto& [k, b] : all) out << k << ' ' << static_cast<int64_t>(b) << '\n';
    if (!out) return;
  }
  fs::rename(tmp, path, ec);
}

// Sum of the 64-bit words of [p, p + n): a read the compiler cannot drop.
uint64_t SumWords(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

}  // namespace

std::string BandwidthCachePath() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string dir = xdg != nullptr && *xdg != '\0' ? pd::StrCat(xdg, "/pdserve")
                          : home != nullptr              ? pd::StrCat(home, "/.cache/pdserve")
                                                         : std::string("/tmp/pdserve");
  return dir + "/bandwidth.txt";
}

absl::StatusOr<MeasuredBandwidth> HostReadBandwidth(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  MeasuredBandwidth m;
  m.key = pd::StrCat("cpu ", CpuModelName(), " x", threads);
  const std::map<std::string, double> cache = ReadCache();
  if (auto it = cache.find(m.key); it != cache.end()) {
    m.bytes_per_s = it->second;
    m.cached = true;
    return m;
  }
  constexpr size_t kBytes = size_t{1} << 30;
  const size_t words = kBytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new (std::nothrow) uint64_t[words]);
  if (!buf) return absl::ResourceExhaustedError("no 1 GiB of host memory to measure bandwidth");
  std::memset(buf.get(), 1, kBytes);  // touch every page before timing
  double best = 0;
  std::vector<uint64_t> sums(threads);
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t begin = words * t / threads, end = words * (t + 1) / threads;
        sums[t] += SumWords(buf.get() + begin, end - begin);
      });
    }
    for (std::thread& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(kBytes) / s);
  }
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  if (total == 0) return absl::InternalError("bandwidth measurement read nothing");
  m.bytes_per_s = best;
  WriteCache(m.key, best);
  return m;
}

absl::StatusOr<MeasuredBandwidth> GpuCopyBandwidth() {
  absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(0);
  if (!info.ok()) return info.status();
  MeasuredBandwidth m;
  m.key = pd::StrCat("gpu ", info->name);
  const std::map<std::string, double> cache = ReadCache();
  if (auto it = cache.find(m.key); it != cache.end()) {
    m.bytes_per_s = it->second;
    m.cached = true;
    return m;
  }
  absl::StatusOr<double> bw = MeasureCudaCopyBandwidth(0);
  if (!bw.ok()) return bw.status();
  m.bytes_per_s = *bw;
  WriteCache(m.key, *bw);
  return m;
}

}  // namespace pd::engine
