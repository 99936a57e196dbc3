#include "engine/model/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>
#include <tuple>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

using json = nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

struct DTypeInfo {
  std::string_view name;
  size_t bits;
};
// Every dtype of the reference implementation. The sub-byte ones (F4, F6_*) are packed: a
// tensor of them must fill whole bytes.
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 8},    {"U8", 8},          {"I8", 8},          {"F8_E4M3", 8}, {"F8_E5M2", 8},
    {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F4", 4},      {"F6_E2M3", 6},
    {"F6_E3M2", 6}, {"I16", 16},        {"U16", 16},        {"F16", 16},    {"BF16", 16},
    {"I32", 32},    {"U32", 32},        {"F32", 32},        {"I64", 64},    {"U64", 64},
    {"F64", 64},    {"C64", 64},
};

// What a JSON value is, for messages: "an array", "a negative integer", ...
std::string_view Described(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
      return "a negative integer";  // "-0" included
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a floating-point number";
    default:
      return "an unexpected value";
  }
}

// `s` for an error message: at most 200 bytes of it (cut at a UTF-8 boundary, "..." appended), so
// that a hostile 50 MB tensor name does not become a 50 MB status.
std::string Shown(std::string_view s) {
  constexpr size_t kMaxShown = 200;
  if (s.size() <= kMaxShown) return std::string(s);
  size_t n = kMaxShown;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return pd::StrCat(s.substr(0, n), "...");
}

// "[2, 3]" for messages.
std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// A SAX consumer that only records the parse error: nlohmann's DOM parser without exceptions
// says that the text is malformed but not where.
struct ParseErrorSax : nlohmann::json_sax<json> {
  std::string error = "unexpected end of input";
  size_t position = 0;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t pos, const std::string&,
                   const nlohmann::detail::exception& e) override {
    position = pos;
    error = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, ..." -> "parse error at line 1, ..."
    if (error.rfind("[json.exception.", 0) == 0) {
      if (size_t end = error.find("] "); end != std::string::npos) error.erase(0, end + 2);
    }
    return false;
  }
};

// Parses `text` (the JSON `what`, starting at byte `base` of its file) into *out. Rejects invalid
// UTF-8, malformed JSON and a key that appears twice in one object, anywhere: nlohmann keeps the
// last of two equal keys silently, and a second parser that kept the first would read another
// tensor from the same file.
absl::Status ParseJson(std::string_view text, uint64_t base, std::string_view what, json* out) {
  if (const size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        pd::StrCat(what, " is not valid UTF-8: byte ", base + bad, " starts no valid sequence"));
  }
  // nlohmann/json takes a NUL for the end of its input and ignores whatever follows it; JSON
  // allows no NUL anywhere (not even inside a string, where it must be escaped).
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return absl::InvalidArgumentError(
        pd::StrCat(what, " is not valid JSON: byte ", base + nul, " is NUL"));
  }
  // One set of keys per object being parsed; the top-level key the current one is under.
  std::vector<std::set<std::string>> open;
  std::string top_key;
  std::string duplicate;
  auto cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string* key = parsed.get_ptr<const std::string*>();
        if (key == nullptr || open.empty()) break;
        if (open.size() == 1) top_key = *key;
        if (!open.back().insert(*key).second && duplicate.empty()) {
          duplicate = open.size() == 1
                          ? pd::StrCat("key '", Shown(*key), "' appears twice")
                          : pd::StrCat("key '", Shown(*key), "' appears twice inside '",
                                       Shown(top_key), "'");
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  *out = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    ParseErrorSax sax;  // parse again, without exceptions, for the position of the error
    json::sax_parse(text.begin(), text.end(), &sax);
    const uint64_t at = base + (sax.position > 0 ? sax.position - 1 : 0);
    return absl::InvalidArgumentError(
        pd::StrCat(what, " is not valid JSON (near byte ", at, "): ", Shown(sax.error)));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(pd::StrCat(what, ": ", duplicate));
  }
  if (!out->is_object()) {
    return absl::InvalidArgumentError(
        pd::StrCat(what, " is ", Described(*out), ", expected an object"));
  }
  return absl::OkStatus();
}

