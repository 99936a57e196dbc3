// Reading a fuzz input as a sequence of small decisions and byte strings. Every read succeeds:
// past the end it yields zeros and empty strings, so a harness never has to reject a short input
// and every prefix of an interesting input stays meaningful to the fuzzer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace pd::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t left() const { return pos_ < size_ ? size_ - pos_ : 0; }

  uint8_t Byte() { return pos_ < size_ ? static_cast<uint8_t>(data_[pos_++]) : 0; }
  bool Bool() { return Byte() & 1; }
  // Little-endian, from as many bytes as are left (zeros after the end).
  template <typename T>
  T Int() {
    uint8_t b[sizeof(T)] = {};
    for (size_t i = 0; i < sizeof(T); ++i) b[i] = Byte();
    T v;
    std::memcpy(&v, b, sizeof(T));
    return v;
  }
  // A value in [0, n) (n > 0) from one byte.
  size_t Pick(size_t n) { return Byte() % n; }

  // The next min(n, left()) bytes.
  std::string_view Bytes(size_t n) {
    const size_t k = n < left() ? n : left();
    std::string_view s(data_ + pos_, k);
    pos_ += k;
    return s;
  }
  // Bytes up to the next `sep` (not included; the separator is consumed), or the rest.
  std::string_view Until(char sep) {
    const std::string_view rest(data_ + (pos_ < size_ ? pos_ : size_), left());
    const size_t at = rest.find(sep);
    if (at == std::string_view::npos) {
      pos_ = size_;
      return rest;
    }
    pos_ += at + 1;
    return rest.substr(0, at);
  }
  // A string whose length is the next byte, then that many bytes.
  std::string_view Short() { return Bytes(Byte()); }
  std::string_view Rest() { return Bytes(left()); }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace pd::fuzz
