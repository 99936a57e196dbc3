// HTTP-layer tests of frontend/http_server.h over loopback (port 0), with an httplib client.
// The Frontend here is a test double at the layer boundary: it records the ApiRequest the server
// built and plays scripted chunks, so that these tests check exactly the HTTP mapping (parsing,
// JSON/SSE shapes, status codes, cancellation). tests/python/test_openai_api.py runs the real
// pd-serve (frontend + scheduler + model) with the official OpenAI client.
#include "frontend/http_server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/metrics.h"
#include "common/strings.h"
#include "frontend/serving_metrics.h"

namespace pd::frontend {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// What a scripted request will do.
struct Script {
  absl::Status start_status;     // non-OK: Start fails with it
  std::vector<ApiChunk> chunks;  // played in order (the last one should be finished)
  bool endless = false;          // after the chunks: a text chunk every `tick` until cancelled
  bool silent = false;           // after the chunks: nothing at all until cancelled
  absl::Duration tick = absl::Milliseconds(5);
  std::string tick_text = "x";
};

// Shared between the frontend, its streams and the test.
struct Record {
  absl::Mutex mu;
  std::vector<ApiRequest> requests ABSL_GUARDED_BY(mu);
  int cancels ABSL_GUARDED_BY(mu) = 0;
  int destroyed ABSL_GUARDED_BY(mu) = 0;
};

// Plays a Script. Like the engine's streams it wakes an event-driven reader (SetNotify) when it
// has something: at once for scripted chunks, every 5 ms while endless, at Cancel().
class ScriptedStream : public Stream {
 public:
  ScriptedStream(std::string id, Script script, std::shared_ptr<Record> record)
      : id_(std::move(id)), record_(std::move(record)) {
    for (auto& c : script.chunks) chunks_.push_back(std::move(c));
    endless_ = script.endless;
    silent_ = script.silent;
    tick_ = script.tick;
    tick_text_ = script.tick_text;
  }
  ~ScriptedStream() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ticker_ = true;
      notify_ = nullptr;
    }
    if (ticker_.joinable()) ticker_.join();
    absl::MutexLock lock(&record_->mu);
    ++record_->destroyed;
  }
  const std::string& request_id() const override { return id_; }
  bool Next(ApiChunk* chunk, absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    if (!chunks_.empty()) {
      *chunk = std::move(chunks_.front());
      chunks_.pop_front();
      finished_ = chunk->finished;
      return true;
    }
    if (!endless_ && !silent_) return false;
    for (;;) {
      if (cancelled_) return Finish(chunk);
      const absl::Time now = absl::Now();
      if (endless_ && now >= last_tick_ + tick_) {
        last_tick_ = now;
        chunk->text = tick_text_;
        chunk->token_ids = {1};
        return true;
      }
      if (now >= deadline) return false;
      const absl::Time wake =
          endless_ ? std::min(deadline, last_tick_ + tick_) : deadline;
      mu_.AwaitWithDeadline(absl::Condition(&cancelled_), wake);
    }
  }
  void Cancel() override {
    std::function<void()> notify;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || cancelled_) return;
      cancelled_ = true;
      notify = notify_;
    }
    {
      absl::MutexLock lock(&record_->mu);
      ++record_->cancels;
    }
    if (notify) notify();
  }
  void SetNotify(std::function<void()> notify) override {
    {
      absl::MutexLock lock(&mu_);
      notify_ = notify;
      if (endless_ && !ticker_.joinable()) {
        ticker_ = std::thread([this] {
          for (;;) {
            std::function<void()> n;
            {
              absl::MutexLock lock(&mu_);
              if (stop_ticker_ || cancelled_) return;
              n = notify_;
            }
            if (n) n();
            absl::SleepFor(tick_);
          }
        });
      }
    }
    notify();
  }

 private:
  bool Finish(ApiChunk* chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    chunk->finished = true;
    chunk->status = absl::CancelledError("cancelled");
    return true;
  }
  const std::string id_;
  std::shared_ptr<Record> record_;
  absl::Mutex mu_;
  std::deque<ApiChunk> chunks_ ABSL_GUARDED_BY(mu_);
  bool endless_ = false, silent_ = false;
  absl::Duration tick_;
  std::string tick_text_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_tick_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::function<void()> notify_ ABSL_GUARDED_BY(mu_);
  bool stop_ticker_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;
};

class ScriptedFrontend : public Frontend {
 public:
  explicit ScriptedFrontend(std::shared_ptr<Record> record) : record_(std::move(record)) {}
  void SetScript(Script s) {
    absl::MutexLock lock(&mu_);
    script_ = std::move(s);
  }
  // Requests whose prompt is `prompt` play `s` instead.
  void SetScriptFor(const std::string& prompt, Script s) {
    absl::MutexLock lock(&mu_);
    by_prompt_[prompt] = std::move(s);
  }
  absl::StatusOr<std::unique_ptr<Stream>> Start(const ApiRequest& request) override {
    Script s;
    {
      absl::MutexLock lock(&mu_);
      auto it = request.prompt.has_value() ? by_prompt_.find(*request.prompt) : by_prompt_.end();
      s = it != by_prompt_.end() ? it->second : script_;
    }
    {
      absl::MutexLock lock(&record_->mu);
      record_->requests.push_back(request);
    }
    if (!s.start_status.ok()) return s.start_status;
    const std::string id = request.request_id.empty() ? "req-1" : request.request_id;
    return std::unique_ptr<Stream>(new ScriptedStream(id, std::move(s), record_));
  }
  std::vector<ModelCard> Models() const override {
    return {ModelCard{"tiny-llama", "llama", 256, 12345, "Q8_0"}};
  }