// A non-negative JSON integer; `what` names it in the error.
absl::StatusOr<uint64_t> NonNegativeInt(const json& v, std::string_view what) {
  // nlohmann stores every integer written without a '-' as unsigned; "-0" is refused, as the
  // reference implementation does.
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  return absl::InvalidArgumentError(
      pd::StrCat(what, " is ", Described(v), ", expected a non-negative integer"));
}

// A tensor entry of the header; sets everything but `data` and `file`.
absl::StatusOr<SafetensorsTensor> ParseEntry(const std::string& name, const json& entry,
                                             uint64_t data_size) {
  SafetensorsTensor t;
  t.name = name;
  const std::string where = pd::StrCat("tensor '", Shown(name), "'");
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        pd::StrCat(where, " is ", Described(entry),
                   ", expected an object with \"dtype\", \"shape\" and \"data_offsets\""));
  }
  auto field = [&](std::string_view key) -> absl::StatusOr<const json*> {
    auto it = entry.find(key);
    if (it == entry.end()) {
      return absl::InvalidArgumentError(pd::StrCat(where, " has no \"", key, "\""));
    }
    return &*it;
  };

  PD_ASSIGN_OR_RETURN(const json* dtype, field("dtype"));
  if (!dtype->is_string()) {
    return absl::InvalidArgumentError(
        pd::StrCat(where, ": \"dtype\" is ", Described(*dtype), ", expected a string"));
  }
  t.dtype = dtype->get<std::string>();
  const size_t bits = SafetensorsDTypeBits(t.dtype);
  if (bits == 0) {
    return absl::InvalidArgumentError(
        pd::StrCat(where, " has unknown dtype '", Shown(t.dtype), "'"));
  }
  t.type = DTypeFromSafetensors(t.dtype);

  PD_ASSIGN_OR_RETURN(const json* shape, field("shape"));
  if (!shape->is_array()) {
    return absl::InvalidArgumentError(
        pd::StrCat(where, ": \"shape\" is ", Described(*shape), ", expected an array"));
  }
  uint64_t numel = 1;
  bool overflow = false;
  t.shape.reserve(shape->size());
  for (size_t i = 0; i < shape->size(); ++i) {
    PD_ASSIGN_OR_RETURN(uint64_t dim,
                        NonNegativeInt((*shape)[i], pd::StrCat(where, ": shape[", i, "]")));
    if (dim > kInt64Max) {
      return absl::InvalidArgumentError(
          pd::StrCat(where, ": shape[", i, "] = ", dim, " is out of range"));
    }
    if (dim != 0 && numel > kInt64Max / dim) overflow = true;
    numel *= dim;  // wraps only when overflow is already set
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  if (overflow || numel > std::numeric_limits<uint64_t>::max() / bits) {
    return absl::InvalidArgumentError(
        pd::StrCat(where, ": the element count of shape ", ShapeString(t.shape), " overflows"));
  }
  const uint64_t total_bits = numel * bits;
  if (total_bits % 8 != 0) {
    return absl::InvalidArgumentError(pd::StrCat(where, ": ", numel, " elements of ", t.dtype, " (",
                                                 bits, " bits each) do not fill whole bytes"));
  }
  const uint64_t expected = total_bits / 8;

  PD_ASSIGN_OR_RETURN(const json* offsets, field("data_offsets"));
  if (!offsets->is_array() || offsets->size() != 2) {
    return absl::InvalidArgumentError(
        pd::StrCat(where, ": \"data_offsets\" is ",
                   offsets->is_array() ? pd::StrCat("an array of ", offsets->size(), " elements")
                                       : std::string(Described(*offsets)),
                   ", expected [begin, end]"));
  }
  PD_ASSIGN_OR_RETURN(uint64_t begin,
                      NonNegativeInt((*offsets)[0], pd::StrCat(where, ": data_offsets[0]")));
  PD_ASSIGN_OR_RETURN(uint64_t end,
                      NonNegativeInt((*offsets)[1], pd::StrCat(where, ": data_offsets[1]")));
  if (begin > end) {
    return absl::InvalidArgumentError(
        pd::StrCat(where, ": data_offsets [", begin, ", ", end, "] end before they begin"));
  }
  if (end - begin != expected) {
    return absl::InvalidArgumentError(pd::StrCat(where, ": data_offsets [", begin, ", ", end,
                                                 "] span ", end - begin, " bytes, but ", t.dtype,
                                                 " ", ShapeString(t.shape), " takes ", expected));
  }
  if (end > data_size) {
    return absl::DataLossError(pd::StrCat(where, ": data_offsets [", begin, ", ", end,
                                          "] run past the end of the ", data_size,
                                          "-byte data buffer (file truncated?)"));
  }
  t.offset = begin;
  t.nbytes = static_cast<size_t>(expected);
  return t;
}

