#include "engine/quant/quantize/draft_model.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string_view>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/gguf.h"
#include "engine/model/vocab_match.h"
#include "engine/quant/quantize/calibration.h"
#include "engine/quant/quantize/texts.h"
#include "engine/runtime/model.h"

namespace pd::engine::quantize {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(pd::StrCat("cannot read calibration text '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(pd::StrCat("cannot read calibration text '", path, "'"));
  return ss.str();
}

// Splits `text` so that about `fraction` of its bytes form the held-out tail, cut at the next
// paragraph break (else line break) so that no entry is shared.
std::pair<std::string_view, std::string_view> SplitHeldOut(std::string_view text, double fraction) {
  if (fraction <= 0 || text.empty()) return {text, {}};
  size_t cut = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - fraction));
  size_t at = text.find("\n\n", cut);
  if (at == std::string_view::npos) at = text.find('\n', cut);
  if (at != std::string_view::npos) cut = at;
  while (cut < text.size() && text[cut] == '\n') ++cut;
  return {text.substr(0, cut), text.substr(cut)};
}

uint64_t StepBytes(const GgufFile& f) {
  const bool tied = f.FindTensor("output.weight") == nullptr;
  uint64_t bytes = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name != "token_embd.weight" || tied) bytes += t.nbytes;
  }
  return bytes;
}

int32_t Argmax(const float* row, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return best;
}

// Milliseconds per single-token step of `model` (after one warm-up step), feeding `tokens`.
absl::StatusOr<double> TimeDecode(Model& model, absl::Span<const int32_t> tokens) {
  constexpr int kBlock = 16;
  const int n = static_cast<int>(tokens.size());
  PD_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> kv,
      KvCache::Create(model.KvOptions((n + kBlock - 1) / kBlock + 1, KvDType::kF16, kBlock),
                      model.backend()));
  PD_RETURN_IF_ERROR(kv->Reserve(0, n));
  std::vector<float> logits;
  Clock::time_point start;
  for (int i = 0; i < n; ++i) {
    if (i == 1) start = Clock::now();
    Batch b;
    b.Add(tokens[i], i, 0, true);
    PD_RETURN_IF_ERROR(model.Forward(b, *kv, &logits));
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  kv->Free(0);
  return n > 1 ? ms / (n - 1) : 0.0;
}

// Runs every chunk through both models (64 positions per forward, all of them scored) and
// counts the positions where their argmax agree, and where the target's is in the draft's head.
absl::Status MeasureAgreement(Model& target, Model& draft,
                              const std::vector<std::vector<int32_t>>& chunks,
                              const std::vector<bool>& in_head, Progress& progress,
                              DraftReport& r) {
  constexpr int kBlock = 16, kStep = 64;
  size_t longest = 0;
  int64_t total = 0;
  for (const auto& c : chunks) {
    longest = std::max(longest, c.size());
    total += static_cast<int64_t>(c.size());
  }
  const int n_blocks = static_cast<int>((longest + kBlock - 1) / kBlock) + 1;
  PD_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> kv_t,
      KvCache::Create(target.KvOptions(n_blocks, KvDType::kF16, kBlock), target.backend()));
  PD_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> kv_d,
      KvCache::Create(draft.KvOptions(n_blocks, KvDType::kF16, kBlock), draft.backend()));
  const int n_vocab = target.config().n_vocab;
  progress.Start("agreement (target vs draft)", total, "tokens");
  int64_t agree = 0, covered = 0, done = 0;
  std::vector<float> lt, ld;
  for (const auto& c : chunks) {
    const int len = static_cast<int>(c.size());
    PD_RETURN_IF_ERROR(kv_t->Reserve(0, len));
    PD_RETURN_IF_ERROR(kv_d->Reserve(0, len));
    for (int start = 0; start < len; start += kStep) {
      Batch b;
      for (int i = start; i < std::min(len, start + kStep); ++i) b.Add(c[i], i, 0, true);
      PD_RETURN_IF_ERROR(target.Forward(b, *kv_t, &lt));
      PD_RETURN_IF_ERROR(draft.Forward(b, *kv_d, &ld));
      for (size_t j = 0; j < b.size(); ++j) {
        const int32_t t = Argmax(lt.data() + j * n_vocab, n_vocab);
        const int32_t d = Argmax(ld.data() + j * n_vocab, n_vocab);
        agree += t == d;
        covered += in_head[t];
      }
      done += static_cast<int64_t>(b.size());
      progress.Update(done);
    }
    kv_t->Free(0);
    kv_d->Free(0);
  }
  progress.Finish();
  r.eval_positions = done;
  r.agreement = done > 0 ? static_cast<double>(agree) / done : 0;
  r.head_coverage = done > 0 ? static_cast<double>(covered) / done : 0;
  return absl::OkStatus();
}

