// Fuzz target: the safetensors reader (SafetensorsFile::Parse) and the index parser
// (ParseSafetensorsIndex). Every input goes through both: a safetensors file is binary, an index
// is JSON text, and each parser must refuse the other's inputs cleanly.
//
// Parse() must either fail with a non-empty message or return a file that keeps every promise of
// safetensors.h: the tensors, in offset order, tile the data buffer exactly; each one's byte size
// is its element count times its dtype's width; each lookup finds it. The fuzzer reads every
// tensor byte (summing them so the reads are not optimised away) so that ASan flags any pointer
// or length that escapes the input. Broken invariants are PD_CHECK failures, which libFuzzer
// reports as crashes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "common/mapped_file.h"
#include "common/status.h"
#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_targets.h"

namespace pd::engine {
namespace {

constexpr char kFileName[] = "fuzz.safetensors";

// Sums `n` bytes at `p`, which must lie inside [begin, end).
uint64_t SumBytes(const uint8_t* p, size_t n, const uint8_t* begin, const uint8_t* end) {
  if (n == 0) return 0;
  PD_CHECK(p >= begin && p <= end && n <= static_cast<size_t>(end - p));
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

uint64_t WalkFile(const SafetensorsFile& f, const uint8_t* begin, const uint8_t* end) {
  const uint64_t size = static_cast<uint64_t>(end - begin);
  PD_CHECK(f.file_size() == size);
  PD_CHECK(f.name() == kFileName);
  PD_CHECK(f.header_size() <= kSafetensorsMaxHeaderBytes);
  PD_CHECK(f.data_start() == 8 + f.header_size() && f.data_start() <= size);
  PD_CHECK(reinterpret_cast<const uint8_t*>(f.header().data()) == begin + 8);
  uint64_t sink = f.header_size();

  for (const auto& [key, value] : f.metadata()) sink += key.size() + value.size();

  const uint8_t* data = begin + f.data_start();
  uint64_t pos = 0;  // the tensors tile the data buffer in order
  for (const SafetensorsTensor& t : f.tensors()) {
    PD_CHECK(f.Find(t.name) == &t);
    PD_CHECK(t.file == kFileName);
    PD_CHECK(t.offset == pos);
    PD_CHECK(t.data == data + t.offset);
    const size_t bits = SafetensorsDTypeBits(t.dtype);
    PD_CHECK(bits > 0);
    PD_CHECK(t.type == DTypeFromSafetensors(t.dtype));
    for (int64_t d : t.shape) PD_CHECK(d >= 0);
    PD_CHECK(t.nbytes <= size);  // so nbytes * 8 cannot overflow
    PD_CHECK(t.nbytes * 8 % bits == 0);
    PD_CHECK(static_cast<uint64_t>(t.numel()) == t.nbytes * 8 / bits);
    sink += SumBytes(t.data, t.nbytes, begin, end);
    pos += t.nbytes;
  }
  PD_CHECK(pos == size - f.data_start());
  return sink;
}

uint64_t WalkIndex(const SafetensorsIndex& index) {
  PD_CHECK(!index.weight_map.empty());
  PD_CHECK(!index.shards.empty());
  PD_CHECK(std::adjacent_find(index.shards.begin(), index.shards.end(),
                              [](const std::string& a, const std::string& b) { return a >= b; }) ==
           index.shards.end());  // sorted and distinct
  uint64_t sink = 0;
  for (const std::string& shard : index.shards) {
    // Never a path out of the checkpoint's folder.
    PD_CHECK(!shard.empty() && shard != "." && shard != "..");
    PD_CHECK(shard.find_first_of(std::string_view("/\\\0", 3)) == std::string::npos);
    sink += shard.size();
  }
  for (const auto& [tensor, shard] : index.weight_map) {
    PD_CHECK(std::binary_search(index.shards.begin(), index.shards.end(), shard));
    sink += tensor.size();
  }
  return sink;
}

}  // namespace
}  // namespace pd::engine

namespace pd::fuzz {

int FuzzSafetensors(const uint8_t* data, size_t size) {
  using namespace pd::engine;
  // A copy of exactly `size` bytes, so that ASan catches a read one past the end even when the
  // caller's buffer has slack.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[size == 0 ? 1 : size]);
  if (size > 0) std::memcpy(copy.get(), data, size);
  const uint8_t* begin = copy.get();

  volatile uint64_t sink = 0;
  auto f = SafetensorsFile::Parse(pd::MappedFile::Borrow(begin, size), kFileName);
  if (f.ok()) {
    sink = sink + WalkFile(**f, begin, begin + size);
  } else {
    PD_CHECK(!f.status().message().empty());
    PD_CHECK(f.status().code() == absl::StatusCode::kInvalidArgument ||
             f.status().code() == absl::StatusCode::kDataLoss);
  }

  auto index = ParseSafetensorsIndex(std::string_view(reinterpret_cast<const char*>(begin), size));
  if (index.ok()) {
    sink = sink + WalkIndex(*index);
  } else {
    PD_CHECK(!index.status().message().empty());
    PD_CHECK(index.status().code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}

}  // namespace pd::fuzz
