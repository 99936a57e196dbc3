#include "frontend/model_card.h"

#include "common/strings.h"

namespace pd::frontend {

std::string QuantizationName(const engine::GgufFile& file) {
  absl::StatusOr<uint64_t> ft = file.GetUint("general.file_type");
  if (!ft.ok()) return "";
  switch (*ft) {
    case 0:
      return "F32";
    case 1:
      return "F16";
    case 2:
      return "Q4_0";
    case 7:
      return "Q8_0";
    case 8:
      return "Q5_0";
    case 10:
      return "Q2_K";
    case 11:
      return "Q3_K_S";
    case 12:
      return "Q3_K_M";
    case 13:
      return "Q3_K_L";
    case 14:
      return "Q4_K_S";
    case 15:
      return "Q4_K_M";
    case 16:
      return "Q5_K_S";
    case 17:
      return "Q5_K_M";
    case 18:
      return "Q6_K";
    case 32:
      return "BF16";
    default:
      return StrCat("file_type_", *ft);
  }
}

std::string FileStem(const std::string& path) {
  std::string trimmed = path;  // a Hugging Face folder may be given as DIR/
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  std::string name = trimmed.substr(trimmed.find_last_of('/') + 1);
  if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
  return name;
}

ModelCard ModelCardFromGguf(const engine::GgufFile& file, const std::string& path,
                            const std::string& id) {
  ModelCard card;
  card.id = id.empty() ? FileStem(path) : id;
  absl::StatusOr<std::string_view> arch = file.GetString("general.architecture");
  if (arch.ok()) card.architecture = std::string(*arch);
  for (const engine::GgufTensorInfo& t : file.tensors()) card.parameters += t.numel();
  card.quantization = QuantizationName(file);
  return card;
}

}  // namespace pd::frontend