 private:
  std::shared_ptr<Record> record_;
  absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Script> by_prompt_ ABSL_GUARDED_BY(mu_);
};

ApiChunk Text(std::string text, std::vector<int32_t> ids) {
  ApiChunk c;
  c.text = std::move(text);
  c.token_ids = std::move(ids);
  return c;
}

ApiChunk Finished(std::string reason, int prompt, int completion, absl::Status status = {}) {
  ApiChunk c;
  c.finished = true;
  c.finish_reason = std::move(reason);
  c.prompt_tokens = prompt;
  c.completion_tokens = completion;
  c.status = std::move(status);
  return c;
}

Script HelloScript() {
  Script s;
  s.chunks = {Text("Hel", {10}), Text("", {11}), Text("lo é", {12, 13}), Finished("length", 5, 4)};
  return s;
}

// Events of an SSE body: the payload of each "data: " line; comments are skipped.
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event: " << body.substr(pos);
    if (end == std::string::npos) break;
    const std::string event = body.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind(":", 0) == 0) continue;
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    out.push_back(event.substr(6));
  }
  return out;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(HttpServerOptions options = {}) {
    options.refresh_metrics = [this] { refreshes_.fetch_add(1); };
    server_ = std::make_unique<HttpServer>(std::move(options), frontend_, registry_, &metrics_);
    auto port = server_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(10, 0);
  }
  void SetUp() override { StartServer(); }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  httplib::Result Post(const std::string& path, const std::string& body,
                       const httplib::Headers& headers = {}) {
    return client_->Post(path.c_str(), headers, body, "application/json");
  }
  static json Json(const httplib::Result& r) {
    return json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  }
  ApiRequest LastRequest() {
    absl::MutexLock lock(&record_->mu);
    return record_->requests.empty() ? ApiRequest{} : record_->requests.back();
  }
  int Cancels() {
    absl::MutexLock lock(&record_->mu);
    return record_->cancels;
  }
  int Destroyed() {
    absl::MutexLock lock(&record_->mu);
    return record_->destroyed;
  }
  // Expects an OpenAI-style error with `status`, `code` and (when not null) `param`.
  static void ExpectError(const httplib::Result& r, int status, const std::string& code,
                          const json& param) {
    ASSERT_TRUE(r) << "no response";
    EXPECT_EQ(r->status, status) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_EQ(j["error"]["code"], code) << r->body;
    EXPECT_EQ(j["error"]["param"], param) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  }

  std::shared_ptr<Record> record_ = std::make_shared<Record>();
  ScriptedFrontend frontend_{record_};
  MetricsRegistry registry_;
  ServingMetrics metrics_{registry_};
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
  int port_ = 0;
  std::atomic<int> refreshes_{0};
};

TEST_F(HttpServerTest, ChatNonStreamingMapsFieldsAndAnswersChatCompletion) {
  frontend_.SetScript(HelloScript());
  const json req = {
      {"model", "tiny-llama"},
      {"messages",
       {{{"role", "developer"}, {"content", "Be brief."}},
        {{"role", "user"},
         {"content",
          {{{"type", "text"}, {"text", "Hi "}}, {{"type", "text"}, {"text", "there"}}}}}}},
      {"max_completion_tokens", 4},
      {"temperature", 0.5},
      {"top_p", 0.9},
      {"top_k", 7},
      {"min_p", 0.1},
      {"repetition_penalty", 1.1},
      {"seed", 42},
      {"stop", {"\n\n", "END"}},
      {"n", 1},
      {"user", "ignored"},
      {"some_future_field", {{"x", 1}}},
      {"priority", 3},
      {"ignore_eos", true},
      {"request_id", "abc"}};
  auto r = Post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  const json j = Json(r);
  EXPECT_EQ(j["id"], "chatcmpl-abc");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["model"], "tiny-llama");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello é");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"], (json{{"prompt_tokens", 5},
                              {"completion_tokens", 4},
                              {"total_tokens", 9},
                              {"prompt_tokens_details", {{"cached_tokens", 0}}},
                    {"completion_tokens_details",
                     {{"accepted_prediction_tokens", 0}, {"rejected_prediction_tokens", 0}}}}));

  const ApiRequest a = LastRequest();
  EXPECT_EQ(a.model, "tiny-llama");
  ASSERT_EQ(a.messages.size(), 2u);
  EXPECT_EQ(a.messages[0].role, "system");
  EXPECT_EQ(a.messages[0].content, "Be brief.");
  EXPECT_EQ(a.messages[1].role, "user");
  EXPECT_EQ(a.messages[1].content, "Hi there");
  EXPECT_FALSE(a.prompt.has_value());
  EXPECT_EQ(a.max_tokens, 4);
  EXPECT_FLOAT_EQ(*a.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*a.top_p, 0.9f);
  EXPECT_EQ(*a.top_k, 7);
  EXPECT_FLOAT_EQ(*a.min_p, 0.1f);
  EXPECT_FLOAT_EQ(*a.repetition_penalty, 1.1f);
  EXPECT_EQ(*a.seed, 42u);
  EXPECT_THAT(a.stop, ElementsAre("\n\n", "END"));
  EXPECT_EQ(a.priority, 3);
  EXPECT_TRUE(a.ignore_eos);
  EXPECT_EQ(a.request_id, "abc");
  EXPECT_EQ(a.deadline, absl::InfiniteFuture());
}

