#include "engine/quant/quantize/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "engine/quant/block_grid.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/matrix_quant.h"
#include "engine/quant/quantize/calibration.h"
#include "engine/quant/quantize/gguf_writer.h"
#include "engine/quant/quantize/policy.h"
#include "engine/quant/quantize/texts.h"
#include "engine/quant/w8a8.h"
#include "engine/runtime/model.h"
#include "engine/tokenizer/tokenizer.h"

namespace pd::engine::quantize {
namespace {

constexpr uint32_t kQuantizationVersion = 2;  // ggml's GGML_QNT_VERSION
constexpr uint64_t kAlignment = 32;

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Weight matrices are quantized (the stacked experts of a mixture too: each expert's rows are
// rows of the stacked tensor); norms, biases, rope factors and other 1-D tensors are copied, and
// so is an expert router (ffn_gate_inp: small, and a rounding there changes which experts run,
// so llama.cpp's quantizer keeps it as well).
bool IsWeightMatrix(const GgufTensorInfo& t) {
  const std::string_view n = t.name;
  constexpr std::string_view kSuffix = ".weight";
  if (t.shape.size() < 2 || n.size() < kSuffix.size()) return false;
  if (n.substr(n.size() - kSuffix.size()) != kSuffix) return false;
  return n.find("norm") == std::string_view::npos &&
         n.find("ffn_gate_inp") == std::string_view::npos;
}

int LayerOf(std::string_view name) {
  static const std::regex kRe(R"(^blk\.(\d+)\..*)");
  std::cmatch m;
  if (!std::regex_match(name.data(), name.data() + name.size(), m, kRe)) return -1;
  return std::stoi(m[1].str());
}

uint32_t DefaultFileType(DType base) {
  switch (base) {
    case DType::kQ2_K:
      return 10;
    case DType::kQ3_K:
      return 12;
    case DType::kQ4_K:
      return 15;
    case DType::kQ5_K:
      return 17;
    case DType::kQ6_K:
      return 18;
    case DType::kQ4_0:
      return 2;
    case DType::kQ8_0:
      return 7;
    case DType::kW8A8:  // pdserve's own types: their type numbers (no llama.cpp file type)
    case DType::kW4A16:
      return static_cast<uint32_t>(base);
    default:
      return 0;
  }
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(pd::StrCat("cannot read calibration text '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::NotFoundError(pd::StrCat("cannot read calibration text '", path, "'"));
  }
  return ss.str();
}

// What happens to one tensor of the input.
struct Plan {
  const GgufTensorInfo* src = nullptr;
  std::string name;            // of the output tensor (src's, except a draft's new head)
  std::vector<int64_t> shape;  // of the output tensor
  // A draft's head: the output holds these rows of src, in this order (else every row).
  const std::vector<int32_t>* select = nullptr;
  // A draft's token_embd: read one row per token, never multiplied, so the head's calibration
  // statistics (filed under token_embd when the input is tied) do not apply: round to nearest.
  bool input_table = false;
  DType type = DType::kF32;
  bool quantize = false;  // false: copy the bytes (of the selected rows)
  int64_t rows = 0, cols = 0;
  size_t out_index = 0;
  std::string note;
  bool done = false;
};

// Everything one run holds.
class Job {
 public:
  Job(const QuantizeOptions& o, Progress& p) : o_(o), progress_(p) {}

  absl::StatusOr<QuantizeReport> Run();

 private:
  absl::Status PlanTensors();
  absl::Status Calibrate();
  // Quantizes one planned tensor and writes it. `h`: the group's H (GPTQ factor `factor` when
  // the method is gptq), or nullptr; `mean_sq`: mean x^2 of its inputs, or nullptr.
  absl::Status QuantizeOne(Plan& plan, const GptqFactor* factor, const std::vector<double>* h,
                           const std::vector<float>* mean_sq);
  const std::vector<float>* MeanSq(std::string_view weight) const {
    auto it = mean_sq_.find(weight);
    return it == mean_sq_.end() ? nullptr : &it->second;
  }
  absl::Status CopyOne(Plan& plan);
  void Warn(std::string line) {
    progress_.Note(pd::StrCat("warning: ", line));
    report_.warnings.push_back(std::move(line));
  }
  int64_t PendingElements() const {
    int64_t n = 0;
    for (const Plan& p : plans_) n += p.done ? 0 : p.rows * p.cols;
    return n;
  }
  void Advance(const Plan& p) {
    done_elements_ += p.rows * p.cols;
    progress_.Update(done_elements_, p.name);
  }

  const QuantizeOptions& o_;
  Progress& progress_;
  QuantizeReport report_;
  Policy policy_;
  std::vector<TensorOverride> overrides_;
  std::shared_ptr<const GgufFile> file_;
  std::vector<Plan> plans_;
  std::unique_ptr<GgufWriter> writer_;
  int64_t done_elements_ = 0;
  // Calibration results that outlive a pass: mean x^2 per weight (by weight name).
  std::map<std::string, std::vector<float>, std::less<>> mean_sq_;

  // ---- W8A8 smoothing (QuantizeOptions::smooth) ----
  // One norm and the matrices that read its output.
  struct SmoothGroup {
    Plan* norm = nullptr;
    std::vector<Plan*> members;
  };
  // Groups with at least one w8a8 member (their norms are written after calibration).
  std::vector<SmoothGroup> SmoothGroups();
  // Computes s for every group from the calibration statistics; fills smooth_.
  absl::Status ComputeSmoothing(const ActivationCollector& collector);
  // Writes every deferred norm: divided by s when its group was smoothed, else copied.
  absl::Status WriteNorms();
  const std::vector<float>* SmoothOf(std::string_view weight) const {
    auto it = smooth_.find(weight);
    return it == smooth_.end() ? nullptr : &it->second;
  }
  bool deferred_norms_ = false;
  // s per smoothed matrix and per smoothed norm (by tensor name).
  std::map<std::string, std::vector<float>, std::less<>> smooth_;
};

// Loads a tensor as F32 (dequantizing when needed).
std::vector<float> ToF32(const GgufTensorInfo& t, int threads) {
  const int64_t cols = t.shape[0], rows = t.rows();
  std::vector<float> out(static_cast<size_t>(rows * cols));
  DequantizeMatrix(t.type, t.data, rows, cols, threads, out.data());
  return out;
}

std::vector<Job::SmoothGroup> Job::SmoothGroups() {
  std::map<std::string, Plan*, std::less<>> by_name;
  for (Plan& p : plans_) by_name[p.src->name] = &p;
  auto find = [&](const std::string& n) -> Plan* {
    auto it = by_name.find(n);
    return it == by_name.end() ? nullptr : it->second;
  };
  std::vector<SmoothGroup> groups;
  auto add = [&](const std::string& norm, const std::vector<std::string>& members) {
    SmoothGroup g;
    g.norm = find(norm);
    if (g.norm == nullptr || g.norm->src->type != DType::kF32 || g.norm->src->shape.size() != 1) {
      return;
    }
    bool any_w8a8 = false;
    for (const std::string& m : members) {
      Plan* p = find(m);
      // Every reader of the norm must take the migration (or the model would change).
      if (p == nullptr || p->cols != g.norm->cols || !p->quantize) return;
      any_w8a8 |= p->type == DType::kW8A8;
      g.members.push_back(p);
    }
    if (any_w8a8) groups.push_back(std::move(g));
  };
  // The head only when it is its own matrix: a tied embedding is also a lookup table whose
  // columns must not change (ResidualReaders names output.weight, which a tied model lacks).
  for (const NormReaders& nr : ResidualReaders(*file_)) add(nr.norm, nr.readers);
  return groups;
}

absl::Status Job::ComputeSmoothing(const ActivationCollector& collector) {
  for (const SmoothGroup& g : SmoothGroups()) {
    const InputStats* stats = collector.Find(g.members[0]->src->name);
    if (stats == nullptr || stats->samples() == 0 || stats->cols() != g.norm->cols) {
      Warn(pd::StrCat("no calibration inputs reached ", g.members[0]->src->name,
                      ": its group is not smoothed"));
      continue;
    }
    std::vector<float> w_absmax(g.norm->cols, 0.f);
    for (const Plan* p : g.members) {
      const std::vector<float> w = ToF32(*p->src, o_.threads);
      for (int64_t r = 0; r < p->rows; ++r) {
        for (int64_t j = 0; j < p->cols; ++j) {
          w_absmax[j] = std::max(w_absmax[j], std::fabs(w[r * p->cols + j]));
        }
      }
    }
    std::vector<float> s = SmoothingFactors(stats->AbsMax(), w_absmax, o_.smooth_alpha);
    for (const Plan* p : g.members) smooth_[p->src->name] = s;
    smooth_[g.norm->src->name] = std::move(s);
  }
  return absl::OkStatus();
}

absl::Status Job::WriteNorms() {
  for (const SmoothGroup& g : SmoothGroups()) {
    Plan& p = *g.norm;
    if (p.done) continue;
    const std::vector<float>* s = SmoothOf(p.src->name);
    if (s == nullptr) {
      PD_RETURN_IF_ERROR(CopyOne(p));
      continue;
    }
    const float* w = reinterpret_cast<const float*>(p.src->data);
    std::vector<float> out(p.cols);
    for (int64_t j = 0; j < p.cols; ++j) out[j] = w[j] / (*s)[j];
    PD_RETURN_IF_ERROR(writer_->WriteTensor(p.out_index, out.data(), out.size() * sizeof(float)));
    TensorReport& r = report_.tensors[&p - plans_.data()];
    r.method = "smooth";
    const auto [lo, hi] = std::minmax_element(s->begin(), s->end());
    r.smooth_range = *hi / *lo;
    r.note = pd::StrCat(r.note.empty() ? "" : r.note + "; ", "divided by the SmoothQuant s");
    p.done = true;
  }
  return absl::OkStatus();
}

absl::Status Job::PlanTensors() {
  const GgufFile& f = *file_;
  int n_layers = 0;
  bool has_output = false, has_embd = false;
  for (const GgufTensorInfo& t : f.tensors()) {
    n_layers = std::max(n_layers, LayerOf(t.name) + 1);
    has_output |= t.name == "output.weight";
    has_embd |= t.name == "token_embd.weight";
  }
  const bool draft = !o_.head_tokens.empty();
  // A draft's embedding is an input table only: its head is a matrix of its own.
  const bool tied = has_embd && !has_output && !draft;
  if (draft) {
    if (f.Has(kDraftHeadTokensKey)) {
      return absl::InvalidArgumentError(
          pd::StrCat("the input is already a draft model (it has '", kDraftHeadTokensKey, "')"));
    }
    if (!has_embd) return absl::InvalidArgumentError("the input has no token_embd.weight");
  }
  // Tensors in input order; a draft of a tied model gets its new output.weight after the
  // embedding it is cut from.
  std::vector<std::pair<const GgufTensorInfo*, const char*>> order;  // (source, output name)
  for (const GgufTensorInfo& t : f.tensors()) {
    order.emplace_back(&t, nullptr);
    if (draft && !has_output && t.name == "token_embd.weight") {
      order.emplace_back(&t, "output.weight");
    }
  }
  bool dequantized_input = false;
  for (const auto& [src, out_name] : order) {
    const GgufTensorInfo& t = *src;
    Plan p;
    p.src = &t;
    p.name = out_name != nullptr ? out_name : t.name;
    p.shape = t.shape;
    p.type = t.type;
    p.cols = t.shape[0];
    p.rows = t.rows();
    if (draft && p.name == "output.weight") {
      const int64_t vocab = t.shape.size() == 2 ? t.shape[1] : 0;
      for (int32_t id : o_.head_tokens) {
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(
              pd::StrCat("head token ", id, " is outside the ", vocab, " rows of ", t.name));
        }
      }
      p.select = &o_.head_tokens;
      p.rows = static_cast<int64_t>(o_.head_tokens.size());
      p.shape = {p.cols, p.rows};
    }
    p.input_table = draft && p.name == "token_embd.weight";
    if (IsWeightMatrix(t)) {
      TypeChoice c = ChooseType(policy_, o_.type, overrides_,
                                TensorPlace{p.name, LayerOf(t.name), n_layers, tied});
      if (p.input_table && c.why.rfind("override", 0) != 0) {
        // A lookup reads one row per token, so the table's size costs no time per token;
        // quantizing 168M weights (Gemma 3 270M) would cost about a minute and, measured, no
        // agreement: kept as stored, floats as q8_0. An override still applies.
        c.type = IsFloat(t.type) ? DType::kQ8_0 : t.type;
        c.why = "draft input table";
      }
      p.note = c.why;
      const std::optional<DType> fits = FallbackForRow(c.type, p.cols);
      if (!fits) {
        p.note =
            pd::StrCat(p.note.empty() ? "" : p.note + "; ", "kept ", Traits(t.type).name,
                       ": row of ", p.cols, " is not a multiple of ", Traits(c.type).block_size);
      } else {
        if (*fits != c.type) {
          p.note = pd::StrCat(p.note.empty() ? "" : p.note + "; ", Traits(c.type).name,
                              " needs rows of ", Traits(c.type).block_size, " (has ", p.cols,
                              "): ", Traits(*fits).name);
        }
        p.type = *fits;
        // A draft's head or input table in the input's own type is a copy (of rows), exact in
        // any type.
        const bool draft_copy = p.select != nullptr || p.input_table;
        p.quantize = p.type != t.type || (!IsFloat(t.type) && !draft_copy);
        if (p.quantize && !IsFloat(t.type)) dequantized_input = true;
      }
    }
    plans_.push_back(std::move(p));
  }
  if (dequantized_input) {
    std::set<std::string> types;
    for (const Plan& p : plans_) {
      if (p.quantize && !IsFloat(p.src->type)) types.insert(std::string(Traits(p.src->type).name));
    }
    std::string list;
    for (const std::string& s : types) list += pd::StrCat(list.empty() ? "" : ", ", s);
    Warn(pd::StrCat("the input is already quantized (", list,
                    "): its weights are dequantized and quantized again, so both errors add up; "
                    "quantize from the F32/F16/BF16 model when you have it"));
  }

  // The output file's layout: every key copied, then the quantization keys.
  writer_ = std::make_unique<GgufWriter>(kAlignment);
  if (const GgufValue* arch = f.Find("general.architecture")) {
    PD_RETURN_IF_ERROR(writer_->CopyKv("general.architecture", *arch));
  }
  for (const auto& [key, value] : f.metadata()) {
    if (key == "general.architecture") continue;
    if (key == "general.alignment") {
      writer_->SetU32(key, static_cast<uint32_t>(kAlignment));
      continue;
    }
    absl::Status s = writer_->CopyKv(key, value);
    if (absl::IsUnimplemented(s)) {
      Warn(pd::StrCat("metadata key '", key, "' (an array of arrays) is not copied"));
    } else if (!s.ok()) {
      return s;
    }
  }
  auto ft = policy_.file_type.find(o_.type);
  report_.file_type = ft != policy_.file_type.end() ? ft->second : DefaultFileType(o_.type);
  writer_->SetU32("general.file_type", report_.file_type);
  writer_->SetU32("general.quantization_version", kQuantizationVersion);
  if (!o_.head_tokens.empty()) {
    writer_->SetI32Array(kDraftHeadTokensKey, o_.head_tokens);
  }
  for (Plan& p : plans_) p.out_index = writer_->AddTensor(p.name, p.type, p.shape);
  return absl::OkStatus();
}

// The bytes of the rows `select` lists of `t` (a draft's head), in that order.
std::vector<uint8_t> GatherRows(const GgufTensorInfo& t, const std::vector<int32_t>& select) {
  const size_t row_bytes = RowBytes(t.type, t.shape[0]);
  std::vector<uint8_t> out(row_bytes * select.size());
  for (size_t i = 0; i < select.size(); ++i) {
    std::memcpy(out.data() + i * row_bytes, t.data + row_bytes * select[i], row_bytes);
  }
  return out;
}

absl::Status Job::CopyOne(Plan& p) {
  if (p.select != nullptr) {
    const std::vector<uint8_t> rows = GatherRows(*p.src, *p.select);
    PD_RETURN_IF_ERROR(writer_->WriteTensor(p.out_index, rows.data(), rows.size()));
  } else {
    PD_RETURN_IF_ERROR(writer_->WriteTensor(p.out_index, p.src->data, p.src->nbytes));
  }
  TensorReport& r = report_.tensors[&p - plans_.data()];
  r.method = "copy";
  p.done = true;
  return absl::OkStatus();
}

absl::Status Job::QuantizeOne(Plan& p, const GptqFactor* factor, const std::vector<double>* h,
                              const std::vector<float>* mean_sq) {
  const GgufTensorInfo& t = *p.src;
  const int64_t rows = p.rows, cols = p.cols, n = rows * cols;
  TensorReport& r = report_.tensors[&p - plans_.data()];
  if (mean_sq != nullptr && static_cast<int64_t>(mean_sq->size()) != cols) mean_sq = nullptr;
  if (h != nullptr && h->size() != static_cast<size_t>(cols * cols)) h = nullptr, factor = nullptr;
  // The input as F32 (a draft's head: its selected rows only).
  std::vector<uint8_t> gathered;
  const uint8_t* src_data = t.data;
  if (p.select != nullptr) {
    gathered = GatherRows(t, *p.select);
    src_data = gathered.data();
  }
  std::vector<float> deq_in;
  const float* w = nullptr;
  if (t.type == DType::kF32) {
    w = reinterpret_cast<const float*>(src_data);
  } else {
    deq_in.resize(n);
    DequantizeMatrix(t.type, src_data, rows, cols, o_.threads, deq_in.data());
    w = deq_in.data();
  }
  for (int64_t k = 0; k < n; ++k) {
    if (!std::isfinite(w[k])) {
      return absl::InvalidArgumentError(
          pd::StrCat("tensor '", p.name, "' holds a non-finite value at element ", k));
    }
  }
  // W8A8 smoothing: the matrix quantized is W diag(s), whose inputs are X diag(1/s); errors are
  // measured on the effective weights Q diag(1/s) against W, in the original inputs' basis.
  const std::vector<float>* smooth = SmoothOf(t.name);
  if (smooth != nullptr && static_cast<int64_t>(smooth->size()) != cols) smooth = nullptr;
  const float* w_orig = w;
  std::vector<float> w_smooth;
  std::vector<float> mean_sq_smooth;
  if (smooth != nullptr) {
    w_smooth.resize(n);
    for (int64_t r0 = 0; r0 < rows; ++r0) {
      for (int64_t j = 0; j < cols; ++j) w_smooth[r0 * cols + j] = w[r0 * cols + j] * (*smooth)[j];
    }
    w = w_smooth.data();
    if (mean_sq != nullptr) {
      mean_sq_smooth = *mean_sq;
      for (int64_t j = 0; j < cols; ++j) mean_sq_smooth[j] /= (*smooth)[j] * (*smooth)[j];
    }
    const auto [lo, hi] = std::minmax_element(smooth->begin(), smooth->end());
    r.smooth_range = *hi / *lo;
    if (r.note.find("smoothed") == std::string::npos) {
      r.note = pd::StrCat(r.note.empty() ? "" : r.note + "; ",
                          absl::StrFormat("smoothed (s max/min %.3g)", r.smooth_range));
    }
  }
  const std::vector<float>* mean_sq_orig = mean_sq;
  if (smooth != nullptr && mean_sq != nullptr) mean_sq = &mean_sq_smooth;
  // Importance: mean x^2 plus a small floor, so that inputs calibration never exercised still
  // count a little.
  std::vector<float> importance;
  if (mean_sq != nullptr) {
    const double mean = std::accumulate(mean_sq->begin(), mean_sq->end(), 0.0) / cols;
    importance.resize(cols);
    for (int64_t j = 0; j < cols; ++j) {
      importance[j] = (*mean_sq)[j] + static_cast<float>(1e-2 * mean);
    }
  }
  std::vector<uint8_t> out(writer_->TensorBytes(p.out_index));
  // An untied token embedding has no input statistics (it is a lookup): its columns are
  // weighed by how much the weights that read the residual stream amplify them.
  std::vector<float> residual;
  if (o_.method != Method::kRtn && mean_sq == nullptr && !p.input_table && p.select == nullptr &&
      p.name == "token_embd.weight" && !IsFloat(p.type) && p.type != DType::kW8A8) {
    residual = ResidualImportance(*file_, cols, o_.threads);
  }
  if (!residual.empty()) {
    QuantizeMatrix(p.type, w, rows, cols, residual.data(), o_.threads, out.data());
    r.method = "importance";
    r.note = pd::StrCat(r.note.empty() ? "" : r.note + "; ", "weighed by the residual stream");
  } else if (IsFloat(p.type)) {
    QuantizeMatrix(p.type, w, rows, cols, nullptr, o_.threads, out.data());
    r.method = "convert";
  } else if (o_.method == Method::kGptq && factor != nullptr && HasGrid(p.type)) {
    GptqOptions go = o_.gptq;
    go.threads = o_.threads;
    PD_RETURN_IF_ERROR(GptqQuantize(p.type, w, rows, cols, *factor, go, out.data()));
    r.method = "gptq";
  } else if (o_.method != Method::kRtn && !importance.empty() && p.type != DType::kW8A8) {
    // (W8A8 has one scale per row taken from its largest weight: nothing to weigh.)
    QuantizeMatrix(p.type, w, rows, cols, importance.data(), o_.threads, out.data());
    r.method = "importance";
  } else {
    QuantizeMatrix(p.type, w, rows, cols, nullptr, o_.threads, out.data());
    r.method = "rtn";
  }
  PD_RETURN_IF_ERROR(writer_->WriteTensor(p.out_index, out.data(), out.size()));
  // Errors, measured on what was written (for a smoothed matrix, on Q diag(1/s) against W).
  std::vector<float> q(n);
  DequantizeMatrix(p.type, out.data(), rows, cols, o_.threads, q.data());
  if (smooth != nullptr) {
    for (int64_t r0 = 0; r0 < rows; ++r0) {
      for (int64_t j = 0; j < cols; ++j) q[r0 * cols + j] /= (*smooth)[j];
    }
  }
  w = w_orig;
  mean_sq = mean_sq_orig;
  r.w_err = RelativeError(w, q.data(), n);
  if (h != nullptr) {
    r.x_err = OutputRelativeError(w, q.data(), rows, cols, h->data(), o_.threads);
    r.x_err_exact = true;
  } else if (mean_sq != nullptr) {
    r.x_err = WeightedRelativeError(w, q.data(), rows, cols, mean_sq->data());
  } else if (!residual.empty()) {
    r.x_err = WeightedRelativeError(w, q.data(), rows, cols, residual.data());
  }
  p.done = true;
  return absl::OkStatus();
}

absl::Status Job::Calibrate() {
  // The text.
  std::string text;
  if (o_.calib_text.has_value()) {
    text = *o_.calib_text;
    report_.calib_source = o_.calib_text_source;
  } else if (o_.calib_file.empty()) {
    PD_ASSIGN_OR_RETURN(text, BuiltinText(TextKind::kCalibration));
    report_.calib_source = "built-in calibration text (Debian fortunes, testdata/texts)";
  } else {
    PD_ASSIGN_OR_RETURN(text, ReadTextFile(o_.calib_file));
    report_.calib_source = o_.calib_file;
  }
  if (text.empty()) {
    return absl::InvalidArgumentError(
        pd::StrCat("calibration text '", o_.calib_file, "' is empty"));
  }
  // The engine.
  const std::string why =
      o_.method == Method::kRtn && deferred_norms_ && o_.calib_file.empty() &&
              !o_.calib_text.has_value() && !o_.eval_hessian
          ? std::string(
                "w8a8 smoothing runs the model on calibration text (--no-smooth skips "
                "it), but ")
          : pd::StrCat("--method ", MethodName(o_.method),
                       " runs the model on calibration text, but ");
  CpuBackendOptions bo;
  bo.threads = o_.threads;
  std::unique_ptr<Backend> backend = CreateCpuBackend(bo);
  auto model = Model::Load(file_, *backend);
  if (!model.ok()) {
    return absl::FailedPreconditionError(
        pd::StrCat(why, "pdserve cannot run this model: ", model.status().message()));
  }
  auto tokenizer = Tokenizer::FromGguf(*file_);
  if (!tokenizer.ok()) {
    return absl::FailedPreconditionError(
        pd::StrCat(why, "its tokenizer cannot be loaded: ", tokenizer.status().message()));
  }
  int chunk = std::max(16, o_.chunk_tokens);
  if ((*model)->config().n_ctx_train > 0) chunk = std::min(chunk, (*model)->config().n_ctx_train);
  const auto chunks = MakeCalibrationChunks(**tokenizer, text, chunk, o_.calib_tokens);
  if (chunks.empty()) return absl::InvalidArgumentError("the calibration text yields no tokens");
  for (const auto& c : chunks) report_.calib_tokens += static_cast<int64_t>(c.size());

  const bool want_h = o_.method == Method::kGptq || o_.eval_hessian;
  std::set<std::string, std::less<>> done_leaders;
  for (int pass = 1;; ++pass) {
    // X^T X for as many pending groups as the budget holds (at least one: progress).
    uint64_t budget = o_.hessian_budget_bytes;
    bool any_full = false;
    auto filter = [&](std::string_view leader, int64_t cols) {
      if (!want_h || done_leaders.count(leader)) return false;
      const uint64_t bytes = static_cast<uint64_t>(cols) * cols * sizeof(double);
      if (any_full && bytes > budget) return false;
      budget -= std::min(budget, bytes);
      any_full = true;
      return true;
    };
    ActivationCollector collector(filter, o_.threads);
    PD_RETURN_IF_ERROR(RunCalibration(
        **model, chunks, o_.head_stride, collector, progress_,
        pass == 1 ? std::string("calibration") : pd::StrCat("calibration pass ", pass)));
    report_.calib_passes = pass;
    if (pass == 1) {
      for (const Plan& p : plans_) {
        if (const InputStats* s = collector.Find(p.src->name)) {
          mean_sq_[p.src->name] = s->MeanSquare();
        }
      }
      if (deferred_norms_) {
        PD_RETURN_IF_ERROR(ComputeSmoothing(collector));
        PD_RETURN_IF_ERROR(WriteNorms());
      }
    }
    // Quantize every pending weight whose group got X^T X in this pass, one H and one GPTQ
    // factorization per group.
    std::map<std::string, std::vector<Plan*>> ready;  // by leader
    for (Plan& p : plans_) {
      if (p.done || !p.quantize || p.input_table) continue;
      const InputStats* s = collector.Find(p.src->name);
      if (s == nullptr || !s->full() || s->samples() == 0 || s->cols() != p.cols) continue;
      ready[std::string(collector.LeaderOf(p.src->name))].push_back(&p);
    }
    if (ready.empty()) break;
    progress_.Start(pass == 1 ? std::string("quantizing") : pd::StrCat("quantizing, pass ", pass),
                    done_elements_ + PendingElements(), "weights");
    progress_.Update(done_elements_);
    for (auto& [leader, group] : ready) {
      done_leaders.insert(leader);
      const std::vector<double> h = collector.Find(leader)->Hessian();
      std::unique_ptr<GptqFactor> factor;
      for (Plan* p : group) {
        if (o_.method == Method::kGptq && HasGrid(p->type) && !factor) {
          GptqOptions go = o_.gptq;
          go.threads = o_.threads;
          if (const std::vector<float>* s = SmoothOf(p->src->name)) {
            // The smoothed matrix's inputs are X diag(1/s): H' = diag(1/s) H diag(1/s). Every
            // member of a group shares the input, hence s and this factor.
            std::vector<double> hs = h;
            for (int64_t i = 0; i < p->cols; ++i) {
              for (int64_t j = 0; j < p->cols; ++j) {
                hs[i * p->cols + j] /= double{(*s)[i]} * (*s)[j];
              }
            }
            PD_ASSIGN_OR_RETURN(factor, GptqFactor::Create(hs, p->cols, go));
          } else {
            PD_ASSIGN_OR_RETURN(factor, GptqFactor::Create(h, p->cols, go));
          }
        }
        PD_RETURN_IF_ERROR(QuantizeOne(*p, factor.get(), &h, MeanSq(p->src->name)));
        Advance(*p);
      }
    }
    progress_.Finish();
    // Another pass only if groups that want X^T X are still pending.
    bool more = false;
    for (const Plan& p : plans_) {
      if (p.done || !p.quantize || p.input_table || !want_h) continue;
      const std::string_view leader = collector.LeaderOf(p.src->name);
      if (!leader.empty() && !done_leaders.count(leader)) more = true;
    }
    if (!more) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantizeReport> Job::Run() {
  const auto t0 = std::chrono::steady_clock::now();
  report_.input = o_.input;
  report_.output = o_.output;
  report_.base = o_.type;
  report_.method = o_.method;
  if (!(o_.smooth_alpha >= 0.f && o_.smooth_alpha <= 1.f)) {
    return absl::InvalidArgumentError(
        pd::StrCat("smoothing alpha ", o_.smooth_alpha, " is not in [0, 1]"));
  }
  if (std::find(QuantTypes().begin(), QuantTypes().end(), o_.type) == QuantTypes().end()) {
    return absl::InvalidArgumentError(
        pd::StrCat("--type ", Traits(o_.type).name, " is not a quantized type"));
  }
  PD_ASSIGN_OR_RETURN(policy_, Policy::Load(o_.policy));
  report_.policy = policy_.name;
  for (const std::string& spec : o_.overrides) {
    PD_ASSIGN_OR_RETURN(TensorOverride ov, ParseOverride(spec));
    overrides_.push_back(std::move(ov));
  }
  auto opened = o_.open_input ? o_.open_input(o_.input) : GgufFile::Open(o_.input);
  if (!opened.ok()) {
    const absl::Status& s = opened.status();
    const bool named = s.message().find(o_.input) != absl::string_view::npos;
    return absl::Status(s.code(),
                        named ? pd::StrCat("cannot read input: ", s.message())
                              : pd::StrCat("cannot read input '", o_.input, "': ", s.message()));
  }
  file_ = std::shared_ptr<const GgufFile>(std::move(*opened));
  PD_RETURN_IF_ERROR(PlanTensors());
  for (const Plan& p : plans_) {
    TensorReport r;
    r.name = p.name;
    r.shape = p.shape;
    r.src_type = p.src->type;
    r.type = p.type;
    r.quantized = p.quantize;
    r.bytes = writer_->TensorBytes(p.out_index);
    r.note = p.note;
    report_.tensors.push_back(std::move(r));
  }
  // Fail early (before calibration) when the output cannot be created.
  PD_RETURN_IF_ERROR(o_.output.empty() ? writer_->OpenMemory(pd::StrCat("quantized:", o_.input))
                                        : writer_->Open(o_.output));
  // Norms that W8A8 smoothing may divide wait for calibration.
  std::set<const Plan*> deferred;
  if (o_.smooth) {
    for (const SmoothGroup& g : SmoothGroups()) deferred.insert(g.norm);
  }
  deferred_norms_ = !deferred.empty();
  for (Plan& p : plans_) {
    if (!p.quantize && !deferred.count(&p)) PD_RETURN_IF_ERROR(CopyOne(p));
  }
  const bool needs_calibration = o_.method != Method::kRtn || !o_.calib_file.empty() ||
                                 o_.calib_text.has_value() || o_.eval_hessian;
  if (needs_calibration || deferred_norms_) {
    absl::Status s = Calibrate();
    if (absl::IsFailedPrecondition(s) && !needs_calibration) {
      // Only smoothing wanted the model run, and rtn never requires it: quantize unsmoothed.
      Warn(pd::StrCat(s.message(), "; w8a8 weights are quantized without smoothing"));
    } else if (!s.ok()) {
      return s;
    }
  }
  if (deferred_norms_) PD_RETURN_IF_ERROR(WriteNorms());  // no-op when calibration wrote them
  // Whatever is left: no X^T X (rtn, importance, weights calibration never reached such as an
  // untied token_embd, or tensors whose type has no grid).
  if (PendingElements() > 0) {
    progress_.Start("quantizing", done_elements_ + PendingElements(), "weights");
    progress_.Update(done_elements_);
    for (Plan& p : plans_) {
      if (p.done) continue;
      PD_RETURN_IF_ERROR(
          QuantizeOne(p, nullptr, nullptr, p.input_table ? nullptr : MeanSq(p.src->name)));
      Advance(p);
    }
    progress_.Finish();
  }
  if (o_.output.empty()) {
    PD_ASSIGN_OR_RETURN(MappedFile map, writer_->CommitToMemory());
    PD_ASSIGN_OR_RETURN(report_.model, GgufFile::Parse(std::move(map)));
  } else {
    PD_RETURN_IF_ERROR(writer_->Commit());
  }

  report_.file_bytes = writer_->FileSize();
  uint64_t bits = 0, qbits = 0;
  int64_t qn = 0;
  for (const TensorReport& r : report_.tensors) {
    int64_t n = 1;
    for (int64_t d : r.shape) n *= d;
    report_.n_elements += n;
    bits += uint64_t{r.bytes} * 8;
    if (r.quantized) qbits += uint64_t{r.bytes} * 8, qn += n;
  }
  report_.bpw = report_.n_elements > 0 ? double(bits) / report_.n_elements : 0;
  report_.bpw_quantized = qn > 0 ? double(qbits) / qn : 0;
  report_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report_;
}

}  // namespace

absl::StatusOr<Method> ParseMethod(std::string_view name) {
  if (name == "rtn") return Method::kRtn;
  if (name == "importance") return Method::kImportance;
  if (name == "gptq") return Method::kGptq;
  return absl::InvalidArgumentError(
      pd::StrCat("unknown method '", name, "' (one of: rtn, importance, gptq)"));
}

std::string_view MethodName(Method m) {
  switch (m) {
    case Method::kRtn:
      return "rtn";
    case Method::kImportance:
      return "importance";
    case Method::kGptq:
      return "gptq";
  }
  return "?";
}

std::string FileTypeName(uint32_t ft) {
  static const std::map<uint32_t, std::string> kNames = {
      {0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {7, "Q8_0"},    {10, "Q2_K"},
      {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"}, {15, "Q4_K_M"},
      {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},   {21, "Q2_K_S"}, {32, "BF16"},
      {static_cast<uint32_t>(DType::kW8A8), "PD_W8A8"},
      {static_cast<uint32_t>(DType::kW4A16), "PD_W4A16"}};
  auto it = kNames.find(ft);
  return it != kNames.end() ? it->second : pd::StrCat("type ", ft);
}

absl::StatusOr<QuantizeReport> QuantizeModel(const QuantizeOptions& options, Progress& progress) {
  Job job(options, progress);
  return job.Run();
}

std::string FormatReport(const QuantizeReport& r) {
  auto shape_str = [](const std::vector<int64_t>& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) out += pd::StrCat(i ? "x" : "", s[i]);
    return out;
  };
  size_t name_w = 6;
  for (const TensorReport& t : r.tensors) name_w = std::max(name_w, t.name.size());
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "%-*s %-12s %-5s %5s %9s %9s  %-10s %s\n",
                static_cast<int>(name_w), "tensor", "shape", "type", "bpw", "w_err", "x_err",
                "method", "note");
  out += line;
  bool any_approx = false;
  for (const TensorReport& t : r.tensors) {
    std::string w_err = t.w_err >= 0 ? pd::StrCat(absl::StrFormat("%.5f", t.w_err)) : "-";
    std::string x_err = "-";
    if (t.x_err >= 0) {
      x_err = absl::StrFormat("%.5f%s", t.x_err, t.x_err_exact ? "" : "~");
      any_approx |= !t.x_err_exact;
    }
    std::snprintf(line, sizeof(line), "%-*s %-12s %-5s %5.2f %9s %9s  %-10s %s\n",
                  static_cast<int>(name_w), t.name.c_str(), shape_str(t.shape).c_str(),
                  std::string(Traits(t.type).name).c_str(), BitsPerWeight(t.type), w_err.c_str(),
                  x_err.c_str(), t.method.c_str(), t.note.c_str());
    out += line;
  }
  out += "\n";
  out += absl::StrFormat(
      "%s: %.2f MiB, %.3f bits per weight over %d weights (quantized tensors: %.3f); "
      "file_type %u (%s), base %s, policy %s, method %s\n",
      r.output, r.file_bytes / 1048576.0, r.bpw, r.n_elements, r.bpw_quantized, r.file_type,
      FileTypeName(r.file_type), std::string(Traits(r.base).name), r.policy,
      std::string(MethodName(r.method)));
  if (r.calib_passes > 0) {
    out += absl::StrFormat("calibration: %d tokens from %s, %d pass%s\n", r.calib_tokens,
                           r.calib_source, r.calib_passes, r.calib_passes > 1 ? "es" : "");
  }
  out += "w_err = ||W - Q|| / ||W||; x_err = ||X (W - Q)^T|| / ||X W^T|| on the calibration inputs";
  out += any_approx ? " (~: diagonal approximation, inputs taken as uncorrelated)\n" : "\n";
  out += absl::StrFormat("done in %.1f s\n", r.seconds);
  return out;
}

}  // namespace pd::engine::quantize