absl::Status WithContext(std::string_view context, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), pd::StrCat("'", context, "': ", s.message()));
}

// A plain file name: a shard must lie in the checkpoint's folder. 255 bytes is Linux's NAME_MAX.
bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\\\0", 3)) == std::string_view::npos;
}

bool IsRegularFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

size_t SafetensorsDTypeBits(std::string_view dtype) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == dtype) return d.bits;
  }
  return 0;
}

std::optional<DType> DTypeFromSafetensors(std::string_view dtype) {
  if (dtype == "F32") return DType::kF32;
  if (dtype == "F16") return DType::kF16;
  if (dtype == "BF16") return DType::kBF16;
  return std::nullopt;
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ------------------------------------------------------------------------------------------------
// SafetensorsFile
// ------------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  PD_ASSIGN_OR_RETURN(MappedFile map, MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->map_ = std::move(map);
  f->name_ = std::filesystem::path(path).filename().string();
  PD_RETURN_IF_ERROR(WithContext(path, f->ParseAll()));
  return f;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(MappedFile map,
                                                                        std::string name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->map_ = std::move(map);
  f->name_ = std::move(name);
  PD_RETURN_IF_ERROR(WithContext(f->name_, f->ParseAll()));
  return f;
}

absl::Status SafetensorsFile::ParseAll() {
  const uint64_t size = map_.size();
  if (size < 8) {
    return absl::DataLossError(
        pd::StrCat("the file is ", size, " bytes long, too short for the 8-byte header length"));
  }
  uint64_t n = 0;  // little-endian, whatever the host
  for (int i = 7; i >= 0; --i) n = (n << 8) | map_.data()[i];
  if (n > kSafetensorsMaxHeaderBytes) {
    return absl::InvalidArgumentError(pd::StrCat("header length ", n, " exceeds the limit of ",
                                                 kSafetensorsMaxHeaderBytes, " bytes"));
  }
  if (n > size - 8) {
    return absl::DataLossError(pd::StrCat("header length ", n, " runs past the end of the file (",
                                          size - 8, " bytes follow the length)"));
  }
  header_size_ = n;
  const uint64_t data_size = size - 8 - n;

  json header;
  PD_RETURN_IF_ERROR(ParseJson(this->header(), 8, "the header", &header));
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    if (key == kMetadataKey) {
      // The reference reads it as an optional map: null means absent.
      if (it->is_null()) continue;
      if (!it->is_object()) {
        return absl::InvalidArgumentError(pd::StrCat("\"", kMetadataKey, "\" is ", Described(*it),
                                                     ", expected an object of strings"));
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        const std::string* value = m->get_ptr<const std::string*>();
        if (value == nullptr) {
          return absl::InvalidArgumentError(pd::StrCat("\"", kMetadataKey, "\" key '",
                                                       Shown(m.key()), "' is ", Described(*m),
                                                       ", expected a string"));
        }
        metadata_.emplace(m.key(), *value);
      }
      continue;
    }
    PD_ASSIGN_OR_RETURN(SafetensorsTensor t, ParseEntry(key, *it, data_size));
    t.file = name_;
    tensors_.push_back(std::move(t));
  }

  // The tensors must tile the data buffer: sorted by offset, each begins where the previous one
  // ended, the first at 0 and the last at the end. Empty tensors take no bytes and may sit
  // anywhere on that path.
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return std::tie(a.offset, a.nbytes, a.name) < std::tie(b.offset, b.nbytes, b.name);
            });
  uint64_t pos = 0;
  const SafetensorsTensor* prev = nullptr;
  for (const SafetensorsTensor& t : tensors_) {
    if (t.offset < pos) {
      return absl::InvalidArgumentError(pd::StrCat(
          "tensors '", Shown(prev->name), "' [", prev->offset, ", ", prev->offset + prev->nbytes,
          ") and '", Shown(t.name), "' [", t.offset, ", ", t.offset + t.nbytes, ") overlap"));
    }
    if (t.offset > pos) {
      return absl::InvalidArgumentError(pd::StrCat("bytes [", pos, ", ", t.offset,
                                                   ") of the data buffer, before tensor '",
                                                   Shown(t.name), "', belong to no tensor"));
    }
    pos = t.offset + t.nbytes;
    prev = &t;
  }
  if (pos != data_size) {
    return absl::InvalidArgumentError(pd::StrCat("bytes [", pos, ", ", data_size,
                                                 ") at the end of the ", data_size,
                                                 "-byte data buffer belong to no tensor"));
  }

  const uint8_t* data = map_.data() + data_start();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    tensors_[i].data = data + tensors_[i].offset;
    index_.emplace(tensors_[i].name, i);
  }
  return absl::OkStatus();
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ------------------------------------------------------------------------------------------------
// The index
// ------------------------------------------------------------------------------------------------

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(std::string_view text) {
  if (text.size() > kSafetensorsMaxHeaderBytes) {
    return absl::InvalidArgumentError(pd::StrCat("the index is ", text.size(),
                                                 " bytes, more than the limit of ",
                                                 kSafetensorsMaxHeaderBytes));
  }
  json j;
  PD_RETURN_IF_ERROR(ParseJson(text, 0, "the index", &j));
  auto wm = j.find("weight_map");
  if (wm == j.end()) {
    return absl::InvalidArgumentError("the index has no \"weight_map\"");
  }
  if (!wm->is_object()) {
    return absl::InvalidArgumentError(
        pd::StrCat("the index's \"weight_map\" is ", Described(*wm), ", expected an object"));
  }
  if (wm->empty()) {
    return absl::InvalidArgumentError("the index's \"weight_map\" lists no tensor");
  }
  SafetensorsIndex index;
  std::set<std::string> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    const std::string* shard = it->get_ptr<const std::string*>();
    if (shard == nullptr) {
      return absl::InvalidArgumentError(pd::StrCat("the index maps tensor '", Shown(it.key()),
                                                   "' to ", Described(*it),
                                                   ", expected a shard's file name"));
    }
    if (!IsPlainFileName(*shard)) {
      return absl::InvalidArgumentError(
          pd::StrCat("the index maps tensor '", Shown(it.key()), "' to '", Shown(*shard),
                     "', which is not a plain file name in the checkpoint's folder"));
    }
    index.weight_map.emplace(it.key(), *shard);
    shards.insert(*shard);
  }
  index.shards.assign(shards.begin(), shards.end());
  return index;
}

