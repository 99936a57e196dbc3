#include "engine/backend/top_k.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace pd::engine {
namespace {

struct Entry {
  uint32_t key;
  int32_t id;
};
// True when a ranks before b.
inline bool Before(const Entry& a, const Entry& b) {
  return a.key > b.key || (a.key == b.key && a.id < b.id);
}

}  // namespace

void RowTopK(const float* row, int64_t cols, int k, int32_t* ids, float* values) {
  if (k == 1) {
    // Greedy decoding's case in two vectorizable passes: the largest number (NaN never compares
    // greater), then its first column. -0 == +0 in both; a row of NaNs gives column 0.
    constexpr int kLanes = 16;
    float m[kLanes];
    for (float& v : m) v = -std::numeric_limits<float>::infinity();
    int64_t i = 0;
    for (; i + kLanes <= cols; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) m[j] = row[i + j] > m[j] ? row[i + j] : m[j];
    }
    float best = -std::numeric_limits<float>::infinity();
    for (; i < cols; ++i) best = row[i] > best ? row[i] : best;
    for (float v : m) best = v > best ? v : best;
    int64_t at = 0;
    for (int64_t j = 0; j < cols; ++j) {
      if (row[j] == best) {
        at = j;
        break;
      }
    }
    ids[0] = static_cast<int32_t>(at);
    values[0] = row[at];
    return;
  }
  // A heap whose front is the worst entry kept: most entries fail one comparison against it.
  std::vector<Entry> heap;
  heap.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < cols; ++i) {
    const Entry e{TopKKey(row[i]), static_cast<int32_t>(i)};
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.push_back(e);
      std::push_heap(heap.begin(), heap.end(), Before);
    } else if (Before(e, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), Before);
      heap.back() = e;
      std::push_heap(heap.begin(), heap.end(), Before);
    }
  }
  std::sort(heap.begin(), heap.end(), Before);
  for (size_t j = 0; j < heap.size(); ++j) {
    ids[j] = heap[j].id;
    values[j] = row[heap[j].id];
  }
}

void MergeTopK(const int32_t* ids, const float* values, int64_t n, int k, int32_t* out_ids,
               float* out_values) {
  std::vector<std::pair<Entry, float>> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[i] = {Entry{TopKKey(values[i]), ids[i]}, values[i]};
  const int64_t keep = std::min<int64_t>(k, n);
  std::partial_sort(all.begin(), all.begin() + keep, all.end(),
                    [](const auto& a, const auto& b) { return Before(a.first, b.first); });
  for (int64_t j = 0; j < keep; ++j) {
    out_ids[j] = all[j].first.id;
    out_values[j] = all[j].second;
  }
}

}  // namespace pd::engine
