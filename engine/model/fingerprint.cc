#include "engine/model/fingerprint.h"

#include <algorithm>
#include <cstdio>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace pd::engine {

namespace {
constexpr size_t kTensorSample = 4096;  // bytes of each tensor's data in the fingerprint
}  // namespace

uint64_t ModelFingerprint(const GgufFile& file) {
  const std::string_view bytes = file.bytes();
  // The header ends where the first tensor's data starts (the whole file without tensors).
  size_t header = bytes.size();
  for (const GgufTensorInfo& t : file.tensors()) {
    header = std::min(header, static_cast<size_t>(t.data - reinterpret_cast<const uint8_t*>(
                                                              bytes.data())));
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, bytes.data(), header);
  for (const GgufTensorInfo& t : file.tensors()) {
    XXH3_64bits_update(&state, t.data, std::min(t.nbytes, kTensorSample));
  }
  return XXH3_64bits_digest(&state);
}

std::string FingerprintHex(uint64_t fingerprint) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fingerprint));
  return buf;
}

}  // namespace pd::engine
