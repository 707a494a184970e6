#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "engine/core/error.h"

namespace attnres {
namespace {

using nlohmann::json;

// The safetensors reference implementation refuses headers above 100 MB; so do we, so that a
// corrupt size field fails fast instead of parsing gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeInfo {
  std::string_view name;
  size_t bits;  // per element (sub-byte types exist: F4, F6)
  std::optional<DType> engine_dtype;
};

// Every dtype the safetensors format defines; only four can become engine tensors.
constexpr DTypeInfo kDTypes[] = {
    {"F32", 32, DType::F32},      {"BF16", 16, DType::BF16},    {"F16", 16, DType::F16},
    {"I32", 32, DType::I32},      {"F64", 64, std::nullopt},    {"I64", 64, std::nullopt},
    {"U64", 64, std::nullopt},    {"U32", 32, std::nullopt},    {"I16", 16, std::nullopt},
    {"U16", 16, std::nullopt},    {"I8", 8, std::nullopt},      {"U8", 8, std::nullopt},
    {"BOOL", 8, std::nullopt},    {"F8_E4M3", 8, std::nullopt}, {"F8_E5M2", 8, std::nullopt},
    {"F8_E8M0", 8, std::nullopt}, {"F6_E2M3", 6, std::nullopt}, {"F6_E3M2", 6, std::nullopt},
    {"F4", 4, std::nullopt},      {"C64", 64, std::nullopt},
};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::string known_dtype_list() {
  std::string s;
  for (const DTypeInfo& info : kDTypes) s += (s.empty() ? "" : ", ") + std::string(info.name);
  return s;
}

// Owns one read-only private mapping of a whole file.
struct Mapping {
  void* addr = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (addr != MAP_FAILED) munmap(addr, size);
  }
};

std::string range_str(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + "," + std::to_string(end) + ")";
}

// Bytes needed by shape x bits, or nullopt on overflow.
std::optional<uint64_t> tensor_bytes(const Shape& shape, size_t bits) {
  uint64_t elements = 1;
  for (int64_t d : shape) {
    if (d != 0 && elements > UINT64_MAX / 64 / static_cast<uint64_t>(d)) return std::nullopt;
    elements *= static_cast<uint64_t>(d);
  }
  return (elements * bits + 7) / 8;
}

SafetensorsFile::Entry parse_entry(const std::string& path, const std::string& name,
                                   const json& value) {
  std::string where = path + ": tensor " + name;
  if (!value.is_object())
    throw Error(where + ": header entry must be an object, found " + value.dump());
  auto dtype_it = value.find("dtype");
  auto shape_it = value.find("shape");
  auto offsets_it = value.find("data_offsets");
  if (dtype_it == value.end()) throw Error(where + ": header entry has no 'dtype'");
  if (shape_it == value.end()) throw Error(where + ": header entry has no 'shape'");
  if (offsets_it == value.end()) throw Error(where + ": header entry has no 'data_offsets'");
  if (!dtype_it->is_string())
    throw Error(where + ": 'dtype' must be a string, found " + dtype_it->dump());

  SafetensorsFile::Entry entry;
  entry.dtype_name = dtype_it->get<std::string>();
  const DTypeInfo* info = find_dtype(entry.dtype_name);
  if (!info) {
    throw Error(where + ": unknown dtype '" + entry.dtype_name + "' (known: " + known_dtype_list() +
                ")");
  }
  entry.supported = info->engine_dtype.has_value();
  if (entry.supported) entry.dtype = *info->engine_dtype;

  if (!shape_it->is_array())
    throw Error(where + ": 'shape' must be a list, found " + shape_it->dump());
  for (const json& d : *shape_it) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      throw Error(where + ": 'shape' must be a list of non-negative integers, found " +
                  shape_it->dump());
    }
    entry.shape.push_back(d.get<int64_t>());
  }
  const json& offsets = *offsets_it;
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    throw Error(where + ": 'data_offsets' must be [begin, end] with non-negative integers, found " +
                offsets.dump());
  }
  uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  if (begin > end) {
    throw Error(where + ": data_offsets " + offsets.dump() + " are out of order (begin > end)");
  }
  std::optional<uint64_t> expected = tensor_bytes(entry.shape, info->bits);
  if (!expected || *expected != end - begin) {
    throw Error(
        where + ": shape " + shape_str(entry.shape) + " of " + entry.dtype_name + " needs " +
        (expected ? std::to_string(*expected) : std::string("an overflowing number of")) +
        " bytes, but data_offsets " + offsets.dump() + " span " + std::to_string(end - begin));
  }
  entry.offset = begin;
  entry.nbytes = end - begin;
  return entry;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  size_t file_size = static_cast<size_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw Error(path + ": file is " + std::to_string(file_size) +
                " bytes, too short for a safetensors header (needs at least 8)");
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->addr = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int mmap_errno = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (mapping->addr == MAP_FAILED)
    throw Error(path + ": mmap failed (" + std::strerror(mmap_errno) + ")");
  mapping->size = file_size;
  // The weights a CPU decode step streams, in 2 MB pages where the kernel and the filesystem
  // give the page cache large folios (HugePageArena says why); elsewhere a no-op.
  madvise(mapping->addr, file_size, MADV_HUGEPAGE);

  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->base_ = static_cast<const std::byte*>(mapping->addr);
  file->file_size_ = file_size;
  file->mapping_ = mapping;

  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i)
    header_size = header_size << 8 | static_cast<uint8_t>(file->base_[i]);
  if (header_size > kMaxHeaderBytes) {
    throw Error(path + ": header size " + std::to_string(header_size) + " is absurd (limit " +
                std::to_string(kMaxHeaderBytes) + "): not a safetensors file?");
  }
  if (header_size > file_size - 8) {
    throw Error(path + ": header size " + std::to_string(header_size) +
                " runs past the end of the " + std::to_string(file_size) + "-byte file");
  }
  file->data_start_ = 8 + header_size;

  json header;
  try {
    header =
        json::parse(std::string_view(reinterpret_cast<const char*>(file->base_ + 8), header_size));
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number overflow
    throw Error(path + ": header is not valid JSON (" + e.what() + ")");
  }
  if (!header.is_object())
    throw Error(path + ": header must be a JSON object, found " + header.type_name());

  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw Error(path + ": __metadata__ must be an object of strings");
      for (auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          throw Error(path + ": __metadata__ value for '" + key + "' must be a string, found " +
                      text.dump());
        }
        file->metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    file->entries_[name] = parse_entry(path, name, value);
  }

  // Every tensor inside the data region, and no two sharing bytes.
  size_t data_size = file_size - file->data_start_;
  std::vector<std::pair<size_t, const std::string*>> by_offset;
  for (const auto& [name, entry] : file->entries_) {
    if (entry.offset + entry.nbytes > data_size) {
      throw Error(path + ": file truncated: tensor " + name + " needs bytes " +
                  range_str(entry.offset, entry.offset + entry.nbytes) +
                  " but the data region has only " + std::to_string(data_size));
    }
    if (entry.nbytes > 0) by_offset.emplace_back(entry.offset, &name);
  }
  std::sort(by_offset.begin(), by_offset.end());
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& prev = file->entries_.at(*by_offset[i - 1].second);
    const Entry& cur = file->entries_.at(*by_offset[i].second);
    if (cur.offset < prev.offset + prev.nbytes) {
      throw Error(path + ": tensors " + *by_offset[i - 1].second + " " +
                  range_str(prev.offset, prev.offset + prev.nbytes) + " and " +
                  *by_offset[i].second + " " + range_str(cur.offset, cur.offset + cur.nbytes) +
                  " overlap");
    }
  }
  return file;
}

