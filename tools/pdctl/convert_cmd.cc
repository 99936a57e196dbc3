#include "tools/pdctl/convert_cmd.h"

#include <cstdio>
#include <optional>
#include <string>

#include "common/strings.h"
#include "engine/convert/hf_convert.h"
#include "engine/quant/dtype.h"
#include "engine/quant/quantize/policy.h"
#include "engine/quant/quantize/progress.h"
#include "engine/quant/quantize/quantize_model.h"
#include "tools/pdctl/cli_util.h"

namespace pd::tools {
namespace {

namespace q = engine::quantize;

int FailConvert(const absl::Status& s) {
  std::fprintf(stderr, "pdctl convert: error: %s\n", std::string(s.message()).c_str());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kFailedPrecondition:
      return 2;
    default:
      return 1;
  }
}

}  // namespace

CLI::App* AddConvertCommand(CLI::App& app, ConvertFlags* f) {
  CLI::App* c = app.add_subcommand(
      "convert",
      "convert a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json) to "
      "GGUF: Llama, Mistral, Qwen2 and Gemma 3 (docs/models.md). pdserve also serves such a "
      "folder directly (-m FOLDER), converting it in memory at each start");
  c->add_option("input", f->input, "the checkpoint folder")->required();
  c->add_option("output", f->output, "output GGUF file (written to OUTPUT.tmp, then renamed)")
      ->required();
  c->add_option("--type", f->type,
                "weights: auto (each tensor as stored: F32, F16 or BF16), f32, f16, bf16, or a "
                "quantized type (q8_0, q4_0, q2_K .. q6_K, w8a8, w4a16: the quantizer runs on "
                "the converted model, round to nearest, with --policy)");
  c->add_option("--policy", f->policy, "quantized --type: mixed-precision policy S, M or L");
  return c;
}

int RunConvert(const ConvertFlags& f) {
  engine::HfConvertOptions o;
  if (!engine::IsHfCheckpoint(f.input)) {
    return FailConvert(absl::InvalidArgumentError(
        StrCat("'", f.input, "' is not a Hugging Face checkpoint folder (no config.json in it)")));
  }
  std::optional<engine::DType> quantized;
  if (f.type == "f32") {
    o.float_type = engine::DType::kF32;
  } else if (f.type == "f16") {
    o.float_type = engine::DType::kF16;
  } else if (f.type == "bf16") {
    o.float_type = engine::DType::kBF16;
  } else if (f.type != "auto") {
    absl::StatusOr<engine::DType> t = q::ParseTypeName(f.type);
    if (!t.ok()) {
      return FailConvert(absl::InvalidArgumentError(
          StrCat("--type '", f.type, "': expected auto, f32, f16, bf16 or a quantized type (",
                 t.status().message(), ")")));
    }
    quantized = *t;
  }
  if (quantized) {
    q::QuantizeOptions qo;
    qo.input = f.input;
    qo.output = f.output;
    qo.type = *quantized;
    qo.policy = f.policy;
    qo.open_input = [](const std::string& dir) {
      std::fprintf(stderr, "pdctl convert: reading %s\n", dir.c_str());
      return engine::LoadHfCheckpoint(dir, {});
    };
    std::unique_ptr<q::Progress> progress = q::MakeStderrProgress();
    absl::StatusOr<q::QuantizeReport> report = [&] {
      TmpFileGuard guard(f.output + ".tmp");
      return q::QuantizeModel(qo, *progress);
    }();
    if (!report.ok()) return FailConvert(report.status());
    const std::string table = q::FormatReport(*report);
    std::fwrite(table.data(), 1, table.size(), stdout);
    return 0;
  }
  size_t last_pct = 101;
  o.progress = [&](const std::string& name, size_t i, size_t n) {
    const size_t pct = i * 100 / n;
    if (pct / 10 != last_pct / 10 || i == n) {
      std::fprintf(stderr, "pdctl convert: %3zu%% [%zu/%zu] %s\n", pct, i, n, name.c_str());
      last_pct = pct;
    }
  };
  absl::Status s = [&] {
    TmpFileGuard guard(f.output + ".tmp");
    return engine::ConvertHfCheckpoint(f.input, f.output, o);
  }();
  if (!s.ok()) return FailConvert(s);
  std::printf("wrote %s\n", f.output.c_str());
  return 0;
}

}  // namespace pd::tools