// The calibration text (the file, or the built-in text when `file` is empty) and where it came
// from.
absl::StatusOr<std::pair<std::string, std::string>> CalibrationText(const std::string& file) {
  std::pair<std::string, std::string> out;
  if (file.empty()) {
    PD_ASSIGN_OR_RETURN(out.first, BuiltinText(TextKind::kCalibration));
    out.second = "built-in calibration text (Debian fortunes, testdata/texts)";
  } else {
    PD_ASSIGN_OR_RETURN(out.first, ReadText(file));
    out.second = file;
  }
  if (out.first.empty()) return absl::InvalidArgumentError("calibration text is empty");
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> HeadTokenizer(const GgufFile& target) {
  auto tokenizer = Tokenizer::FromGguf(target);
  if (!tokenizer.ok()) {
    return absl::FailedPreconditionError(
        pd::StrCat("a draft's head is ranked on the target's tokens, but its tokenizer cannot be "
                   "loaded: ",
                   tokenizer.status().message()));
  }
  return std::move(*tokenizer);
}

}  // namespace

HeadSelection SelectHeadTokens(const Tokenizer& tok, absl::Span<const int32_t> text_ids, int n) {
  const int32_t n_vocab = tok.n_vocab();
  std::vector<bool> taken(n_vocab, false);
  HeadSelection s;
  auto take = [&](int32_t id) {
    if (!tok.IsValid(id) || taken[id]) return false;
    taken[id] = true;
    s.ids.push_back(id);
    return true;
  };
  // Tokens the draft must be able to say: markup and turn tokens, and whatever ends a generation
  // (a draft that cannot propose EOS stalls every reply's last step). Unused placeholders are not
  // (Gemma 3 has 6,242 "<unusedN>" control tokens that no text contains).
  for (int32_t id = 0; id < n_vocab; ++id) {
    const uint32_t a = tok.token_attrs(id);
    if ((a & TokenAttr::kUnused) != 0) continue;
    if ((a & (TokenAttr::kControl | TokenAttr::kUserDefined)) != 0) s.special += take(id);
  }
  for (int32_t id : {tok.bos(), tok.eos(), tok.eot(), tok.eom(), tok.unk(), tok.pad()}) {
    s.special += take(id);
  }
  for (int32_t id : tok.eog_ids()) s.special += take(id);

  const size_t want = static_cast<size_t>(std::clamp(n, 0, n_vocab));
  // By frequency in the text (ties: lower id first).
  std::vector<int64_t> count(n_vocab, 0);
  for (int32_t id : text_ids) {
    if (tok.IsValid(id)) ++count[id];
  }
  std::vector<int32_t> order;
  for (int32_t id = 0; id < n_vocab; ++id) {
    if (count[id] > 0 && !taken[id]) order.push_back(id);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return count[a] > count[b]; });
  for (int32_t id : order) {
    if (s.ids.size() >= want) break;
    s.from_text += take(id);
  }
  // The tokenizer's prior: SPM scores are log-probabilities of the pieces; BPE ids follow the
  // merge order, which follows frequency in the tokenizer's training data.
  order.clear();
  for (int32_t id = 0; id < n_vocab && s.ids.size() + order.size() < static_cast<size_t>(n_vocab);
       ++id) {
    const TokenType type = tok.token_type(id);
    if (taken[id] || (tok.token_attrs(id) & TokenAttr::kUnused) != 0 ||
        type == TokenType::kUnused || type == TokenType::kUndefined) {
      continue;
    }
    order.push_back(id);
  }
  if (tok.model() == TokenizerModel::kSpm) {
    // Byte tokens carry a placeholder score (0, above every real piece's log-probability) and
    // only spell what no piece covers: they come last.
    auto is_byte = [&](int32_t id) { return tok.token_type(id) == TokenType::kByte; };
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      if (is_byte(a) != is_byte(b)) return is_byte(b);
      return tok.token_score(a) > tok.token_score(b);
    });
  }
  for (int32_t id : order) {
    if (s.ids.size() >= want) break;
    s.from_prior += take(id);
  }
  std::sort(s.ids.begin(), s.ids.end());
  return s;
}