// ------------------------------------------------------------------------------------------------
// SafetensorsCheckpoint
// ------------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& path) {
  namespace fs = std::filesystem;
  std::unique_ptr<SafetensorsCheckpoint> c(new SafetensorsCheckpoint());
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(pd::StrCat("'", path, "' does not exist"));
  }
  if (S_ISREG(st.st_mode)) {
    const fs::path p(path);
    c->dir_ = p.has_parent_path() ? p.parent_path().string() : ".";
    const std::string file = p.filename().string();
    if (EndsWith(file, ".json")) {
      PD_RETURN_IF_ERROR(c->OpenIndex(path));
    } else {
      PD_RETURN_IF_ERROR(c->OpenFiles({file}));
    }
  } else if (S_ISDIR(st.st_mode)) {
    c->dir_ = path;
    if (IsRegularFile(path + "/model.safetensors")) {
      PD_RETURN_IF_ERROR(c->OpenFiles({"model.safetensors"}));
    } else if (IsRegularFile(path + "/model.safetensors.index.json")) {
      PD_RETURN_IF_ERROR(c->OpenIndex(path + "/model.safetensors.index.json"));
    } else {
      std::vector<std::string> names;
      std::error_code ec;
      for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (EndsWith(name, ".safetensors") && IsRegularFile(it->path().string())) {
          names.push_back(name);
        }
      }
      if (ec) {
        return absl::PermissionDeniedError(pd::StrCat("cannot list '", path, "': ", ec.message()));
      }
      if (names.empty()) {
        return absl::NotFoundError(
            pd::StrCat("'", path, "' has no model.safetensors, no model.safetensors.index.json ",
                       "and no other *.safetensors file"));
      }
      std::sort(names.begin(), names.end());
      PD_RETURN_IF_ERROR(c->OpenFiles(names));
    }
  } else {
    return absl::InvalidArgumentError(
        pd::StrCat("'", path, "' is neither a folder nor a regular file"));
  }
  PD_RETURN_IF_ERROR(c->Collect());
  return c;
}

