// int8_wire_kl: what INT8 compression of the KV transfer ("INT8 on the wire") costs in decode
// accuracy, on a real model, through the real wire codec (kvtransfer/kv_codec.h).
//
// Per prompt (real text, tokenized by the model's tokenizer, BOS first), in one process on the
// CPU backend:
//   A  the prefill node: Model::Forward over the prompt into an F16 cache; its last logits give
//      the first token (as the prefill node's would).
//   C  the uncompressed wire: each layer of A packed with PackLayer(wire F16) and imported with
//      ImportLayer into a second F16 cache (other block ids). Must equal A bit for bit: the
//      prompt blocks are compared byte for byte, and A decodes in lockstep with C, logits
//      compared bitwise at every step.
//   B  the INT8 wire: PackLayer(wire INT8, per token and head scales) + ImportLayer into an F16
//      cache (INT8 expanded to F16). Only the prompt's K/V pass through INT8; the tokens decoded
//      on B are stored F16, as on a decode node.
//   D  (unless --no-int8-cache) the INT8 wire into an INT8 cache: the decode node's cache is INT8
//      too, so the decoded tokens' K/V are INT8 as well.
// C decodes --steps tokens greedily; B, D (and the diagnostic variants) decode teacher-forced on
// C's tokens, so every step compares the distributions of the same context: KL(p_C || p_X) over
// the full vocabulary (F64 log-softmax, nats) and agreement of the argmax.
//
// A control variant always runs: the F16 wire with the last mantissa bit of every prompt K/V value
// made random (a change of at most one F16 ulp, ~2^-11 relative, a tenth of an INT8 step): the KL
// any rounding-level change to the prompt KV costs this model.
// --floor adds C's prompt KV decoded on the scalar kernels (same bytes, F32 additions in another
// order): the KL that rounding-level noise alone causes in this model's decode.
// --diagnose-prompts K adds, for the first K prompts of each length, variants where only some of
// the prompt's K/V pass through INT8: only K, only V, only the sliding-window layers, only the
// global layers, and each layer alone.
//
// Output: a markdown table on stdout and, with --json, the numbers (bench/kv_transfer/
// int8_wire_kl.py writes them into bench/results/). Cost per prompt: one prefill, then per step
// one single-token Forward per variant (plus A's) and one log-softmax over the vocabulary each.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/kv_int8/kl_divergence.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/gguf.h"
#include "engine/model/model_finder.h"
#include "engine/runtime/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "kvtransfer/kv_codec.h"
#include "kvtransfer/kv_transport.h"

