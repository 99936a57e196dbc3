#include "engine/quant/quantize/synth_model.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <system_error>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/parallel.h"
#include "engine/quant/quantize/gguf_writer.h"

namespace pd::engine::quantize {
namespace {

constexpr int kSpecialTokens = 3;  // <unk>, <s>, </s>
constexpr int kMinVocab = kSpecialTokens + 256;
constexpr char kSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's space
// Bytes generated and quantized per piece of a tensor: big enough to keep every core busy, small
// enough that a 128k x 4096 f32 embedding table never sits in memory whole.
constexpr uint64_t kPieceBytes = uint64_t{32} << 20;

SynthModelSpec Shape(std::string name, int n_layer, int n_embd, int n_head, int n_head_kv, int n_ff,
                     int n_vocab, int n_ctx, float rope_base) {
  SynthModelSpec s;
  s.name = std::move(name);
  s.n_layer = n_layer;
  s.n_embd = n_embd;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.n_ff = n_ff;
  s.n_vocab = n_vocab;
  s.n_ctx = n_ctx;
  s.rope_freq_base = rope_base;
  return s;
}

// general.file_type as llama.cpp numbers it (every matrix of one type: the "_S" variants);
// pdserve's own types write their type numbers, as `pdctl quantize` does.
uint32_t FileType(DType t) {
  switch (t) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kQ4_0:
      return 2;
    case DType::kQ8_0:
      return 7;
    case DType::kQ5_0:
      return 8;
    case DType::kQ2_K:
      return 10;
    case DType::kQ3_K:
      return 11;
    case DType::kQ4_K:
      return 14;
    case DType::kQ5_K:
      return 16;
    case DType::kQ6_K:
      return 18;
    case DType::kBF16:
      return 32;
    case DType::kW8A8:
    case DType::kW4A16:
      return static_cast<uint32_t>(t);
    case DType::kQ8_K:
    case DType::kQ8_0x16:
    case DType::kQ5_0x16:
    case DType::kQ4_Kx16:
    case DType::kQ6_Kx16:
      break;
  }
  return 0;
}

int HeadDim(const SynthModelSpec& s) { return s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head; }

absl::Status CheckRange(std::string_view what, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        pd::StrCat(what, " = ", v, " is out of range (", lo, "..", hi, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckRows(DType t, std::string_view role,
                       std::initializer_list<std::pair<std::string_view, int64_t>> cols) {
  if (t == DType::kQ8_K) {
    return absl::InvalidArgumentError(
        pd::StrCat(role, " q8_K is an activation type, never stored in model files"));
  }
  const int bs = Traits(t).block_size;
  for (const auto& [name, n] : cols) {
    if (n % bs != 0) {
      return absl::InvalidArgumentError(pd::StrCat(
          role, " ", Traits(t).name, " stores rows in blocks of ", bs, " weights, but ", name,
          " = ", n, " is not a multiple of ", bs, " (choose another type or shape)"));
    }
  }
  return absl::OkStatus();
}

// ---- random numbers ----
// splitmix64's finalizer: a bijective 64-bit mix.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A counter-based stream: splitmix64 from a state derived from (seed, stream, index), so that
// every row (or pool block) has its own sequence whatever thread draws it.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream, uint64_t index)
      : state_(Mix(Mix(Mix(seed) ^ (stream + 1)) ^ (index + 0x632be59bd9b4e019ull))) {}

  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return Mix(state_);
  }
  // Uniform in [0, n).
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(((Next() >> 32) * uint64_t{n}) >> 32); }
  // n draws of N(0, stddev^2): two 24-bit uniforms per step, Box-Muller. Tails stop at 5.9
  // sigma (u1 >= 2^-25).
  void Normals(float* out, int64_t n, float stddev) {
    constexpr float kTwoPi = 6.28318530717958647692f;
    constexpr float kInv24 = 1.0f / 16777216.0f;
    for (int64_t i = 0; i < n; i += 2) {
      const uint64_t x = Next();
      const float u1 = (static_cast<float>(x >> 40) + 0.5f) * kInv24;  // (0, 1)
      const float u2 = static_cast<float>((x >> 16) & 0xFFFFFF) * kInv24;
      const float r = std::sqrt(-2.0f * std::log(u1)) * stddev;
      const float th = kTwoPi * u2;
      out[i] = r * std::cos(th);
      if (i + 1 < n) out[i + 1] = r * std::sin(th);
    }
  }

 private:
  uint64_t state_;
};

