// Mixed-precision policies: which block type each weight tensor of a model gets, given the base
// type the user asked for. A policy is data: a small YAML file (engine/quant/policies/{s,m,l}.yaml,
// compiled into the binary, or any file given by path), parsed at run time; the format is in
// engine/quant/policies/m.yaml and docs/quantization.md. Command-line overrides ("REGEX=TYPE")
// take precedence over the policy.
//
// Thread safety: Policy and TensorOverride are immutable after creation.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/quant/dtype.h"

namespace pd::engine::quantize {

// The base types `pdctl quantize --type` accepts, in ascending bits per weight.
const std::vector<DType>& QuantTypes();
// Parses a type name (ggml's spelling, any case: "q4_K", "Q4_K", "q8_0"). `allow_float` also
// accepts q5_0 (the k-quants' row fallback), f32, f16 and bf16, for overrides and policy rules.
// INVALID_ARGUMENT lists the accepted names.
absl::StatusOr<DType> ParseTypeName(std::string_view name, bool allow_float = false);
// Bits per stored weight of a type (block bytes * 8 / block size).
double BitsPerWeight(DType t);

struct PolicyRule {
  std::string match;  // regular expression, matched against the whole tensor name
  std::regex re;
  std::optional<bool> tied_output;          // condition: the head is (not) the tied embedding
  double layer_from = 0.0, layer_to = 1.0;  // condition: layer index / n_layers in [from, to)
  bool has_layers = false;
  std::optional<DType> type;      // exact type
  int bump = 0;                   // steps up the base type's ladder
  std::optional<DType> at_least;  // minimum type by bits per weight
};

struct Policy {
  std::string name;
  std::string description;
  std::string source;                   // "built-in M" or the file path
  std::map<DType, uint32_t> file_type;  // general.file_type per base type
  std::vector<PolicyRule> rules;

  // Parses YAML text; `source` names it in errors. INVALID_ARGUMENT on malformed YAML, unknown
  // keys, bad regexes, unknown types, or a rule with `type` and `bump`/`at_least` together.
  static absl::StatusOr<Policy> Parse(std::string_view yaml, std::string_view source);
  // "S", "M", "L" (any case): the built-in policy; anything else is a path to a YAML file.
  // INVALID_ARGUMENT for an unknown name that is not a readable file.
  static absl::StatusOr<Policy> Load(std::string_view name_or_path);
};

// One `--override REGEX=TYPE`: tensors whose whole name matches REGEX get TYPE (which may be
// f32/f16/bf16). The split is at the last '='.
struct TensorOverride {
  std::string spec;
  std::regex re;
  DType type = DType::kF32;
};
absl::StatusOr<TensorOverride> ParseOverride(std::string_view spec);

// What the tensor is and where it sits, as far as the policy cares.
struct TensorPlace {
  std::string_view name;
  int layer = -1;    // blk.N index, -1 for tensors outside the blocks
  int n_layers = 0;  // number of blocks in the model
  bool tied_output = false;
};

struct TypeChoice {
  DType type;
  std::string why;  // "base", "policy M: 'blk\.\d+\.attn_v\.weight' bump 1", "override ..."
};

// The type of a weight tensor: the first matching override, else the policy's first matching
// rule applied to `base`, else `base`. (Row-length fallbacks are the caller's: see
// FallbackForRow.)
TypeChoice ChooseType(const Policy& policy, DType base,
                      const std::vector<TensorOverride>& overrides, const TensorPlace& place);

// The type a row of `cols` weights can actually take when `t` needs blocks that do not divide
// it: k-quants (256) fall back to a 32-weight type of about as many bits or more: q2_K, q3_K ->
// q4_0 (4.5 bpw); q4_K, q5_K -> q5_0 (5.5); q6_K -> q8_0 (8.5); w4a16 (128) -> q4_0. 32-weight
// types that do not fit (w8a8 included) give nullopt (the tensor stays in its float type).
// Returns `t` itself when it fits.
std::optional<DType> FallbackForRow(DType t, int64_t cols);

}  // namespace pd::engine::quantize