namespace pd::bench {
namespace {

using engine::KvDType;
using engine::KvPart;

constexpr double kKlTarget = 1e-3;

struct Flags {
  std::string model, text, json;
  std::vector<int> lengths = {100, 500, 2000};
  int prompts = 2, steps = 64, threads = 2, block = 16, chunk = 256, diagnose_prompts = 0;
  bool floor = false, no_int8_cache = false;
};

// One way of getting the prompt's K/V to the decode side. int8[2 * layer + part]: that (layer,
// K or V) goes through the INT8 wire, else through the F16 wire.
struct Variant {
  std::string name;
  KvDType cache_dtype = KvDType::kF16;
  std::vector<bool> int8;
  bool scalar = false;      // decode on the scalar-kernel model
  bool ulp_noise = false;   // F16 wire with the last mantissa bit of each value made random
  bool diagnostic = false;  // only for the first --diagnose-prompts prompts of each length
};

struct Stats {
  std::vector<double> kl;  // one per step, over all prompts
  int64_t agree = 0;
  double Mean() const {
    double s = 0;
    for (double x : kl) s += x;
    return kl.empty() ? 0 : s / double(kl.size());
  }
  double Quantile(double q) const {
    if (kl.empty()) return 0;
    std::vector<double> v = kl;
    std::sort(v.begin(), v.end());
    // Nearest rank: the smallest value with at least q of the values at or below it.
    const double rank = std::ceil(q * double(v.size()));
    return v[std::clamp<size_t>(static_cast<size_t>(rank), 1, v.size()) - 1];
  }
  double Max() const { return kl.empty() ? 0 : *std::max_element(kl.begin(), kl.end()); }
  double Top1() const { return kl.empty() ? 0 : double(agree) / double(kl.size()); }
};

struct Prompt {
  std::vector<int32_t> ids;
  int length_class = 0;  // the --lengths entry it was cut for
  int index = 0;         // within its length class
};

// The prompt's layers as they travel: one payload per layer per wire dtype.
struct Wire {
  kvtransfer::TransferGeometry g16, g8;
  std::vector<std::vector<uint8_t>> f16, i8;  // [layer] payload bytes
};

absl::StatusOr<Wire> Pack(engine::KvCache& a, int64_t seq, int n_tokens) {
  Wire w;
  w.g16 = kvtransfer::TransferGeometry::ForCache(a.options(), n_tokens, KvDType::kF16);
  w.g8 = kvtransfer::TransferGeometry::ForCache(a.options(), n_tokens, KvDType::kI8);
  const int n_layer = a.options().n_layer;
  for (int l = 0; l < n_layer; ++l) {
    PD_ASSIGN_OR_RETURN(std::vector<engine::KvSpan> spans, a.ExportSpans(seq, l));
    w.f16.emplace_back(w.g16.LayerBytes());
    w.i8.emplace_back(w.g8.LayerBytes());
    PD_RETURN_IF_ERROR(
        kvtransfer::PackLayer(w.g16, a.options().dtype, l, spans, absl::MakeSpan(w.f16.back())));
    PD_RETURN_IF_ERROR(
        kvtransfer::PackLayer(w.g8, a.options().dtype, l, spans, absl::MakeSpan(w.i8.back())));
  }
  return w;
}

// Imports the prompt into `seq` of `cache` (freed first) as `v` says, through ImportLayer; where a
// layer mixes wires, its INT8-wire import is followed by KvCache::Import of the F16-wire spans.
absl::Status Receive(const Wire& w, const Variant& v, engine::KvCache& cache, int64_t seq) {
  cache.Free(seq);
  PD_RETURN_IF_ERROR(cache.Reserve(seq, w.g16.n_tokens));
  kvtransfer::TransferGeometry g16 = w.g16, g8 = w.g8;
  g16.receiver_dtype = g8.receiver_dtype = cache.options().dtype;
  const size_t span16 = g16.SpanBytes(KvDType::kF16);
  for (int l = 0; l < g16.n_layer; ++l) {
    const bool k8 = v.int8[2 * l], v8 = v.int8[2 * l + 1];
    if (!k8 && !v8 && v.ulp_noise) {
      // Every F16 value moved by at most one unit in the last place (~2^-11 relative), about a
      // tenth of INT8's rounding step: what any rounding-level change to the prompt KV costs.
      std::vector<uint8_t> noisy = w.f16[l];
      std::mt19937 rng(1234 + l);
      for (size_t i = 0; i + 1 < noisy.size(); i += 2) noisy[i] ^= rng() & 1;  // little-endian LSB
      PD_RETURN_IF_ERROR(kvtransfer::ImportLayer(g16, l, noisy, cache, seq));
      continue;
    }
    if (!k8 && !v8) {
      PD_RETURN_IF_ERROR(kvtransfer::ImportLayer(g16, l, w.f16[l], cache, seq));
      continue;
    }
    PD_RETURN_IF_ERROR(kvtransfer::ImportLayer(g8, l, w.i8[l], cache, seq));
    if (k8 && v8) continue;
    PD_CHECK(cache.options().dtype == KvDType::kF16);
    const KvPart keep16 = k8 ? KvPart::kV : KvPart::kK;
    for (int b = 0; b < g16.n_blocks(); ++b) {
      const uint8_t* src = w.f16[l].data() + (2 * b + static_cast<int>(keep16)) * span16;
      PD_RETURN_IF_ERROR(cache.Import(seq, l, b, keep16, src, span16));
    }
  }
  return absl::OkStatus();
}

// One single-token decode step of `seq` at `pos`; `logits` gets n_vocab floats.
absl::Status Step(engine::Model& m, engine::KvCache& kv, int64_t seq, int32_t token, int pos,
                  std::vector<float>* logits) {
  PD_RETURN_IF_ERROR(kv.Reserve(seq, pos + 1));
  engine::Batch b;
  b.Add(token, pos, seq, /*want_logits=*/true);
  return m.Forward(b, kv, logits);
}

// Compares the prompt blocks of two caches byte for byte.
absl::StatusOr<bool> SameBlocks(const engine::KvCache& x, int64_t sx, const engine::KvCache& y,
                                int64_t sy) {
  for (int l = 0; l < x.options().n_layer; ++l) {
    PD_ASSIGN_OR_RETURN(std::vector<engine::KvSpan> a, x.ExportSpans(sx, l));
    PD_ASSIGN_OR_RETURN(std::vector<engine::KvSpan> b, y.ExportSpans(sy, l));
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      if (a[i].bytes != b[i].bytes || std::memcmp(a[i].data, b[i].data, a[i].bytes) != 0) {
        return false;
      }
    }
  }
  return true;
}

absl::Status Run(const Flags& f) {
  std::string model_path = f.model;
  if (model_path.empty()) {
    PD_ASSIGN_OR_RETURN(model_path, engine::FindDefaultModel());
  }
  std::ifstream in(f.text, std::ios::binary);
  if (!in) return absl::NotFoundError(pd::StrCat("cannot read '", f.text, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  if (f.steps < 1 || f.prompts < 1 || f.lengths.empty()) {
    return absl::InvalidArgumentError("bad sizes");
  }

  engine::CpuBackendOptions bo;
  bo.threads = f.threads;
  std::unique_ptr<engine::Backend> backend = engine::CreateCpuBackend(bo);
  PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::GgufFile> file, engine::GgufFile::Open(model_path));
  std::shared_ptr<const engine::GgufFile> shared(std::move(file));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model, engine::Model::Load(shared, *backend));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::Tokenizer> tok, engine::Tokenizer::FromGguf(*shared));
  std::unique_ptr<engine::Backend> scalar_backend;
  std::unique_ptr<engine::Model> scalar_model;
  if (f.floor) {
    bo.force_scalar = true;
    scalar_backend = engine::CreateCpuBackend(bo);
    PD_ASSIGN_OR_RETURN(scalar_model, engine::Model::Load(shared, *scalar_backend));
  }
  const engine::ModelConfig& cfg = model->config();
  const int64_t n_vocab = cfg.n_vocab;
  const int n_layer = cfg.n_layer;

