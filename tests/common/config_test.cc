#include "common/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/status_matchers.h"

namespace pd {
namespace {

using ::pd::testing::StatusIs;
using ::testing::HasSubstr;

// Every file in configs/ must load and validate (tests run in the source root).
TEST(ConfigTest, EveryFileInConfigsLoads) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("configs")) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".yaml" && ext != ".yml") continue;
    SCOPED_TRACE(entry.path().string());
    absl::StatusOr<ServeOptions> o = LoadServeOptions(entry.path().string());
    EXPECT_TRUE(o.ok()) << o.status();
    ++n;
  }
  EXPECT_GE(n, 1);
}

// configs/serve.yaml documents the defaults: it must parse to exactly what an empty file gives.
TEST(ConfigTest, ServeYamlShowsTheDefaults) {
  absl::StatusOr<ServeOptions> file = LoadServeOptions("configs/serve.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ServeOptions> empty = ParseServeOptions("", "empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  const ServeOptions& a = *file;
  const ServeOptions& b = *empty;
  EXPECT_EQ(a.model.path, b.model.path);
  EXPECT_EQ(a.model.id, b.model.id);
  EXPECT_EQ(a.model.chat_template, b.model.chat_template);
  EXPECT_EQ(a.model.context, b.model.context);
  EXPECT_EQ(a.model.backend, b.model.backend);
  EXPECT_EQ(a.model.gpu_layers, b.model.gpu_layers);
  EXPECT_EQ(a.threads, b.threads);
  EXPECT_EQ(a.grpc.enabled, b.grpc.enabled);
  EXPECT_EQ(a.grpc.host, b.grpc.host);
  EXPECT_EQ(a.grpc.port, b.grpc.port);
  EXPECT_EQ(a.http.enabled, b.http.enabled);
  EXPECT_EQ(a.http.host, b.http.host);
  EXPECT_EQ(a.http.port, b.http.port);
  EXPECT_EQ(a.api_keys, b.api_keys);
  EXPECT_EQ(a.api_keys_file, b.api_keys_file);
  EXPECT_EQ(a.http_limits.max_connections, b.http_limits.max_connections);
  EXPECT_EQ(a.http_limits.max_connections_per_address, b.http_limits.max_connections_per_address);
  EXPECT_EQ(a.http_limits.header_timeout_ms, b.http_limits.header_timeout_ms);
  EXPECT_EQ(a.http_limits.body_timeout_ms, b.http_limits.body_timeout_ms);
  EXPECT_EQ(a.http_limits.idle_timeout_ms, b.http_limits.idle_timeout_ms);
  EXPECT_EQ(a.http_limits.write_timeout_ms, b.http_limits.write_timeout_ms);
  EXPECT_EQ(a.http_limits.threads, b.http_limits.threads);
  EXPECT_EQ(a.http_limits.io_threads, b.http_limits.io_threads);
  EXPECT_EQ(a.tls.cert_file, b.tls.cert_file);
  EXPECT_EQ(a.tls.key_file, b.tls.key_file);
  EXPECT_EQ(a.admission.max_waiting, b.admission.max_waiting);
  EXPECT_EQ(a.admission.ttft_slo_ms, b.admission.ttft_slo_ms);
  EXPECT_EQ(a.admission.slo_headroom, b.admission.slo_headroom);
  EXPECT_EQ(a.scheduler.max_running_seqs, b.scheduler.max_running_seqs);
  EXPECT_EQ(a.scheduler.max_waiting, b.scheduler.max_waiting);
  EXPECT_EQ(a.scheduler.max_total_tokens, b.scheduler.max_total_tokens);
  EXPECT_EQ(a.scheduler.token_budget, b.scheduler.token_budget);
  EXPECT_EQ(a.scheduler.chunked_prefill, b.scheduler.chunked_prefill);
  EXPECT_EQ(a.scheduler.prefill_chunk, b.scheduler.prefill_chunk);
  EXPECT_EQ(a.scheduler.step_time_stretch, b.scheduler.step_time_stretch);
  EXPECT_EQ(a.scheduler.min_prefill_chunk, b.scheduler.min_prefill_chunk);
  EXPECT_EQ(a.scheduler.prefill_pace_steps, b.scheduler.prefill_pace_steps);
  EXPECT_EQ(a.scheduler.prompt_rate_steps, b.scheduler.prompt_rate_steps);
  EXPECT_EQ(a.scheduler.priority, b.scheduler.priority);
  EXPECT_EQ(a.kv.dtype, b.kv.dtype);
  EXPECT_EQ(a.kv.memory_mib, b.kv.memory_mib);
  EXPECT_EQ(a.kv.block_size, b.kv.block_size);
  EXPECT_EQ(a.prefix_cache.enabled, b.prefix_cache.enabled);
  EXPECT_EQ(a.prefix_cache.min_free_blocks, b.prefix_cache.min_free_blocks);
  EXPECT_EQ(a.prefix_cache.summary_blocks, b.prefix_cache.summary_blocks);
  EXPECT_EQ(a.prefix_cache.compress_idle_ms, b.prefix_cache.compress_idle_ms);
  EXPECT_EQ(a.prefix_cache.fill_generated, b.prefix_cache.fill_generated);
  EXPECT_EQ(a.limits.default_max_tokens, b.limits.default_max_tokens);
  EXPECT_EQ(a.limits.max_tokens, b.limits.max_tokens);
  EXPECT_EQ(a.limits.max_body_bytes, b.limits.max_body_bytes);
  EXPECT_EQ(a.limits.max_stop, b.limits.max_stop);
  EXPECT_EQ(a.shutdown_grace_s, b.shutdown_grace_s);
  EXPECT_EQ(a.router.nodes.size(), b.router.nodes.size());
  EXPECT_EQ(a.router.health_interval_ms, b.router.health_interval_ms);
  EXPECT_EQ(a.router.health_timeout_ms, b.router.health_timeout_ms);
  EXPECT_EQ(a.router.unhealthy_after, b.router.unhealthy_after);
  EXPECT_EQ(a.router.decode_policy, b.router.decode_policy);
  EXPECT_EQ(a.router.prefill_policy, b.router.prefill_policy);
  EXPECT_EQ(a.router.prefix_weight, b.router.prefix_weight);
  EXPECT_EQ(a.router.seq_cost_tokens, b.router.seq_cost_tokens);
  EXPECT_EQ(a.router.max_retries, b.router.max_retries);
  EXPECT_EQ(a.router.disaggregate, b.router.disaggregate);
  EXPECT_EQ(a.router.kv_wire, b.router.kv_wire);
  EXPECT_EQ(a.router.kv_transfer_timeout_ms, b.router.kv_transfer_timeout_ms);
  EXPECT_EQ(a.router.disaggregate_min_prompt, b.router.disaggregate_min_prompt);
  EXPECT_EQ(a.kv_transfer.enabled, b.kv_transfer.enabled);
  EXPECT_EQ(a.kv_transfer.ucx_tls, b.kv_transfer.ucx_tls);
  EXPECT_EQ(a.kv_transfer.peer_failure, b.kv_transfer.peer_failure);
  EXPECT_EQ(a.kv_transfer.staging_mib, b.kv_transfer.staging_mib);
  EXPECT_EQ(a.kv_transfer.prefix_pull, b.kv_transfer.prefix_pull);
  EXPECT_EQ(a.kv_transfer.prefix_pull_min_tokens, b.kv_transfer.prefix_pull_min_tokens);
  EXPECT_EQ(a.etcd.endpoints, b.etcd.endpoints);
  EXPECT_EQ(a.etcd.prefix, b.etcd.prefix);
  EXPECT_EQ(a.etcd.lease_ttl_s, b.etcd.lease_ttl_s);
  EXPECT_EQ(a.etcd.poll_interval_ms, b.etcd.poll_interval_ms);
  EXPECT_EQ(a.etcd.node_name, b.etcd.node_name);
}

TEST(ConfigTest, ParsesEveryField) {
  absl::StatusOr<ServeOptions> o = ParseServeOptions(R"(
model: {path: /m.gguf, id: tiny, chat_template: chatml, context: 2048, backend: cuda,
        gpu_layers: 12}
threads: 3
grpc: {enabled: false, host: 0.0.0.0, port: 0}
http: {host: ::1, port: 9000, max_connections: 100, max_connections_per_address: 7,
       header_timeout_ms: 1, body_timeout_ms: 2, idle_timeout_ms: 3, write_timeout_ms: 4,
       threads: 5, io_threads: 2}
tls: {cert_file: /c.pem, key_file: /k.pem}
cluster_tls: {ca_file: /ca.pem, cert_file: /n.pem, key_file: /n.key, server_name: pd}
admission: {max_waiting: 12, ttft_slo_ms: 2500, slo_headroom: 0.5}
api_keys: [a, b]
api_keys_file: /keys
scheduler:
  max_running_seqs: 4
  max_waiting: 9
  max_total_tokens: 10000
  token_budget: 64
  chunked_prefill: no
  prefill_chunk: 32
  step_time_stretch: 1.25
  min_prefill_chunk: 8
  prefill_pace_steps: 4
  prompt_rate_steps: 16
  priority: false
kv: {dtype: int8, memory_mib: 64, block_size: 32}
prefix_cache: {enabled: false, min_free_blocks: 5, summary_blocks: 10, fill_generated: false}
speculative: {drafter: self, max_k: 4, min_gain: 1.2, fixed_k: 2, ngram_min: 1, ngram_max: 3,
              draft_kv_mib: 32, head_rows: 16384}
limits: {default_max_tokens: 16, max_tokens: 128, max_body_bytes: 4096, max_stop: 2}
shutdown_grace_s: 0.5
)",
                                                     "inline");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->model.path, "/m.gguf");
  EXPECT_EQ(o->model.id, "tiny");
  EXPECT_EQ(o->model.chat_template, "chatml");
  EXPECT_EQ(o->model.context, 2048);
  EXPECT_EQ(o->model.backend, "cuda");
  EXPECT_EQ(o->model.gpu_layers, "12");
  EXPECT_EQ(o->threads, 3);
  EXPECT_FALSE(o->grpc.enabled);
  EXPECT_EQ(o->grpc.host, "0.0.0.0");
  EXPECT_EQ(o->grpc.port, 0);
  EXPECT_TRUE(o->http.enabled);
  EXPECT_EQ(o->http.host, "::1");
  EXPECT_EQ(o->http.port, 9000);
  EXPECT_EQ(o->api_keys, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(o->api_keys_file, "/keys");
  EXPECT_EQ(o->http_limits.max_connections, 100);
  EXPECT_EQ(o->http_limits.max_connections_per_address, 7);
  EXPECT_EQ(o->http_limits.header_timeout_ms, 1);
  EXPECT_EQ(o->http_limits.body_timeout_ms, 2);
  EXPECT_EQ(o->http_limits.idle_timeout_ms, 3);
  EXPECT_EQ(o->http_limits.write_timeout_ms, 4);
  EXPECT_EQ(o->http_limits.threads, 5);
  EXPECT_EQ(o->http_limits.io_threads, 2);
  EXPECT_EQ(o->tls.cert_file, "/c.pem");
  EXPECT_EQ(o->tls.key_file, "/k.pem");
  EXPECT_EQ(o->cluster_tls.ca_file, "/ca.pem");
  EXPECT_EQ(o->cluster_tls.cert_file, "/n.pem");
  EXPECT_EQ(o->cluster_tls.key_file, "/n.key");
  EXPECT_EQ(o->cluster_tls.server_name, "pd");
  EXPECT_EQ(o->admission.max_waiting, 12);
  EXPECT_EQ(o->admission.ttft_slo_ms, 2500);
  EXPECT_EQ(o->admission.slo_headroom, 0.5);
  EXPECT_EQ(o->scheduler.max_running_seqs, 4);
  EXPECT_EQ(o->scheduler.max_waiting, 9);
  EXPECT_EQ(o->scheduler.max_total_tokens, 10000);
  EXPECT_EQ(o->scheduler.token_budget, 64);
  EXPECT_FALSE(o->scheduler.chunked_prefill);
  EXPECT_EQ(o->scheduler.prefill_chunk, 32);
  EXPECT_EQ(o->scheduler.step_time_stretch, 1.25);
  EXPECT_EQ(o->scheduler.min_prefill_chunk, 8);
  EXPECT_EQ(o->scheduler.prefill_pace_steps, 4);
  EXPECT_EQ(o->scheduler.prompt_rate_steps, 16);
  EXPECT_FALSE(o->scheduler.priority);
  EXPECT_EQ(o->kv.dtype, "int8");
  EXPECT_EQ(o->kv.memory_mib, 64);
  EXPECT_EQ(o->kv.block_size, 32);
  EXPECT_FALSE(o->prefix_cache.enabled);
  EXPECT_EQ(o->prefix_cache.min_free_blocks, 5);
  EXPECT_EQ(o->prefix_cache.summary_blocks, 10);
  EXPECT_FALSE(o->prefix_cache.fill_generated);
  EXPECT_EQ(o->speculative.drafter, "self");
  EXPECT_EQ(o->speculative.max_k, 4);
  EXPECT_DOUBLE_EQ(o->speculative.min_gain, 1.2);
  EXPECT_EQ(o->speculative.fixed_k, 2);
  EXPECT_EQ(o->speculative.ngram_min, 1);
  EXPECT_EQ(o->speculative.ngram_max, 3);
  EXPECT_EQ(o->speculative.draft_kv_mib, 32);
  EXPECT_EQ(o->speculative.head_rows, 16384);
  EXPECT_EQ(o->limits.default_max_tokens, 16);
  EXPECT_EQ(o->limits.max_tokens, 128);
  EXPECT_EQ(o->limits.max_body_bytes, 4096);
  EXPECT_EQ(o->limits.max_stop, 2);
  EXPECT_DOUBLE_EQ(o->shutdown_grace_s, 0.5);
}

