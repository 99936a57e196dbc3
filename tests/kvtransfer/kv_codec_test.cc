// The wire codec: checksum, f16 <-> int8 block conversion, packing and importing layers, and the
// descriptor's byte format.
#include "kvtransfer/kv_codec.h"

#include "kvtransfer/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "engine/backend/kv_rotation.h"
#include "engine/quant/fp16.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace pd::kvtransfer {
namespace {

using ::pd::testing::StatusIs;
using testing::BlockBytes;
using testing::CacheOptions;
using testing::FillRandom;

TEST(Checksum64, MatchesXxh3ReferenceVectors) {
  // From Debian's libxxhash (XXH3_64bits, seed 0): a build of xxHash other than ours.
  EXPECT_EQ(Checksum64("", 0), 0x2D06800538D394C2ull);
  EXPECT_EQ(Checksum64("abc", 3), 0x78AF5F94892F3950ull);
  std::vector<char> b(1000);  // > 240 bytes: XXH3's long-input (vector) loop
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(i * 131 + 7);
  EXPECT_EQ(Checksum64(b.data(), b.size()), 0x571D5CBFEF44331Bull);
}

// Every vector build gives the generic build's hash, one-shot and streamed in uneven pieces
// (the streaming state crosses XXH3's 1 KiB stripes and its internal buffer at odd offsets).
void ExpectSameAsGeneric(const internal::ChecksumImpl& a) {
  const internal::ChecksumImpl& g = internal::ChecksumGeneric();
  std::vector<uint8_t> d(70000);
  std::mt19937 rng(11);
  for (auto& x : d) x = static_cast<uint8_t>(rng());
  for (size_t n = 0; n + 1 < d.size(); n = n < 300 ? n + 1 : n * 5 / 4 + 7) {
    ASSERT_EQ(g.oneshot(d.data() + 1, n), a.oneshot(d.data() + 1, n)) << n;  // unaligned too
  }
  auto streamed = [&](const internal::ChecksumImpl& impl, size_t piece) {
    void* state = ::operator new(impl.state_bytes, std::align_val_t{64});
    impl.reset(state);
    for (size_t off = 0; off < d.size(); off += piece) {
      impl.update(state, d.data() + off, std::min(piece, d.size() - off));
    }
    const uint64_t h = impl.digest(state);
    ::operator delete(state, std::align_val_t{64});
    return h;
  };
  for (size_t piece : {1u, 63u, 1000u, 4099u, 65536u}) {
    ASSERT_EQ(streamed(g, piece), streamed(a, piece)) << piece;
  }
  ASSERT_EQ(streamed(a, 777), g.oneshot(d.data(), d.size()));
}

TEST(Checksum64, Avx2AndGenericBuildsAgree) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2 on this CPU";
  ExpectSameAsGeneric(internal::ChecksumAvx2());
}

TEST(Checksum64, Avx512AndGenericBuildsAgree) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "no AVX512F on this CPU";
  ExpectSameAsGeneric(internal::ChecksumAvx512());
}

TEST(Checksum64, StreamingInPiecesEqualsOneShot) {
  std::vector<uint8_t> d(3000);
  std::mt19937 rng(3);
  for (auto& b : d) b = static_cast<uint8_t>(rng());
  for (size_t n : {0, 1, 3, 31, 32, 33, 64, 100, 2999, 3000}) {
    for (size_t piece : {1, 5, 32, 48, 1000}) {
      Checksum64Stream s;
      for (size_t i = 0; i < n; i += piece) s.Update(d.data() + i, std::min(piece, n - i));
      ASSERT_EQ(s.Digest(), Checksum64(d.data(), n)) << n << " in pieces of " << piece;
    }
  }
}

TEST(Checksum64, EverySingleBitFlipChangesIt) {
  std::vector<uint8_t> d(1000);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(i * 7 + 3);
  const uint64_t ref = Checksum64(d.data(), d.size());
  for (size_t i = 0; i < d.size(); i += 37) {
    for (int bit = 0; bit < 8; ++bit) {
      d[i] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_NE(Checksum64(d.data(), d.size()), ref) << "byte " << i << " bit " << bit;
      d[i] ^= static_cast<uint8_t>(1 << bit);
    }
  }
  EXPECT_EQ(Checksum64(d.data(), d.size() - 1) == ref, false);
}

