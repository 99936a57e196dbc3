#include "engine/quant/quantize/policy.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "common/status.h"
#include "common/strings.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/quantize/embedded.h"
#include "yaml-cpp/yaml.h"

namespace pd::engine::quantize {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Ladders that `bump` climbs: the k-quants, and the 32-weight block types.
const std::vector<DType> kKLadder = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                                     DType::kQ5_K, DType::kQ6_K, DType::kQ8_0};
const std::vector<DType> kLegacyLadder = {DType::kQ4_0, DType::kQ5_0, DType::kQ8_0};
// pdserve's own types climb among themselves, so that a model stays within the formats the GPU
// kernels of both run.
const std::vector<DType> kPdLadder = {DType::kW4A16, DType::kW8A8};

DType Bump(DType base, int steps) {
  for (const auto* ladder : {&kKLadder, &kLegacyLadder, &kPdLadder}) {
    auto it = std::find(ladder->begin(), ladder->end(), base);
    if (it == ladder->end()) continue;
    const int64_t i = std::clamp<int64_t>((it - ladder->begin()) + steps, 0,
                                          static_cast<int64_t>(ladder->size()) - 1);
    return (*ladder)[i];
  }
  return base;  // float types do not climb
}

absl::StatusOr<std::regex> CompileRegex(const std::string& pattern, std::string_view where) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(
        pd::StrCat(where, ": bad regular expression '", pattern, "': ", e.what()));
  }
}

absl::StatusOr<Policy> ParseNode(const YAML::Node& root, std::string_view source) {
  auto bad = [&](std::string_view what) {
    return absl::InvalidArgumentError(pd::StrCat("policy ", source, ": ", what));
  };
  if (!root.IsMap()) return bad("expected a mapping at the top level");
  Policy p;
  p.source = std::string(source);
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (key == "name") {
      p.name = kv.second.as<std::string>();
    } else if (key == "description") {
      p.description = kv.second.as<std::string>();
    } else if (key == "file_type") {
      if (!kv.second.IsMap()) return bad("file_type must map type names to numbers");
      for (const auto& ft : kv.second) {
        auto t = ParseTypeName(ft.first.as<std::string>());
        if (!t.ok()) return bad(std::string(t.status().message()));
        p.file_type[*t] = ft.second.as<uint32_t>();
      }
    } else if (key == "rules") {
      if (!kv.second.IsSequence()) return bad("rules must be a list");
      int index = 0;
      for (const auto& rn : kv.second) {
        const std::string where = pd::StrCat("rule ", index++);
        if (!rn.IsMap()) return bad(pd::StrCat(where, " is not a mapping"));
        PolicyRule r;
        bool has_match = false;
        for (const auto& f : rn) {
          const std::string k = f.first.as<std::string>();
          if (k == "match") {
            r.match = f.second.as<std::string>();
            has_match = true;
          } else if (k == "tied_output") {
            r.tied_output = f.second.as<bool>();
          } else if (k == "layers") {
            if (!f.second.IsSequence() || f.second.size() != 2) {
              return bad(pd::StrCat(where, ": layers must be [from, to]"));
            }
            r.layer_from = f.second[0].as<double>();
            r.layer_to = f.second[1].as<double>();
            r.has_layers = true;
            if (!(r.layer_from >= 0 && r.layer_from < r.layer_to && r.layer_to <= 1)) {
              return bad(pd::StrCat(where, ": layers must satisfy 0 <= from < to <= 1"));
            }
          } else if (k == "type" || k == "at_least") {
            auto t = ParseTypeName(f.second.as<std::string>(), /*allow_float=*/k == "type");
            if (!t.ok()) return bad(pd::StrCat(where, ": ", t.status().message()));
            (k == "type" ? r.type : r.at_least) = *t;
          } else if (k == "bump") {
            r.bump = f.second.as<int>();
          } else {
            return bad(pd::StrCat(where, ": unknown key '", k,
                                  "' (match, tied_output, layers, type, bump, at_least)"));
          }
        }
        if (!has_match) return bad(pd::StrCat(where, " has no 'match'"));
        if (r.type && (r.bump != 0 || r.at_least)) {
          return bad(pd::StrCat(where, ": 'type' excludes 'bump' and 'at_least'"));
        }
        if (!r.type && r.bump == 0 && !r.at_least) {
          return bad(pd::StrCat(where, ": needs 'type', 'bump' or 'at_least'"));
        }
        PD_ASSIGN_OR_RETURN(r.re, CompileRegex(r.match, pd::StrCat("policy ", source, " ", where)));
        p.rules.push_back(std::move(r));
      }
    } else {
      return bad(pd::StrCat("unknown key '", key, "' (name, description, file_type, rules)"));
    }
  }
  if (p.name.empty()) return bad("missing 'name'");
  return p;
}

}  // namespace