  // Prompts: consecutive, disjoint stretches of the text, [BOS] + text tokens.
  const std::vector<int32_t> text = tok->Encode(ss.str(), /*add_special=*/false,
                                                /*parse_special=*/false);
  std::vector<Prompt> prompts;
  size_t at = 0;
  for (int p = 0; p < f.prompts; ++p) {
    for (int len : f.lengths) {
      Prompt pr;
      pr.length_class = len;
      pr.index = p;
      if (tok->add_bos()) pr.ids.push_back(tok->bos());
      const size_t take = static_cast<size_t>(len) - pr.ids.size();
      if (at + take > text.size()) {
        return absl::InvalidArgumentError(
            pd::StrCat("the text has ", text.size(), " tokens, too few for the prompts"));
      }
      pr.ids.insert(pr.ids.end(), text.begin() + at, text.begin() + at + take);
      at += take;
      prompts.push_back(std::move(pr));
    }
  }
  std::stable_sort(prompts.begin(), prompts.end(), [](const Prompt& a, const Prompt& b) {
    return a.length_class < b.length_class;
  });
  const int max_len = *std::max_element(f.lengths.begin(), f.lengths.end());

  // Variants, in table order.
  const std::vector<bool> all8(2 * n_layer, true);
  std::vector<Variant> variants;
  variants.push_back({.name = "int8 wire -> f16 cache", .int8 = all8});
  if (!f.no_int8_cache) {
    variants.push_back(
        {.name = "int8 wire -> int8 cache", .cache_dtype = KvDType::kI8, .int8 = all8});
  }
  {
    variants.push_back({.name = "f16 wire, last bit of each value random (control)",
                        .int8 = std::vector<bool>(2 * n_layer),
                        .ulp_noise = true});
  }
  if (f.floor) {
    variants.push_back({.name = "f16 wire, scalar kernels (floor)",
                        .int8 = std::vector<bool>(2 * n_layer),
                        .scalar = true});
  }
  if (f.diagnose_prompts > 0) {
    auto add = [&](std::string name, const std::function<bool(int, int)>& pick) {
      Variant v{
          .name = std::move(name), .int8 = std::vector<bool>(2 * n_layer), .diagnostic = true};
      for (int l = 0; l < n_layer; ++l) {
        for (int p = 0; p < 2; ++p) v.int8[2 * l + p] = pick(l, p);
      }
      variants.push_back(std::move(v));
    };
    add("int8: K only", [](int, int p) { return p == 0; });
    add("int8: V only", [](int, int p) { return p == 1; });
    add("int8: sliding layers only", [&](int l, int) { return cfg.IsSlidingLayer(l); });
    add("int8: global layers only", [&](int l, int) { return !cfg.IsSlidingLayer(l); });
    for (int l = 0; l < n_layer; ++l) {
      add(pd::StrCat("int8: layer ", l, cfg.IsSlidingLayer(l) ? " (sliding)" : " (global)"),
          [l](int ll, int) { return ll == l; });
    }
  }

