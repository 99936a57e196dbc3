// The local Frontend against a scripted GenerationEngine: what it submits (template, tokens,
// sampling, stop tokens, limits) and how a Stream turns engine events into text chunks.
#include "frontend/frontend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status_matchers.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/frontend/serving_testing.h"

namespace pd::frontend {
namespace {

using engine::FinishInfo;
using engine::FinishReason;
using engine::GenerationRequest;
using engine::GenerationSink;
using ::pd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records what it is given; the test plays the engine thread by calling the sinks.
class ScriptedEngine final : public engine::GenerationEngine {
 public:
  absl::Status Submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) override {
    if (!submit_status.ok()) return submit_status;
    requests.push_back(std::move(request));
    sinks.push_back(std::move(sink));
    return absl::OkStatus();
  }
  // Like the real engine: the request ends with OnFinish(reason).
  void Cancel(const std::string& id, FinishReason reason) override {
    cancels.emplace_back(id, reason);
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].id == id && sinks[i] != nullptr) {
        FinishInfo info;
        info.reason = reason;
        sinks[i]->OnFinish(info);
        sinks[i] = nullptr;
      }
    }
  }
  engine::EngineLoad Load() const override { return {}; }
  int max_context() const override { return context; }

  int context = 64;
  absl::Status submit_status;
  std::vector<GenerationRequest> requests;
  std::vector<std::shared_ptr<GenerationSink>> sinks;
  std::vector<std::pair<std::string, FinishReason>> cancels;
};

struct Env {
  std::string bytes;
  std::unique_ptr<engine::Tokenizer> tok;
  ScriptedEngine engine;
  std::unique_ptr<Frontend> fe;
};

std::unique_ptr<Env> MakeEnv(FrontendOptions options = {}) {
  auto env = std::make_unique<Env>();
  env->bytes = testing::ServingModelGguf();
  auto file = engine::GgufFile::Parse(MappedFile::Borrow(env->bytes.data(), env->bytes.size()));
  PD_CHECK_OK(file.status());
  auto tok = engine::Tokenizer::FromGguf(**file);
  PD_CHECK_OK(tok.status());
  env->tok = std::move(*tok);
  env->fe = MakeLocalFrontend(options, env->engine, *env->tok, engine::ChatTemplateKind::kChatMl,
                              ModelCard{"tiny", "llama", 64, 0, ""}, nullptr);
  return env;
}

ApiRequest UserSays(const std::string& text) {
  ApiRequest r;
  r.messages.push_back({"user", text});
  return r;
}

// Reads chunks until the finished one (or a 1 s silence, which fails the test).
std::vector<ApiChunk> Drain(Stream& s) {
  std::vector<ApiChunk> out;
  ApiChunk c;
  while (s.Next(&c, absl::Now() + absl::Seconds(1))) {
    out.push_back(c);
    if (c.finished) break;
  }
  EXPECT_TRUE(!out.empty() && out.back().finished);
  return out;
}

std::string Text(const std::vector<ApiChunk>& chunks) {
  std::string t;
  for (const ApiChunk& c : chunks) t += c.text;
  return t;
}

