#include "engine/convert/hf_convert.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <numbers>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/safetensors.h"
#include "engine/quant/fp16.h"
#include "engine/quant/quantize/gguf_vocab.h"
#include "engine/quant/quantize/gguf_writer.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

using json = nlohmann::json;
using quantize::GgufWriter;

// llama.cpp's general.file_type for the float files this writes.
constexpr uint32_t kFileTypeF32 = 0, kFileTypeF16 = 1, kFileTypeBf16 = 32;

// What a class does with config.json's `sliding_window`.
enum class Window {
  kIgnored,     // not part of the model (transformers' Llama has no window): not read
  kOptIn,       // Qwen2, Qwen3: only with use_sliding_window, which is refused below the context
  kEveryLayer,  // Mistral: every layer slides (use_sliding_window: false turns it off)
  kPhi3,        // written as llama.cpp's converter writes it (0 when null)
  kGemma,       // Gemma 2 and 3: read with their layer patterns
};

// One supported transformers class: its GGUF architecture and per-layer tensor names.
struct ArchSpec {
  std::string_view hf_class;
  std::string_view arch;
  std::string_view activation;  // config.json hidden_act / hidden_activation the model runs
  bool permute_qk;     // llama.cpp's "llama" rotates adjacent pairs; HF rotates halves
  bool norm_plus_one;  // Gemma: RMSNorm scales by (1 + w)
  Window window;
  // "model.layers.N.<hf>" -> "blk.N.<gguf>".
  std::vector<std::pair<std::string_view, std::string_view>> layer;
};

// The tensor names of a mixture of experts: "<block>.gate.weight" is the router, and
// "<block>.experts.E.<gate|up|down>.weight" expert E's matrices, which the GGUF stacks into
// ffn_{gate,up,down}_exps.
struct MoeNames {
  std::string_view block, gate, up, down;
};

// The expert layout of a class, or nullptr for a dense one.
const MoeNames* MoeNamesOf(std::string_view hf_class) {
  static constexpr MoeNames kQwen3Moe{"mlp", "gate_proj", "up_proj", "down_proj"};
  static constexpr MoeNames kMixtral{"block_sparse_moe", "w1", "w3", "w2"};
  if (hf_class == "Qwen3MoeForCausalLM") return &kQwen3Moe;
  if (hf_class == "MixtralForCausalLM") return &kMixtral;
  return nullptr;
}

