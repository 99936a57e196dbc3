#include "engine/quant/quantize/calibration.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "common/status.h"
#include "common/strings.h"
#include "engine/quant/dtype.h"
#include "engine/quant/matrix_quant.h"
#include "engine/kv/kv_cache.h"

namespace pd::engine::quantize {

std::vector<std::vector<int32_t>> MakeCalibrationChunks(const Tokenizer& tokenizer,
                                                        std::string_view text, int chunk_tokens,
                                                        int64_t max_tokens) {
  const std::vector<int32_t> ids = tokenizer.Encode(text, /*add_special=*/false,
                                                    /*parse_special=*/false);
  const bool bos = tokenizer.add_bos() && tokenizer.bos() != kNoToken;
  const int64_t body = std::max(1, chunk_tokens - (bos ? 1 : 0));
  std::vector<std::pair<int64_t, int64_t>> spans;  // [begin, end) into ids
  for (int64_t b = 0; b < static_cast<int64_t>(ids.size()); b += body) {
    const int64_t e = std::min<int64_t>(b + body, ids.size());
    if (e - b < 16 && !spans.empty()) break;
    spans.emplace_back(b, e);
  }
  const int64_t want = std::max<int64_t>(1, max_tokens / std::max(1, chunk_tokens));
  std::vector<std::vector<int32_t>> chunks;
  const int64_t n = static_cast<int64_t>(spans.size());
  const int64_t take = std::min(n, want);
  for (int64_t k = 0; k < take; ++k) {
    const auto [b, e] = spans[k * n / take];  // evenly spaced over the text
    std::vector<int32_t> c;
    c.reserve(static_cast<size_t>(e - b) + 1);
    if (bos) c.push_back(tokenizer.bos());
    for (int64_t k = b; k < e; ++k) c.push_back(ids[k]);
    chunks.push_back(std::move(c));
  }
  return chunks;
}

ActivationCollector::ActivationCollector(HessianFilter filter, int threads)
    : filter_(std::move(filter)), threads_(threads) {}

void ActivationCollector::Observe(std::string_view weight, const float* x, int64_t rows,
                                  int64_t cols) {
  auto known = leader_.find(weight);
  const bool same_input = !last_leader_.empty() && rows == last_rows_ && cols == last_cols_ &&
                          std::memcmp(x, last_x_.data(), sizeof(float) * rows * cols) == 0;
  if (same_input) {
    // The previous matmul's input again: this weight belongs to that group.
    if (known == leader_.end()) known = leader_.emplace(std::string(weight), last_leader_).first;
    if (known->second == last_leader_) return;
  }
  if (known == leader_.end()) {
    known = leader_.emplace(std::string(weight), std::string(weight)).first;
  }
  const std::string& leader = known->second;
  auto it = stats_.find(leader);
  if (it == stats_.end()) {
    const bool full = filter_ && filter_(leader, cols);
    it = stats_.emplace(leader, std::make_unique<InputStats>(cols, full)).first;
  }
  if (it->second->cols() == cols) it->second->Add(x, rows, threads_);
  last_x_.assign(x, x + rows * cols);
  last_rows_ = rows;
  last_cols_ = cols;
  last_leader_ = leader;
}

const InputStats* ActivationCollector::Find(std::string_view weight) const {
  auto l = leader_.find(weight);
  if (l == leader_.end()) return nullptr;
  auto it = stats_.find(l->second);
  return it == stats_.end() ? nullptr : it->second.get();
}

std::string_view ActivationCollector::LeaderOf(std::string_view weight) const {
  auto l = leader_.find(weight);
  return l == leader_.end() ? std::string_view() : std::string_view(l->second);
}

std::vector<std::string> ActivationCollector::Leaders() const {
  std::vector<std::string> out;
  for (const auto& [name, s] : stats_) out.push_back(name);
  return out;
}

absl::Status RunCalibration(Model& model, const std::vector<std::vector<int32_t>>& chunks,
                            int head_stride, MatMulObserver& observer, Progress& progress,
                            std::string_view stage) {
  size_t longest = 0;
  int64_t total = 0;
  for (const auto& c : chunks) {
    longest = std::max(longest, c.size());
    total += static_cast<int64_t>(c.size());
  }
  constexpr int kBlock = 16;
  const int n_blocks = static_cast<int>((longest + kBlock - 1) / kBlock);
  PD_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> kv,
      KvCache::Create(model.KvOptions(std::max(1, n_blocks), KvDType::kF16, kBlock),
                      model.backend()));
  head_stride = std::max(1, head_stride);
  progress.Start(stage, total, "tokens");
  model.set_observer(&observer);
  int64_t done = 0;
  absl::Status status;
  std::vector<float> logits;
  for (const auto& c : chunks) {
    status = kv->Reserve(0, static_cast<int>(c.size()));
    if (!status.ok()) break;
    Batch batch;
    for (size_t i = 0; i < c.size(); ++i) {
      const bool head = (i + 1) % head_stride == 0 || i + 1 == c.size();
      batch.Add(c[i], static_cast<int32_t>(i), 0, head);
    }
    status = model.Forward(batch, *kv, &logits);
    kv->Free(0);
    if (!status.ok()) break;
    done += static_cast<int64_t>(c.size());
    progress.Update(done);
  }
  model.set_observer(nullptr);
  progress.Finish();
  return status;
}

