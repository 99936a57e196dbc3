#include "engine/quant/dtype.h"

#include <string>

#include "common/status.h"
#include "common/strings.h"
#include "engine/quant/q4_kx16.h"

namespace pd::engine {

const DTypeTraits& Traits(DType t) {
  static const DTypeTraits kF32{"f32", 1, 4};
  static const DTypeTraits kF16{"f16", 1, 2};
  static const DTypeTraits kBF16{"bf16", 1, 2};
  static const DTypeTraits kQ8_0{"q8_0", 32, 34};
  // Bytes per block from the layouts in k_quants.h (static_asserts there check the structs).
  static const DTypeTraits kQ4_0{"q4_0", 32, 18};
  static const DTypeTraits kQ5_0{"q5_0", 32, 22};    // f16 d + 4 bytes of high bits + 16 of nibbles    // f16 d + 16 bytes of nibbles
  static const DTypeTraits kQ2_K{"q2_K", 256, 84};   // 16 + 64 + 2 x f16
  static const DTypeTraits kQ3_K{"q3_K", 256, 110};  // 32 + 64 + 12 + f16
  static const DTypeTraits kQ4_K{"q4_K", 256, 144};  // 2 x f16 + 12 + 128
  static const DTypeTraits kQ5_K{"q5_K", 256, 176};  // 2 x f16 + 12 + 32 + 128
  static const DTypeTraits kQ6_K{"q6_K", 256, 210};  // 128 + 64 + 16 + f16
  static const DTypeTraits kQ8_K{"q8_K", 256, 292};  // f32 + 256 + 16 x int16
  static const DTypeTraits kW8A8{"w8a8", 32, 32, 16};  // 16-byte row header (f32 scale) + int8
  static const DTypeTraits kW4A16{"w4a16", 128, 66};   // f16 d + 64 bytes of nibbles
  static const DTypeTraits kQ8_0x16{"q8_0x16", 32, 34};  // Q8_0's bytes, 16 rows interleaved
  static const DTypeTraits kQ5_0x16{"q5_0x16", 32, 22};  // Q5_0's bytes, 16 rows interleaved
  static const DTypeTraits kQ4_Kx16{"q4_Kx16", 256,
                                    kQ4_Kx16RowBytes};     // Q4_K's, scales unpacked (q4_kx16.h)
  static const DTypeTraits kQ6_Kx16{"q6_Kx16", 256, 210};  // Q6_K's bytes, 16 rows interleaved
  switch (t) {
    case DType::kF32: return kF32;
    case DType::kF16: return kF16;
    case DType::kBF16: return kBF16;
    case DType::kQ8_0: return kQ8_0;
    case DType::kQ4_0: return kQ4_0;
    case DType::kQ5_0: return kQ5_0;
    case DType::kQ2_K: return kQ2_K;
    case DType::kQ3_K: return kQ3_K;
    case DType::kQ4_K: return kQ4_K;
    case DType::kQ5_K: return kQ5_K;
    case DType::kQ6_K: return kQ6_K;
    case DType::kQ8_K: return kQ8_K;
    case DType::kW8A8: return kW8A8;
    case DType::kW4A16: return kW4A16;
    case DType::kQ8_0x16:
      return kQ8_0x16;
    case DType::kQ5_0x16:
      return kQ5_0x16;
    case DType::kQ4_Kx16:
      return kQ4_Kx16;
    case DType::kQ6_Kx16:
      return kQ6_Kx16;
  }
  PD_CHECK_MSG(false, "unsupported DType");
}

std::optional<DType> DTypeFromGgml(uint32_t v) {
  switch (v) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 2: return DType::kQ4_0;
    case 6: return DType::kQ5_0;
    case 8: return DType::kQ8_0;
    case 10: return DType::kQ2_K;
    case 11: return DType::kQ3_K;
    case 12: return DType::kQ4_K;
    case 13: return DType::kQ5_K;
    case 14: return DType::kQ6_K;
    case 15: return DType::kQ8_K;
    case 30: return DType::kBF16;
    case static_cast<uint32_t>(DType::kW8A8): return DType::kW8A8;
    case static_cast<uint32_t>(DType::kW4A16): return DType::kW4A16;
    default: return std::nullopt;
  }
}

std::string RawGgmlTypeName(uint32_t v) {
  // Names of the ggml types this engine does not (yet) run, so errors can say what was found.
  static const char* kNames[] = {"f32",  "f16",  "q4_0", "q4_1", "q4_2", "q4_3", "q5_0", "q5_1",
                                 "q8_0", "q8_1", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K",
                                 "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s",
                                 "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64", "f64", "iq1_m",
                                 "bf16"};
  if (v < sizeof(kNames) / sizeof(kNames[0])) return kNames[v];
  if (v == static_cast<uint32_t>(DType::kW8A8)) return "w8a8";
  if (v == static_cast<uint32_t>(DType::kW4A16)) return "w4a16";
  if (v == static_cast<uint32_t>(DType::kQ8_0x16)) return "q8_0x16 (a runtime layout)";
  if (v == static_cast<uint32_t>(DType::kQ5_0x16)) return "q5_0x16 (a runtime layout)";
  if (v == static_cast<uint32_t>(DType::kQ4_Kx16)) return "q4_Kx16 (a runtime layout)";
  if (v == static_cast<uint32_t>(DType::kQ6_Kx16)) return "q6_Kx16 (a runtime layout)";
  return pd::StrCat("type ", v);
}

}  // namespace pd::engine