absl::Status SafetensorsCheckpoint::OpenFiles(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                        SafetensorsFile::Open(pd::StrCat(dir_, "/", name)));
    files_.push_back(std::move(f));
  }
  std::sort(files_.begin(), files_.end(),
            [](const auto& a, const auto& b) { return a->name() < b->name(); });
  return absl::OkStatus();
}

absl::Status SafetensorsCheckpoint::OpenIndex(const std::string& index_path) {
  PD_ASSIGN_OR_RETURN(MappedFile map, MappedFile::Open(index_path));
  const std::string_view text(reinterpret_cast<const char*>(map.data()), map.size());
  absl::StatusOr<SafetensorsIndex> index = ParseSafetensorsIndex(text);
  PD_RETURN_IF_ERROR(WithContext(index_path, index.status()));
  PD_RETURN_IF_ERROR(WithContext(index_path, OpenFiles(index->shards)));

  std::map<std::string_view, const SafetensorsFile*> by_file;
  for (const auto& f : files_) by_file.emplace(f->name(), f.get());
  // Every tensor the index lists is where it says...
  for (const auto& [tensor, shard] : index->weight_map) {
    auto f = by_file.find(shard);
    PD_CHECK(f != by_file.end());  // OpenFiles opened every shard the index names
    if (f->second->Find(tensor) == nullptr) {
      return absl::InvalidArgumentError(pd::StrCat("'", index_path, "': the index puts tensor '",
                                                   Shown(tensor), "' in '", shard,
                                                   "', which has no such tensor"));
    }
  }
  // ... and every tensor of every shard is in the index, under that shard.
  for (const auto& f : files_) {
    for (const SafetensorsTensor& t : f->tensors()) {
      auto it = index->weight_map.find(t.name);
      if (it == index->weight_map.end()) {
        return absl::InvalidArgumentError(pd::StrCat("'", index_path, "': tensor '", Shown(t.name),
                                                     "' of shard '", f->name(),
                                                     "' is not in the index's weight_map"));
      }
      if (it->second != f->name()) {
        return absl::InvalidArgumentError(
            pd::StrCat("'", index_path, "': tensor '", Shown(t.name), "' is in shard '", f->name(),
                       "' as well as in '", it->second, "', where the index puts it"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SafetensorsCheckpoint::Collect() {
  for (const auto& f : files_) {
    for (const SafetensorsTensor& t : f->tensors()) {
      tensors_.push_back(&t);
      total_nbytes_ += t.nbytes;
    }
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
              return std::tie(a->name, a->file) < std::tie(b->name, b->file);
            });
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (i > 0 && tensors_[i]->name == tensors_[i - 1]->name) {
      return absl::InvalidArgumentError(
          pd::StrCat("tensor '", Shown(tensors_[i]->name), "' is in both '", tensors_[i - 1]->file,
                     "' and '", tensors_[i]->file, "' in '", dir_, "'"));
    }
    by_name_.emplace(tensors_[i]->name, tensors_[i]);
  }
  return absl::OkStatus();
}

const SafetensorsTensor* SafetensorsCheckpoint::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

}  // namespace pd::engine
