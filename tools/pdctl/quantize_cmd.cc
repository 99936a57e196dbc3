#include "tools/pdctl/quantize_cmd.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/strings.h"
#include "engine/convert/hf_convert.h"
#include "engine/quant/quantize/draft_model.h"
#include "engine/quant/quantize/policy.h"
#include "engine/quant/quantize/progress.h"
#include "engine/quant/quantize/quantize_model.h"
#include "engine/quant/quantize/texts.h"
#include "tools/pdctl/cli_util.h"

namespace pd::tools {
namespace {

namespace q = engine::quantize;

int FailQuantize(const absl::Status& s) {
  std::fprintf(stderr, "pdctl quantize: error: %s\n", std::string(s.message()).c_str());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kOutOfRange:
      return 2;
    default:
      return 1;
  }
}

}  // namespace

CLI::App* AddQuantizeCommand(CLI::App& app, QuantizeFlags* f) {
  CLI::App* c = app.add_subcommand(
      "quantize",
      "quantize a GGUF model (F32/F16/BF16, or an already quantized one) to q8_0, q4_0, q2_K, "
      "q3_K, q4_K, q5_K, q6_K, or pdserve's own w8a8 / w4a16, with a mixed-precision policy; "
      "prints a per-tensor table. With --draft: a self-draft model for speculative decoding "
      "(docs/quantization.md, \"Draft models\")");
  c->add_option("input", f->input, "input GGUF model, or a Hugging Face checkpoint folder")
      ->required();
  c->add_option("output", f->output, "output GGUF file (written to OUTPUT.tmp, then renamed)")
      ->required();
  c->add_option("--type", f->type,
                "base type: q8_0, q4_0, q2_K, q3_K, q4_K, q5_K, q6_K, w8a8 (INT8 weights and "
                "per-token INT8 activations), w4a16 (INT4 groups of 128, float activations); "
                "required unless --draft (default there: q3_K)");
  c->add_option("--method", f->method,
                "rtn (round to nearest, the default), importance (scale search weighted by "
                "calibration activations; the default with --draft), gptq (error compensation "
                "through the calibration Hessian)");
  c->add_option("--policy", f->policy,
                "mixed-precision policy: S, M (the default), L (built in, docs/quantization.md) or "
                "a YAML file; --draft defaults to S");
  c->add_option("--override", f->overrides,
                "REGEX=TYPE: tensors whose whole name matches get TYPE (repeatable, first match "
                "wins, before the policy), e.g. 'blk\\.[0-3]\\..*=q6_K'");
  c->add_option("--calib", f->calib,
                "calibration text file (default for importance/gptq: the built-in text)");
  c->add_option("--calib-tokens", f->calib_tokens,
                "calibration tokens in total (default 16384; 4096 with --draft)")
      ->check(CLI::PositiveNumber);
  c->add_option("--chunk", f->chunk_tokens, "calibration tokens per forward pass")
      ->check(CLI::Range(16, 1 << 16));
  c->add_flag("--eval-hessian", f->eval_hessian,
              "collect X^T X also for rtn/importance so that x_err is exact (comparisons)");
  c->add_option("--hessian-mib", f->hessian_mib,
                "memory for X^T X held at once; more groups take more calibration passes")
      ->check(CLI::PositiveNumber);
  c->add_option("-t,--threads", f->threads, "threads (0 = all cores)");
  c->add_option("--damp", f->damp, "GPTQ dampening, relative to mean(diag H)")
      ->check(CLI::Range(0.0, 10.0));
  c->add_option("--gptq-block", f->gptq_block, "GPTQ lazy-update batch (columns)")
      ->check(CLI::Range(1, 1 << 20));
  c->add_flag("--no-act-order", f->no_act_order, "GPTQ: keep the column order");
  c->add_option("--smooth-alpha", f->smooth_alpha,
                "w8a8 SmoothQuant strength in [0, 1]: s = max|X|^a / max|W|^(1-a) per input "
                "channel");
  c->add_flag("--no-smooth", f->no_smooth,
              "w8a8: no SmoothQuant migration (and no calibration run for it)");
  c->add_flag("--draft", f->draft,
              "write a draft model for speculative decoding: the same tokenizer and input "
              "embeddings, low-bit layers, and an output head restricted to --draft-vocab tokens "
              "(special and end-of-generation tokens, then the most frequent in the calibration "
              "text, then the tokenizer's prior), listed in pdserve.draft.head_tokens. The last "
              "10% of the calibration text is held out: the report gives the top-1 agreement "
              "of draft and target there (the greedy acceptance estimate)");
  c->add_option("--draft-vocab", f->draft_vocab,
                "--draft: rows of the draft's output head (more if the special tokens need more)")
      ->check(CLI::Range(1, 1 << 24));
  c->add_option("--draft-eval-tokens", f->draft_eval_tokens,
                "--draft: held-out positions compared for the agreement (0: none)")
      ->check(CLI::NonNegativeNumber);
  return c;
}

