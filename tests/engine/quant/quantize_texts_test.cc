// The built-in calibration/evaluation texts (engine/quant/quantize/texts.h) and the SHA-256 that
// pins their sources. The texts need Debian's fortunes package (scripts/setup.sh); without it the
// tests that read them are skipped, and the error is checked instead.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/status_matchers.h"
#include "engine/quant/quantize/embedded.h"
#include "engine/quant/quantize/sha256.h"
#include "engine/quant/quantize/texts.h"

namespace pd::engine::quantize {
namespace {

using ::pd::testing::StatusIs;

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Lengths around the padding boundary (55, 56, 63, 64 bytes) differ from each other.
  EXPECT_NE(Sha256Hex(std::string(55, 'x')), Sha256Hex(std::string(56, 'x')));
  EXPECT_EQ(Sha256Hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(FortuneEntriesTest, SplitsOnPercentLinesAndStrips) {
  EXPECT_EQ(JoinFortuneEntries("one\n%\n  two\n  lines \n%\n%\n\n%\nthree"),
            "one\n\ntwo\n  lines\n\nthree");
  EXPECT_EQ(JoinFortuneEntries("a % b\n%%\nc\n"), "a % b\n%%\nc");  // only lines of "%" split
  EXPECT_EQ(JoinFortuneEntries("%\n%\n"), "");
  EXPECT_EQ(JoinFortuneEntries(""), "");
}

TEST(BuiltinTextTest, ManifestIsCompiledIn) {
  EXPECT_NE(EmbeddedTextsManifest().find("\"calibration\""), std::string_view::npos);
  EXPECT_NE(EmbeddedPolicy("M").find("name: M"), std::string_view::npos);
  EXPECT_TRUE(EmbeddedPolicy("XL").empty());
}

TEST(BuiltinTextTest, TextsAreDisjointAndPinned) {
  auto cal = BuiltinText(TextKind::kCalibration);  // from Debian's fortunes (scripts/setup.sh)
  PD_ASSERT_OK(cal);
  auto eval = BuiltinText(TextKind::kEvaluation);
  PD_ASSERT_OK(eval);
  EXPECT_GT(cal->size(), 300000u);
  EXPECT_GT(eval->size(), 150000u);
  // No entry of the evaluation text occurs in the calibration text.
  size_t start = 0, shared = 0, entries = 0;
  while (start < eval->size()) {
    size_t end = eval->find("\n\n", start);
    if (end == std::string::npos) end = eval->size();
    const std::string entry = eval->substr(start, end - start);
    if (entry.size() > 40) {
      ++entries;
      shared += cal->find(entry) != std::string::npos;
    }
    start = end + 2;
  }
  EXPECT_GT(entries, 500u);
  EXPECT_EQ(shared, 0u);
}

TEST(BuiltinTextTest, MissingOrChangedSourcesAreClearErrors) {
  const std::string dir = ::testing::TempDir() + "/fortunes_test";
  std::filesystem::create_directories(dir);
  EXPECT_THAT(BuiltinText(TextKind::kCalibration, dir + "/nowhere"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "install Debian's fortunes"));
  // A file of the right name with other bytes.
  for (const char* f : {"science", "literature", "wisdom", "education", "humorists", "linux"}) {
    std::ofstream(dir + "/" + f) << "not the pinned file\n%\n";
  }
  EXPECT_THAT(BuiltinText(TextKind::kCalibration, dir),
              StatusIs(absl::StatusCode::kFailedPrecondition, "differs from"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pd::engine::quantize