TEST_F(HttpServerTest, UnsetFieldsStayUnsetAndNullCountsAsAbsent) {
  frontend_.SetScript(HelloScript());
  auto r = Post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"x"}],"temperature":null,"stop":"S",
                    "max_tokens":null,"top_k":null})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const ApiRequest a = LastRequest();
  EXPECT_EQ(a.model, "");
  EXPECT_FALSE(a.temperature || a.top_p || a.top_k || a.min_p || a.repetition_penalty || a.seed ||
               a.max_tokens);
  EXPECT_THAT(a.stop, ElementsAre("S"));
  // Without a model in the request, responses name the served one.
  EXPECT_EQ(Json(r)["model"], "tiny-llama");
  EXPECT_EQ(Json(r)["id"], "chatcmpl-req-1");
}

TEST_F(HttpServerTest, UnsupportedFieldsAtTheirUnsetValuesPass) {
  frontend_.SetScript(HelloScript());
  auto r = Post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"x"}],"tools":[],"logit_bias":{},
                    "top_logprobs":0,"logprobs":false,"presence_penalty":0,"frequency_penalty":0.0,
                    "response_format":{"type":"text"},"best_of":1,"n":1})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(HttpServerTest, CompletionNonStreaming) {
  frontend_.SetScript(HelloScript());
  auto r = Post("/v1/completions", R"({"model":"tiny-llama","prompt":"Once","max_tokens":4})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = Json(r);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"], "cmpl-req-1");
  EXPECT_EQ(j["choices"][0]["text"], "Hello é");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["total_tokens"], 9);
  const ApiRequest a = LastRequest();
  EXPECT_EQ(a.prompt, std::optional<std::string>("Once"));
  EXPECT_TRUE(a.messages.empty());
  EXPECT_EQ(a.max_tokens, 4);
}

TEST_F(HttpServerTest, ChatStreamingWithUsage) {
  frontend_.SetScript(HelloScript());
  auto r = Post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"x"}],"stream":true,
                    "stream_options":{"include_usage":true}})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  const std::vector<std::string> data = SseData(r->body);
  // "Hel", "lo é" (the empty chunk sends nothing), the finish chunk, the usage chunk, [DONE].
  ASSERT_EQ(data.size(), 5u) << r->body;
  EXPECT_EQ(data.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const json j = json::parse(data[i]);
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    EXPECT_EQ(j["id"], "chatcmpl-req-1");
    EXPECT_EQ(j["model"], "tiny-llama");
    ASSERT_TRUE(j.contains("usage"));
    if (i + 2 < data.size()) {
      EXPECT_TRUE(j["usage"].is_null());
      ASSERT_EQ(j["choices"].size(), 1u);
      const json& c = j["choices"][0];
      if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
      EXPECT_EQ(c["delta"].contains("role"), i == 0) << data[i];
      EXPECT_EQ(c["finish_reason"].is_null(), i + 3 < data.size()) << data[i];
    } else {
      EXPECT_TRUE(j["choices"].empty());
      EXPECT_EQ(j["usage"], (json{{"prompt_tokens", 5},
                                  {"completion_tokens", 4},
                                  {"total_tokens", 9},
                                  {"prompt_tokens_details", {{"cached_tokens", 0}}},
                    {"completion_tokens_details",
                     {{"accepted_prediction_tokens", 0}, {"rejected_prediction_tokens", 0}}}}));
    }
  }
  EXPECT_EQ(text, "Hello é");
  EXPECT_EQ(json::parse(data[2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(json::parse(data[0])["choices"][0]["delta"]["role"], "assistant");
}

TEST_F(HttpServerTest, CompletionStreamingWithTokenIdsWithoutUsage) {
  frontend_.SetScript(HelloScript());
  auto r = Post("/v1/completions",
                R"({"prompt":"x","stream":true,"stream_options":{"include_token_ids":true}})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::vector<std::string> data = SseData(r->body);
  // With token ids, the empty-text chunk is sent too (its token is news).
  ASSERT_EQ(data.size(), 5u) << r->body;
  EXPECT_EQ(data.back(), "[DONE]");
  std::string text;
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const json j = json::parse(data[i]);
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_FALSE(j.contains("usage"));
    text += j["choices"][0]["text"].get<std::string>();
    for (int32_t id : j["choices"][0]["token_ids"]) ids.push_back(id);
  }
  EXPECT_EQ(text, "Hello é");
  EXPECT_THAT(ids, ElementsAre(10, 11, 12, 13));
  EXPECT_EQ(json::parse(data[3])["choices"][0]["finish_reason"], "length");
}

TEST_F(HttpServerTest, RequestErrorsNameTheField) {
  struct Case {
    const char* path;
    const char* body;
    const char* param;  // nullptr: JSON null
    const char* message_part;
  };
  const Case cases[] = {
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],)", nullptr,
       "not valid JSON"},
      {"/v1/chat/completions", R"([1,2])", nullptr, "JSON object"},
      {"/v1/chat/completions", R"({"model":"m"})", "messages", "required"},
      {"/v1/chat/completions", R"({"messages":[]})", "messages", "empty"},
      {"/v1/chat/completions", R"({"messages":"hi"})", "messages", "list"},
      {"/v1/chat/completions", R"({"messages":[{"role":"tool","content":"x"}]})",
       "messages[0].role", "tool"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user"}]})", "messages[0].content",
       "required"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[0].content[0]", "text"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":2})", "n",
       "n must be 1"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature",
       "number"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})",
       "max_tokens", "integer"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"max_tokens":99999999999})", "max_tokens",
       "max_tokens"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"max_tokens":3,"max_completion_tokens":4})",
       "max_completion_tokens", "disagree"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})",
       "stop[0]", "string"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})",
       "stream", "boolean"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1}})",
       "stream_options.include_usage", "boolean"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"presence_penalty":0.5})", "presence_penalty",
       "not supported"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})",
       "logprobs", "not supported"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools",
       "not supported"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})",
       "response_format", "text"},
      {"/v1/completions", R"({"prompt":[1,2,3]})", "prompt", "token ids"},
      {"/v1/completions", R"({"prompt":["a","b"]})", "prompt", "one request per prompt"},
      {"/v1/completions", R"({"model":"m"})", "prompt", "required"},
      {"/v1/completions", R"({"prompt":"x","model":7})", "model", "string"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    auto r = Post(c.path, c.body);
    ExpectError(r, 400, "INVALID_ARGUMENT", c.param ? json(c.param) : json(nullptr));
    if (r) {
      EXPECT_THAT(Json(r)["error"]["message"].get<std::string>(), HasSubstr(c.message_part));
    }
  }
  // None of them reached the frontend.
  absl::MutexLock lock(&record_->mu);
  EXPECT_TRUE(record_->requests.empty());
}