TEST(FrontendTest, SubmitsTheTemplatedPromptWithEogStopsAndDefaults) {
  FrontendOptions o;
  o.default_max_tokens = 1000;  // more than the context leaves: lowered to what is left
  o.default_sampling.temperature = 0.25f;
  auto env = MakeEnv(o);
  ApiRequest r;
  r.messages = {{"system", "be nice"}, {"user", "hello world"}};
  r.top_k = 5;
  r.seed = 42;
  r.priority = 3;
  r.deadline = absl::FromUnixSeconds(2000000000);
  auto s = env->fe->Start(r);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(env->engine.requests.size(), 1u);
  const GenerationRequest& g = env->engine.requests[0];
  auto text = engine::ApplyChatTemplate(engine::ChatTemplateKind::kChatMl, r.messages, true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(g.prompt, env->tok->Encode(*text, true, true));
  EXPECT_NE(std::find(g.prompt.begin(), g.prompt.end(), 3), g.prompt.end());  // <|im_start|>
  EXPECT_EQ(g.max_tokens, 64 - static_cast<int>(g.prompt.size()));
  EXPECT_EQ(g.stop_token_ids, (absl::flat_hash_set<int32_t>{2, 4}));  // </s>, <|im_end|>
  EXPECT_EQ(g.sampling.temperature, 0.25f);
  EXPECT_EQ(g.sampling.top_k, 5);
  EXPECT_EQ(g.sampling.seed, 42u);
  EXPECT_EQ(g.priority, 3);
  EXPECT_EQ(g.deadline, absl::FromUnixSeconds(2000000000));
  EXPECT_FALSE(g.id.empty());
  EXPECT_EQ((*s)->request_id(), g.id);  // none given: the generated one
}

TEST(FrontendTest, IgnoreEosAndRawPromptAndExplicitMaxTokens) {
  auto env = MakeEnv();
  ApiRequest r;
  r.prompt = "the cat";
  r.ignore_eos = true;
  r.max_tokens = 7;
  r.request_id = "abc";
  auto s = env->fe->Start(r);
  ASSERT_TRUE(s.ok()) << s.status();
  const GenerationRequest& g = env->engine.requests[0];
  EXPECT_EQ(g.prompt, env->tok->Encode("the cat", true, true));
  EXPECT_TRUE(g.stop_token_ids.empty());
  EXPECT_EQ(g.max_tokens, 7);
  EXPECT_EQ((*s)->request_id(), "abc");
  EXPECT_NE(g.id, "abc");  // engine ids stay unique whatever clients send
}

TEST(FrontendTest, RefusesMessagesAndPromptTogether) {
  auto env = MakeEnv();
  ApiRequest r = UserSays("hi");
  r.prompt = "hi";
  EXPECT_THAT(env->fe->Start(r), StatusIs(absl::StatusCode::kInvalidArgument, "prompt"));
  EXPECT_TRUE(env->engine.requests.empty());
}

TEST(FrontendTest, RefusesBadValuesNamingTheField) {
  auto env = MakeEnv();
  auto expect = [&](ApiRequest r, const char* field) {
    EXPECT_THAT(env->fe->Start(r), StatusIs(absl::StatusCode::kInvalidArgument, field)) << field;
  };
  expect(ApiRequest{}, "messages");
  ApiRequest r = UserSays("hi");
  r.temperature = std::numeric_limits<float>::quiet_NaN();
  expect(r, "temperature");
  r = UserSays("hi");
  r.messages.push_back({"tool", "x"});
  expect(r, "messages[1].role");
  r = UserSays("hi");
  r.request_id = "\xFF";
  expect(r, "request_id");
  r = UserSays("hi");
  r.stop = {std::string(300, 'x')};
  expect(r, "stop[0]");
  // Gemma-style alternation errors come from the template; ChatML has none, but an assistant
  // turn alone is still a conversation. Unknown roles are caught first.
  EXPECT_TRUE(env->engine.requests.empty());
  r = UserSays("hi");
  r.max_tokens = 64;  // the prompt leaves less than that
  EXPECT_THAT(env->fe->Start(r), StatusIs(absl::StatusCode::kInvalidArgument, "context is 64"));
}

TEST(FrontendTest, SubmitErrorsPassThrough) {
  auto env = MakeEnv();
  env->engine.submit_status = absl::ResourceExhaustedError("queue full");
  EXPECT_THAT(env->fe->Start(UserSays("hi")),
              StatusIs(absl::StatusCode::kResourceExhausted, "queue full"));
}

TEST(FrontendTest, StreamsTextAndCutsAtAStopStringSpanningTokens) {
  auto env = MakeEnv();
  ApiRequest r = UserSays("hi");
  r.stop = {"o w", "zzz"};
  auto s = env->fe->Start(r);
  ASSERT_TRUE(s.ok());
  const std::vector<int32_t> ids = env->tok->Encode("hello world", false, false);
  ASSERT_GE(ids.size(), 2u);
  GenerationSink& sink = *env->engine.sinks[0];
  for (int32_t id : ids) sink.OnTokens({id});
  std::vector<ApiChunk> chunks = Drain(**s);
  EXPECT_EQ(Text(chunks), " hell");
  EXPECT_EQ(chunks.back().finish_reason, "stop");
  EXPECT_TRUE(chunks.back().status.ok());
  ASSERT_EQ(env->engine.cancels.size(), 1u);
  EXPECT_EQ(env->engine.cancels[0].second, FinishReason::kStop);
  ApiChunk c;
  EXPECT_FALSE((*s)->Next(&c, absl::Now()));  // after the end: false at once
}

TEST(FrontendTest, HoldsBackIncompleteUtf8AndPossibleStopPrefixes) {
  auto env = MakeEnv();
  ApiRequest r = UserSays("hi");
  r.stop = {"cat!"};
  auto s = env->fe->Start(r);
  ASSERT_TRUE(s.ok());
  GenerationSink& sink = *env->engine.sinks[0];
  const int32_t c3 = 5 + 0xC3, a9 = 5 + 0xA9;  // byte tokens of "é"
  sink.OnTokens({c3});
  ApiChunk c;
  ASSERT_TRUE((*s)->Next(&c, absl::Now() + absl::Seconds(1)));
  EXPECT_EQ(c.text, "");
  EXPECT_THAT(c.token_ids, ElementsAre(c3));
  sink.OnTokens({a9});
  ASSERT_TRUE((*s)->Next(&c, absl::Now() + absl::Seconds(1)));
  EXPECT_EQ(c.text, "\xC3\xA9");
  for (int32_t id : env->tok->Encode("cat", false, false)) sink.OnTokens({id});
  ASSERT_TRUE((*s)->Next(&c, absl::Now() + absl::Seconds(1)));
  EXPECT_EQ(c.text, " ");  // "cat" could still become "cat!"
  FinishInfo info;
  info.reason = FinishReason::kLength;
  info.prompt_tokens = 9;
  info.completion_tokens = 6;
  sink.OnFinish(info);
  ASSERT_TRUE((*s)->Next(&c, absl::Now() + absl::Seconds(1)));
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.text, "cat");
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_EQ(c.prompt_tokens, 9);
  EXPECT_EQ(c.completion_tokens, 6);
}

