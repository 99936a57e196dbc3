#include "tools/pdctl/synth_model_cmd.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "common/strings.h"
#include "engine/quant/quantize/policy.h"
#include "engine/quant/quantize/progress.h"
#include "engine/quant/quantize/synth_model.h"
#include "tools/pdctl/cli_util.h"

namespace pd::tools {
namespace {

namespace q = engine::quantize;

int FailSynth(const absl::Status& s) {
  std::fprintf(stderr, "pdctl synth-model: error: %s\n", std::string(s.message()).c_str());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
      return 2;
    default:
      return 1;
  }
}

// The spec the flags describe: the shape's, with every given flag overriding its field.
absl::StatusOr<q::SynthModelSpec> SpecFromFlags(const SynthModelFlags& f) {
  q::SynthModelSpec s;
  if (!f.shape.empty()) {
    auto shape = q::FindSynthShape(f.shape);
    if (!shape.ok()) return absl::InvalidArgumentError(shape.status().message());
    s = *shape;
  } else {
    std::string missing;
    for (const auto& [flag, v] : {std::pair<const char*, int>{"--layers", f.layers},
                                  {"--embd", f.embd},
                                  {"--heads", f.heads},
                                  {"--ff", f.ff},
                                  {"--vocab", f.vocab}}) {
      if (v == 0) missing += pd::StrCat(missing.empty() ? "" : ", ", flag);
    }
    if (!missing.empty()) {
      return absl::InvalidArgumentError(
          pd::StrCat("give --shape NAME, or the whole shape (missing: ", missing, ")"));
    }
  }
  auto set = [](int v, int* field) {
    if (v > 0) *field = v;
  };
  set(f.layers, &s.n_layer);
  set(f.embd, &s.n_embd);
  set(f.heads, &s.n_head);
  set(f.ff, &s.n_ff);
  set(f.vocab, &s.n_vocab);
  set(f.ctx, &s.n_ctx);
  set(f.head_dim, &s.head_dim);
  if (f.kv_heads > 0) {
    s.n_head_kv = f.kv_heads;
  } else if (s.n_head_kv == 0) {
    s.n_head_kv = s.n_head;  // no shape: no GQA
  }
  if (f.rope_base > 0) s.rope_freq_base = static_cast<float>(f.rope_base);
  if (f.rms_eps > 0) s.rms_eps = static_cast<float>(f.rms_eps);
  if (f.tied) s.tied_output = true;
  if (f.shape.empty()) s.name = "custom";
  auto type = q::ParseTypeName(f.type, /*allow_float=*/true);
  if (!type.ok()) return type.status();
  s.type = *type;
  if (!f.output_type.empty()) {
    auto ot = q::ParseTypeName(f.output_type, /*allow_float=*/true);
    if (!ot.ok()) {
      return absl::InvalidArgumentError(pd::StrCat("--output-type: ", ot.status().message()));
    }
    s.output_type = *ot;
  }
  s.seed = f.seed;
  s.threads = f.threads;
  return s;
}

}  // namespace

CLI::App* AddSynthModelCommand(CLI::App& app, SynthModelFlags* f) {
  CLI::App* c = app.add_subcommand(
      "synth-model",
      "write a random-weight Llama GGUF model of a given shape (built-in --shape, or the sizes), "
      "with a synthetic SentencePiece vocabulary: a test or benchmark model made without Python "
      "or a network (docs/quantization.md, \"Synthetic models\")");
  c->option_defaults()->always_capture_default(false);  // "=0" would read as a real default
  c->add_option("output", f->output, "output GGUF file (written to OUTPUT.tmp, then renamed)");
  c->add_option("--shape", f->shape, "a built-in shape (below), or 'list' to print them");
  c->add_option("--layers", f->layers, "transformer blocks")->check(CLI::PositiveNumber);
  c->add_option("--embd", f->embd, "embedding width (n_embd)")->check(CLI::PositiveNumber);
  c->add_option("--heads", f->heads, "attention heads")->check(CLI::PositiveNumber);
  c->add_option("--kv-heads", f->kv_heads, "key/value heads (default: --heads)")
      ->check(CLI::PositiveNumber);
  c->add_option("--ff", f->ff, "feed-forward width (n_ff)")->check(CLI::PositiveNumber);
  c->add_option("--vocab", f->vocab, "vocabulary size (>= 259)")->check(CLI::PositiveNumber);
  c->add_option("--head-dim", f->head_dim,
                "head dimension (default: embd / heads; another value is written as "
                "attention.key_length)")
      ->check(CLI::PositiveNumber);
  c->add_option("--ctx", f->ctx, "trained context length (default 4096)")
      ->check(CLI::PositiveNumber);
  c->add_option("--rope-base", f->rope_base, "rope frequency base (default 10000)")
      ->check(CLI::PositiveNumber);
  c->add_option("--rms-eps", f->rms_eps, "RMSNorm epsilon (default 1e-5)")
      ->check(CLI::PositiveNumber);
  c->add_option("--type", f->type,
                "type of every matrix, token_embd included: f32, f16, bf16, q8_0, q5_0, q4_0, "
                "q2_K, q3_K, q4_K, q5_K, q6_K, w8a8, w4a16 (norms stay f32); required");
  c->add_option("--output-type", f->output_type,
                "type of output.weight (default: --type; llama.cpp's Q4_K_M uses q6_K)");
  c->add_flag("--tied", f->tied, "no output.weight: the head reuses token_embd");
  c->add_option("--seed", f->seed, "random seed: the same seed writes the same bytes (default 1)");
  c->add_option("-t,--threads", f->threads, "threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  c->footer("Shapes:\n" + q::DescribeSynthShapes() +
            "Explicit size flags override the shape's fields.");
  return c;
}

int RunSynthModel(const SynthModelFlags& f) {
  if (f.shape == "list") {
    std::fputs(q::DescribeSynthShapes().c_str(), stdout);
    return 0;
  }
  if (f.output.empty()) return FailSynth(absl::InvalidArgumentError("OUTPUT is required"));
  if (f.type.empty()) return FailSynth(absl::InvalidArgumentError("--type is required"));
  auto spec = SpecFromFlags(f);
  if (!spec.ok()) return FailSynth(spec.status());
  auto plan = q::PlanSynthModel(*spec);
  if (!plan.ok()) return FailSynth(plan.status());
  const double params = static_cast<double>(plan->n_params);
  std::fprintf(stderr,
               "pdctl synth-model: %s: %d layers, embd %d, heads %d/%d kv, ff %d, vocab %d, %s, "
               "%.*f%s params, %.1f MiB\n",
               spec->name.c_str(), spec->n_layer, spec->n_embd, spec->n_head, spec->n_head_kv,
               spec->n_ff, spec->n_vocab, std::string(engine::Traits(spec->type).name).c_str(),
               params >= 1e9 ? 2 : 1, params >= 1e9 ? params / 1e9 : params / 1e6,
               params >= 1e9 ? "B" : "M", static_cast<double>(plan->file_bytes) / (1 << 20));

  std::unique_ptr<q::Progress> progress = q::MakeStderrProgress();
  const auto start = std::chrono::steady_clock::now();
  absl::Status s;
  {
    TmpFileGuard guard(f.output + ".tmp");
    s = q::WriteSynthModel(*spec, f.output, *progress);
  }
  if (!s.ok()) return FailSynth(s);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s (%.1f MiB) in %.1f s\n", f.output.c_str(),
              static_cast<double>(plan->file_bytes) / (1 << 20), secs);
  return 0;
}

}  // namespace pd::tools