  // + 8: the receiving caches also hold sequence 99 (up to 7 blocks).
  const int n_blocks = (max_len + f.steps + f.block - 1) / f.block + 8;
  auto make_cache = [&](KvDType t, engine::Backend& be) {
    return engine::KvCache::Create(model->KvOptions(n_blocks, t, f.block), be);
  };
  PD_ASSIGN_OR_RETURN(auto cache_a, make_cache(KvDType::kF16, *backend));
  PD_ASSIGN_OR_RETURN(auto cache_c, make_cache(KvDType::kF16, *backend));
  PD_ASSIGN_OR_RETURN(auto cache_x16, make_cache(KvDType::kF16, *backend));
  PD_ASSIGN_OR_RETURN(auto cache_x8, make_cache(KvDType::kI8, *backend));
  std::unique_ptr<engine::KvCache> cache_scalar;
  if (f.floor) {
    PD_ASSIGN_OR_RETURN(cache_scalar, make_cache(KvDType::kF16, *scalar_backend));
  }
  // The receiving caches hold another sequence first, so imports land in other block ids than A's.
  PD_RETURN_IF_ERROR(cache_c->Reserve(/*seq=*/99, 3 * f.block));
  PD_RETURN_IF_ERROR(cache_x16->Reserve(99, 5 * f.block));
  PD_RETURN_IF_ERROR(cache_x8->Reserve(99, 7 * f.block));

  std::vector<Stats> all(variants.size());
  std::map<int, std::vector<Stats>> by_length;  // main variants per prompt length
  std::vector<std::string> prompt_lines;
  bool f16_blocks_equal = true, f16_logits_equal = true;
  size_t wire16 = 0, wire8 = 0;
  int64_t wire_tokens = 0;
  std::vector<double> lp_ref, lp;
  std::vector<float> la, lx;
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int64_t kSeqA = 1, kSeq = 7;