TEST_F(HttpServerTest, InvalidUtf8NamesTheField) {
  const std::string body =
      "{\"messages\":[{\"role\":\"user\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":\"bad "
      "\xC3\x28 \xFF\"}]}";
  auto r = Post("/v1/chat/completions", body);
  ExpectError(r, 400, "INVALID_ARGUMENT", "messages[1].content");
  EXPECT_THAT(Json(r)["error"]["message"].get<std::string>(), HasSubstr("UTF-8"));
  // Outside any string: no field to name, still a 400.
  r = Post("/v1/completions", "{\"prompt\":\"x\"}\xFF");
  ExpectError(r, 400, "INVALID_ARGUMENT", nullptr);
  EXPECT_THAT(Json(r)["error"]["message"].get<std::string>(), HasSubstr("UTF-8"));
}

TEST_F(HttpServerTest, FrontendErrorsMapToHttpStatuses) {
  struct Case {
    absl::Status status;
    int http;
    const char* code;
    json param;
  };
  const Case cases[] = {
      {absl::InvalidArgumentError("top_p must be in (0, 1], got 0"), 400, "INVALID_ARGUMENT",
       "top_p"},
      {absl::InvalidArgumentError("messages[2].role must be ..."), 400, "INVALID_ARGUMENT",
       "messages[2].role"},
      {absl::InvalidArgumentError("prompt + max_tokens exceed the context"), 400,
       "INVALID_ARGUMENT", "prompt"},
      {absl::NotFoundError("unknown model \"gpt-4\""), 404, "NOT_FOUND", "model"},
      {absl::ResourceExhaustedError("queue full"), 429, "RESOURCE_EXHAUSTED", nullptr},
      {absl::UnavailableError("shutting down"), 503, "UNAVAILABLE", nullptr},
      {absl::DeadlineExceededError("deadline"), 504, "DEADLINE_EXCEEDED", nullptr},
      {absl::UnauthenticatedError("no"), 401, "UNAUTHENTICATED", nullptr},
      {absl::InternalError("boom"), 500, "INTERNAL", nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.status.ToString());
    Script s;
    s.start_status = c.status;
    frontend_.SetScript(s);
    auto r = Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})");
    ExpectError(r, c.http, c.code, c.param);
    if (r) {
      EXPECT_EQ(Json(r)["error"]["message"], std::string(c.status.message()));
    }
  }
}