absl::StatusOr<HeadSelection> DraftHeadTokens(const GgufFile& target, int n,
                                              const std::string& calib_file,
                                              double heldout_fraction) {
  if (n < 1) return absl::InvalidArgumentError(pd::StrCat("head rows ", n, " must be >= 1"));
  PD_ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tok, HeadTokenizer(target));
  PD_ASSIGN_OR_RETURN(const auto text_source, CalibrationText(calib_file));
  const std::string_view calib = SplitHeldOut(text_source.first, heldout_fraction).first;
  return SelectHeadTokens(*tok, tok->Encode(calib, false, false), n);
}

absl::StatusOr<DraftReport> QuantizeDraft(const DraftOptions& o, Progress& progress) {
  const auto t0 = Clock::now();
  if (o.head_rows < 1) {
    return absl::InvalidArgumentError(pd::StrCat("--draft-vocab ", o.head_rows, " must be >= 1"));
  }
  if (!(o.heldout_fraction >= 0 && o.heldout_fraction <= 0.5)) {
    return absl::InvalidArgumentError(
        pd::StrCat("held-out fraction ", o.heldout_fraction, " is not in [0, 0.5]"));
  }
  DraftReport r;
  auto opened = o.quant.open_input ? o.quant.open_input(o.quant.input)
                                   : GgufFile::Open(o.quant.input);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(), pd::StrCat("cannot read input '", o.quant.input,
                                                           "': ", opened.status().message()));
  }
  std::shared_ptr<const GgufFile> target_file(std::move(*opened));
  r.target_bytes = target_file->file_size();
  PD_ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tokenizer, HeadTokenizer(*target_file));
  const Tokenizer& tok = *tokenizer;
  r.n_vocab = tok.n_vocab();

  // The text: its head part ranks the head tokens and calibrates; its tail measures agreement.
  PD_ASSIGN_OR_RETURN(const auto text_source, CalibrationText(o.quant.calib_file));
  const auto& [text, source] = text_source;
  const auto [calib, heldout] = SplitHeldOut(text, o.heldout_fraction);
  const std::vector<int32_t> ids = tok.Encode(calib, false, false);
  r.text_tokens = static_cast<int64_t>(ids.size());
  r.head = SelectHeadTokens(tok, ids, o.head_rows);
  progress.Note(absl::StrFormat(
      "draft head: %d of %d tokens (%d special, %d from %d tokens of text, %d by the tokenizer's "
      "prior)",
      r.head.ids.size(), r.n_vocab, r.head.special, r.head.from_text, r.text_tokens,
      r.head.from_prior));

  QuantizeOptions q = o.quant;
  q.head_tokens = r.head.ids;
  q.calib_text = std::string(calib);
  q.calib_text_source = heldout.empty() ? source : pd::StrCat(source, ", less its held-out tail");
  PD_ASSIGN_OR_RETURN(r.quant, QuantizeModel(q, progress));
  r.draft_bytes = r.quant.file_bytes;

  // Agreement on the held-out tail, with our engine on the CPU.
  PD_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> draft_opened, GgufFile::Open(q.output));
  std::shared_ptr<const GgufFile> draft_file(std::move(draft_opened));
  PD_RETURN_IF_ERROR(CheckSameVocabulary(*target_file, *draft_file));
  r.target_step_bytes = StepBytes(*target_file);
  r.draft_step_bytes = StepBytes(*draft_file);
  CpuBackendOptions bo;
  bo.threads = o.quant.threads;
  std::unique_ptr<Backend> backend = CreateCpuBackend(bo);
  auto target = Model::Load(target_file, *backend);
  if (!target.ok()) {
    return absl::FailedPreconditionError(
        pd::StrCat("the draft is written, but the target cannot be run to measure it: ",
                   target.status().message()));
  }
  PD_ASSIGN_OR_RETURN(std::unique_ptr<Model> draft, Model::Load(draft_file, *backend));
  std::vector<bool> in_head(r.n_vocab, false);
  for (int32_t id : r.head.ids) in_head[id] = true;
  int chunk = std::max(16, o.quant.chunk_tokens);
  chunk = std::min(chunk, (*target)->config().n_ctx_train);
  const auto chunks = heldout.empty() || o.eval_tokens <= 0
                          ? std::vector<std::vector<int32_t>>{}
                          : MakeCalibrationChunks(tok, heldout, chunk, o.eval_tokens);
  PD_RETURN_IF_ERROR(MeasureAgreement(**target, *draft, chunks, in_head, progress, r));
  if (o.decode_steps > 1 && !chunks.empty()) {
    const auto& c = chunks.front();
    const size_t n = std::min(c.size(), static_cast<size_t>(o.decode_steps));
    const absl::Span<const int32_t> tokens(c.data(), n);
    PD_ASSIGN_OR_RETURN(r.target_ms_per_token, TimeDecode(**target, tokens));
    PD_ASSIGN_OR_RETURN(r.draft_ms_per_token, TimeDecode(*draft, tokens));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

std::string FormatDraftReport(const DraftReport& r) {
  std::string out = FormatReport(r.quant);
  out += absl::StrFormat(
      "draft: %.2f MiB, %.1f%% of the target's %.2f MiB; head: %d of %d tokens (%d special, %d "
      "from the text, %d by the tokenizer's prior)\n",
      r.draft_bytes / 1048576.0, r.target_bytes > 0 ? 100.0 * r.draft_bytes / r.target_bytes : 0,
      r.target_bytes / 1048576.0, r.head.ids.size(), r.n_vocab, r.head.special, r.head.from_text,
      r.head.from_prior);
  out += absl::StrFormat("weights read per decode step: draft %.2f MiB, target %.2f MiB (%.2fx)\n",
                         r.draft_step_bytes / 1048576.0, r.target_step_bytes / 1048576.0,
                         r.draft_step_bytes > 0
                             ? static_cast<double>(r.target_step_bytes) / r.draft_step_bytes
                             : 0);
  if (r.eval_positions > 0) {
    out += absl::StrFormat(
        "top-1 agreement with the target: %.4f over %d held-out positions (greedy acceptance "
        "estimate); the target's top-1 is in the draft's head at %.4f of them\n",
        r.agreement, r.eval_positions, r.head_coverage);
  } else {
    out += "top-1 agreement: not measured (no held-out text)\n";
  }
  if (r.target_ms_per_token > 0) {
    out += absl::StrFormat(
        "decode step on the CPU: target %.2f ms, draft %.2f ms per token (%.2fx)\n",
        r.target_ms_per_token, r.draft_ms_per_token,
        r.draft_ms_per_token > 0 ? r.target_ms_per_token / r.draft_ms_per_token : 0);
  }
  out += absl::StrFormat("draft done in %.1f s\n", r.seconds);
  return out;
}

}  // namespace pd::engine::quantize