const SafetensorsFile::Entry& SafetensorsFile::entry_or_throw(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw Error(path_ + ": no tensor named " + name);
  return it->second;
}

const std::byte* SafetensorsFile::data_of(const Entry& entry) const {
  return base_ + data_start_ + entry.offset;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const Entry& entry = entry_or_throw(name);
  if (!entry.supported) {
    throw Error(path_ + ": unsupported dtype " + entry.dtype_name + " for tensor " + name +
                " (supported: F32, BF16, F16, I32)");
  }
  const std::byte* data = data_of(entry);
  // Writers pad the header so that tensors are aligned (the reference one pads to 8 bytes);
  // a file that is not gets a copy rather than misaligned loads in the kernels.
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(entry.dtype) != 0) {
    Tensor copy = Tensor::empty(entry.shape, entry.dtype);
    std::memcpy(copy.data, data, entry.nbytes);
    return copy;
  }
  // const_cast: Tensor has no const view; the pages are PROT_READ, so a write faults loudly.
  return Tensor::wrap(const_cast<std::byte*>(data), entry.shape, entry.dtype, mapping_);
}

SafetensorsFile::Raw SafetensorsFile::raw(const std::string& name) const {
  const Entry& entry = entry_or_throw(name);
  return {data_of(entry), entry.nbytes, entry.shape, entry.dtype_name, mapping_};
}

float SafetensorsFile::read_scalar(const std::string& name) const {
  const Entry& entry = entry_or_throw(name);
  const std::byte* p = data_of(entry);
  size_t elements = 1;
  for (int64_t d : entry.shape) elements *= static_cast<size_t>(d);
  if (elements != 1) {
    throw Error(path_ + ": tensor " + name + " has shape " + shape_str(entry.shape) +
                ", expected a single value ([] or [1])");
  }
  if (entry.dtype_name == "F64") {
    double v;
    std::memcpy(&v, p, 8);
    return static_cast<float>(v);
  }
  if (entry.dtype_name == "F32") {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t half;
  std::memcpy(&half, p, 2);
  if (entry.dtype_name == "BF16") return bf16_to_f32(half);
  if (entry.dtype_name == "F16") return f16_to_f32(half);
  throw Error(path_ + ": tensor " + name + " has dtype " + entry.dtype_name +
              ", expected a float (F64, F32, BF16 or F16)");
}

const std::byte* SafetensorsFile::mapping_begin() const { return base_; }
size_t SafetensorsFile::mapping_size() const { return file_size_; }

}  // namespace attnres