TEST_F(HttpServerTest, FailureAfterAcceptance) {
  Script s;
  s.chunks = {Text("Hi", {1}), Finished("", 3, 1, absl::DeadlineExceededError("deadline passed"))};
  frontend_.SetScript(s);
  // Non-streaming: the status of the failure.
  auto r = Post("/v1/completions", R"({"prompt":"x"})");
  ExpectError(r, 504, "DEADLINE_EXCEEDED", nullptr);
  // Streaming: already 200; the error is an event (OpenAI clients raise it), then [DONE].
  frontend_.SetScript(s);
  r = Post("/v1/completions", R"({"prompt":"x","stream":true})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const std::vector<std::string> data = SseData(r->body);
  ASSERT_EQ(data.size(), 3u) << r->body;
  EXPECT_EQ(json::parse(data[0])["choices"][0]["text"], "Hi");
  EXPECT_EQ(json::parse(data[1])["error"]["code"], "DEADLINE_EXCEEDED");
  EXPECT_EQ(data[2], "[DONE]");
}

// Debian's compiled cpp-httplib listens with a backlog of 5; a burst of 64 streams then lost
// connections (SYNs dropped, a read error a second later). The server raises it: `ss` shows a
// listening socket's backlog as its Send-Q.
TEST_F(HttpServerTest, ListenBacklogHoldsABurstOfClients) {
  const std::string cmd = pd::StrCat("ss -ltnH 'sport = :", port_, "' 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int rc = pclose(p);
  if (rc != 0 || out.empty()) GTEST_SKIP() << "`ss` (iproute2) is not available";
  // State Recv-Q Send-Q Local:Port Peer:Port
  std::istringstream line(out);
  std::string state;
  int recv_q = -1, send_q = -1;
  line >> state >> recv_q >> send_q;
  ASSERT_EQ(state, "LISTEN") << out;
  int somaxconn = 4096;
  if (FILE* f = fopen("/proc/sys/net/core/somaxconn", "r")) {
    if (fscanf(f, "%d", &somaxconn) != 1) somaxconn = 4096;
    fclose(f);
  }
  EXPECT_EQ(send_q, std::min(1024, somaxconn)) << out;
}

TEST_F(HttpServerTest, UnknownPathIs404Json) {
  auto r = client_->Get("/v1/nothing");
  ExpectError(r, 404, "NOT_FOUND", nullptr);
  EXPECT_THAT(Json(r)["error"]["message"].get<std::string>(), HasSubstr("/v1/nothing"));
}

TEST_F(HttpServerTest, ModelsAndHealth) {
  auto r = client_->Get("/v1/models");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const json j = Json(r);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny-llama");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["owned_by"], "pdserve");
  EXPECT_EQ(j["data"][0]["context_length"], 256);
  r = client_->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(Json(r)["status"], "ok");
}

TEST_F(HttpServerTest, MetricsEndpointRefreshesAndCounts) {
  frontend_.SetScript(HelloScript());
  ASSERT_EQ(Post("/v1/completions", R"({"prompt":"x"})")->status, 200);
  ASSERT_EQ(Post("/v1/completions", R"({"prompt":)")->status, 400);
  auto r = client_->Get("/metrics");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(refreshes_.load(), 1);
  EXPECT_THAT(
      r->body,
      HasSubstr("pdserve_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1\n"));
  EXPECT_THAT(
      r->body,
      HasSubstr("pdserve_http_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n"));
  // The malformed request was refused by the HTTP layer, which counts it.
  EXPECT_THAT(r->body, HasSubstr("pdserve_errors_total{code=\"INVALID_ARGUMENT\"} 1\n"));
  EXPECT_THAT(r->body, HasSubstr("# TYPE pdserve_time_to_first_token_seconds histogram\n"));
}

TEST(HttpServerOptionsTest, BodyLimitAnswers413Json) {
  auto record = std::make_shared<Record>();
  ScriptedFrontend frontend(record);
  frontend.SetScript(HelloScript());
  MetricsRegistry registry;
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  HttpServer server(options, frontend, registry);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Client client("127.0.0.1", *port);
  const std::string big = json{{"prompt", std::string(5000, 'a')}}.dump();
  auto r = client.Post("/v1/completions", big, "application/json");
  ASSERT_TRUE(r) << "no response: " << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 413);
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("1000 bytes"));
  // Form-encoded bodies (curl -d's default type) have no smaller cap of their own.
  options.max_body_bytes = 1 << 20;
  MetricsRegistry registry2;
  HttpServer server2(options, frontend, registry2);
  auto port2 = server2.Start("127.0.0.1", 0);
  ASSERT_TRUE(port2.ok());
  httplib::Client client2("127.0.0.1", *port2);
  r = client2.Post("/v1/completions", json{{"prompt", std::string(9000, 'a')}}.dump(),
                   "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  // A body under the limit passes.
  r = client.Post("/v1/completions", R"({"prompt":"x"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST(HttpServerOptionsTest, ApiKeys) {
  auto record = std::make_shared<Record>();
  ScriptedFrontend frontend(record);
  frontend.SetScript(HelloScript());
  MetricsRegistry registry;
  HttpServerOptions options;
  options.api_keys = {"k1", "sk-secret"};
  HttpServer server(options, frontend, registry);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Client client("127.0.0.1", *port);
  const std::string body = R"({"prompt":"x"})";
  // One keep-alive connection: a refused request must leave it usable for the next one.
  client.set_keep_alive(true);
  for (const httplib::Headers& h :
       {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer nope"}},
        httplib::Headers{{"Authorization", "sk-secret"}},
        httplib::Headers{{"Authorization", "Bearer sk-secre"}},
        httplib::Headers{{"x-api-key", "k2"}}}) {
    auto r = client.Post("/v1/completions", h, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "UNAUTHENTICATED");
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
    r = client.Get("/v1/models", h);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
  }
  auto r = client.Post("/v1/completions", {{"Authorization", "Bearer sk-secret"}}, body,
                       "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = client.Post("/v1/completions", {{"x-api-key", "k1"}}, body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  // Health and metrics stay open.
  EXPECT_EQ(client.Get("/health")->status, 200);
  EXPECT_EQ(client.Get("/metrics")->status, 200);
  absl::MutexLock lock(&record->mu);
  EXPECT_EQ(record->requests.size(), 2u);
}

TEST(HttpServerOptionsTest, RequestTimeoutSetsTheDeadline) {
  auto record = std::make_shared<Record>();
  ScriptedFrontend frontend(record);
  frontend.SetScript(HelloScript());
  MetricsRegistry registry;
  HttpServerOptions options;
  options.request_timeout = absl::Seconds(30);
  HttpServer server(options, frontend, registry);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  httplib::Client client("127.0.0.1", *port);
  const absl::Time before = absl::Now();
  ASSERT_EQ(client.Post("/v1/completions", R"({"prompt":"x"})", "application/json")->status, 200);
  absl::MutexLock lock(&record->mu);
  ASSERT_EQ(record->requests.size(), 1u);
  EXPECT_GE(record->requests[0].deadline, before + absl::Seconds(30));
  EXPECT_LE(record->requests[0].deadline, absl::Now() + absl::Seconds(30));
}

TEST(HttpServerOptionsTest, ValidateAndStartErrors) {
  HttpServerOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.threads = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.api_keys = {""};
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);

  auto record = std::make_shared<Record>();
  ScriptedFrontend frontend(record);
  MetricsRegistry r1, r2;
  HttpServer a({}, frontend, r1);
  auto port = a.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  EXPECT_EQ(a.Start("127.0.0.1", 0).status().code(), absl::StatusCode::kFailedPrecondition);
  HttpServer b({}, frontend, r2);
  EXPECT_EQ(b.Start("127.0.0.1", *port).status().code(), absl::StatusCode::kUnavailable);
}

TEST(HttpStatusForTest, OneToOne) {
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDataLoss), 500);
}