TEST(FrontendTest, EngineEndsMapToStatuses) {
  struct Case {
    FinishReason reason;
    absl::Status status;
    absl::StatusCode want;
  };
  for (const Case& k : {Case{FinishReason::kCancelled, {}, absl::StatusCode::kCancelled},
                        Case{FinishReason::kDeadline, {}, absl::StatusCode::kDeadlineExceeded},
                        Case{FinishReason::kError, absl::UnavailableError("shutting down"),
                             absl::StatusCode::kUnavailable},
                        Case{FinishReason::kError, {}, absl::StatusCode::kInternal}}) {
    auto env = MakeEnv();
    auto s = env->fe->Start(UserSays("hi"));
    ASSERT_TRUE(s.ok());
    FinishInfo info;
    info.reason = k.reason;
    info.status = k.status;
    env->engine.sinks[0]->OnFinish(info);
    std::vector<ApiChunk> chunks = Drain(**s);
    EXPECT_EQ(chunks.back().status.code(), k.want) << engine::FinishReasonName(k.reason);
  }
}

TEST(FrontendTest, NextTimesOutWithoutData) {
  auto env = MakeEnv();
  auto s = env->fe->Start(UserSays("hi"));
  ASSERT_TRUE(s.ok());
  ApiChunk c;
  const absl::Time t0 = absl::Now();
  EXPECT_FALSE((*s)->Next(&c, t0 + absl::Milliseconds(30)));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(25));
}

TEST(FrontendTest, DroppingOrCancellingAStreamCancelsTheRequest) {
  auto env = MakeEnv();
  {
    auto s = env->fe->Start(UserSays("hi"));
    ASSERT_TRUE(s.ok());
  }
  ASSERT_EQ(env->engine.cancels.size(), 1u);
  EXPECT_EQ(env->engine.cancels[0].first, env->engine.requests[0].id);
  EXPECT_EQ(env->engine.cancels[0].second, FinishReason::kCancelled);

  auto s = env->fe->Start(UserSays("hi"));
  ASSERT_TRUE(s.ok());
  (*s)->Cancel();
  ASSERT_EQ(env->engine.cancels.size(), 2u);
  std::vector<ApiChunk> chunks = Drain(**s);
  EXPECT_EQ(chunks.back().status.code(), absl::StatusCode::kCancelled);
  s->reset();
  EXPECT_EQ(env->engine.cancels.size(), 2u);  // finished: nothing more to cancel
}

