// The Hadamard matrix INT8 KV rows are rotated by (engine/backend/kv_rotation.h), written out
// entry by entry, independently of its butterflies: the tests' reference.
#pragma once

#include <bit>

namespace pd::engine::testing {

// H[i][j] = (-1)^popcount(i & j): the Sylvester Hadamard matrix.
inline int HadamardEntry(int i, int j) {
  return std::popcount(static_cast<unsigned>(i & j)) % 2 ? -1 : 1;
}

}  // namespace pd::engine::testing