int RunQuantize(const QuantizeFlags& f) {
  q::QuantizeOptions o;
  o.input = f.input;
  o.output = f.output;
  o.open_input = engine::OpenModelFile;  // a GGUF, or a Hugging Face folder
  if (f.type.empty() && !f.draft) {
    return FailQuantize(absl::InvalidArgumentError("--type is required (or --draft)"));
  }
  auto type = q::ParseTypeName(f.type.empty() ? "q3_K" : f.type);
  if (!type.ok()) return FailQuantize(type.status());
  o.type = *type;
  auto method = q::ParseMethod(!f.method.empty() ? f.method : f.draft ? "importance" : "rtn");
  if (!method.ok()) return FailQuantize(method.status());
  o.method = *method;
  o.policy = !f.policy.empty() ? f.policy : f.draft ? "S" : "M";
  o.overrides = f.overrides;
  o.calib_file = f.calib;
  o.calib_tokens = f.calib_tokens > 0 ? f.calib_tokens : f.draft ? 4096 : 16384;
  o.chunk_tokens = f.chunk_tokens;
  o.eval_hessian = f.eval_hessian;
  o.hessian_budget_bytes = static_cast<uint64_t>(f.hessian_mib) << 20;
  o.threads = f.threads;
  o.gptq.damp = f.damp;
  o.gptq.block_size = f.gptq_block;
  o.gptq.act_order = !f.no_act_order;
  o.smooth = !f.no_smooth;
  o.smooth_alpha = f.smooth_alpha;
  if (o.method == q::Method::kRtn && !o.calib_file.empty()) {
    std::fprintf(stderr, "pdctl quantize: note: --method rtn uses --calib only to report x_err\n");
  }

  std::unique_ptr<q::Progress> progress = q::MakeStderrProgress();
  std::string table;
  if (f.draft) {
    q::DraftOptions d;
    d.quant = o;
    d.head_rows = f.draft_vocab;
    d.eval_tokens = f.draft_eval_tokens;
    absl::StatusOr<q::DraftReport> report = [&] {
      TmpFileGuard guard(f.output + ".tmp");
      return q::QuantizeDraft(d, *progress);
    }();
    if (!report.ok()) return FailQuantize(report.status());
    table = q::FormatDraftReport(*report);
  } else {
    absl::StatusOr<q::QuantizeReport> report = [&] {
      TmpFileGuard guard(f.output + ".tmp");
      return q::QuantizeModel(o, *progress);
    }();
    if (!report.ok()) return FailQuantize(report.status());
    table = q::FormatReport(*report);
  }
  std::fwrite(table.data(), 1, table.size(), stdout);
  std::fflush(stdout);
  return 0;
}

CLI::App* AddTextsCommand(CLI::App& app, TextsFlags* f) {
  CLI::App* c = app.add_subcommand(
      "texts",
      "write the built-in calibration or evaluation text (Debian fortunes, pinned by "
      "testdata/texts/manifest.json)");
  c->add_option("kind", f->kind, "calibration or evaluation")
      ->required()
      ->check(CLI::IsMember({"calibration", "evaluation"}));
  c->add_option("-o,--out", f->out, "output file (default: stdout)");
  return c;
}

int RunTexts(const TextsFlags& f) {
  auto text = q::BuiltinText(f.kind == "calibration" ? q::TextKind::kCalibration
                                                     : q::TextKind::kEvaluation);
  if (!text.ok()) {
    std::fprintf(stderr, "pdctl texts: error: %s\n", std::string(text.status().message()).c_str());
    return 2;
  }
  if (f.out.empty()) {
    std::fwrite(text->data(), 1, text->size(), stdout);
    return 0;
  }
  std::ofstream out(f.out, std::ios::binary);
  out.write(text->data(), static_cast<std::streamsize>(text->size()));
  if (!out) {
    std::fprintf(stderr, "pdctl texts: error: cannot write '%s'\n", f.out.c_str());
    return 2;
  }
  return 0;
}

}  // namespace pd::tools
