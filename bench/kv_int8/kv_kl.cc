// kv_kl: how much the KV cache's element type changes a model's next-token distributions.
//
// Runs the same token sequence through one KV cache per type (the first --types entry is the
// reference), in prefill chunks with the logits of every position, and reports per type the mean
// and max KL(reference || type) of the next-token distributions over the full vocabulary (F64
// log-softmax), top-1 agreement, perplexity of the text, and the cache's bytes against the
// reference's; --floor adds the reference type run on the scalar kernels (same numbers up to the
// order of F32 additions) to show what rounding-level noise alone costs. The text is tokenized with
// the model's tokenizer (BOS added when the model adds one) and cut into sequences of --ctx
// positions, each from an empty cache.
//
// Output: a table on stdout and, with --json, the numbers as JSON (bench/kv_int8/run.py writes
// them into bench/results/). Cost: per type one forward pass over --tokens positions plus their
// output head (2 * n_vocab * n_embd flops per position).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
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

namespace pd::bench {
namespace {

using engine::KvDType;

struct Flags {
  std::string model, text, json;
  std::vector<std::string> types = {"f16", "int8", "f32"};
  int tokens = 2048, ctx = 2048, chunk = 256, threads = 0, block = 16;
  bool floor = false;
};

struct Stats {
  std::string name;
  KvDType type;
  double kl_sum = 0, kl_max = 0, nll = 0;
  int64_t positions = 0, agree = 0, targets = 0;
  size_t cache_bytes = 0;
};

absl::Status Run(const Flags& f) {
  std::string model_path = f.model;
  if (model_path.empty()) {
    PD_ASSIGN_OR_RETURN(model_path, engine::FindDefaultModel());
  }
  std::ifstream in(f.text, std::ios::binary);
  if (!in) return absl::NotFoundError(pd::StrCat("cannot read '", f.text, "'"));
  std::stringstream ss;
  ss << in.rdbuf();

  std::vector<KvDType> types;
  for (const std::string& name : f.types) {
    const auto t = engine::ParseKvDType(name);
    if (!t) return absl::InvalidArgumentError(pd::StrCat("unknown KV type ", name));
    types.push_back(*t);
  }
  if (types.size() < 2) return absl::InvalidArgumentError("--types needs a reference and one more");
  if (f.ctx < 2 || f.chunk < 1 || f.tokens < 2) return absl::InvalidArgumentError("bad sizes");

  engine::CpuBackendOptions bo;
  bo.threads = f.threads;
  std::unique_ptr<engine::Backend> backend = engine::CreateCpuBackend(bo);
  PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::GgufFile> file, engine::GgufFile::Open(model_path));
  std::shared_ptr<const engine::GgufFile> shared(std::move(file));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model, engine::Model::Load(shared, *backend));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::Tokenizer> tok, engine::Tokenizer::FromGguf(*shared));
  const int64_t n_vocab = model->config().n_vocab;

  // Sequences of ctx positions: [BOS] + text tokens, until `tokens` positions are covered.
  const std::vector<int32_t> ids = tok->Encode(ss.str(), /*add_special=*/false,
                                               /*parse_special=*/false);
  const bool bos = tok->add_bos();
  std::vector<std::vector<int32_t>> seqs;
  int64_t covered = 0;
  for (size_t at = 0; at < ids.size() && covered < f.tokens;) {
    std::vector<int32_t> s;
    if (bos) s.push_back(tok->bos());
    const size_t take = std::min<size_t>(
        {ids.size() - at, size_t(f.ctx) - s.size(), size_t(f.tokens - covered) - s.size()});
    s.insert(s.end(), ids.begin() + at, ids.begin() + at + take);
    at += take;
    if (s.size() < 2) break;
    covered += static_cast<int64_t>(s.size());
    seqs.push_back(std::move(s));
  }
  if (covered < f.tokens) {
    return absl::InvalidArgumentError(
        pd::StrCat("text has only ", covered, " positions, --tokens ", f.tokens));
  }

  const int n_blocks = (f.ctx + f.block - 1) / f.block;
  // --floor: the reference KV type once more on the scalar kernels, which differ from AVX2 only
  // in the order of F32 additions: the KL any rounding-level change costs this model.
  std::unique_ptr<engine::Backend> scalar_backend;
  std::unique_ptr<engine::Model> scalar_model;
  std::vector<engine::Model*> models(types.size(), model.get());
  std::vector<std::string> names;
  for (KvDType t : types) names.emplace_back(engine::KvDTypeName(t));
  if (f.floor) {
    bo.force_scalar = true;
    scalar_backend = engine::CreateCpuBackend(bo);
    PD_ASSIGN_OR_RETURN(scalar_model, engine::Model::Load(shared, *scalar_backend));
    types.push_back(types[0]);
    models.push_back(scalar_model.get());
    names.push_back(names[0] + "/scalar");
  }
  std::vector<std::unique_ptr<engine::KvCache>> caches;
  std::vector<Stats> stats;
  for (size_t k = 0; k < types.size(); ++k) {
    engine::KvCacheOptions o = model->KvOptions(n_blocks, types[k], f.block);
    PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::KvCache> c,
                        engine::KvCache::Create(o, models[k]->backend()));
    caches.push_back(std::move(c));
    Stats s;
    s.name = names[k];
    s.type = types[k];
    s.cache_bytes = engine::KvCache::BytesFor(o);
    stats.push_back(s);
  }

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> logits(types.size());
  std::vector<double> lp_ref, lp;
  for (const std::vector<int32_t>& s : seqs) {
    for (auto& c : caches) {
      c->Free(0);
      PD_RETURN_IF_ERROR(c->Reserve(0, static_cast<int>(s.size())));
    }
    for (size_t first = 0; first < s.size(); first += f.chunk) {
      const size_t n = std::min<size_t>(f.chunk, s.size() - first);
      engine::Batch batch;
      for (size_t i = 0; i < n; ++i) {
        batch.Add(s[first + i], static_cast<int32_t>(first + i), 0, /*want_logits=*/true);
      }
      for (size_t k = 0; k < types.size(); ++k) {
        PD_RETURN_IF_ERROR(models[k]->Forward(batch, *caches[k], &logits[k]));
      }
      for (size_t i = 0; i < n; ++i) {
        const float* ref = logits[0].data() + i * n_vocab;
        LogSoftmax(ref, n_vocab, &lp_ref);
        const bool has_next = first + i + 1 < s.size();
        for (size_t k = 0; k < types.size(); ++k) {
          const float* row = logits[k].data() + i * n_vocab;
          LogSoftmax(row, n_vocab, &lp);
          const double kl = KlDivergence(lp_ref, lp);
          Stats& st = stats[k];
          st.kl_sum += kl;
          st.kl_max = std::max(st.kl_max, kl);
          st.agree += ArgMax(row, n_vocab) == ArgMax(ref, n_vocab);
          ++st.positions;
          if (has_next) {
            st.nll -= lp[s[first + i + 1]];
            ++st.targets;
          }
        }
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const engine::ModelConfig& cfg = model->config();
  std::printf(
      "model %s: %d layers, %d kv heads x %d, vocab %lld; %zu sequences, %lld positions, "
      "%.1f s\n",
      model_path.c_str(), cfg.n_layer, cfg.n_head_kv, cfg.head_dim, static_cast<long long>(n_vocab),
      seqs.size(), static_cast<long long>(covered), seconds);
  std::printf("%-10s %12s %12s %8s %9s %14s %8s\n", "kv", "mean_kl", "max_kl", "top1", "ppl",
              "cache_bytes", "bytes/ref");
  std::ostringstream js;
  js << "{\"model\": \"" << model_path << "\", \"reference\": \"" << engine::KvDTypeName(types[0])
     << "\", \"n_layer\": " << cfg.n_layer << ", \"n_kv_heads\": " << cfg.n_head_kv
     << ", \"head_dim\": " << cfg.head_dim << ", \"n_vocab\": " << n_vocab
     << ", \"sequences\": " << seqs.size() << ", \"positions\": " << covered
     << ", \"ctx\": " << f.ctx << ", \"block_size\": " << f.block << ", \"seconds\": " << seconds
     << ", \"types\": [";
  for (size_t k = 0; k < stats.size(); ++k) {
    const Stats& st = stats[k];
    const double mean = st.kl_sum / double(st.positions);
    const double top1 = double(st.agree) / double(st.positions);
    const double ppl = std::exp(st.nll / double(st.targets));
    const double ratio = double(st.cache_bytes) / double(stats[0].cache_bytes);
    std::printf("%-10s %12.3e %12.3e %8.4f %9.4f %14zu %8.4f\n", st.name.c_str(), mean, st.kl_max,
                top1, ppl, st.cache_bytes, ratio);
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s{\"kv_type\": \"%s\", \"mean_kl\": %.6e, \"max_kl\": %.6e, \"top1\": %.6f, "
                  "\"ppl\": %.6f, \"cache_bytes\": %zu, \"bytes_vs_reference\": %.6f}",
                  k ? ", " : "", st.name.c_str(), mean, st.kl_max, top1, ppl, st.cache_bytes,
                  ratio);
    js << buf;
  }
  js << "]}\n";
  if (!f.json.empty()) {
    std::ofstream out(f.json);
    out << js.str();
    if (!out) return absl::InternalError(pd::StrCat("cannot write '", f.json, "'"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pd::bench

int main(int argc, char** argv) {
  pd::bench::Flags f;
  CLI::App app{"kv_kl: KL divergence of next-token distributions between KV cache types"};
  app.add_option("-m,--model", f.model, "GGUF model (default: the default model)");
  app.add_option("--text", f.text, "text file to evaluate on")->required();
  app.add_option("--types", f.types, "KV types, the first is the reference (default f16 int8 f32)");
  app.add_option("--tokens", f.tokens, "positions to evaluate (default 2048)");
  app.add_option("--ctx", f.ctx, "positions per sequence (default 2048)");
  app.add_option("--chunk", f.chunk, "prefill chunk in tokens (default 256)");
  app.add_option("--block", f.block, "KV block size (default 16)");
  app.add_option("-t,--threads", f.threads, "CPU threads (0 = all cores)");
  app.add_option("--json", f.json, "also write the results as JSON");
  app.add_flag("--floor", f.floor,
               "also run the reference type on the scalar kernels (rounding-order noise floor)");
  CLI11_PARSE(app, argc, argv);
  const absl::Status s = pd::bench::Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "kv_kl: error: %s\n", std::string(s.ToString()).c_str());
    return 1;
  }
  return 0;
}