const std::vector<ArchSpec>& Archs() {
  static const auto* archs = [] {
    using Names = std::vector<std::pair<std::string_view, std::string_view>>;
    const Names attention = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
    };
    const Names dense_mlp = {
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    // The attention rows and `extra`; with_mlp: the dense MLP's too (experts: MoeNamesOf).
    auto rows = [&](Names extra, bool with_mlp) {
      extra.insert(extra.begin(), attention.begin(), attention.end());
      if (with_mlp) extra.insert(extra.end(), dense_mlp.begin(), dense_mlp.end());
      return extra;
    };
    auto with = [&](Names extra) { return rows(std::move(extra), true); };
    const auto llama_like = with({{"post_attention_layernorm.weight", "ffn_norm.weight"},
                                  {"self_attn.q_proj.bias", "attn_q.bias"},
                                  {"self_attn.k_proj.bias", "attn_k.bias"},
                                  {"self_attn.v_proj.bias", "attn_v.bias"}});
    // Phi-3 stores Q, K and V as one matrix (rows q, k, v) and gate and up as one (gate first),
    // as llama.cpp's attn_qkv and 2 * n_ff-row ffn_up hold them (Weights::Load splits both).
    const std::vector<std::pair<std::string_view, std::string_view>> phi3 = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    return new std::vector<ArchSpec>{
        {"LlamaForCausalLM", "llama", "silu", true, false, Window::kIgnored, llama_like},
        {"MistralForCausalLM", "llama", "silu", true, false, Window::kEveryLayer, llama_like},
        {"Qwen2ForCausalLM", "qwen2", "silu", false, false, Window::kOptIn, llama_like},
        {"Qwen3ForCausalLM", "qwen3", "silu", false, false, Window::kOptIn,
         with({{"post_attention_layernorm.weight", "ffn_norm.weight"},
               {"self_attn.q_norm.weight", "attn_q_norm.weight"},
               {"self_attn.k_norm.weight", "attn_k_norm.weight"}})},
        {"Phi3ForCausalLM", "phi3", "silu", false, false, Window::kPhi3, phi3},
        {"Qwen3MoeForCausalLM", "qwen3moe", "silu", false, false, Window::kOptIn,
         rows({{"self_attn.q_norm.weight", "attn_q_norm.weight"},
               {"self_attn.k_norm.weight", "attn_k_norm.weight"},
               {"post_attention_layernorm.weight", "ffn_norm.weight"}},
              false)},
        {"MixtralForCausalLM", "llama", "silu", true, false, Window::kEveryLayer,
         rows({{"post_attention_layernorm.weight", "ffn_norm.weight"}}, false)},
        {"Gemma2ForCausalLM", "gemma2", "gelu_pytorch_tanh", false, true, Window::kGemma,
         with({{"post_attention_layernorm.weight", "post_attention_norm.weight"},
               {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
               {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"}})},
        {"Gemma3ForCausalLM", "gemma3", "gelu_pytorch_tanh", false, true, Window::kGemma,
         with({{"self_attn.q_norm.weight", "attn_q_norm.weight"},
               {"self_attn.k_norm.weight", "attn_k_norm.weight"},
               {"post_attention_layernorm.weight", "post_attention_norm.weight"},
               {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
               {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"}})},
    };
  }();
  return *archs;
}

std::string SupportedClasses() {
  std::string s;
  for (const ArchSpec& a : Archs()) s += (s.empty() ? "" : ", ") + std::string(a.hf_class);
  return s;
}

absl::StatusOr<json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("cannot open '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(StrCat(path, ": not valid JSON"));
  if (!j.is_object()) return absl::InvalidArgumentError(StrCat(path, ": not a JSON object"));
  return j;
}

// Typed reads of config.json; null counts as absent, as transformers treats it.
class Config {
 public:
  Config(json j, std::string file) : j_(std::move(j)), file_(std::move(file)) {}

  bool Has(std::string_view key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  const json* Get(std::string_view key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  absl::StatusOr<int64_t> Int(std::string_view key, int64_t lo, int64_t hi) const {
    const json* v = Get(key);
    if (v == nullptr) return Bad(key, "is missing");
    if (!v->is_number_integer()) return Bad(key, "is not an integer");
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return Bad(key, StrCat("= ", x, " is outside [", lo, ", ", hi, "]"));
    return x;
  }
  absl::StatusOr<int64_t> IntOr(std::string_view key, int64_t def, int64_t lo, int64_t hi) const {
    return Has(key) ? Int(key, lo, hi) : def;
  }
  absl::StatusOr<double> Float(std::string_view key) const {
    const json* v = Get(key);
    if (v == nullptr) return Bad(key, "is missing");
    if (!v->is_number()) return Bad(key, "is not a number");
    const double x = v->get<double>();
    if (!std::isfinite(x)) return Bad(key, "is not finite");
    return x;
  }
  absl::StatusOr<double> FloatOr(std::string_view key, double def) const {
    return Has(key) ? Float(key) : def;
  }
  absl::StatusOr<std::string> String(std::string_view key) const {
    const json* v = Get(key);
    if (v == nullptr) return Bad(key, "is missing");
    if (!v->is_string()) return Bad(key, "is not a string");
    return v->get<std::string>();
  }
  absl::StatusOr<bool> BoolOr(std::string_view key, bool def) const {
    const json* v = Get(key);
    if (v == nullptr) return def;
    if (!v->is_boolean()) return Bad(key, "is not true or false");
    return v->get<bool>();
  }
  absl::Status Bad(std::string_view key, std::string_view what) const {
    return absl::InvalidArgumentError(StrCat(file_, ": \"", key, "\" ", what));
  }
  absl::Status Unsupported(std::string_view what) const {
    return absl::UnimplementedError(StrCat(file_, ": ", what));
  }
  const std::string& file() const { return file_; }

 private:
  json j_;
  std::string file_;
};

// A tensor of the output: from the checkpoint (with a transform) or computed here.
struct OutTensor {
  std::string name;
  DType type = DType::kF32;
  std::vector<int64_t> shape;  // ggml order
  const SafetensorsTensor* src = nullptr;
  // Stacked experts (src == nullptr): expert e's matrix is the e-th block of rows.
  std::vector<const SafetensorsTensor*> experts;
  int permute_heads = 0;  // > 0: reorder rows from rotate-half to adjacent-pair layout
  bool plus_one = false;
  std::vector<float> values;  // src == nullptr and no experts: the data, F32
};

// Llama 3's rope frequency factors (rope_scaling.rope_type "llama3"): wavelengths shorter than
// the original context / high_freq_factor keep their frequency, those longer than the original
// context / low_freq_factor are divided by `factor`, and the ones between blend smoothly.
// llama.cpp applies them as theta_i / factor_i, which is what rope_freqs.weight holds.
absl::StatusOr<std::vector<float>> Llama3RopeFactors(const Config& cfg, const json& rs,
                                                     int head_dim, double base) {
  auto num = [&](const char* k, double def) -> absl::StatusOr<double> {
    auto it = rs.find(k);
    if (it == rs.end() || it->is_null()) {
      if (def > 0) return def;
      return cfg.Bad(StrCat("rope_scaling.", k), "is missing");
    }
    if (!it->is_number() || !(it->get<double>() > 0)) {
      return cfg.Bad(StrCat("rope_scaling.", k), "is not a positive number");
    }
    return it->get<double>();
  };
  PD_ASSIGN_OR_RETURN(double factor, num("factor", 0));
  PD_ASSIGN_OR_RETURN(double low, num("low_freq_factor", 1.0));
  PD_ASSIGN_OR_RETURN(double high, num("high_freq_factor", 4.0));
  PD_ASSIGN_OR_RETURN(double old_ctx, num("original_max_position_embeddings", 8192));
  if (!(high > low)) {
    return cfg.Bad("rope_scaling.high_freq_factor", "must exceed low_freq_factor");
  }
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  std::vector<float> f;
  for (int i = 0; i < head_dim; i += 2) {
    const double freq = 1.0 / std::pow(base, static_cast<double>(i) / head_dim);
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      f.push_back(static_cast<float>(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return f;
}

struct Plan {
  std::unique_ptr<SafetensorsCheckpoint> ckpt;
  std::vector<OutTensor> tensors;
};

float LoadElement(const SafetensorsTensor& t, size_t i) {
  switch (*t.type) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, t.data + 4 * i, 4);
      return v;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return F16ToF32(h);
    }
    default: {  // BF16
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return Bf16ToF32(h);
    }
  }
}

void StoreElement(DType type, float v, uint8_t* out, size_t i) {
  if (type == DType::kF32) {
    std::memcpy(out + 4 * i, &v, 4);
  } else {
    const uint16_t h = type == DType::kF16 ? F32ToF16(v) : F32ToBf16(v);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

// Sets every metadata key and adds every tensor to `w`; the data is written by WriteData.
absl::StatusOr<Plan> MakePlan(const std::string& dir, const HfConvertOptions& o, GgufWriter* w) {
  PD_ASSIGN_OR_RETURN(json cj, ReadJson(dir + "/config.json"));
  const Config cfg(std::move(cj), dir + "/config.json");
  const json* classes = cfg.Get("architectures");
  if (classes == nullptr || !classes->is_array() || classes->size() != 1 ||
      !(*classes)[0].is_string()) {
    return cfg.Bad("architectures", "must be a list of one class name");
  }
  const std::string cls = (*classes)[0].get<std::string>();
  const ArchSpec* spec = nullptr;
  for (const ArchSpec& a : Archs()) {
    if (a.hf_class == cls) spec = &a;
  }
  if (spec == nullptr) {
    return cfg.Unsupported(StrCat("architecture ", cls, " is not supported (supported: ",
                                  SupportedClasses(), ")"));
  }
  const std::string arch(spec->arch);
  const std::string p = arch + ".";

  // ---- hyperparameters ----
  PD_ASSIGN_OR_RETURN(int64_t n_embd, cfg.Int("hidden_size", 1, 1 << 16));
  PD_ASSIGN_OR_RETURN(int64_t n_ff, cfg.Int("intermediate_size", 1, 1 << 20));
  PD_ASSIGN_OR_RETURN(int64_t n_layer, cfg.Int("num_hidden_layers", 1, 1024));
  PD_ASSIGN_OR_RETURN(int64_t n_head, cfg.Int("num_attention_heads", 1, 1024));
  PD_ASSIGN_OR_RETURN(int64_t n_head_kv, cfg.IntOr("num_key_value_heads", n_head, 1, 1024));
  PD_ASSIGN_OR_RETURN(int64_t n_ctx, cfg.IntOr("max_position_embeddings", 4096, 1, 1 << 24));
  if (n_head % n_head_kv != 0) {
    return cfg.Bad("num_key_value_heads", StrCat("= ", n_head_kv, " does not divide ",
                                                 "num_attention_heads = ", n_head));
  }
  const bool explicit_head_dim = cfg.Has("head_dim");
  if (!explicit_head_dim && n_embd % n_head != 0) {
    return cfg.Bad("hidden_size", "is not a multiple of num_attention_heads (and no head_dim)");
  }
  PD_ASSIGN_OR_RETURN(int64_t head_dim, cfg.IntOr("head_dim", n_embd / n_head, 2, 1024));
  if (head_dim % 2 != 0) return cfg.Bad("head_dim", "is odd");
  PD_ASSIGN_OR_RETURN(double eps, cfg.FloatOr("rms_norm_eps", 1e-6));
  PD_ASSIGN_OR_RETURN(double rope_base, cfg.FloatOr("rope_theta", 10000.0));
  const std::string act_key = cfg.Has("hidden_activation") ? "hidden_activation" : "hidden_act";
  if (cfg.Has(act_key)) {
    PD_ASSIGN_OR_RETURN(std::string act, cfg.String(act_key));
    if (act != spec->activation) {
      return cfg.Unsupported(StrCat(act_key, " '", act, "' is not supported for ", cls,
                                    " (supported: ", spec->activation, ")"));
    }
  }
  PD_ASSIGN_OR_RETURN(bool mlp_bias, cfg.BoolOr("mlp_bias", false));
  if (mlp_bias) return cfg.Unsupported("mlp_bias: true is not supported");
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  PD_ASSIGN_OR_RETURN(bool tied, cfg.BoolOr("tie_word_embeddings", gemma));
  if (const json* pr = cfg.Get("partial_rotary_factor"); pr != nullptr && *pr != 1.0) {
    return cfg.Unsupported("partial_rotary_factor other than 1 is not supported");
  }
  // Sliding windows (Gemma's below, with their layer patterns). Mistral's slides on every layer;
  // Qwen2's and Qwen3's (use_sliding_window, on the layers from max_window_layers on) do not run
  // yet and are refused when they would bite.
  int64_t window = 0;  // written as {arch}.attention.sliding_window when > 0 (and for Phi-3)
  if (spec->window == Window::kOptIn && cfg.Has("sliding_window")) {
    PD_ASSIGN_OR_RETURN(bool use_swa, cfg.BoolOr("use_sliding_window", false));
    PD_ASSIGN_OR_RETURN(int64_t w_cfg, cfg.Int("sliding_window", 1, int64_t{1} << 40));
    if (use_swa && w_cfg < n_ctx) {
      return cfg.Unsupported(StrCat("sliding_window = ", w_cfg, " below max_position_embeddings = ",
                                    n_ctx, ": sliding-window attention is not supported for ",
                                    cls, " yet"));
    }
  }
  if (spec->window == Window::kEveryLayer && cfg.Has("sliding_window")) {
    PD_ASSIGN_OR_RETURN(bool use_swa, cfg.BoolOr("use_sliding_window", true));
    PD_ASSIGN_OR_RETURN(int64_t w_cfg, cfg.Int("sliding_window", 1, int64_t{1} << 24));
    // A window as long as the context changes nothing: written only when it can bite.
    if (use_swa && w_cfg < n_ctx) window = w_cfg;
  }
  if (spec->window == Window::kPhi3) {
    // llama.cpp writes Phi-3's window as given, 0 when null (Phi-4); Hugging Face's Phi3 masks
    // every layer with it, and so does pdserve (llama.cpp 0.3.36 ignores it: docs/models.md).
    PD_ASSIGN_OR_RETURN(window, cfg.IntOr("sliding_window", 0, 0, 1 << 24));
  }

  w->SetString("general.architecture", arch);
  std::string name = dir;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  name = name.substr(name.find_last_of('/') + 1);  // npos + 1 == 0
  if (name.empty() || name == "/" || name == ".") name = "model";
  w->SetString("general.name", name);
  w->SetU32(p + "context_length", static_cast<uint32_t>(n_ctx));
  w->SetU32(p + "embedding_length", static_cast<uint32_t>(n_embd));
  w->SetU32(p + "block_count", static_cast<uint32_t>(n_layer));
  w->SetU32(p + "feed_forward_length", static_cast<uint32_t>(n_ff));
  w->SetU32(p + "attention.head_count", static_cast<uint32_t>(n_head));
  w->SetU32(p + "attention.head_count_kv", static_cast<uint32_t>(n_head_kv));
  w->SetF32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(eps));
  w->SetF32(p + "rope.freq_base", static_cast<float>(rope_base));
  w->SetU32(p + "rope.dimension_count", static_cast<uint32_t>(head_dim));
  if (explicit_head_dim || gemma) {
    w->SetU32(p + "attention.key_length", static_cast<uint32_t>(head_dim));
    w->SetU32(p + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  const MoeNames* const moe_names = MoeNamesOf(spec->hf_class);
  const bool moe = moe_names != nullptr;
  int64_t n_expert = 0;
  if (moe) {
    // Qwen3-MoE: num_experts of moe_intermediate_size rows; Mixtral: num_local_experts of
    // intermediate_size. Both route with softmax, top num_experts_per_tok, weights renormalized
    // (Qwen3-MoE: norm_topk_prob, which llama.cpp's qwen3moe graph assumes).
    const bool qwen = arch == "qwen3moe";
    PD_ASSIGN_OR_RETURN(n_expert, cfg.Int(qwen ? "num_experts" : "num_local_experts", 1, 4096));
    PD_ASSIGN_OR_RETURN(int64_t used, cfg.Int("num_experts_per_tok", 1, n_expert));
    w->SetU32(p + "expert_count", static_cast<uint32_t>(n_expert));
    w->SetU32(p + "expert_used_count", static_cast<uint32_t>(used));
    if (qwen) {
      PD_ASSIGN_OR_RETURN(int64_t moe_ff, cfg.Int("moe_intermediate_size", 1, 1 << 20));
      w->SetU32(p + "expert_feed_forward_length", static_cast<uint32_t>(moe_ff));
      PD_ASSIGN_OR_RETURN(bool norm_topk, cfg.BoolOr("norm_topk_prob", false));
      if (!norm_topk) {
        return cfg.Unsupported(
            "norm_topk_prob: false (expert weights not renormalized) is not supported; "
            "llama.cpp's qwen3moe and pdserve renormalize them");
      }
      PD_ASSIGN_OR_RETURN(int64_t step, cfg.IntOr("decoder_sparse_step", 1, 0, 1024));
      const json* dense = cfg.Get("mlp_only_layers");
      if (step != 1 || (dense != nullptr && !(dense->is_array() && dense->empty()))) {
        return cfg.Unsupported(
            "dense layers among the expert layers (decoder_sparse_step other than 1, or "
            "mlp_only_layers) are not supported");
      }
    }
  }
  if (window > 0 || spec->window == Window::kPhi3) {
    w->SetU32(p + "attention.sliding_window", static_cast<uint32_t>(window));
  }
  if (arch == "phi3" && cfg.Has("original_max_position_embeddings")) {
    PD_ASSIGN_OR_RETURN(int64_t orig, cfg.Int("original_max_position_embeddings", 1, 1 << 24));
    w->SetU32(p + "rope.scaling.original_context_length", static_cast<uint32_t>(orig));
  }

  std::vector<float> rope_factors;
  if (const json* rs = cfg.Get("rope_scaling")) {
    if (!rs->is_object()) return cfg.Bad("rope_scaling", "is not an object");
    std::string type;
    for (const char* k : {"rope_type", "type"}) {
      auto it = rs->find(k);
      if (it != rs->end() && it->is_string()) type = it->get<std::string>();
    }
    if (arch == "phi3" && type != "default") {
      // LongRoPE ("longrope", "su": Phi-3 128k, Phi-3.5) needs per-context factor sets and an
      // attention factor the engine does not run; nothing else is Phi-3's.
      return cfg.Unsupported(StrCat("rope_scaling type '", type, "' is not supported for ", cls,
                                    " (LongRoPE does not run yet; only no rope_scaling does)"));
    }
    if (type == "linear") {
      auto it = rs->find("factor");
      if (it == rs->end() || !it->is_number() || !(it->get<double>() > 0)) {
        return cfg.Bad("rope_scaling.factor", "is not a positive number");
      }
      w->SetString(p + "rope.scaling.type", "linear");
      w->SetF32(p + "rope.scaling.factor", static_cast<float>(it->get<double>()));
    } else if (type == "llama3" && arch == "llama") {
      PD_ASSIGN_OR_RETURN(rope_factors,
                          Llama3RopeFactors(cfg, *rs, static_cast<int>(head_dim), rope_base));
    } else if (type != "default") {
      return cfg.Unsupported(StrCat("rope_scaling type '", type, "' is not supported for ", cls,
                                    " (supported: linear", arch == "llama" ? ", llama3" : "",
                                    ")"));
    }
  }

  if (arch == "gemma3") {
    PD_ASSIGN_OR_RETURN(int64_t gemma_window, cfg.Int("sliding_window", 1, 1 << 24));
    w->SetU32(p + "attention.sliding_window", static_cast<uint32_t>(gemma_window));
    PD_ASSIGN_OR_RETURN(int64_t pattern, cfg.IntOr("sliding_window_pattern", 6, 1, 1024));
    if (const json* lt = cfg.Get("layer_types")) {
      // Newer configs list each layer; pdserve runs Gemma 3's five local, one global.
      if (!lt->is_array() || static_cast<int64_t>(lt->size()) != n_layer) {
        return cfg.Bad("layer_types", "is not a list of num_hidden_layers strings");
      }
      for (int64_t i = 0; i < n_layer; ++i) {
        const bool global = (i + 1) % 6 == 0;
        if ((*lt)[i] != (global ? "full_attention" : "sliding_attention")) {
          return cfg.Unsupported("layer_types other than five sliding, one full is not supported");
        }
      }
    } else if (pattern != 6) {
      return cfg.Unsupported(StrCat("sliding_window_pattern ", pattern,
                                    " is not supported (Gemma 3's is 6)"));
    }
    PD_ASSIGN_OR_RETURN(double local_base, cfg.FloatOr("rope_local_base_freq", 10000.0));
    if (local_base != 10000.0) {
      return cfg.Unsupported("rope_local_base_freq other than 10000 is not supported");
    }
    PD_ASSIGN_OR_RETURN(double qscale, cfg.FloatOr("query_pre_attn_scalar",
                                                   static_cast<double>(head_dim)));
    const bool scale_ok = qscale == static_cast<double>(head_dim) ||
                          (n_layer == 62 && qscale == static_cast<double>(n_embd / n_head));
    if (!scale_ok) {
      return cfg.Unsupported(StrCat("query_pre_attn_scalar ", qscale,
                                    " is not supported (the head dimension ", head_dim,
                                    " is, as in every released Gemma 3 but 27B)"));
    }
    for (const char* k : {"final_logit_softcapping", "attn_logit_softcapping"}) {
      if (cfg.Has(k)) return cfg.Unsupported(StrCat(k, " is not supported for Gemma 3"));
    }
  }

  if (arch == "gemma2") {
    PD_ASSIGN_OR_RETURN(int64_t gemma_window, cfg.IntOr("sliding_window", 4096, 1, 1 << 24));
    w->SetU32(p + "attention.sliding_window", static_cast<uint32_t>(gemma_window));
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping"}) {
      if (!cfg.Has(k)) {
        return cfg.Unsupported(StrCat(k, ": null (no soft-capping) is not supported for Gemma 2"));
      }
      PD_ASSIGN_OR_RETURN(double cap, cfg.Float(k));
      if (!(cap > 0)) return cfg.Bad(k, "must be > 0");
      w->SetF32(p + k, static_cast<float>(cap));
    }
    PD_ASSIGN_OR_RETURN(double qscale, cfg.FloatOr("query_pre_attn_scalar",
                                                   static_cast<double>(head_dim)));
    if (qscale != static_cast<double>(head_dim) &&
        !(n_layer == 46 && qscale == static_cast<double>(n_embd / n_head))) {
      return cfg.Unsupported(StrCat("query_pre_attn_scalar ", qscale,
                                    " is not supported (the head dimension ", head_dim,
                                    " is, as in every released Gemma 2 but 27B)"));
    }
  }

  // ---- tokenizer ----
  PD_ASSIGN_OR_RETURN(GgufVocab vocab, ReadHfTokenizer(dir));

  // ---- tensors ----
  Plan plan;
  PD_ASSIGN_OR_RETURN(plan.ckpt, SafetensorsCheckpoint::Open(dir));
  std::map<std::string_view, std::string_view> layer_map(spec->layer.begin(), spec->layer.end());
  std::vector<std::set<std::string>> per_layer(n_layer);
  std::vector<std::string> unknown;
  std::map<std::string, std::vector<const SafetensorsTensor*>> experts;  // by GGUF name
  int64_t vocab_rows = -1;
  for (const SafetensorsTensor* t : plan.ckpt->tensors()) {
    const std::string& hf = t->name;
    std::string out;
    if (hf == "model.embed_tokens.weight") {
      out = "token_embd.weight";
      if (t->shape.size() == 2) vocab_rows = t->shape[0];
    } else if (hf == "model.norm.weight") {
      out = "output_norm.weight";
    } else if (hf == "lm_head.weight") {
      if (tied) continue;  // the embedding is the head
      out = "output.weight";
    } else if (hf.starts_with("model.layers.")) {
      const std::string_view rest = std::string_view(hf).substr(13);
      const size_t dot = rest.find('.');
      int64_t layer = -1;
      if (dot != std::string_view::npos && dot > 0 && dot < 5) {
        layer = 0;
        for (char c : rest.substr(0, dot)) {
          layer = c >= '0' && c <= '9' ? layer * 10 + (c - '0') : -1 - n_layer;
        }
      }
      const std::string_view suffix = dot == std::string_view::npos ? "" : rest.substr(dot + 1);
      if (suffix == "self_attn.rotary_emb.inv_freq") continue;  // recomputed from rope_theta
      if (moe && layer >= 0 && layer < n_layer && suffix.starts_with(moe_names->block) &&
          suffix.size() > moe_names->block.size() && suffix[moe_names->block.size()] == '.') {
        const std::string_view m = suffix.substr(moe_names->block.size() + 1);
        if (m == "gate.weight") {
          // The router: F32 whatever the checkpoint stores, as llama.cpp's converter writes it.
          if (!t->type.has_value() || t->shape.size() != 2 || t->shape[0] != n_expert) {
            return absl::InvalidArgumentError(StrCat("tensor ", hf, " must be a 2-D float matrix "
                                                     "of ", n_expert, " rows (one per expert)"));
          }
          OutTensor ot;
          ot.name = StrCat("blk.", layer, ".ffn_gate_inp.weight");
          ot.src = t;
          ot.shape.assign(t->shape.rbegin(), t->shape.rend());
          per_layer[layer].insert("ffn_gate_inp.weight");
          plan.tensors.push_back(std::move(ot));
          continue;
        }
        // experts.E.<name>.weight
        int64_t e = -1;
        std::string_view kind;
        if (m.starts_with("experts.")) {
          const std::string_view r = m.substr(8);
          const size_t d = r.find('.');
          if (d != std::string_view::npos && d > 0 && d < 5) {
            e = 0;
            for (char c : r.substr(0, d)) e = c >= '0' && c <= '9' ? e * 10 + (c - '0') : -4096;
            kind = r.substr(d + 1);
          }
        }
        const char* which = kind == StrCat(moe_names->gate, ".weight")   ? "ffn_gate_exps"
                            : kind == StrCat(moe_names->up, ".weight")   ? "ffn_up_exps"
                            : kind == StrCat(moe_names->down, ".weight") ? "ffn_down_exps"
                                                                         : nullptr;
        if (e < 0 || e >= n_expert || which == nullptr) {
          unknown.push_back(hf);
          continue;
        }
        std::vector<const SafetensorsTensor*>& slots =
            experts[StrCat("blk.", layer, ".", which, ".weight")];
        slots.resize(static_cast<size_t>(n_expert), nullptr);
        slots[static_cast<size_t>(e)] = t;
        per_layer[layer].insert(StrCat(which, ".weight"));
        continue;
      }
      auto it = layer_map.find(suffix);
      if (layer < 0 || layer >= n_layer || it == layer_map.end()) {
        unknown.push_back(hf);
        continue;
      }
      per_layer[layer].insert(std::string(it->second));
      out = StrCat("blk.", layer, ".", it->second);
    } else {
      unknown.push_back(hf);
      continue;
    }
    if (!t->type.has_value()) {
      return absl::UnimplementedError(StrCat("tensor ", hf, " (", t->file, ") has dtype ",
                                             t->dtype, ": only F32, F16 and BF16 are supported"));
    }
    if (t->shape.empty() || t->shape.size() > 2) {
      return absl::InvalidArgumentError(StrCat("tensor ", hf, " (", t->file, ") has ",
                                               t->shape.size(), " dimensions: expected 1 or 2"));
    }
    OutTensor ot;
    ot.name = out;
    ot.src = t;
    ot.shape.assign(t->shape.rbegin(), t->shape.rend());
    const bool is_matrix = t->shape.size() == 2;
    ot.type = is_matrix ? o.float_type.value_or(*t->type) : DType::kF32;
    ot.plus_one = spec->norm_plus_one && hf.ends_with("norm.weight");
    if (spec->permute_qk && (out.ends_with("attn_q.weight") || out.ends_with("attn_q.bias") ||
                             out.ends_with("attn_k.weight") || out.ends_with("attn_k.bias"))) {
      const bool q = out.find("attn_q.") != std::string::npos;
      ot.permute_heads = static_cast<int>(q ? n_head : n_head_kv);
      if (t->shape[0] != ot.permute_heads * head_dim) {
        return absl::InvalidArgumentError(
            StrCat("tensor ", hf, " has ", t->shape[0], " rows: expected ", ot.permute_heads,
                   " heads of ", head_dim));
      }
    }
    plan.tensors.push_back(std::move(ot));
  }
  // Each stacked tensor: every expert present, all of one 2-D shape and dtype.
  for (auto& [name, slots] : experts) {
    const SafetensorsTensor* first = slots[0];
    for (size_t e = 0; e < slots.size(); ++e) {
      const SafetensorsTensor* t = slots[e];
      if (t == nullptr) {
        return absl::InvalidArgumentError(StrCat(name, ": expert ", e, " of ", slots.size(),
                                                 " is missing from the checkpoint"));
      }
      if (!t->type.has_value()) {
        return absl::UnimplementedError(StrCat("tensor ", t->name, " (", t->file, ") has dtype ",
                                               t->dtype, ": only F32, F16 and BF16 are "
                                               "supported"));
      }
      if (t->shape.size() != 2 || t->shape != first->shape || t->type != first->type) {
        return absl::InvalidArgumentError(StrCat("tensor ", t->name, " differs in shape or "
                                                 "dtype from expert 0's (", first->name, ")"));
      }
    }
    OutTensor ot;
    ot.name = name;
    ot.experts = slots;
    ot.shape = {first->shape[1], first->shape[0], static_cast<int64_t>(slots.size())};
    ot.type = o.float_type.value_or(*first->type);
    plan.tensors.push_back(std::move(ot));
  }
  if (!unknown.empty()) {
    std::string list;
    for (size_t i = 0; i < unknown.size() && i < 5; ++i) list += (i ? ", " : "") + unknown[i];
    if (unknown.size() > 5) list += StrCat(" and ", unknown.size() - 5, " more");
    return absl::UnimplementedError(StrCat(unknown.size(), " tensor(s) of the checkpoint are not ",
                                           "part of a ", cls, " this converter knows: ", list));
  }
  if (vocab_rows < 0) {
    return absl::InvalidArgumentError("model.embed_tokens.weight is missing or not 2-D");
  }
  for (int64_t i = 0; i < n_layer; ++i) {
    for (const std::string& want : per_layer[0]) {
      if (!per_layer[i].count(want)) {
        return absl::InvalidArgumentError(
            StrCat("model.layers.", i, ": its ", want, " (GGUF name) is missing"));
      }
    }
    if (per_layer[i].size() != per_layer[0].size()) {
      return absl::InvalidArgumentError(
          StrCat("model.layers.", i, " has tensors that layer 0 lacks"));
    }
  }
  if (!tied && plan.ckpt->Find("lm_head.weight") == nullptr) {
    return absl::InvalidArgumentError(
        "lm_head.weight is missing and tie_word_embeddings is false");
  }
  if (!rope_factors.empty()) {
    OutTensor rf;
    rf.name = "rope_freqs.weight";
    rf.shape = {static_cast<int64_t>(rope_factors.size())};
    rf.values = std::move(rope_factors);
    plan.tensors.push_back(std::move(rf));
  }

  // The embedding may have more rows than the tokenizer has tokens (padded for speed): those
  // rows become unused tokens, as llama.cpp's converter writes them.
  if (static_cast<int64_t>(vocab.tokens.size()) > vocab_rows) {
    return absl::InvalidArgumentError(StrCat("the tokenizer has ", vocab.tokens.size(),
                                             " tokens but model.embed_tokens.weight only ",
                                             vocab_rows, " rows"));
  }
  while (static_cast<int64_t>(vocab.tokens.size()) < vocab_rows) {
    vocab.tokens.push_back(StrCat("[PAD", vocab.tokens.size(), "]"));
    if (!vocab.scores.empty()) vocab.scores.push_back(-1000.0f);
    if (!vocab.token_types.empty()) vocab.token_types.push_back(5);  // unused
  }
  quantize::SetVocabKeys(vocab, w);

  // general.file_type: the matrices' type (the embedding's when stored types differ).
  DType ft = DType::kF32;
  for (const OutTensor& t : plan.tensors) {
    if (t.name == "token_embd.weight") ft = t.type;
  }
  w->SetU32("general.file_type", ft == DType::kF16    ? kFileTypeF16
                                 : ft == DType::kBF16 ? kFileTypeBf16
                                                      : kFileTypeF32);
  for (const OutTensor& t : plan.tensors) w->AddTensor(t.name, t.type, t.shape);
  return plan;
}

absl::Status WriteSource(const OutTensor& t, const SafetensorsTensor& s, size_t i,
                         uint64_t base, GgufWriter* w, std::vector<uint8_t>& buf);

// Writes each tensor's data: copied when the stored type is the output's, else converted.
absl::Status WriteData(const Plan& plan, const HfConvertOptions& o, GgufWriter* w) {
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const OutTensor& t = plan.tensors[i];
    if (o.progress) o.progress(t.name, i + 1, plan.tensors.size());
    if (t.src == nullptr && t.experts.empty()) {
      PD_RETURN_IF_ERROR(w->WriteTensor(i, t.values.data(), t.values.size() * sizeof(float)));
      continue;
    }
    // One source, or the experts' matrices one after the other.
    const std::vector<const SafetensorsTensor*> sources =
        t.src != nullptr ? std::vector<const SafetensorsTensor*>{t.src} : t.experts;
    uint64_t base = 0;
    for (const SafetensorsTensor* src : sources) {
      PD_RETURN_IF_ERROR(WriteSource(t, *src, i, base, w, buf));
      base += static_cast<uint64_t>(src->nbytes / Traits(*src->type).block_bytes) *
              Traits(t.type).block_bytes;
    }
  }
  return absl::OkStatus();
}

absl::Status WriteSource(const OutTensor& t, const SafetensorsTensor& s, size_t i,
                         uint64_t base, GgufWriter* w, std::vector<uint8_t>& buf) {
  {
    if (t.type == *s.type && t.permute_heads == 0 && !t.plus_one) {
      return w->WriteTensorPart(i, base, s.data, s.nbytes);
    }
    const int64_t cols = s.shape.size() == 2 ? s.shape[1] : s.shape[0];
    const int64_t rows = s.shape.size() == 2 ? s.shape[0] : 1;
    const size_t esize = Traits(t.type).block_bytes;  // F32/F16/BF16: one element per block
    // Rows in pieces of about 16 MiB, converted and written as they go.
    const int64_t chunk = std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(1, cols * 4));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t nr = std::min(chunk, rows - r0);
      buf.resize(static_cast<size_t>(nr * cols) * esize);
      for (int64_t r = r0; r < r0 + nr; ++r) {
        int64_t src_row = r;
        if (t.permute_heads > 0) {
          // Output row h*d + 2i + j holds input row h*d + j*d/2 + i.
          const int64_t d = rows / t.permute_heads;
          const int64_t h = r / d, k = r % d;
          src_row = h * d + (k % 2) * (d / 2) + k / 2;
        }
        for (int64_t c = 0; c < cols; ++c) {
          float v = LoadElement(s, static_cast<size_t>(src_row * cols + c));
          if (t.plus_one) v += 1.0f;
          StoreElement(t.type, v, buf.data(), static_cast<size_t>((r - r0) * cols + c));
        }
      }
      PD_RETURN_IF_ERROR(w->WriteTensorPart(i, base + static_cast<uint64_t>(r0 * cols) * esize,
                                            buf.data(), buf.size()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFloatType(const HfConvertOptions& o) {
  if (o.float_type && *o.float_type != DType::kF32 && *o.float_type != DType::kF16 &&
      *o.float_type != DType::kBF16) {
    return absl::InvalidArgumentError("the converted weights' type must be F32, F16 or BF16");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsHfCheckpoint(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
         ::stat((path + "/config.json").c_str(), &st) == 0;
}

absl::Status ConvertHfCheckpoint(const std::string& dir, const std::string& out,
                                 const HfConvertOptions& options) {
  PD_RETURN_IF_ERROR(CheckFloatType(options));
  GgufWriter w;
  PD_ASSIGN_OR_RETURN(Plan plan, MakePlan(dir, options, &w));
  PD_RETURN_IF_ERROR(w.Open(out));
  PD_RETURN_IF_ERROR(WriteData(plan, options, &w));
  return w.Commit();
}

absl::StatusOr<std::unique_ptr<GgufFile>> LoadHfCheckpoint(const std::string& dir,
                                                           const HfConvertOptions& options) {
  PD_RETURN_IF_ERROR(CheckFloatType(options));
  GgufWriter w;
  PD_ASSIGN_OR_RETURN(Plan plan, MakePlan(dir, options, &w));
  PD_RETURN_IF_ERROR(w.OpenMemory(StrCat("pdserve-hf:", dir)));
  PD_RETURN_IF_ERROR(WriteData(plan, options, &w));
  PD_ASSIGN_OR_RETURN(MappedFile map, w.CommitToMemory());
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Parse(std::move(map));
  if (!f.ok()) {
    return absl::InternalError(StrCat("the GGUF converted from ", dir,
                                      " does not parse: ", f.status().message()));
  }
  return f;
}

absl::StatusOr<std::unique_ptr<GgufFile>> OpenModelFile(const std::string& path) {
  if (IsHfCheckpoint(path)) {
    absl::StatusOr<std::unique_ptr<GgufFile>> f = LoadHfCheckpoint(path, {});
    if (!f.ok()) {
      return absl::Status(f.status().code(), StrCat("Hugging Face checkpoint ", path, ": ",
                                                    f.status().message()));
    }
    return f;
  }
  return GgufFile::Open(path);
}

}  // namespace pd::engine