  for (const Prompt& pr : prompts) {
    const auto tp = std::chrono::steady_clock::now();
    const int n = static_cast<int>(pr.ids.size());
    // A: the prefill node.
    cache_a->Free(kSeqA);
    PD_RETURN_IF_ERROR(cache_a->Reserve(kSeqA, n));
    std::vector<float> prefill_logits;
    for (int first = 0; first < n; first += f.chunk) {
      const int m = std::min(f.chunk, n - first);
      engine::Batch batch;
      for (int i = 0; i < m; ++i)
        batch.Add(pr.ids[first + i], first + i, kSeqA, first + i == n - 1);
      PD_RETURN_IF_ERROR(model->Forward(batch, *cache_a, &prefill_logits));
    }
    PD_ASSIGN_OR_RETURN(Wire w, Pack(*cache_a, kSeqA, n));
    wire16 += w.g16.TotalBytes();
    wire8 += w.g8.TotalBytes();
    wire_tokens += n;

    // C: the uncompressed wire; greedy decode, A in lockstep (bitwise), reference logits kept.
    PD_RETURN_IF_ERROR(
        Receive(w, {.name = "f16", .int8 = std::vector<bool>(2 * n_layer)}, *cache_c, kSeq));
    PD_ASSIGN_OR_RETURN(bool same, SameBlocks(*cache_a, kSeqA, *cache_c, kSeq));
    f16_blocks_equal = f16_blocks_equal && same;
    std::vector<int32_t> tokens = {static_cast<int32_t>(ArgMax(prefill_logits.data(), n_vocab))};
    std::vector<std::vector<float>> ref(f.steps);
    for (int s = 0; s < f.steps; ++s) {
      PD_RETURN_IF_ERROR(Step(*model, *cache_c, kSeq, tokens[s], n + s, &ref[s]));
      PD_RETURN_IF_ERROR(Step(*model, *cache_a, kSeqA, tokens[s], n + s, &la));
      if (la.size() != ref[s].size() ||
          std::memcmp(la.data(), ref[s].data(), la.size() * sizeof(float)) != 0) {
        f16_logits_equal = false;
      }
      tokens.push_back(static_cast<int32_t>(ArgMax(ref[s].data(), n_vocab)));
    }
    std::vector<std::vector<double>> ref_lp(f.steps);
    for (int s = 0; s < f.steps; ++s) LogSoftmax(ref[s].data(), n_vocab, &ref_lp[s]);

    std::string line = pd::StrCat("prompt ", pr.length_class, "#", pr.index, " (", n, " tokens):");
    std::vector<Stats>& lens = by_length[pr.length_class];
    lens.resize(variants.size());
    for (size_t k = 0; k < variants.size(); ++k) {
      const Variant& v = variants[k];
      if (v.diagnostic && pr.index >= f.diagnose_prompts) continue;
      engine::KvCache& kv = v.scalar                        ? *cache_scalar
                            : v.cache_dtype == KvDType::kI8 ? *cache_x8
                                                            : *cache_x16;
      engine::Model& m = v.scalar ? *scalar_model : *model;
      PD_RETURN_IF_ERROR(Receive(w, v, kv, kSeq));
      Stats one;
      for (int s = 0; s < f.steps; ++s) {
        PD_RETURN_IF_ERROR(Step(m, kv, kSeq, tokens[s], n + s, &lx));
        LogSoftmax(lx.data(), n_vocab, &lp);
        one.kl.push_back(KlDivergence(ref_lp[s], lp));
        one.agree += ArgMax(lx.data(), n_vocab) == tokens[s + 1];
      }
      for (Stats* st : {&all[k], &lens[k]}) {
        st->kl.insert(st->kl.end(), one.kl.begin(), one.kl.end());
        st->agree += one.agree;
      }
      if (!v.diagnostic) {
        char buf[160];
        std::snprintf(buf, sizeof buf, " [%s] mean %.3e max %.3e top1 %.3f;", v.name.c_str(),
                      one.Mean(), one.Max(), one.Top1());
        line += buf;
      }
    }
    cache_a->Free(kSeqA);
    cache_c->Free(kSeq);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - tp).count();
    line += pd::StrCat(" ", static_cast<int>(secs), " s");
    std::fprintf(stderr, "%s\n", line.c_str());
    prompt_lines.push_back(line);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Report.
  const double per_tok16 = double(wire16) / double(wire_tokens);
  const double per_tok8 = double(wire8) / double(wire_tokens);
  std::printf(
      "model %s: %d layers (%s), %d kv heads x %d, vocab %lld; %zu prompts, %d decode steps "
      "each, %.0f s\n",
      model_path.c_str(), n_layer,
      cfg.swa_pattern > 0 ? pd::StrCat("sliding window ", cfg.sliding_window, ", every ",
                                       cfg.swa_pattern, "th layer global")
                                .c_str()
                          : "no sliding window",
      cfg.n_head_kv, cfg.head_dim, static_cast<long long>(n_vocab), prompts.size(), f.steps,
      seconds);
  std::printf("f16 wire bit-identical to the prefill cache: blocks %s, decode logits %s\n",
              f16_blocks_equal ? "yes" : "NO", f16_logits_equal ? "yes" : "NO");
  std::printf(
      "wire bytes per prompt token (all layers, K+V, last block padded): f16 %.1f, "
      "int8 %.1f, ratio %.4f\n\n",
      per_tok16, per_tok8, per_tok8 / per_tok16);
  std::printf(
      "| variant | prompts | steps | mean KL | p99 KL | max KL | top-1 | target mean KL <= "
      "1e-3 |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
  auto row = [&](const std::string& name, const Stats& st, bool target) {
    std::printf("| %s | %zu | %zu | %.3e | %.3e | %.3e | %.4f | %s |\n", name.c_str(),
                st.kl.size() / f.steps, st.kl.size(), st.Mean(), st.Quantile(0.99), st.Max(),
                st.Top1(),
                !target                  ? "-"
                : st.Mean() <= kKlTarget ? "met"
                                         : "**missed**");
  };
  for (size_t k = 0; k < variants.size(); ++k) {
    if (!variants[k].diagnostic) row(variants[k].name, all[k], k == 0);
  }
  for (const auto& [len, st] : by_length) {
    for (size_t k = 0; k < variants.size(); ++k) {
      if (!variants[k].diagnostic && !variants[k].scalar) {
        row(pd::StrCat(variants[k].name, ", ~", len, "-token prompts"), st[k], false);
      }
    }
  }
  if (f.diagnose_prompts > 0) {
    std::printf("\nDiagnostics (first %d prompt(s) of each length; KL vs the f16 wire):\n\n",
                f.diagnose_prompts);
    std::printf(
        "| only these through int8 | steps | mean KL | p99 KL | max KL | top-1 |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (size_t k = 0; k < variants.size(); ++k) {
      if (!variants[k].diagnostic) continue;
      const Stats& st = all[k];
      std::printf("| %s | %zu | %.3e | %.3e | %.3e | %.4f |\n", variants[k].name.c_str(),
                  st.kl.size(), st.Mean(), st.Quantile(0.99), st.Max(), st.Top1());
    }
  }

  if (!f.json.empty()) {
    std::ostringstream js;
    js << "{\"model\": \"" << model_path << "\", \"n_layer\": " << n_layer
       << ", \"n_kv_heads\": " << cfg.n_head_kv << ", \"head_dim\": " << cfg.head_dim
       << ", \"n_vocab\": " << n_vocab << ", \"sliding_window\": " << cfg.sliding_window
       << ", \"swa_pattern\": " << cfg.swa_pattern << ", \"prompts\": " << prompts.size()
       << ", \"steps\": " << f.steps << ", \"block_size\": " << f.block
       << ", \"threads\": " << f.threads << ", \"seconds\": " << seconds
       << ", \"f16_wire_bit_identical\": "
       << (f16_blocks_equal && f16_logits_equal ? "true" : "false")
       << ", \"wire_bytes_per_token_f16\": " << per_tok16
       << ", \"wire_bytes_per_token_int8\": " << per_tok8 << ", \"prompt_tokens\": [";
    for (size_t i = 0; i < prompts.size(); ++i) js << (i ? ", " : "") << prompts[i].ids.size();
    js << "], \"variants\": [";
    auto obj = [&](const std::string& name, const Stats& st, bool diag) {
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "{\"name\": \"%s\", \"diagnostic\": %s, \"steps\": %zu, \"mean_kl\": %.6e, "
                    "\"p99_kl\": %.6e, \"max_kl\": %.6e, \"top1\": %.6f}",
                    name.c_str(), diag ? "true" : "false", st.kl.size(), st.Mean(),
                    st.Quantile(0.99), st.Max(), st.Top1());
      return std::string(buf);
    };
    for (size_t k = 0; k < variants.size(); ++k) {
      js << (k ? ", " : "") << obj(variants[k].name, all[k], variants[k].diagnostic);
    }
    js << "], \"by_length\": {";
    bool first = true;
    for (const auto& [len, st] : by_length) {
      js << (first ? "" : ", ") << "\"" << len << "\": [";
      first = false;
      bool f2 = true;
      for (size_t k = 0; k < variants.size(); ++k) {
        if (variants[k].diagnostic || st[k].kl.empty()) continue;
        js << (f2 ? "" : ", ") << obj(variants[k].name, st[k], false);
        f2 = false;
      }
      js << "]";
    }
    js << "}, \"per_prompt\": [";
    for (size_t i = 0; i < prompt_lines.size(); ++i) {
      js << (i ? ", " : "") << "\"" << prompt_lines[i] << "\"";
    }
    js << "]}\n";
    std::ofstream out(f.json);
    out << js.str();
    if (!out) return absl::InternalError(pd::StrCat("cannot write '", f.json, "'"));
  }
  if (!f16_blocks_equal || !f16_logits_equal) {
    return absl::InternalError("the f16 wire is not bit-identical to the prefill cache");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pd::bench

int main(int argc, char** argv) {
  pd::bench::Flags f;
  CLI::App app{"int8_wire_kl: decode KL divergence of INT8 vs F16 KV transfer"};
  app.add_option("-m,--model", f.model, "GGUF model (default: the default model)");
  app.add_option("--text", f.text, "text file the prompts are cut from")->required();
  app.add_option("--lengths", f.lengths, "prompt lengths in tokens (default 100 500 2000)");
  app.add_option("--prompts", f.prompts, "prompts per length (default 2)");
  app.add_option("--steps", f.steps, "decode steps per prompt (default 64)");
  app.add_option("--chunk", f.chunk, "prefill chunk in tokens (default 256)");
  app.add_option("--block", f.block, "KV block size (default 16)");
  app.add_option("-t,--threads", f.threads, "CPU threads (default 2; 0 = all cores)");
  app.add_option("--diagnose-prompts", f.diagnose_prompts,
                 "per-layer / K / V diagnostics on the first N prompts of each length (default 0)");
  app.add_flag("--floor", f.floor, "also decode the f16 wire on the scalar kernels (noise floor)");
  app.add_flag("--no-int8-cache", f.no_int8_cache, "skip the int8 wire -> int8 cache variant");
  app.add_option("--json", f.json, "also write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  const absl::Status s = pd::bench::Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "int8_wire_kl: error: %s\n", std::string(s.ToString()).c_str());
    return 1;
  }
  return 0;
}
