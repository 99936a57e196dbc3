// Test helper: writes GGUF v3 files in memory (metadata of any scalar/array type and tensors of
// the engine's types), and a tiny random Llama-style model built on it. Header-only, tests only.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/quant/dtype.h"
#include "engine/quant/fp16.h"
#include "engine/quant/q8_0.h"

namespace pd::testing {

class GgufBuilder {
 public:
  void U32(const std::string& k, uint32_t v) { Key(k, 4); Put(v); ++n_kv_; }
  void F32(const std::string& k, float v) { Key(k, 6); Put(v); ++n_kv_; }
  void Bool(const std::string& k, bool v) { Key(k, 7); Put(uint8_t{v}); ++n_kv_; }
  void Str(const std::string& k, const std::string& v) { Key(k, 8); Str(kv_, v); ++n_kv_; }
  void StrArray(const std::string& k, const std::vector<std::string>& v) {
    Key(k, 9); Put(uint32_t{8}); Put(uint64_t(v.size()));
    for (const auto& s : v) Str(kv_, s);
    ++n_kv_;
  }
  void F32Array(const std::string& k, const std::vector<float>& v) {
    Key(k, 9); Put(uint32_t{6}); Put(uint64_t(v.size()));
    for (float f : v) Put(f);
    ++n_kv_;
  }
  void I32Array(const std::string& k, const std::vector<int32_t>& v) {
    Key(k, 9); Put(uint32_t{5}); Put(uint64_t(v.size()));
    for (int32_t x : v) Put(x);
    ++n_kv_;
  }

  // Adds a tensor from F32 values, stored as `type`. shape in ggml order (shape[0] = row length).
  void Tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v,
              engine::DType type = engine::DType::kF32) {
    std::vector<uint8_t> bytes;
    const int64_t row = shape[0];
    const int64_t rows = int64_t(v.size()) / row;
    bytes.resize(engine::RowBytes(type, row) * rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = v.data() + r * row;
      uint8_t* dst = bytes.data() + r * engine::RowBytes(type, row);
      switch (type) {
        case engine::DType::kF32: std::memcpy(dst, src, row * 4); break;
        case engine::DType::kF16:
          engine::F32ToF16Row(src, reinterpret_cast<uint16_t*>(dst), row);
          break;
        case engine::DType::kBF16:
          engine::F32ToBf16Row(src, reinterpret_cast<uint16_t*>(dst), row);
          break;
        case engine::DType::kQ8_0:
          engine::QuantizeRowQ8_0(src, reinterpret_cast<engine::BlockQ8_0*>(dst), row);
          break;
      }
    }
    tensors_.push_back({name, shape, static_cast<uint32_t>(type), std::move(bytes)});
  }

  std::vector<uint8_t> Build() const {
    std::vector<uint8_t> out;
    auto put = [&](const void* p, size_t n) {
      out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    const uint32_t magic = 0x46554747, version = 3;
    const uint64_t nt = tensors_.size(), nkv = n_kv_;
    put(&magic, 4); put(&version, 4); put(&nt, 8); put(&nkv, 8);
    put(kv_.data(), kv_.size());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      std::vector<uint8_t> tmp;
      Str(tmp, t.name);
      put(tmp.data(), tmp.size());
      const uint32_t nd = uint32_t(t.shape.size());
      put(&nd, 4);
      for (int64_t d : t.shape) { const uint64_t u = d; put(&u, 8); }
      put(&t.type, 4);
      put(&offset, 8);
      offsets.push_back(offset);
      offset += (t.bytes.size() + 31) / 32 * 32;
    }
    out.resize((out.size() + 31) / 32 * 32, 0);
    const size_t base = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(base + offsets[i], 0);
      put(tensors_[i].bytes.data(), tensors_[i].bytes.size());
    }
    out.resize(base + offset, 0);
    return out;
  }

 private:
  struct T {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t type;
    std::vector<uint8_t> bytes;
  };
  template <typename V>
  void Put(V v) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
    kv_.insert(kv_.end(), p, p + sizeof(V));
  }
  static void Str(std::vector<uint8_t>& out, const std::string& s) {
    const uint64_t n = s.size();
    out.insert(out.end(), reinterpret_cast<const uint8_t*>(&n), reinterpret_cast<const uint8_t*>(&n) + 8);
    out.insert(out.end(), s.begin(), s.end());
  }
  void Key(const std::string& k, uint32_t type) { Str(kv_, k); Put(type); }

  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

