#include "bench/pd_bench/conversation.h"

#include <random>

#include "bench/pd_bench/prompt.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd::bench {
namespace {

// Streams of the seed, kept apart so that changing one knob (e.g. --user-words) leaves the other
// texts and draws (e.g. the system prompts) as they were.
constexpr uint64_t kSystemStream = 0x5e5;
constexpr uint64_t kAssignStream = 0xa55;
constexpr uint64_t kUserLengthStream = 0x05e;
constexpr uint64_t kUserTextStream = 0x7e7;
constexpr uint64_t kOutputStream = 0x0a7;
constexpr uint64_t kThinkStream = 0x7b1;

std::mt19937_64 TurnRng(const ConversationOptions& o, uint64_t stream, int64_t conversation,
                        int turn) {
  return std::mt19937_64(
      MixSeed(MixSeed(o.seed, stream, static_cast<uint64_t>(conversation)), turn, 0));
}

int UserWords(const ConversationOptions& o, int64_t conversation, int turn) {
  std::mt19937_64 rng = TurnRng(o, kUserLengthStream, conversation, turn);
  return o.user_words.Sample(rng);
}

}  // namespace

absl::Status ConversationOptions::Validate() const {
  const int64_t n_words = static_cast<int64_t>(PromptWords().size());
  if (conversations < 0) return absl::InvalidArgumentError("--conversations must be >= 0");
  if (turns < 1) return absl::InvalidArgumentError("--turns must be >= 1");
  if (!(think_time_ms >= 0)) return absl::InvalidArgumentError("--think-time-ms must be >= 0");
  if (system_prompts < 0) return absl::InvalidArgumentError("--system-prompts must be >= 0");
  if (system_prompts > 0 && system_words < 1) {
    return absl::InvalidArgumentError("--system-words must be >= 1");
  }
  if (system_prompts > n_words * n_words) {
    return absl::InvalidArgumentError(
        pd::StrCat("--system-prompts must be <= ", n_words * n_words,
                   " (the first two words tell the system prompts apart)"));
  }
  if (system_prompts > n_words && system_words < 2) {
    return absl::InvalidArgumentError(
        pd::StrCat("with more than ", n_words,
                   " system prompts, --system-words must be >= 2 (the first two "
                   "words tell the system prompts apart)"));
  }
  return absl::OkStatus();
}

std::string SystemPrompt(const ConversationOptions& o, int index) {
  PD_CHECK(index >= 0 && index < o.system_prompts);
  const std::vector<std::string_view>& words = PromptWords();
  const size_t n = words.size();
  // The leading words encode the index in base n, offset by the seed: distinct prompts differ in
  // their first word (index mod n) or their second (index / n).
  std::mt19937_64 rng(MixSeed(o.seed, kSystemStream, 0));
  const size_t first_offset = rng() % n, second_offset = rng() % n;
  std::string text(words[(index % n + first_offset) % n]);
  if (o.system_words >= 2) {
    text += " ";
    text += words[(index / n + second_offset) % n];
  }
  if (o.system_words >= 3) {
    text += " ";
    text += BuildPrompt(o.system_words - 2, MixSeed(o.seed, kSystemStream, 1 + index));
  }
  return text;
}

int SystemPromptOf(const ConversationOptions& o, int64_t conversation) {
  if (o.system_prompts == 0) return -1;
  if (o.assignment == SystemPromptAssignment::kRoundRobin) {
    return static_cast<int>(conversation % o.system_prompts);
  }
  std::mt19937_64 rng(MixSeed(o.seed, kAssignStream, static_cast<uint64_t>(conversation)));
  return std::uniform_int_distribution<int>(0, o.system_prompts - 1)(rng);
}

std::string UserMessage(const ConversationOptions& o, int64_t conversation, int turn) {
  return BuildPrompt(UserWords(o, conversation, turn),
                     TurnRng(o, kUserTextStream, conversation, turn)());
}

int TurnMaxTokens(const ConversationOptions& o, int64_t conversation, int turn) {
  std::mt19937_64 rng = TurnRng(o, kOutputStream, conversation, turn);
  return o.output.Sample(rng);
}

double ThinkTimeS(const ConversationOptions& o, int64_t conversation, int turn) {
  const double mean_s = o.think_time_ms / 1e3;
  if (o.think_time == ThinkTime::kFixed || mean_s <= 0) return mean_s;
  std::mt19937_64 rng = TurnRng(o, kThinkStream, conversation, turn);
  return std::exponential_distribution<double>(1 / mean_s)(rng);
}

Conversation::Conversation(const ConversationOptions& options, int64_t index)
    : options_(options), index_(index) {
  if (const int system = SystemPromptOf(options, index); system >= 0) {
    history_.push_back({"system", SystemPrompt(options, system)});
    history_tokens_ = options.system_words;
  }
}

std::vector<ChatMessage> Conversation::NextMessages() const {
  PD_CHECK(!finished());
  std::vector<ChatMessage> messages = history_;
  messages.push_back({"user", UserMessage(options_, index_, next_turn())});
  return messages;
}

int Conversation::NextPromptTokens() const {
  PD_CHECK(!finished());
  return history_tokens_ + UserWords(options_, index_, next_turn());
}

void Conversation::AddAnswer(std::string text, int tokens) {
  PD_CHECK(!finished());
  const int turn = next_turn();
  history_.push_back({"user", UserMessage(options_, index_, turn)});
  history_.push_back({"assistant", std::move(text)});
  history_tokens_ += UserWords(options_, index_, turn) + tokens;
  ++turns_done_;
}

}  // namespace pd::bench
