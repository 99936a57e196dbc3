// SHA-256 (FIPS 180-4), for pinning the calibration texts' source files. Small and dependency-free;
// not constant-time and not meant for secrets.
#pragma once

#include <string>
#include <string_view>

namespace pd::engine::quantize {

// Lower-case hex digest of `data`.
std::string Sha256Hex(std::string_view data);

}  // namespace pd::engine::quantize