struct TinyModelSpec {
  std::string arch = "llama";
  int n_vocab = 96, n_embd = 64, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 96;
  bool tied = false, qkv_bias = false;
  engine::DType type = engine::DType::kF32;
  uint32_t seed = 1;
};

// A random model with a byte-level-ish vocabulary of plain tokens "t0".."tN".
inline std::vector<uint8_t> TinyModel(const TinyModelSpec& s) {
  GgufBuilder b;
  std::mt19937 rng(s.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto rnd = [&](size_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng) * scale;
    return v;
  };
  auto ones = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = 1.f + 0.1f * nd(rng);
    return v;
  };
  const std::string a = s.arch;
  const int hd = s.n_embd / s.n_head;
  b.Str("general.architecture", a);
  b.U32(a + ".context_length", 256);
  b.U32(a + ".embedding_length", s.n_embd);
  b.U32(a + ".block_count", s.n_layer);
  b.U32(a + ".feed_forward_length", s.n_ff);
  b.U32(a + ".attention.head_count", s.n_head);
  b.U32(a + ".attention.head_count_kv", s.n_head_kv);
  b.F32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  b.F32(a + ".rope.freq_base", 10000.f);
  const float w = 1.0f / std::sqrt(float(s.n_embd));
  b.Tensor("token_embd.weight", {s.n_embd, s.n_vocab}, rnd(size_t(s.n_embd) * s.n_vocab, 1.f), s.type);
  b.Tensor("output_norm.weight", {s.n_embd}, ones(s.n_embd));
  if (!s.tied) b.Tensor("output.weight", {s.n_embd, s.n_vocab}, rnd(size_t(s.n_embd) * s.n_vocab, w), s.type);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    b.Tensor(p + "attn_norm.weight", {s.n_embd}, ones(s.n_embd));
    b.Tensor(p + "attn_q.weight", {s.n_embd, s.n_head * hd}, rnd(size_t(s.n_embd) * s.n_head * hd, w), s.type);
    b.Tensor(p + "attn_k.weight", {s.n_embd, s.n_head_kv * hd}, rnd(size_t(s.n_embd) * s.n_head_kv * hd, w), s.type);
    b.Tensor(p + "attn_v.weight", {s.n_embd, s.n_head_kv * hd}, rnd(size_t(s.n_embd) * s.n_head_kv * hd, w), s.type);
    if (s.qkv_bias) {
      b.Tensor(p + "attn_q.bias", {s.n_head * hd}, rnd(s.n_head * hd, 0.1f));
      b.Tensor(p + "attn_k.bias", {s.n_head_kv * hd}, rnd(s.n_head_kv * hd, 0.1f));
      b.Tensor(p + "attn_v.bias", {s.n_head_kv * hd}, rnd(s.n_head_kv * hd, 0.1f));
    }
    b.Tensor(p + "attn_output.weight", {s.n_head * hd, s.n_embd}, rnd(size_t(s.n_embd) * s.n_head * hd, w), s.type);
    b.Tensor(p + "ffn_norm.weight", {s.n_embd}, ones(s.n_embd));
    b.Tensor(p + "ffn_gate.weight", {s.n_embd, s.n_ff}, rnd(size_t(s.n_embd) * s.n_ff, w), s.type);
    b.Tensor(p + "ffn_up.weight", {s.n_embd, s.n_ff}, rnd(size_t(s.n_embd) * s.n_ff, w), s.type);
    b.Tensor(p + "ffn_down.weight", {s.n_ff, s.n_embd}, rnd(size_t(s.n_embd) * s.n_ff, 1.0f / std::sqrt(float(s.n_ff))), s.type);
  }
  return b.Build();
}

}  // namespace pd::testing