// ---- block pools ----
// The quantizers of these types search scales per block (k_quants_quantize.cc: microseconds a
// weight), which would make a 7B model take hours. Large tensors of them are therefore built
// from a pool of kPoolBlocks quantized N(0, stddev^2) blocks: each row is a random sequence of
// pool blocks. Every block is self-contained (its own scales), so the rows are valid, their
// values are normal in distribution, and rows (of >= 4 blocks) all differ; the kernels see the
// blocks a real quantized model has.
constexpr uint32_t kPoolBlocks = 4096;

bool HasSlowQuantizer(DType t) {
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kW4A16:
      return true;
    default:
      return false;
  }
}

// Whether a tensor may be pooled: rows of at least kMinPooledRowBlocks blocks, so that 4096^4
// combinations keep every row distinct.
constexpr int64_t kMinPooledRowBlocks = 4;

bool Poolable(DType type, const std::vector<int64_t>& shape, float stddev) {
  if (stddev == 0 || !HasSlowQuantizer(type) || Traits(type).row_header_bytes != 0) return false;
  return shape[0] / Traits(type).block_size >= kMinPooledRowBlocks;
}

int64_t Blocks(DType type, const std::vector<int64_t>& shape) {
  int64_t blocks = shape[0] / Traits(type).block_size;
  for (size_t d = 1; d < shape.size(); ++d) blocks *= shape[d];
  return blocks;
}

// The pool's stream number: disjoint from the tensors' (their indices).
uint64_t PoolStream(DType type, float stddev) {
  uint32_t bits;
  std::memcpy(&bits, &stddev, sizeof(bits));
  return (uint64_t{1} << 63) | (Mix(uint64_t{static_cast<uint32_t>(type)} << 32 | bits) >> 1);
}

std::vector<uint8_t> MakePool(const SynthModelSpec& s, DType type, float stddev, int threads) {
  const DTypeTraits& tr = Traits(type);
  std::vector<uint8_t> pool(size_t{kPoolBlocks} * tr.block_bytes);
  const uint64_t stream = PoolStream(type, stddev);
  ParallelFor(kPoolBlocks, threads, 16, [&](int64_t a, int64_t b) {
    std::vector<float> x(tr.block_size);
    for (int64_t i = a; i < b; ++i) {
      Rng(s.seed, stream, static_cast<uint64_t>(i)).Normals(x.data(), tr.block_size, stddev);
      QuantizeRow(type, x.data(), pool.data() + i * tr.block_bytes, tr.block_size);
    }
  });
  return pool;
}

// The writer with every key and tensor of the model added (not opened).
void Layout(const SynthModelSpec& s, const std::vector<SynthTensor>& tensors, GgufWriter* w) {
  const std::string a = "llama.";
  const int hd = HeadDim(s);
  w->SetString("general.architecture", "llama");
  w->SetString("general.name", pd::StrCat("synth-", s.name, "-", Traits(s.type).name));
  w->SetString("general.description", pd::StrCat("pdctl synth-model: random weights (seed ", s.seed,
                                                 "), synthetic vocabulary; not a trained model"));
  w->SetU32("general.file_type", FileType(s.type));
  w->SetU32("general.quantization_version", 2);
  w->SetU32(a + "vocab_size", static_cast<uint32_t>(s.n_vocab));
  w->SetU32(a + "context_length", static_cast<uint32_t>(s.n_ctx));
  w->SetU32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
  w->SetU32(a + "block_count", static_cast<uint32_t>(s.n_layer));
  w->SetU32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w->SetU32(a + "rope.dimension_count", static_cast<uint32_t>(hd));
  w->SetU32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
  w->SetU32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  if (s.head_dim > 0) {
    w->SetU32(a + "attention.key_length", static_cast<uint32_t>(hd));
    w->SetU32(a + "attention.value_length", static_cast<uint32_t>(hd));
  }
  w->SetF32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
  w->SetF32(a + "rope.freq_base", s.rope_freq_base);

  std::vector<std::string> tokens = SynthVocabulary(s.n_vocab);
  std::vector<float> scores(tokens.size(), 0.f);
  std::vector<int32_t> types(tokens.size(), 1);                 // normal
  types[0] = 2;                                                 // unknown
  types[1] = types[2] = 3;                                      // control
  for (int b = 0; b < 256; ++b) types[kSpecialTokens + b] = 6;  // byte
  for (size_t i = kMinVocab; i < tokens.size(); ++i) {
    scores[i] = -static_cast<float>(i - kMinVocab);  // shorter pieces merge first
  }
  w->SetString("tokenizer.ggml.model", "llama");
  w->SetStringArray("tokenizer.ggml.tokens", tokens);
  w->SetF32Array("tokenizer.ggml.scores", scores);
  w->SetI32Array("tokenizer.ggml.token_type", types);
  w->SetU32("tokenizer.ggml.unknown_token_id", 0);
  w->SetU32("tokenizer.ggml.bos_token_id", 1);
  w->SetU32("tokenizer.ggml.eos_token_id", 2);
  w->SetBool("tokenizer.ggml.add_bos_token", true);
  w->SetBool("tokenizer.ggml.add_eos_token", false);

  for (const SynthTensor& t : tensors) w->AddTensor(t.name, t.type, t.shape);
}