// Independent scalar reference of the engine's INT8 KV scheme (docs/kv_cache.md): the row
// rotated into the stored basis (RotateKvRowIn, tested against an explicit Hadamard matrix in
// kv_rotation_test), then quantized per row.
float RefQuantize(const float* head, int8_t* q, int n) {
  std::vector<float> rotated(head, head + n);
  engine::RotateKvRowIn(rotated.data(), n);
  const float* x = rotated.data();
  float amax = 0.f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int i = 0; i < n; ++i) {
    q[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, std::nearbyint(x[i] * id))));
  }
  return d;
}

struct Shape {
  int block_size, heads, head_dim;
};

class ConvertTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ConvertTest, F16ToInt8MatchesEngineSchemeAndExpandsWithinBound) {
  const Shape sh = GetParam();
  const int rows = sh.block_size * sh.heads, hd = sh.head_dim;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<uint16_t> f16(static_cast<size_t>(rows) * hd);
  for (size_t i = 0; i < f16.size(); ++i)
    f16[i] = engine::F32ToF16(nd(rng) * (i % 50 == 0 ? 30 : 1));
  for (int i = 0; i < hd; ++i) f16[i] = 0;  // an all-zero head: scale 0
  const size_t i8_bytes = static_cast<size_t>(rows) * hd + rows * 4;
  std::vector<uint8_t> i8(i8_bytes);
  CompressBlockF16ToI8(f16.data(), i8.data(), sh.block_size, sh.heads, hd);

  std::vector<float> x(hd);
  std::vector<int8_t> q(hd);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < hd; ++i) x[i] = engine::F16ToF32(f16[static_cast<size_t>(r) * hd + i]);
    const float d = RefQuantize(x.data(), q.data(), hd);
    float got_d;
    std::memcpy(&got_d, i8.data() + static_cast<size_t>(rows) * hd + r * 4, 4);
    ASSERT_EQ(got_d, d) << "row " << r;
    ASSERT_EQ(std::memcmp(i8.data() + static_cast<size_t>(r) * hd, q.data(), hd), 0) << "row " << r;
  }

  std::vector<uint16_t> back(f16.size());
  ExpandBlockI8ToF16(i8.data(), back.data(), sh.block_size, sh.heads, hd);
  const int block = engine::KvRotationBlock(hd);
  for (int r = 0; r < rows; ++r) {
    float scale;
    std::memcpy(&scale, i8.data() + static_cast<size_t>(rows) * hd + r * 4, 4);
    double err2 = 0, norm2 = 0;
    for (int i = 0; i < hd; ++i) {
      const size_t k = static_cast<size_t>(r) * hd + i;
      const float a = engine::F16ToF32(f16[k]), b = engine::F16ToF32(back[k]);
      // INT8 rounding (scale / 2 per rotated value; rotating back sums `block` of them) plus the
      // f16 rounding of the result (2^-11 relative).
      ASSERT_LE(std::fabs(a - b), scale / 2 * block * 1.0001f + std::fabs(b) * 0x1p-11f)
          << "row " << r << " i " << i;
      err2 += (double{a} - b) * (double{a} - b);
      norm2 += double{a} * a;
    }
    // In norm the rounding is far smaller: |H e| = sqrt(block) |e| <= sqrt(block * hd) scale / 2.
    ASSERT_LE(std::sqrt(err2), std::sqrt(static_cast<double>(block) * hd) * scale / 2 * 1.0001 +
                                   std::sqrt(norm2) * 0x1p-11)
        << "row " << r;
  }
}

TEST_P(ConvertTest, F16F32RoundTripIsExactAndSameTypeIsACopy) {
  const Shape sh = GetParam();
  const size_t n = static_cast<size_t>(sh.block_size) * sh.heads * sh.head_dim;
  std::vector<uint16_t> f16(n), back(n);
  for (size_t i = 0; i < n; ++i) f16[i] = static_cast<uint16_t>((i * 2654435761u) & 0x7bff);
  std::vector<float> f32(n);
  ConvertBlock(KvDType::kF16, f16.data(), KvDType::kF32, f32.data(), sh.block_size, sh.heads,
               sh.head_dim);
  ConvertBlock(KvDType::kF32, f32.data(), KvDType::kF16, back.data(), sh.block_size, sh.heads,
               sh.head_dim);
  EXPECT_EQ(f16, back);
  std::vector<uint16_t> copy(n);
  ConvertBlock(KvDType::kF16, f16.data(), KvDType::kF16, copy.data(), sh.block_size, sh.heads,
               sh.head_dim);
  EXPECT_EQ(f16, copy);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvertTest,
                         ::testing::Values(Shape{16, 1, 256}, Shape{16, 2, 64}, Shape{4, 3, 33},
                                           Shape{1, 1, 1}));

