#include "engine/quant/dtype.h"

#include <string>

#include "common/strings.h"
#include "common/status.h"

namespace pd::engine {

const DTypeTraits& Traits(DType t) {
  static const DTypeTraits kF32{"f32", 1, 4};
  static const DTypeTraits kF16{"f16", 1, 2};
  static const DTypeTraits kBF16{"bf16", 1, 2};
  static const DTypeTraits kQ8_0{"q8_0", 32, 34};
  switch (t) {
    case DType::kF32: return kF32;
    case DType::kF16: return kF16;
    case DType::kBF16: return kBF16;
    case DType::kQ8_0: return kQ8_0;
  }
  PD_CHECK_MSG(false, "unsupported DType");
}

std::optional<DType> DTypeFromGgml(uint32_t v) {
  switch (v) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 8: return DType::kQ8_0;
    case 30: return DType::kBF16;
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
  return pd::StrCat("type ", v);
}

}  // namespace pd::engine