std::vector<SynthTensor> Tensors(const SynthModelSpec& s) {
  const int64_t E = s.n_embd, F = s.n_ff, V = s.n_vocab;
  const int64_t q = int64_t{s.n_head} * HeadDim(s), kv = int64_t{s.n_head_kv} * HeadDim(s);
  auto sd = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  std::vector<SynthTensor> t;
  t.push_back({"token_embd.weight", s.type, {E, V}, 1.0f});
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = pd::StrCat("blk.", l, ".");
    t.push_back({p + "attn_norm.weight", DType::kF32, {E}, 0});
    t.push_back({p + "attn_q.weight", s.type, {E, q}, sd(E)});
    t.push_back({p + "attn_k.weight", s.type, {E, kv}, sd(E)});
    t.push_back({p + "attn_v.weight", s.type, {E, kv}, sd(E)});
    t.push_back({p + "attn_output.weight", s.type, {q, E}, sd(q)});
    t.push_back({p + "ffn_norm.weight", DType::kF32, {E}, 0});
    t.push_back({p + "ffn_gate.weight", s.type, {E, F}, sd(E)});
    t.push_back({p + "ffn_up.weight", s.type, {E, F}, sd(E)});
    t.push_back({p + "ffn_down.weight", s.type, {F, E}, sd(F)});
  }
  t.push_back({"output_norm.weight", DType::kF32, {E}, 0});
  if (!s.tied_output) t.push_back({"output.weight", s.output_type.value_or(s.type), {E, V}, sd(E)});
  // One pool serves every tensor of its (type, stddev): pooled when they hold more than twice
  // the pool's blocks (smaller models cost less to quantize directly).
  std::map<uint64_t, int64_t> group_blocks;
  for (const SynthTensor& x : t) {
    if (Poolable(x.type, x.shape, x.stddev)) {
      group_blocks[PoolStream(x.type, x.stddev)] += Blocks(x.type, x.shape);
    }
  }
  for (SynthTensor& x : t) {
    x.pooled = Poolable(x.type, x.shape, x.stddev) &&
               group_blocks[PoolStream(x.type, x.stddev)] > 2 * int64_t{kPoolBlocks};
  }
  return t;
}

