#include "tools/pdctl/logits_cmd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "common/strings.h"
#include "engine/runtime/model.h"
#include "tools/pdctl/cli_util.h"

namespace pd::tools {
namespace {

// Writes the input of every weight matmul to DIR/<weight name>.f32 ([rows, cols] float32,
// row-major), and each layer's Q, K (after RoPE) and V to DIR/blk.L.{Q,K,V}cur.f32: for comparing a
// forward pass with another engine's intermediate tensors (scripts/compare_intermediates.py does it
// against llama.cpp).
class MatMulInputDumper final : public engine::MatMulObserver {
 public:
  explicit MatMulInputDumper(std::string dir) : dir_(std::move(dir)) {}
  void Observe(std::string_view weight, const float* x, int64_t rows, int64_t cols) override {
    Write(weight, x, rows, cols);
  }
  bool WantsIntermediates() const override { return true; }
  void ObserveIntermediate(std::string_view name, const float* x, int64_t rows,
                           int64_t cols) override {
    Write(name, x, rows, cols);
  }
  const absl::Status& status() const { return status_; }

 private:
  void Write(std::string_view name, const float* x, int64_t rows, int64_t cols) {
    const std::string path = pd::StrCat(dir_, "/", name, ".f32");
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(x),
              static_cast<std::streamsize>(rows * cols * sizeof(float)));
    if (!out && status_.ok())
      status_ = absl::InternalError(pd::StrCat("cannot write '", path, "'"));
  }

  std::string dir_;
  absl::Status status_;
};

}  // namespace

CLI::App* AddLogitsCommand(CLI::App& app, LogitsFlags* flags) {
  CLI::App* lg = app.add_subcommand(
      "logits", "write the final position's logits (n_vocab float32, little-endian) to a file");
  flags->engine.Add(lg);
  lg->add_option("--prompt-ids", flags->prompt_ids, "prompt as space-separated token ids")
      ->required();
  lg->add_option("-o,--out", flags->out, "output file")->required();
  lg->add_flag("--all", flags->all_positions,
               "every prompt position, not only the last (needs --top)");
  lg->add_option("--top", flags->top,
                 "write per position: float32 logsumexp, then the N best ids (int32) and their "
                 "logits (float32); 0 = the final position's full logits");
  lg->add_option("--dump-matmul-inputs", flags->dump_dir,
                 "also write the input of every weight matmul to DIR/<weight>.f32 (float32 "
                 "[tokens, cols]), for comparing intermediates with another engine");
  return lg;
}

int RunLogits(const LogitsFlags& flags) {
  const std::string& prompt_ids = flags.prompt_ids;
  const std::string& out_path = flags.out;
  const bool all_positions = flags.all_positions;
  const int top = flags.top;
  const std::string& dump_dir = flags.dump_dir;
  auto ids = ParseIds(prompt_ids);
  if (!ids.ok()) return Fail(ids.status());
  if (ids->empty()) return Fail(absl::InvalidArgumentError("--prompt-ids is empty"));
  auto e = LoadEngine(flags.engine);
  if (!e.ok()) return Fail(e.status());
  if (auto s = e->kv->Reserve(0, static_cast<int>(ids->size())); !s.ok()) return Fail(s);
  engine::Batch batch;
  for (size_t i = 0; i < ids->size(); ++i) {
    batch.AddOrdered((*ids)[i], static_cast<int32_t>(i), 0, all_positions || i + 1 == ids->size(),
                     static_cast<int32_t>(ids->size()), all_positions);
  }
  std::optional<MatMulInputDumper> dumper;
  if (!dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dump_dir, ec);
    if (ec) {
      return Fail(absl::InvalidArgumentError(pd::StrCat(
          "cannot create --dump-matmul-inputs directory '", dump_dir, "': ", ec.message())));
    }
    dumper.emplace(dump_dir);
    e->model->set_observer(&*dumper);
  }
  std::vector<float> logits;
  if (auto s = e->model->Forward(batch, *e->kv, &logits); !s.ok()) return Fail(s);
  e->model->set_observer(nullptr);
  if (dumper && !dumper->status().ok()) return Fail(dumper->status());
  std::ofstream out(out_path, std::ios::binary);
  if (top <= 0) {
    out.write(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
  } else {
    const int64_t n_vocab = e->model->config().n_vocab;
    const int k = static_cast<int>(std::min<int64_t>(top, n_vocab));
    std::vector<int32_t> order(n_vocab);
    for (size_t r = 0; r < logits.size() / n_vocab; ++r) {
      const float* row = logits.data() + r * n_vocab;
      const float mx = *std::max_element(row, row + n_vocab);
      double sum = 0;
      for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(double(row[i]) - mx);
      const float lse = static_cast<float>(mx + std::log(sum));
      for (int64_t i = 0; i < n_vocab; ++i) order[i] = static_cast<int32_t>(i);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
      });
      std::vector<float> vals(k);
      for (int i = 0; i < k; ++i) vals[i] = row[order[i]];
      out.write(reinterpret_cast<const char*>(&lse), sizeof(float));
      out.write(reinterpret_cast<const char*>(order.data()), k * sizeof(int32_t));
      out.write(reinterpret_cast<const char*>(vals.data()), k * sizeof(float));
    }
  }
  if (!out) return Fail(absl::InternalError(pd::StrCat("cannot write '", out_path, "'")));
  return 0;
}

}  // namespace pd::tools