// A raw client that sends a streaming request, reads `read_bytes` of the response, and closes
// the connection (the way a browser tab or a killed client goes away).
void PostAndHangUp(int port, const std::string& body, size_t read_bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string req =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string got;
  char buf[512];
  while (got.size() < read_bytes) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    got.append(buf, n);
  }
  EXPECT_THAT(got, HasSubstr("200 OK"));
  close(fd);
}

bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return cond();
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamCancels) {
  Script s;
  s.endless = true;  // tokens keep coming until cancelled
  frontend_.SetScript(s);
  PostAndHangUp(port_, R"({"messages":[{"role":"user","content":"x"}],"stream":true})", 300);
  EXPECT_TRUE(WaitFor([&] { return Cancels() == 1; }, absl::Seconds(3)));
  EXPECT_TRUE(WaitFor([&] { return Destroyed() == 1; }, absl::Seconds(3)));
}

TEST_F(HttpServerTest, ClientDisconnectWhileIdleCancels) {
  // Nothing is produced (the request waits in the queue): the keep-alive comments notice the
  // closed connection.
  Script s;
  s.chunks = {Text("a", {1})};
  s.silent = true;
  frontend_.SetScript(s);
  PostAndHangUp(port_, R"({"messages":[{"role":"user","content":"x"}],"stream":true})", 100);
  EXPECT_TRUE(WaitFor([&] { return Cancels() == 1; }, absl::Seconds(3)));
}

TEST_F(HttpServerTest, BadRequestsAnsweredWhileAStreamRuns) {
  Script s;
  s.endless = true;
  frontend_.SetScript(s);
  absl::Notification got_data;
  std::atomic<size_t> bytes{0};
  std::thread streamer([&] {
    httplib::Client c("127.0.0.1", port_);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = R"({"messages":[{"role":"user","content":"x"}],"stream":true})";
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t n, uint64_t, uint64_t) {
      bytes += n;
      if (!got_data.HasBeenNotified()) got_data.Notify();
      return bytes < 20000;  // then hang up
    };
    c.send(req);
  });
  ASSERT_TRUE(got_data.WaitForNotificationWithTimeout(absl::Seconds(5)));
  auto r = Post("/v1/chat/completions", R"({"messages":[]})");
  ExpectError(r, 400, "INVALID_ARGUMENT", "messages");
  streamer.join();
  EXPECT_TRUE(WaitFor([&] { return Cancels() == 1; }, absl::Seconds(3)));
}

TEST_F(HttpServerTest, StopEndsStreamsInProgress) {
  Script s;
  s.silent = true;
  frontend_.SetScript(s);
  std::thread client([&] {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(10, 0);
    c.Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":true})",
           "application/json");
  });
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::MutexLock l(&record_->mu);
        return record_->requests.size() == 1;
      },
      absl::Seconds(3)));
  const absl::Time start = absl::Now();
  server_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  client.join();
  EXPECT_EQ(Cancels(), 1);
  EXPECT_EQ(Destroyed(), 1);
}


TEST_F(HttpServerTest, OverloadIs429WithRetryAfter) {
  Script s;
  s.start_status = OverloadedError("server overloaded: 9 requests wait", 3);
  frontend_.SetScript(s);
  auto r = Post("/v1/completions", R"({"prompt":"x"})");
  ExpectError(r, 429, "RESOURCE_EXHAUSTED", nullptr);
  EXPECT_EQ(r->get_header_value("Retry-After"), "3");
}

// ---- connections: caps, deadlines, slow and stalled clients ------------------------------------

int Destroyed(const std::shared_ptr<Record>& record) {
  absl::MutexLock lock(&record->mu);
  return record->destroyed;
}

// A raw TCP connection to the server from `source` (a loopback address, 127.0.0.x), with a receive
// buffer of `rcvbuf` bytes when > 0. -1 when it cannot connect.
int Connect(int port, const char* source = nullptr, int rcvbuf = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  if (source != nullptr) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    inet_pton(AF_INET, source, &src.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0) {
      close(fd);
      return -1;
    }
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(n);
  }
  return true;
}

std::string PostText(const std::string& path, const std::string& body) {
  return StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
                "Content-Length: ", body.size(), "\r\n\r\n", body);
}