absl::Status CheckOutputFolder(const std::string& path, uint64_t bytes) {
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) {
    return absl::NotFoundError(
        pd::StrCat("output folder '", folder.string(), "' does not exist (for '", path, "')"));
  }
  struct statvfs fs;
  if (::statvfs(folder.c_str(), &fs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    // An existing file at `path` is replaced only at the end: its space does not count.
    if (free_bytes < bytes) {
      return absl::ResourceExhaustedError(pd::StrCat("the model needs ", bytes >> 20, " MiB but '",
                                                     folder.string(), "' has ", free_bytes >> 20,
                                                     " MiB free"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<SynthShape>& SynthShapes() {
  static const std::vector<SynthShape> kShapes = {
      {"tiny", "2 small layers with k-quant-friendly sizes, for tests",
       Shape("tiny", 2, 256, 4, 2, 512, 512, 1024, 10000.f)},
      {"llama-1b", "a Llama-style ~1.1B model with GQA and a 32k vocabulary",
       Shape("llama-1b", 16, 2048, 32, 8, 8192, 32000, 4096, 10000.f)},
      {"tinyllama-1.1b", "TinyLlama 1.1B",
       Shape("tinyllama-1.1b", 22, 2048, 32, 4, 5632, 32000, 2048, 10000.f)},
      {"llama-7b", "Llama 2 7B", Shape("llama-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 10000.f)},
      {"llama-13b", "Llama 2 13B",
       Shape("llama-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 10000.f)},
      {"llama3-8b", "Llama 3 8B (128k vocabulary, rope base 500000)",
       Shape("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.f)},
  };
  return kShapes;
}

absl::StatusOr<SynthModelSpec> FindSynthShape(std::string_view name) {
  std::string names;
  for (const SynthShape& s : SynthShapes()) {
    if (s.name == name) return s.spec;
    names += pd::StrCat(names.empty() ? "" : ", ", s.name);
  }
  return absl::NotFoundError(pd::StrCat("unknown shape '", name, "' (one of: ", names, ")"));
}

std::string DescribeSynthShapes() {
  std::string out;
  for (const SynthShape& sh : SynthShapes()) {
    const SynthModelSpec& s = sh.spec;
    double params = 0;  // without the writer's layout: this runs for every `pdctl --help`
    for (const SynthTensor& t : Tensors(s)) {
      double n = 1;
      for (int64_t d : t.shape) n *= static_cast<double>(d);
      params += n;
    }
    char size[32];
    if (params >= 1e9) {
      std::snprintf(size, sizeof(size), "%.2fB", params / 1e9);
    } else {
      std::snprintf(size, sizeof(size), "%.1fM", params / 1e6);
    }
    char line[256];
    std::snprintf(line, sizeof(line),
                  "  %-15s %2d layers, embd %4d, heads %2d/%2d kv, ff %5d, vocab %6d, ctx %4d, "
                  "rope %6g: %s params; %s\n",
                  std::string(sh.name).c_str(), s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.n_ff,
                  s.n_vocab, s.n_ctx, s.rope_freq_base, size, std::string(sh.description).c_str());
    out += line;
  }
  return out;
}

absl::Status ValidateSynthSpec(const SynthModelSpec& s) {
  // The limits of ModelConfig::FromGguf, so that whatever is written also loads.
  PD_RETURN_IF_ERROR(CheckRange("layers", s.n_layer, 1, 1024));
  PD_RETURN_IF_ERROR(CheckRange("embd", s.n_embd, 1, 1 << 16));
  PD_RETURN_IF_ERROR(CheckRange("heads", s.n_head, 1, 1024));
  PD_RETURN_IF_ERROR(CheckRange("kv-heads", s.n_head_kv, 1, 1024));
  PD_RETURN_IF_ERROR(CheckRange("ff", s.n_ff, 1, 1 << 20));
  PD_RETURN_IF_ERROR(CheckRange("vocab", s.n_vocab, kMinVocab, 1 << 24));
  PD_RETURN_IF_ERROR(CheckRange("ctx", s.n_ctx, 1, 1 << 24));
  PD_RETURN_IF_ERROR(CheckRange("head-dim", s.head_dim, 0, 1024));
  if (s.n_head % s.n_head_kv != 0) {
    return absl::InvalidArgumentError(
        pd::StrCat("heads = ", s.n_head, " is not a multiple of kv-heads = ", s.n_head_kv));
  }
  if (s.head_dim == 0 && s.n_embd % s.n_head != 0) {
    return absl::InvalidArgumentError(pd::StrCat("embd = ", s.n_embd,
                                                 " is not a multiple of heads = ", s.n_head,
                                                 " (give --head-dim for heads of another size)"));
  }
  const int hd = HeadDim(s);
  if (hd % 2 != 0) {
    return absl::InvalidArgumentError(
        pd::StrCat("the head dimension ", hd, " is odd (rotary embeddings rotate pairs)"));
  }
  if (!(s.rope_freq_base > 1.f) || !std::isfinite(s.rope_freq_base)) {
    return absl::InvalidArgumentError(pd::StrCat("rope base ", s.rope_freq_base, " must be > 1"));
  }
  if (!(s.rms_eps > 0.f && s.rms_eps < 1.f)) {
    return absl::InvalidArgumentError(pd::StrCat("rms eps ", s.rms_eps, " is not in (0, 1)"));
  }
  const int64_t q = int64_t{s.n_head} * hd;
  PD_RETURN_IF_ERROR(
      CheckRows(s.type, "type", {{"embd", s.n_embd}, {"heads * head-dim", q}, {"ff", s.n_ff}}));
  if (s.output_type && !s.tied_output) {
    PD_RETURN_IF_ERROR(CheckRows(*s.output_type, "output type", {{"embd", s.n_embd}}));
  }
  return absl::OkStatus();
}

std::vector<std::string> SynthVocabulary(int n_vocab) {
  PD_CHECK(n_vocab >= kMinVocab);
  std::vector<std::string> v;
  v.reserve(n_vocab);
  v.insert(v.end(), {"<unk>", "<s>", "</s>"});
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) v.push_back({'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'});
  const size_t n = static_cast<size_t>(n_vocab);
  auto add = [&](std::string s) {
    if (v.size() < n) v.push_back(std::move(s));
  };
  add(kSpace);
  for (char c = 0x21; c < 0x7F; ++c) add(std::string(1, c));
  // Level k: "▁" + (k-1 letters), then k letters. Letter strings are counted in base 26.
  for (int k = 2; v.size() < n; ++k) {
    for (int with_space = 1; with_space >= 0 && v.size() < n; --with_space) {
      const int len = with_space ? k - 1 : k;
      std::string s(len, 'a');
      for (;;) {
        add(with_space ? kSpace + s : s);
        if (v.size() >= n) break;
        int i = len - 1;  // increment, last letter fastest
        while (i >= 0 && s[i] == 'z') s[i--] = 'a';
        if (i < 0) break;
        ++s[i];
      }
    }
  }
  return v;
}

absl::StatusOr<SynthPlan> PlanSynthModel(const SynthModelSpec& spec) {
  PD_RETURN_IF_ERROR(ValidateSynthSpec(spec));
  SynthPlan plan;
  plan.tensors = Tensors(spec);
  for (const SynthTensor& t : plan.tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    plan.n_params += n;
  }
  GgufWriter w;
  Layout(spec, plan.tensors, &w);
  plan.file_bytes = w.FileSize();
  return plan;
}

absl::Status WriteSynthModel(const SynthModelSpec& spec, const std::string& path,
                             Progress& progress) {
  PD_RETURN_IF_ERROR(ValidateSynthSpec(spec));
  const std::vector<SynthTensor> tensors = Tensors(spec);
  GgufWriter w;
  Layout(spec, tensors, &w);
  PD_RETURN_IF_ERROR(CheckOutputFolder(path, w.FileSize()));
  PD_RETURN_IF_ERROR(w.Open(path));

  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) total += w.TensorBytes(i);
  const int threads = spec.threads > 0 ? spec.threads : DefaultThreads();
  progress.Start("synth-model", static_cast<int64_t>((total + (1 << 20) - 1) >> 20), "MiB");
  uint64_t done = 0;
  std::vector<uint8_t> piece;
  std::map<uint64_t, std::vector<uint8_t>> pools;  // by PoolStream(type, stddev)
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const SynthTensor& t = tensors[ti];
    const int64_t cols = t.shape[0];
    const int64_t rows = t.shape.size() > 1 ? t.shape[1] : 1;
    const size_t rb = RowBytes(t.type, cols);
    const std::string detail = pd::StrCat("tensor ", ti + 1, "/", tensors.size(), " ", t.name);
    progress.Update(static_cast<int64_t>(done >> 20), detail);
    const std::vector<uint8_t>* pool = nullptr;
    if (t.pooled) {
      const uint64_t key = PoolStream(t.type, t.stddev);
      auto it = pools.find(key);
      if (it == pools.end()) {
        it = pools.emplace(key, MakePool(spec, t.type, t.stddev, threads)).first;
      }
      pool = &it->second;
    }
    const int64_t piece_rows = std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes / rb));
    for (int64_t r0 = 0; r0 < rows; r0 += piece_rows) {
      const int64_t n = std::min(piece_rows, rows - r0);
      piece.resize(static_cast<size_t>(n) * rb);
      // Rows in grains of >= 64k weights: enough work per task to amortize the hand-out.
      const int64_t grain = std::max<int64_t>(1, 65536 / cols);
      ParallelFor(n, threads, grain, [&](int64_t a, int64_t b) {
        std::vector<float> row(pool ? 0 : static_cast<size_t>(cols));
        for (int64_t r = a; r < b; ++r) {
          uint8_t* out = piece.data() + static_cast<size_t>(r) * rb;
          Rng rng(spec.seed, ti, static_cast<uint64_t>(r0 + r));
          if (pool != nullptr) {
            const size_t bb = Traits(t.type).block_bytes;
            for (int64_t j = 0; j < cols / Traits(t.type).block_size; ++j) {
              std::memcpy(out + j * bb, pool->data() + rng.Below(kPoolBlocks) * bb, bb);
            }
            continue;
          }
          if (t.stddev == 0) {
            std::fill(row.begin(), row.end(), 1.0f);
          } else {
            rng.Normals(row.data(), cols, t.stddev);
          }
          QuantizeRow(t.type, row.data(), out, cols);
        }
      });
      PD_RETURN_IF_ERROR(
          w.WriteTensorPart(ti, static_cast<uint64_t>(r0) * rb, piece.data(), piece.size()));
      done += piece.size();
      progress.Update(static_cast<int64_t>(done >> 20), detail);
    }
  }
  PD_RETURN_IF_ERROR(w.Commit());
  progress.Finish();
  return absl::OkStatus();
}

}  // namespace pd::engine::quantize