// Admission happens before the chat template and the tokenizer: a refused request costs no
// tokenization (the engine never sees it), and a waiting slot frees at the first token.
TEST(FrontendTest, AdmissionRefusesBeforeTokenizingAndFreesAtTheFirstToken) {
  FrontendOptions options;
  options.admission.max_waiting = 2;
  auto env = MakeEnv(options);
  auto a = env->fe->Start(UserSays("one"));
  auto b = env->fe->Start(UserSays("two"));
  ASSERT_TRUE(a.ok() && b.ok());
  // Even an invalid request is refused first: nothing about it is looked at.
  ApiRequest bad = UserSays("three");
  bad.temperature = -1;
  auto c = env->fe->Start(bad);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GE(RetryAfterSeconds(c.status()), 1);
  EXPECT_EQ(env->engine.requests.size(), 2u);
  // a's first token frees a slot; b's cancellation frees another.
  env->engine.sinks[0]->OnTokens({5});
  auto three = env->fe->Start(UserSays("three"));
  EXPECT_TRUE(three.ok());
  b->reset();
  auto four = env->fe->Start(UserSays("four"));
  EXPECT_TRUE(four.ok());
  EXPECT_EQ(env->fe->Start(UserSays("five")).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A request refused after admission (here by validation) gives its slot back.
  env->engine.sinks[2]->OnTokens({5});
  ApiRequest invalid = UserSays("six");
  invalid.temperature = -1;
  EXPECT_EQ(env->fe->Start(invalid).status().code(), absl::StatusCode::kInvalidArgument);
  auto seven = env->fe->Start(UserSays("seven"));
  EXPECT_TRUE(seven.ok());
  EXPECT_EQ(env->fe->Start(UserSays("eight")).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(FrontendTest, SetNotifyWakesOnTokensAndFinish) {
  auto env = MakeEnv();
  auto s = env->fe->Start(UserSays("hi"));
  ASSERT_TRUE(s.ok());
  std::atomic<int> wakes{0};
  (*s)->SetNotify([&] { wakes.fetch_add(1); });
  EXPECT_EQ(wakes.load(), 0);  // nothing waiting yet
  env->engine.sinks[0]->OnTokens({5});
  EXPECT_EQ(wakes.load(), 1);
  ApiChunk c;
  EXPECT_TRUE((*s)->Next(&c, absl::InfinitePast()));  // a past deadline polls
  EXPECT_FALSE((*s)->Next(&c, absl::InfinitePast()));
  FinishInfo info;
  info.reason = FinishReason::kLength;
  env->engine.sinks[0]->OnFinish(info);
  EXPECT_EQ(wakes.load(), 2);
  // Data already waiting: a new registration is called at once.
  std::atomic<int> late{0};
  (*s)->SetNotify([&] { late.fetch_add(1); });
  EXPECT_EQ(late.load(), 1);
  EXPECT_TRUE((*s)->Next(&c, absl::InfinitePast()));
  EXPECT_TRUE(c.finished);
}

TEST(FrontendTest, ModelsListsTheCard) {
  auto env = MakeEnv();
  std::vector<ModelCard> m = env->fe->Models();
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].id, "tiny");
  ApiRequest r = UserSays("hi");
  r.model = "tiny";
  EXPECT_TRUE(env->fe->Start(r).ok());
  r.model = "big";
  EXPECT_THAT(env->fe->Start(r), StatusIs(absl::StatusCode::kNotFound, "big"));
}

TEST(FrontendTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xC3\x28"));          // bad continuation
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xFF"));
  EXPECT_FALSE(IsValidUtf8("\x80"));
}

}  // namespace
}  // namespace pd::frontend