// What arrives on `fd` until the peer closes, `until` appears, or `timeout` passes.
struct Received {
  std::string data;
  bool closed = false;
};
Received ReadFor(int fd, absl::Duration timeout, std::string_view until = {}) {
  Received r;
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    pollfd p{fd, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(end - absl::Now())) + 1;
    if (poll(&p, 1, ms) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      r.closed = true;
      return r;
    }
    r.data.append(buf, n);
    if (!until.empty() && r.data.find(until) != std::string::npos) return r;
  }
  return r;
}

// Time from sending a streaming completion request to its first SSE event.
absl::Duration TimeToFirstEvent(int port, const std::string& prompt) {
  const int fd = Connect(port);
  if (fd < 0) return absl::InfiniteDuration();
  const absl::Time start = absl::Now();
  SendAll(fd, PostText("/v1/completions",
                       json{{"prompt", prompt}, {"stream", true}}.dump()));
  const Received r = ReadFor(fd, absl::Seconds(20), "data: ");
  const absl::Duration took = absl::Now() - start;
  close(fd);
  return r.data.find("data: ") != std::string::npos ? took : absl::InfiniteDuration();
}

double MetricValue(MetricsRegistry& registry, const std::string& series) {
  const std::string text = registry.Render();
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

// The issue's attack: 2,000 connections that send a request header and never its body, and 200
// SSE streams whose readers never read, while a normal client asks for completions. On the old
// thread-per-connection server 200 half-open sockets alone made a request wait 14 s.
TEST(HttpServerLoadTest, HalfOpenConnectionsAndSlowReadersDoNotStarveAClient) {
  auto record = std::make_shared<Record>();
  ScriptedFrontend frontend(record);
  frontend.SetScript(HelloScript());
  Script slow;
  slow.endless = true;
  slow.tick = absl::Milliseconds(20);
  slow.tick_text = std::string(200, 'y');
  frontend.SetScriptFor("slow", slow);
  MetricsRegistry registry;
  HttpServerOptions options;
  options.write_timeout = absl::Seconds(120);  // the stalled readers stay for the whole test
  HttpServer server(options, frontend, registry);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();

  absl::Duration unloaded = absl::ZeroDuration();
  for (int i = 0; i < 5; ++i) unloaded = std::max(unloaded, TimeToFirstEvent(*port, "hi"));
  ASSERT_LT(unloaded, absl::Seconds(1));

  std::vector<int> fds;
  const std::string half = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n";
  for (int i = 0; i < 2000; ++i) {
    const std::string source = StrCat("127.0.0.", 2 + i / 250);  // 250 per address
    const int fd = Connect(*port, source.c_str());
    ASSERT_GE(fd, 0) << "connection " << i << " from " << source << ": " << strerror(errno);
    ASSERT_TRUE(SendAll(fd, half));
    fds.push_back(fd);
  }
  const std::string slow_request =
      PostText("/v1/completions", json{{"prompt", "slow"}, {"stream", true}}.dump());
  for (int i = 0; i < 200; ++i) {
    const int fd = Connect(*port, "127.0.0.10", 4096);
    ASSERT_GE(fd, 0) << "slow reader " << i << ": " << strerror(errno);
    ASSERT_TRUE(SendAll(fd, slow_request));
    fds.push_back(fd);
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::MutexLock l(&record->mu);
        return record->requests.size() >= 205;
      },
      absl::Seconds(20)));
  absl::SleepFor(absl::Seconds(1));  // the stalled readers' buffers fill up

  absl::Duration loaded = absl::ZeroDuration();
  for (int i = 0; i < 5; ++i) loaded = std::max(loaded, TimeToFirstEvent(*port, "hi"));
  std::fprintf(stderr, "first event: unloaded %s, with 2,000 half-open + 200 stalled readers %s\n",
               absl::FormatDuration(unloaded).c_str(), absl::FormatDuration(loaded).c_str());
  EXPECT_LT(loaded, unloaded + absl::Seconds(1));
  // Every attacker connection is still open (none was dropped to make room).
  EXPECT_GE(MetricValue(registry, "pdserve_http_connections"), 2200);
  {
    absl::MutexLock l(&record->mu);
    EXPECT_EQ(record->cancels, 0);
  }
  for (int fd : fds) close(fd);
  // Closing them cancels the 200 streams.
  EXPECT_TRUE(WaitFor(
      [&] {
        absl::MutexLock l(&record->mu);
        return record->cancels == 200;
      },
      absl::Seconds(10)));
}

