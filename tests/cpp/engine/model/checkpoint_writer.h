// Test helpers: write safetensors files (valid or deliberately broken), JSON files and tiny
// model directories into a fresh temporary directory, independently of the code under test.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/error.h"

namespace attnres::test_files {

using nlohmann::json;

// The message of the attnres::Error that fn throws ("" if it throws nothing).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A directory under /tmp removed when the test ends.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "attnres-load-XXXXXX").string();
    path_ = mkdtemp(templ.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline void write_json(const std::string& path, const json& value) {
  write_bytes(path, value.dump(2));
}

// A safetensors file from a raw header text and a raw data buffer.
inline void write_raw_safetensors(const std::string& path, const std::string& header,
                                  const std::string& data) {
  std::string bytes(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_bytes(path, bytes + header + data);
}

// Element bytes of `values` encoded as dtype ("F32", "BF16", "F16", "F64", "I32").
inline std::string encode(const std::string& dtype, const std::vector<float>& values) {
  std::string out;
  for (float v : values) {
    if (dtype == "F32") {
      out.append(reinterpret_cast<const char*>(&v), 4);
    } else if (dtype == "F64") {
      double d = v;
      out.append(reinterpret_cast<const char*>(&d), 8);
    } else if (dtype == "I32") {
      int32_t i = static_cast<int32_t>(v);
      out.append(reinterpret_cast<const char*>(&i), 4);
    } else {
      uint16_t h = dtype == "BF16" ? f32_to_bf16(v) : f32_to_f16(v);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

inline size_t element_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 1;
}

// Builds a well-formed safetensors file tensor by tensor.
class SafetensorsWriter {
 public:
  // Values default to a deterministic, non-zero ramp distinct per tensor.
  void add(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
           std::vector<float> values = {}) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    if (values.empty()) {
      for (size_t i = 0; i < n; ++i)
        values.push_back(0.25f * static_cast<float>((i + seed_) % 13) - 1.5f);
      ++seed_;
    }
    add_raw(name, dtype, shape, encode(dtype, values));
  }
  void add_raw(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
               const std::string& bytes) {
    header_[name] = {{"dtype", dtype},
                     {"shape", shape},
                     {"data_offsets", {data_.size(), data_.size() + bytes.size()}}};
    data_ += bytes;
  }
  void remove(const std::string& name) { header_.erase(name); }  // leaves a hole: allowed
  void metadata(const std::string& key, const std::string& value) {
    header_["__metadata__"][key] = value;
  }
  bool has(const std::string& name) const { return header_.contains(name); }
  json& header() { return header_; }
  std::string& data() { return data_; }
  // Pads the header with spaces to a multiple of 8 bytes, as the reference writer does, so
  // that tensors are aligned (unless pad is false).
  void write(const std::string& path, bool pad = true) const {
    std::string header = header_.dump();
    if (pad) header.resize((header.size() + 7) / 8 * 8, ' ');
    write_raw_safetensors(path, header, data_);
  }

 private:
  json header_ = json::object();
  std::string data_;
  size_t seed_ = 0;
};

}  // namespace attnres::test_files