TEST(ConfigTest, UnknownKeysAreRejectedWithTheirFullPath) {
  EXPECT_THAT(ParseServeOptions("scheduler:\n  token_budgt: 5\n", "f.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "f.yaml: scheduler.token_budgt: unknown key (line 2"));
  EXPECT_THAT(ParseServeOptions("modle: {}\n", "f.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument, "modle: unknown key"));
  EXPECT_THAT(ParseServeOptions("grpc: {porrt: 1}\n", "f.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument, "grpc.porrt: unknown key"));
}

TEST(ConfigTest, WrongTypesNameTheField) {
  EXPECT_THAT(ParseServeOptions("scheduler: {token_budget: lots}\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "scheduler.token_budget: expected an integer, got 'lots'"));
  EXPECT_THAT(ParseServeOptions("scheduler: {chunked_prefill: maybe}\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, "scheduler.chunked_prefill"));
  EXPECT_THAT(ParseServeOptions("grpc: {port: 99999999999}\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, "grpc.port: expected an integer"));
  EXPECT_THAT(ParseServeOptions("api_keys: abc\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, "api_keys: expected a list"));
  EXPECT_THAT(ParseServeOptions("kv: 5\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, "kv: expected a mapping"));
  EXPECT_THAT(ParseServeOptions("model: {path: [a]}\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, "model.path: expected a single value"));
}

TEST(ConfigTest, SyntaxErrorsGiveTheLine) {
  EXPECT_THAT(ParseServeOptions("a: b\n  c: [d\n", "bad.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad.yaml:"));
}

TEST(ConfigTest, ValidateNamesTheField) {
  auto bad = [](const char* yaml, const char* field) {
    EXPECT_THAT(ParseServeOptions(yaml, "f"),
                StatusIs(absl::StatusCode::kInvalidArgument, std::string("f: ") + field))
        << yaml;
  };
  bad("kv: {dtype: q4}", "kv.dtype");
  bad("kv: {memory_mib: 0}", "kv.memory_mib");
  bad("kv: {block_size: 0}", "kv.block_size");
  bad("prefix_cache: {min_free_blocks: -1}", "prefix_cache.min_free_blocks");
  bad("prefix_cache: {summary_blocks: -2}", "prefix_cache.summary_blocks");
  bad("speculative: {drafter: ''}", "speculative.drafter");
  bad("speculative: {max_k: 0}", "speculative.max_k");
  bad("speculative: {max_k: 17}", "speculative.max_k");
  bad("speculative: {fixed_k: 9}", "speculative.fixed_k");
  bad("speculative: {ngram_min: 3, ngram_max: 2}", "speculative.ngram_max");
  bad("speculative: {draft_kv_mib: 0}", "speculative.draft_kv_mib");
  bad("speculative: {head_rows: 0}", "speculative.head_rows");
  bad("speculative: {k: 3}", "speculative.k");
  bad("prefix_cache: {enable: true}", "prefix_cache.enable");
  bad("prefix_cache: {compress_idle_ms: -1}", "prefix_cache.compress_idle_ms");
  bad("kv: {dtype: int8}\nprefix_cache: {compress_idle_ms: 100}", "prefix_cache.compress_idle_ms");
  bad("router: {max_retries: 1, max_retries: 2}", "router.max_retries: duplicate key");
  bad("threads: 1\nthreads: 2\n", "threads: duplicate key (lines 1 and 2)");
  bad("scheduler: {max_running_seqs: 0}", "scheduler.max_running_seqs");
  bad("scheduler: {max_running_seqs: 8, token_budget: 4}", "scheduler.token_budget");
  bad("scheduler: {prefill_chunk: 0}", "scheduler.prefill_chunk");
  bad("scheduler: {step_time_stretch: 0.5}", "scheduler.step_time_stretch");
  bad("scheduler: {step_time_stretch: fast}", "scheduler.step_time_stretch");
  bad("scheduler: {min_prefill_chunk: 0}", "scheduler.min_prefill_chunk");
  bad("scheduler: {prefill_pace_steps: -1}", "scheduler.prefill_pace_steps");
  bad("scheduler: {prompt_rate_steps: 0}", "scheduler.prompt_rate_steps");
  bad("scheduler: {max_waiting: -1}", "scheduler.max_waiting");
  bad("limits: {default_max_tokens: 0}", "limits.default_max_tokens");
  bad("limits: {default_max_tokens: 100, max_tokens: 10}", "limits.max_tokens");
  bad("limits: {max_stop: 100}", "limits.max_stop");
  bad("grpc: {port: 70000}", "grpc.port");
  bad("model: {chat_template: jinja}", "model.chat_template");
  bad("model: {backend: tpu}", "model.backend");
  bad("model: {gpu_layers: 4}", "model.gpu_layers");
  bad("model: {backend: cuda, gpu_layers: most}", "model.gpu_layers");
  bad("model: {backend: cuda, gpu_layers: -1}", "model.gpu_layers");
  bad("api_keys: ['']", "api_keys[0]");
  bad("threads: -2", "threads");
  bad("router: {kv_wire: fp8}", "router.kv_wire");
  bad("router: {kv_transfer_timeout_ms: 0}", "router.kv_transfer_timeout_ms");
  bad("router: {disaggregate_min_prompt: -1}", "router.disaggregate_min_prompt");
  bad("kv_transfer: {staging_mib: 0}", "kv_transfer.staging_mib");
  bad("kv_transfer: {prefix_pull_min_tokens: 0}", "kv_transfer.prefix_pull_min_tokens");
}

TEST(ConfigTest, KvTransferAndDisaggregationFields) {
  absl::StatusOr<ServeOptions> o = ParseServeOptions(
      "kv_transfer: {enabled: false, ucx_tls: 'tcp,self', peer_failure: true, staging_mib: 64, "
      "prefix_pull: false, prefix_pull_min_tokens: 128}\n"
      "router: {disaggregate: false, kv_wire: int8, kv_transfer_timeout_ms: 500, "
      "disaggregate_min_prompt: 32}\n",
      "f");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->kv_transfer.enabled);
  EXPECT_EQ(o->kv_transfer.ucx_tls, "tcp,self");
  EXPECT_TRUE(o->kv_transfer.peer_failure);
  EXPECT_EQ(o->kv_transfer.staging_mib, 64);
  EXPECT_FALSE(o->kv_transfer.prefix_pull);
  EXPECT_EQ(o->kv_transfer.prefix_pull_min_tokens, 128);
  EXPECT_FALSE(o->router.disaggregate);
  EXPECT_EQ(o->router.kv_wire, "int8");
  EXPECT_EQ(o->router.kv_transfer_timeout_ms, 500);
  EXPECT_EQ(o->router.disaggregate_min_prompt, 32);
  EXPECT_THAT(ParseServeOptions("kv_transfer: {enable: true}", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, "kv_transfer.enable"));
}

TEST(ConfigTest, EtcdSection) {
  absl::StatusOr<ServeOptions> off = ParseServeOptions("", "f");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_TRUE(off->etcd.endpoints.empty());  // membership through etcd is off by default
  EXPECT_EQ(off->etcd.prefix, "/pdserve/");
  EXPECT_EQ(off->etcd.lease_ttl_s, 3);
  EXPECT_EQ(off->etcd.poll_interval_ms, 250);
  EXPECT_EQ(off->etcd.node_name, "");

  absl::StatusOr<ServeOptions> o = ParseServeOptions(R"(
etcd:
  endpoints: [http://127.0.0.1:2379, "http://etcd-1.example:2379"]
  prefix: /prod/pdserve/
  lease_ttl_s: 10
  poll_interval_ms: 100
  node_name: d7
)",
                                                     "f");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->etcd.endpoints,
            (std::vector<std::string>{"http://127.0.0.1:2379", "http://etcd-1.example:2379"}));
  EXPECT_EQ(o->etcd.prefix, "/prod/pdserve/");
  EXPECT_EQ(o->etcd.lease_ttl_s, 10);
  EXPECT_EQ(o->etcd.poll_interval_ms, 100);
  EXPECT_EQ(o->etcd.node_name, "d7");

  // Strict like every section: unknown keys with their path, wrong types, bad values.
  EXPECT_THAT(ParseServeOptions("etcd: {endpoint: [http://a:1]}\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, "f: etcd.endpoint: unknown key"));
  EXPECT_THAT(ParseServeOptions("etcd: {endpoints: http://a:1}\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, "etcd.endpoints: expected a list"));
  EXPECT_THAT(ParseServeOptions("etcd: {lease_ttl_s: soon}\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "etcd.lease_ttl_s: expected an integer, got 'soon'"));
  EXPECT_THAT(ParseServeOptions("etcd: [a]\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, "etcd: expected a mapping"));
  auto bad = [](const char* yaml, const char* field) {
    EXPECT_THAT(ParseServeOptions(yaml, "f"),
                StatusIs(absl::StatusCode::kInvalidArgument, std::string("f: ") + field))
        << yaml;
  };
  bad("etcd: {endpoints: ['127.0.0.1:2379']}", "etcd.endpoints[0]: must be http://host:port");
  bad("etcd: {endpoints: ['http://a:1', 'https://b:2']}", "etcd.endpoints[1]");
  bad("etcd: {endpoints: ['http://a']}", "etcd.endpoints[0]");
  bad("etcd: {endpoints: ['http://a:1/v3']}", "etcd.endpoints[0]");
  bad("etcd: {endpoints: ['http://a:']}", "etcd.endpoints[0]");
  bad("etcd: {prefix: /pdserve}", "etcd.prefix: must end with '/'");
  bad("etcd: {prefix: ''}", "etcd.prefix");
  bad("etcd: {lease_ttl_s: 1}", "etcd.lease_ttl_s: must be in [2, 3600]");
  bad("etcd: {lease_ttl_s: 4000}", "etcd.lease_ttl_s");
  bad("etcd: {poll_interval_ms: 0}", "etcd.poll_interval_ms");
  bad("etcd: {node_name: a/b}", "etcd.node_name");
}

TEST(ConfigTest, MissingFileIsNotFound) {
  EXPECT_THAT(LoadServeOptions("/nonexistent/serve.yaml"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(ConfigTest, ApiKeysFromCommaSeparatedText) {
  std::vector<std::string> keys = {"x"};
  AddApiKeys(" a, b ,,c ", &keys);
  EXPECT_EQ(keys, (std::vector<std::string>{"x", "a", "b", "c"}));
}

TEST(ConfigTest, SecurityFieldsAreValidated) {
  for (const char* bad : {"tls: {cert_file: /c.pem}", "cluster_tls: {ca_file: /ca.pem}",
                          "cluster_tls: {cert_file: /c.pem, key_file: /k.pem}",
                          "http: {max_connections: 0}", "http: {write_timeout_ms: 0}",
                          "admission: {slo_headroom: 1.5}", "admission: {ttft_slo_ms: -1}",
                          "http: {max_connections_per_address: -1}"}) {
    EXPECT_THAT(ParseServeOptions(bad, "inline"), StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
}

TEST(ConfigTest, ApiKeysFileAddsKeysAndNeverEchoesThem) {
  const std::string path = ::testing::TempDir() + "/pd_keys.txt";
  {
    std::ofstream f(path);
    f << "# the team's keys\n  sk-one  \n\nsk-two\n";
  }
  std::vector<std::string> keys = {"sk-zero"};
  ASSERT_TRUE(LoadApiKeysFile(path, &keys).ok());
  EXPECT_EQ(keys, (std::vector<std::string>{"sk-zero", "sk-one", "sk-two"}));
  {
    std::ofstream f(path);
    f << "# nothing here\n\n";
  }
  EXPECT_THAT(LoadApiKeysFile(path, &keys), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(LoadApiKeysFile(path + ".missing", &keys), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace pd