namespace {

// Column sums of squares of a stored matrix [rows, cols] times its row weight, added to `acc`;
// read in slabs so that a large consumer is never held as F32 whole.
void AddColumnSquares(const GgufTensorInfo& t, int64_t cols, double weight, int threads,
                      std::vector<double>& acc) {
  const int64_t rows = t.rows();
  const size_t row_bytes = RowBytes(t.type, cols);
  constexpr int64_t kSlab = 1024;
  std::vector<float> slab(static_cast<size_t>(std::min(rows, kSlab)) * cols);
  for (int64_t r0 = 0; r0 < rows; r0 += kSlab) {
    const int64_t n = std::min(kSlab, rows - r0);
    DequantizeMatrix(t.type, t.data + r0 * row_bytes, n, cols, threads, slab.data());
    for (int64_t r = 0; r < n; ++r) {
      const float* x = slab.data() + r * cols;
      for (int64_t j = 0; j < cols; ++j) acc[j] += weight * double{x[j]} * x[j];
    }
  }
}

}  // namespace

std::vector<NormReaders> ResidualReaders(const GgufFile& file) {
  int n_layers = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    std::string_view n = t.name;
    if (n.substr(0, 4) != "blk.") continue;
    int layer = 0;
    const auto [end, ec] = std::from_chars(n.data() + 4, n.data() + n.size(), layer);
    if (ec == std::errc() && end != n.data() + n.size() && *end == '.') {
      n_layers = std::max(n_layers, layer + 1);
    }
  }
  auto has = [&](const std::string& name) { return file.FindTensor(name) != nullptr; };
  std::vector<NormReaders> out;
  for (int i = 0; i < n_layers; ++i) {
    const std::string b = pd::StrCat("blk.", i, ".");
    if (has(b + "attn_qkv.weight")) {
      out.push_back({b + "attn_norm.weight", {b + "attn_qkv.weight"}});
    } else {
      out.push_back(
          {b + "attn_norm.weight", {b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"}});
    }
    if (has(b + "ffn_gate.weight")) {
      out.push_back({b + "ffn_norm.weight", {b + "ffn_gate.weight", b + "ffn_up.weight"}});
    } else if (has(b + "ffn_gate_inp.weight")) {
      out.push_back({b + "ffn_norm.weight",
                     {b + "ffn_gate_inp.weight", b + "ffn_gate_exps.weight",
                      b + "ffn_up_exps.weight"}});
    } else {
      out.push_back({b + "ffn_norm.weight", {b + "ffn_up.weight"}});
    }
  }
  out.push_back({"output_norm.weight", {"output.weight"}});
  return out;
}

std::vector<float> ResidualImportance(const GgufFile& file, int64_t cols, int threads) {
  std::vector<double> total(cols, 0.0);
  bool any = false;
  double experts_used = 1;
  if (auto arch = file.GetString("general.architecture"); arch.ok()) {
    experts_used = static_cast<double>(
        file.GetUintOr(pd::StrCat(*arch, ".expert_used_count"), 1).value_or(1));
  }
  // One norm and the matrices that read its output.
  auto add = [&](const std::string& norm, const std::vector<std::string>& readers) {
    std::vector<double> part(cols, 0.0);
    bool found = false;
    for (const std::string& name : readers) {
      const GgufTensorInfo* t = file.FindTensor(name);
      if (t == nullptr || t->shape.empty() || t->shape[0] != cols || t->shape.size() > 3 ||
          cols % Traits(t->type).block_size != 0) {
        continue;
      }
      // Stacked experts [cols, ff, n_expert]: a token meets expert_used_count of them.
      const double weight =
          t->shape.size() == 3 && t->shape[2] > 0 ? experts_used / t->shape[2] : 1.0;
      AddColumnSquares(*t, cols, weight, threads, part);
      found = true;
    }
    if (!found) return;
    any = true;
    std::vector<float> g(cols, 1.f);
    if (const GgufTensorInfo* n = file.FindTensor(norm);
        n != nullptr && n->numel() == cols && cols % Traits(n->type).block_size == 0) {
      DequantizeMatrix(n->type, n->data, 1, cols, 1, g.data());
    }
    for (int64_t j = 0; j < cols; ++j) total[j] += double{g[j]} * g[j] * part[j];
  };
  for (const NormReaders& nr : ResidualReaders(file)) add(nr.norm, nr.readers);
  if (!any) return {};
  // A floor, as for calibrated importance: columns no consumer reads still count a little.
  double mean = 0;
  for (double v : total) mean += v;
  mean /= cols;
  std::vector<float> out(cols);
  for (int64_t j = 0; j < cols; ++j) out[j] = static_cast<float>(total[j] + 1e-2 * mean);
  return out;
}

}  // namespace pd::engine::quantize