TEST(HttpServerLoadTest, ConnectionCapsRefuseWith503PerAddressAndInTotal) {
  auto record = std::make_shared<Record>();
  ScriptedFrontend frontend(record);
  frontend.SetScript(HelloScript());
  MetricsRegistry registry;
  HttpServerOptions options;
  options.max_connections = 5;
  options.max_connections_per_address = 3;
  HttpServer server(options, frontend, registry);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  auto accepted = [&](int fd) {
    // An accepted connection answers a request; a refused one says 503 and closes.
    const Received r = ReadFor(fd, absl::Milliseconds(300));
    return !r.closed && r.data.empty();
  };
  std::vector<int> a;
  for (int i = 0; i < 3; ++i) {
    a.push_back(Connect(*port, "127.0.0.2"));
    ASSERT_GE(a.back(), 0);
  }
  for (int fd : a) EXPECT_TRUE(accepted(fd));
  const int fourth = Connect(*port, "127.0.0.2");
  ASSERT_GE(fourth, 0);
  Received r = ReadFor(fourth, absl::Seconds(3));
  EXPECT_TRUE(r.closed);
  EXPECT_THAT(r.data, HasSubstr("503 Service Unavailable"));
  EXPECT_THAT(r.data, HasSubstr("Retry-After: 1"));
  close(fourth);
  // Another address still gets in, up to the total.
  const int b1 = Connect(*port, "127.0.0.3"), b2 = Connect(*port, "127.0.0.3");
  EXPECT_TRUE(accepted(b1));
  EXPECT_TRUE(accepted(b2));
  const int c = Connect(*port, "127.0.0.4");
  r = ReadFor(c, absl::Seconds(3));
  EXPECT_TRUE(r.closed);
  EXPECT_THAT(r.data, HasSubstr("503"));
  close(c);
  EXPECT_EQ(MetricValue(registry, "pdserve_http_connections_refused_total{cap=\"per_address\"}"),
            1);
  EXPECT_EQ(MetricValue(registry, "pdserve_http_connections_refused_total{cap=\"total\"}"), 1);
  // A slot freed is a slot reused: a full request on a new connection from the capped address.
  close(a[0]);
  ASSERT_TRUE(WaitFor([&] { return MetricValue(registry, "pdserve_http_connections") == 4; },
                      absl::Seconds(3)));
  const int d = Connect(*port, "127.0.0.2");
  ASSERT_TRUE(SendAll(d, PostText("/v1/completions", R"({"prompt":"x"})")));
  r = ReadFor(d, absl::Seconds(3), "\"length\"");
  EXPECT_THAT(r.data, HasSubstr("200 OK"));
  close(d);
  for (int fd : {a[1], a[2], b1, b2}) close(fd);
}

TEST(HttpServerLoadTest, DeadlinesCloseSlowHeadersBodiesAndIdleConnections) {
  auto record = std::make_shared<Record>();
  ScriptedFrontend frontend(record);
  frontend.SetScript(HelloScript());
  MetricsRegistry registry;
  HttpServerOptions options;
  options.header_timeout = absl::Milliseconds(300);
  options.body_timeout = absl::Milliseconds(300);
  options.idle_timeout = absl::Milliseconds(300);
  HttpServer server(options, frontend, registry);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());

  // Slowloris: half a header, then nothing.
  int fd = Connect(*port);
  ASSERT_TRUE(SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  absl::Time start = absl::Now();
  Received r = ReadFor(fd, absl::Seconds(5));
  EXPECT_TRUE(r.closed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  close(fd);
  // A body that stops half way.
  fd = Connect(*port);
  ASSERT_TRUE(SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pro"));
  start = absl::Now();
  r = ReadFor(fd, absl::Seconds(5));
  EXPECT_TRUE(r.closed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  close(fd);
  // A keep-alive connection left idle after its answer.
  fd = Connect(*port);
  ASSERT_TRUE(SendAll(fd, PostText("/v1/completions", R"({"prompt":"x"})")));
  r = ReadFor(fd, absl::Seconds(5));  // the answer, then the close
  EXPECT_THAT(r.data, HasSubstr("200 OK"));
  EXPECT_TRUE(r.closed);
  close(fd);
  EXPECT_EQ(MetricValue(registry, "pdserve_http_timeouts_total{phase=\"header\"}"), 1);
  EXPECT_EQ(MetricValue(registry, "pdserve_http_timeouts_total{phase=\"body\"}"), 1);
  EXPECT_EQ(MetricValue(registry, "pdserve_http_timeouts_total{phase=\"idle\"}"), 1);
  // Oversized headers: 431, closed.
  fd = Connect(*port);
  ASSERT_TRUE(SendAll(fd, StrCat("GET /health HTTP/1.1\r\nX-Big: ", std::string(20000, 'a'),
                                 "\r\n\r\n")));
  r = ReadFor(fd, absl::Seconds(5));
  EXPECT_THAT(r.data, HasSubstr("431"));
  EXPECT_TRUE(r.closed);
  close(fd);
}

// A client that stops reading its stream: the server's writes stall, and past write_timeout the
// request is cancelled (its KV freed) and the connection closed.
TEST(HttpServerLoadTest, ReaderThatStopsReadingIsCancelled) {
  auto record = std::make_shared<Record>();
  ScriptedFrontend frontend(record);
  Script s;
  s.endless = true;
  s.tick = absl::Milliseconds(2);
  s.tick_text = std::string(2000, 'z');
  frontend.SetScript(s);
  MetricsRegistry registry;
  HttpServerOptions options;
  options.write_timeout = absl::Milliseconds(300);
  HttpServer server(options, frontend, registry);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  const int fd = Connect(*port, nullptr, 4096);
  ASSERT_TRUE(SendAll(fd, PostText("/v1/completions",
                                   json{{"prompt", "x"}, {"stream", true}}.dump())));
  const absl::Time start = absl::Now();
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::MutexLock l(&record->mu);
        return record->cancels == 1;
      },
      absl::Seconds(10)));
  std::fprintf(stderr, "stalled reader cancelled after %s\n",
               absl::FormatDuration(absl::Now() - start).c_str());
  EXPECT_EQ(MetricValue(registry, "pdserve_http_timeouts_total{phase=\"write\"}"), 1);
  EXPECT_TRUE(WaitFor([&] { return Destroyed(record) == 1; }, absl::Seconds(3)));
  close(fd);
}

}  // namespace
}  // namespace pd::frontend