TEST(PackLayer, RejectsBadSpans) {
  auto backend = engine::CreateCpuBackend({1});
  auto kv = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
  PD_ASSERT_OK(FillRandom(*kv, 1, 40, 1));  // 3 blocks
  const TransferGeometry g = TransferGeometry::ForCache(kv->options(), 40, KvDType::kF16);
  std::vector<uint8_t> out(g.LayerBytes());
  auto spans = *kv->ExportSpans(1, 2);
  uint64_t sum = 0;
  PD_EXPECT_OK(PackLayer(g, KvDType::kF16, 2, spans, absl::MakeSpan(out), &sum));
  EXPECT_EQ(sum, Checksum64(out.data(), out.size()));
  EXPECT_THAT(PackLayer(g, KvDType::kF16, 1, spans, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected (layer 1"));
  EXPECT_THAT(
      PackLayer(g, KvDType::kF16, 2, absl::MakeSpan(spans).subspan(0, 5), absl::MakeSpan(out)),
      StatusIs(absl::StatusCode::kInvalidArgument, "has 5 spans"));
  auto swapped = spans;
  std::swap(swapped[0], swapped[1]);
  EXPECT_THAT(PackLayer(g, KvDType::kF16, 2, swapped, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, "span 0"));
  EXPECT_THAT(PackLayer(g, KvDType::kF32, 2, spans, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected"));
  EXPECT_THAT(PackLayer(g, KvDType::kF16, 2, spans, absl::MakeSpan(out).subspan(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, "output holds"));
}

TEST(ImportLayer, PackThenImportCopiesEveryBlockAndChecksTheCache) {
  auto backend = engine::CreateCpuBackend({1});
  auto src = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
  auto dst = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
  PD_ASSERT_OK(FillRandom(*src, 1, 70, 2));
  PD_ASSERT_OK(dst->Reserve(99, 33));  // other block ids
  PD_ASSERT_OK(dst->Reserve(5, 70));
  const TransferGeometry g = TransferGeometry::ForCache(dst->options(), 70, KvDType::kF16);
  std::vector<uint8_t> payload(g.LayerBytes());
  for (int l = 0; l < g.n_layer; ++l) {
    PD_ASSERT_OK(PackLayer(g, KvDType::kF16, l, *src->ExportSpans(1, l), absl::MakeSpan(payload)));
    PD_ASSERT_OK(ImportLayer(g, l, payload, *dst, 5));
  }
  for (int l = 0; l < g.n_layer; ++l) {
    for (int b = 0; b < g.n_blocks(); ++b) {
      for (auto part : {engine::KvPart::kK, engine::KvPart::kV}) {
        EXPECT_EQ(BlockBytes(*src, 1, l, b, part), BlockBytes(*dst, 5, l, b, part));
      }
    }
  }
  EXPECT_THAT(ImportLayer(g, 0, payload, *dst, 6),
              StatusIs(absl::StatusCode::kFailedPrecondition, "Reserve first"));
  EXPECT_THAT(ImportLayer(g, 0, absl::MakeSpan(payload).subspan(2), *dst, 5),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto i8 = *engine::KvCache::Create(CacheOptions(KvDType::kI8), *backend);
  EXPECT_THAT(ImportLayer(g, 0, payload, *i8, 5),
              StatusIs(absl::StatusCode::kFailedPrecondition, "dtype"));
  auto other = *engine::KvCache::Create(CacheOptions(KvDType::kF16, 4, 1, 128), *backend);
  EXPECT_THAT(ImportLayer(g, 0, payload, *other, 5),
              StatusIs(absl::StatusCode::kFailedPrecondition, "n_kv_heads"));
}

// LandLayer writes what ImportLayer writes, for every wire and cache dtype, into other block ids,
// and returns the payload's checksum (taken in the same pass).
TEST(LandLayer, WritesWhatImportLayerWritesAndReturnsTheChecksum) {
  auto backend = engine::CreateCpuBackend({1});
  auto src = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
  PD_ASSERT_OK(FillRandom(*src, 1, 70, 3));  // 5 blocks, the last one partial
  for (KvDType wire : {KvDType::kF16, KvDType::kI8}) {
    for (KvDType cache : {KvDType::kF16, KvDType::kI8, KvDType::kF32}) {
      SCOPED_TRACE(std::string(engine::KvDTypeName(wire)) + " -> " +
                   std::string(engine::KvDTypeName(cache)));
      auto imported = *engine::KvCache::Create(CacheOptions(cache), *backend);
      auto landed = *engine::KvCache::Create(CacheOptions(cache), *backend);
      PD_ASSERT_OK(imported->Reserve(5, 70));
      PD_ASSERT_OK(landed->Reserve(99, 33));  // other block ids
      PD_ASSERT_OK(landed->Reserve(5, 70));
      const TransferGeometry g = TransferGeometry::ForCache(landed->options(), 70, wire);
      std::vector<uint8_t> payload(g.LayerBytes());
      for (int l = 0; l < g.n_layer; ++l) {
        PD_ASSERT_OK(
            PackLayer(g, KvDType::kF16, l, *src->ExportSpans(1, l), absl::MakeSpan(payload)));
        PD_ASSERT_OK(ImportLayer(g, l, payload, *imported, 5));
        absl::StatusOr<uint64_t> sum = LandLayer(g, l, payload, *landed->ExportSpans(5, l));
        PD_ASSERT_OK(sum.status());
        EXPECT_EQ(*sum, Checksum64(payload.data(), payload.size()));
      }
      for (int l = 0; l < g.n_layer; ++l) {
        for (int b = 0; b < g.n_blocks(); ++b) {
          for (auto part : {engine::KvPart::kK, engine::KvPart::kV}) {
            ASSERT_EQ(BlockBytes(*imported, 5, l, b, part), BlockBytes(*landed, 5, l, b, part));
          }
        }
      }
    }
  }
}

TEST(LandLayer, RejectsSpansAndPayloadsThatDoNotFit) {
  auto backend = engine::CreateCpuBackend({1});
  auto kv = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
  PD_ASSERT_OK(kv->Reserve(5, 40));  // 3 blocks
  const TransferGeometry g = TransferGeometry::ForCache(kv->options(), 40, KvDType::kF16);
  std::vector<uint8_t> payload(g.LayerBytes(), 7);
  const std::vector<engine::KvSpan> spans = *kv->ExportSpans(5, 1);
  PD_EXPECT_OK(LandLayer(g, 1, payload, spans).status());
  EXPECT_THAT(LandLayer(g, 1, absl::MakeSpan(payload).subspan(1), spans).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "LandLayer: payload of"));
  EXPECT_THAT(LandLayer(g, 2, payload, spans).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "receive target: span 0 is (layer 1"));
  EXPECT_THAT(LandLayer(g, 1, payload, absl::MakeSpan(spans).subspan(0, 5)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "receive target: layer 1 has 5 spans"));
  TransferGeometry gi = g;
  gi.receiver_dtype = KvDType::kI8;  // the spans are an F16 cache's
  EXPECT_THAT(CheckLandingSpans(gi, 1, spans),
              StatusIs(absl::StatusCode::kInvalidArgument, "receive target: span 0 has"));
}

TEST(TransferDescriptor, RoundTripsAndRejectsGarbage) {
  TransferDescriptor d;
  d.transport = "ucx";
  d.address = std::string("\0\1\2binary\xff", 10);
  d.transfer_id = 0x123456789;
  d.geometry = {18, 1, 256, 16, 4000, KvDType::kF16, KvDType::kI8, 200};
  d.deadline = absl::FromUnixMicros(1790000000123456);
  const std::string bytes = d.Serialize();
  auto back = TransferDescriptor::Parse(bytes);
  PD_ASSERT_OK(back);
  EXPECT_EQ(back->transport, d.transport);
  EXPECT_EQ(back->address, d.address);
  EXPECT_EQ(back->transfer_id, d.transfer_id);
  EXPECT_EQ(back->geometry, d.geometry);
  EXPECT_EQ(back->deadline, d.deadline);
  d.deadline = absl::InfiniteFuture();
  EXPECT_EQ(TransferDescriptor::Parse(d.Serialize())->deadline, absl::InfiniteFuture());

  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THAT(TransferDescriptor::Parse(bytes.substr(0, n)),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << n;
  }
  EXPECT_THAT(TransferDescriptor::Parse(bytes + "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "trailing"));
  std::string bad = bytes;
  bad[0] ^= 1;
  EXPECT_THAT(TransferDescriptor::Parse(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, "magic"));
  d.geometry.first_block = 250;  // 4000 tokens are 250 blocks: one at least must travel
  EXPECT_THAT(TransferDescriptor::Parse(d.Serialize()),
              StatusIs(absl::StatusCode::kInvalidArgument, "first_block = 250"));
  d.geometry.first_block = -1;
  EXPECT_THAT(TransferDescriptor::Parse(d.Serialize()),
              StatusIs(absl::StatusCode::kInvalidArgument, "first_block"));
  d.geometry.first_block = 0;
  d.geometry.head_dim = 0;
  EXPECT_THAT(TransferDescriptor::Parse(d.Serialize()),
              StatusIs(absl::StatusCode::kInvalidArgument, "head_dim"));
}

// A receiver that holds a prompt's first blocks (its prefix cache) gets only the rest: the
// payload starts at first_block, and packing, landing and importing write exactly those blocks.
TEST(FirstBlock, OnlyTheBlocksFromFirstBlockTravelAndLand) {
  auto backend = engine::CreateCpuBackend({1});
  auto src = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
  PD_ASSERT_OK(FillRandom(*src, 1, 70, 4));  // 5 blocks of 16
  for (KvDType wire : {KvDType::kF16, KvDType::kI8}) {
    SCOPED_TRACE(engine::KvDTypeName(wire));
    auto landed = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
    auto imported = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
    PD_ASSERT_OK(FillRandom(*landed, 5, 70, 9));  // blocks 0-1 must keep these bytes
    PD_ASSERT_OK(FillRandom(*imported, 5, 70, 9));
    TransferGeometry g = TransferGeometry::ForCache(landed->options(), 70, wire);
    const size_t full = g.LayerBytes();
    g.first_block = 2;
    EXPECT_EQ(g.total_blocks(), 5);
    EXPECT_EQ(g.n_blocks(), 3);
    EXPECT_EQ(g.LayerBytes(), full / 5 * 3);
    std::vector<uint8_t> payload(g.LayerBytes());
    for (int l = 0; l < g.n_layer; ++l) {
      const auto spans = *src->ExportSpans(1, l);
      PD_ASSERT_OK(PackLayer(g, KvDType::kF16, l, spans, absl::MakeSpan(payload)));
      if (wire == KvDType::kF16) {
        std::vector<ByteRun> runs;
        uint64_t sum = 0;
        PD_ASSERT_OK(LayerRuns(g, KvDType::kF16, l, spans, &runs, &sum));
        EXPECT_EQ(sum, Checksum64(payload.data(), payload.size()));
      }
      PD_ASSERT_OK(LandLayer(g, l, payload, *landed->ExportSpans(5, l)).status());
      PD_ASSERT_OK(ImportLayer(g, l, payload, *imported, 5));
    }
    auto before = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
    PD_ASSERT_OK(FillRandom(*before, 5, 70, 9));
    for (int l = 0; l < g.n_layer; ++l) {
      for (int b = 0; b < 5; ++b) {
        for (auto part : {engine::KvPart::kK, engine::KvPart::kV}) {
          EXPECT_EQ(BlockBytes(*landed, 5, l, b, part), BlockBytes(*imported, 5, l, b, part));
          if (b < 2) {  // untouched
            EXPECT_EQ(BlockBytes(*landed, 5, l, b, part), BlockBytes(*before, 5, l, b, part));
          } else if (wire == KvDType::kF16) {  // a copy of the sender's
            EXPECT_EQ(BlockBytes(*landed, 5, l, b, part), BlockBytes(*src, 1, l, b, part));
          } else {
            EXPECT_NE(BlockBytes(*landed, 5, l, b, part), BlockBytes(*before, 5, l, b, part));
          }
        }
      }
    }
  }
}

TEST(TransferGeometry, SizesFollowTheKvLayout) {
  TransferGeometry g{18, 1, 256, 16, 1000, KvDType::kF16, KvDType::kF16};
  EXPECT_EQ(g.n_blocks(), 63);
  EXPECT_EQ(g.SpanBytes(KvDType::kF16), 16u * 256 * 2);
  EXPECT_EQ(g.SpanBytes(KvDType::kI8), 16u * 256 + 16 * 4);
  EXPECT_EQ(g.LayerBytes(), 63u * 2 * 8192);
  engine::KvCacheOptions o = CacheOptions(KvDType::kI8, 18, 1, 256);
  EXPECT_EQ(g.SpanBytes(KvDType::kI8), engine::KvCache::BlockBytesFor(o).span());
}

}  // namespace
}  // namespace pd::kvtransfer