const std::vector<DType>& QuantTypes() {
  static const std::vector<DType> kTypes = {DType::kQ2_K, DType::kQ3_K, DType::kW4A16,
                                            DType::kQ4_0, DType::kQ4_K, DType::kQ5_K,
                                            DType::kQ6_K, DType::kW8A8,  DType::kQ8_0};
  return kTypes;
}

absl::StatusOr<DType> ParseTypeName(std::string_view name, bool allow_float) {
  const std::string want = Lower(name);
  std::vector<DType> types = QuantTypes();
  if (allow_float)
    types.insert(types.end(), {DType::kQ5_0, DType::kF32, DType::kF16, DType::kBF16});
  std::string names;
  for (DType t : types) {
    if (Lower(Traits(t).name) == want) return t;
    names += pd::StrCat(names.empty() ? "" : ", ", Traits(t).name);
  }
  return absl::InvalidArgumentError(pd::StrCat("unknown type '", name, "' (one of: ", names, ")"));
}

double BitsPerWeight(DType t) {
  const DTypeTraits& tr = Traits(t);
  // W8A8's 16-byte row header is not counted (0.03 bits per weight on rows of 4096); the
  // quantizer's report counts every byte written.
  return static_cast<double>(tr.block_bytes) * 8.0 / tr.block_size;
}

absl::StatusOr<Policy> Policy::Parse(std::string_view yaml, std::string_view source) {
  try {
    return ParseNode(YAML::Load(std::string(yaml)), source);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(pd::StrCat("policy ", source, ": ", e.what()));
  }
}

absl::StatusOr<Policy> Policy::Load(std::string_view name_or_path) {
  std::string upper(name_or_path);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (std::string_view text = EmbeddedPolicy(upper); !text.empty()) {
    return Parse(text, pd::StrCat("built-in ", upper));
  }
  std::ifstream in{std::string(name_or_path)};
  if (!in) {
    return absl::InvalidArgumentError(pd::StrCat(
        "unknown policy '", name_or_path, "': use S, M, L or the path of a policy YAML file"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), name_or_path);
}

absl::StatusOr<TensorOverride> ParseOverride(std::string_view spec) {
  const size_t eq = spec.rfind('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == spec.size()) {
    return absl::InvalidArgumentError(
        pd::StrCat("--override '", spec, "': expected REGEX=TYPE, e.g. 'blk\\.[0-3]\\..*=q6_K'"));
  }
  TensorOverride o;
  o.spec = std::string(spec);
  auto t = ParseTypeName(spec.substr(eq + 1), /*allow_float=*/true);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        pd::StrCat("--override '", spec, "': ", t.status().message()));
  }
  o.type = *t;
  PD_ASSIGN_OR_RETURN(
      o.re, CompileRegex(std::string(spec.substr(0, eq)), pd::StrCat("--override '", spec, "'")));
  return o;
}

TypeChoice ChooseType(const Policy& policy, DType base,
                      const std::vector<TensorOverride>& overrides, const TensorPlace& place) {
  const std::string name(place.name);
  for (const TensorOverride& o : overrides) {
    if (std::regex_match(name, o.re)) return {o.type, pd::StrCat("override ", o.spec)};
  }
  for (const PolicyRule& r : policy.rules) {
    if (!std::regex_match(name, r.re)) continue;
    if (r.tied_output && *r.tied_output != place.tied_output) continue;
    if (r.has_layers) {
      if (place.layer < 0 || place.n_layers <= 0) continue;
      const double f = static_cast<double>(place.layer) / place.n_layers;
      if (f < r.layer_from || f >= r.layer_to) continue;
    }
    std::string why = pd::StrCat("policy ", policy.name, ":");
    if (r.type) {
      return {*r.type, pd::StrCat(why, " ", Traits(*r.type).name)};
    }
    DType t = Bump(base, r.bump);
    if (r.bump != 0) why += pd::StrCat(" ", r.bump > 0 ? "+" : "", r.bump);
    if (r.at_least && BitsPerWeight(t) < BitsPerWeight(*r.at_least)) {
      t = *r.at_least;
      why += pd::StrCat(" >=", Traits(*r.at_least).name);
    }
    return {t, why};
  }
  return {base, ""};
}

std::optional<DType> FallbackForRow(DType t, int64_t cols) {
  const int bs = Traits(t).block_size;
  if (cols % bs == 0) return t;
  if (t == DType::kW4A16 && cols % 32 == 0) return DType::kQ4_0;  // 4.5 bpw, x Q8_0
  if (bs == kQK && cols % 32 == 0) {
    switch (t) {
      case DType::kQ2_K:
      case DType::kQ3_K:
        return DType::kQ4_0;
      case DType::kQ4_K:
      case DType::kQ5_K:
        return DType::kQ5_0;
      default:
        return DType::kQ8_0;
    }
  }
  return std::nullopt;
}

}  // namespace pd::engine::quantize
