// Fuzz target: the GGUF reader and what reads it next, ModelConfig::FromGguf and Weights::Load.
//
// Parse() must either fail with a non-empty message or return a file whose every value, getter
// and tensor byte can be read without leaving the input: the fuzzer reads them all (summing the
// bytes so the reads are not optimised away) so that ASan flags any pointer or length that
// escapes the buffer. Broken invariants are PD_CHECK failures, which libFuzzer reports as crashes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "common/mapped_file.h"
#include "common/status.h"
#include "engine/backend/backend.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "tests/fuzz/fuzz_targets.h"

namespace pd::engine {
namespace {

// Sums `n` bytes at `p`, which must lie inside [begin, end).
uint64_t SumBytes(const uint8_t* p, size_t n, const uint8_t* begin, const uint8_t* end) {
  if (n == 0) return 0;
  PD_CHECK(p >= begin && p <= end && n <= static_cast<size_t>(end - p));
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

uint64_t Walk(const GgufFile& f, const uint8_t* begin, const uint8_t* end) {
  uint64_t sink = f.version() + f.alignment() + f.file_size();
  PD_CHECK(f.version() == 2 || f.version() == 3);
  PD_CHECK(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);

  for (const auto& [key, v] : f.metadata()) {
    PD_CHECK(f.Find(key) == &v);
    sink += key.size() + static_cast<uint32_t>(v.type) + v.i + v.u + (v.f != 0);
    sink += SumBytes(reinterpret_cast<const uint8_t*>(v.str.data()), v.str.size(), begin, end);
    if (v.type == GgufValueType::kArray) {
      const size_t es = GgufScalarSize(v.elem_type);
      if (es > 0) {
        PD_CHECK(v.count <= static_cast<size_t>(end - begin) / es);
        sink += SumBytes(v.raw, v.count * es, begin, end);
      } else if (v.elem_type == GgufValueType::kString) {
        PD_CHECK(v.strings.size() == v.count);
        for (std::string_view s : v.strings) {
          sink += SumBytes(reinterpret_cast<const uint8_t*>(s.data()), s.size(), begin, end);
        }
      }
    }
    // Every getter on every key: each either succeeds or fails cleanly.
    if (auto r = f.GetString(key); r.ok()) sink += r->size();
    if (auto r = f.GetUint(key); r.ok()) sink += *r;
    if (auto r = f.GetInt(key); r.ok()) sink += static_cast<uint64_t>(*r);
    if (auto r = f.GetFloat(key); r.ok()) sink += static_cast<uint64_t>(*r != 0);
    if (auto r = f.GetBool(key); r.ok()) sink += *r;
    if (auto r = f.GetStringArray(key); r.ok()) sink += r->size();
    if (auto r = f.GetFloatArray(key); r.ok()) {
      PD_CHECK(r->size() == v.count);
      for (float x : *r) sink += x != 0;
    }
    if (auto r = f.GetIntArray(key); r.ok()) {
      PD_CHECK(r->size() == v.count);
      for (int64_t x : *r) sink += static_cast<uint64_t>(x);
    }
    if (auto r = f.GetUintOr(key, 1); r.ok()) sink += *r;
    if (auto r = f.GetFloatOr(key, 1); r.ok()) sink += *r != 0;
    if (auto r = f.GetBoolOr(key, true); r.ok()) sink += *r;
  }

  for (const GgufTensorInfo& t : f.tensors()) {
    PD_CHECK(f.FindTensor(t.name) == &t);
    PD_CHECK(!t.shape.empty() && t.shape.size() <= 4);
    for (int64_t d : t.shape) PD_CHECK(d > 0);
    PD_CHECK(t.offset % f.alignment() == 0);
    PD_CHECK(t.nbytes == RowBytes(t.type, t.shape[0]) * static_cast<size_t>(t.rows()));
    PD_CHECK(t.numel() == t.shape[0] * t.rows());
    sink += SumBytes(t.data, t.nbytes, begin, end);
  }
  return sink;
}

}  // namespace
}  // namespace pd::engine

namespace pd::fuzz {

int FuzzGguf(const uint8_t* data, size_t size) {
  using namespace pd::engine;
  // A copy of exactly `size` bytes, so that ASan catches a read one past the end even when the
  // caller's buffer has slack.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[size == 0 ? 1 : size]);
  if (size > 0) std::memcpy(copy.get(), data, size);
  const uint8_t* begin = copy.get();

  auto f = GgufFile::Parse(pd::MappedFile::Borrow(begin, size));
  if (!f.ok()) {
    PD_CHECK(!f.status().message().empty());
    return 0;
  }
  volatile uint64_t sink = Walk(**f, begin, begin + size);
  (void)sink;

  auto config = ModelConfig::FromGguf(**f);
  if (!config.ok()) {
    PD_CHECK(!config.status().message().empty());
    return 0;
  }
  PD_CHECK(config->n_embd > 0 && config->n_head > 0 && config->n_head_kv > 0);
  PD_CHECK(config->n_layer > 0 && config->head_dim > 0 && config->rope_dim > 0);
  // One single-threaded CPU backend for the whole run; Load borrows the file's bytes only.
  static Backend* backend = CreateCpuBackend(CpuBackendOptions{.threads = 1}).release();
  auto weights = Weights::Load(**f, *config, *backend);
  if (weights.ok()) {
    sink = (*weights)->total_bytes;
    for (float x : (*weights)->rope_freq_factors) sink = sink + (x != 0);
  }
  return 0;
}

}  // namespace pd::fuzz
