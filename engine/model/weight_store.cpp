#include "engine/model/weight_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"

namespace attnres {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// weight_map of the index: tensor name -> shard file name (relative to the model directory).
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) throw Error(index_path + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  json index;
  try {
    index = json::parse(text.str());
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number overflow
    throw Error(index_path + ": not valid JSON (" + e.what() + ")");
  }
  if (!index.is_object()) throw Error(index_path + ": expected a JSON object at the top level");
  auto it = index.find("weight_map");
  if (it == index.end() || !it->is_object()) {
    throw Error(index_path +
                ": field 'weight_map' is missing or not an object of "
                "{tensor name: shard file}");
  }
  std::map<std::string, std::string> weight_map;
  for (auto& [name, shard] : it->items()) {
    if (!shard.is_string()) {
      throw Error(index_path + ": weight_map entry for tensor " + name +
                  " must be a file name, found " + shard.dump());
    }
    std::string file = shard.get<std::string>();
    // Shards live next to the index; a path escaping the directory is a corrupt index.
    fs::path p(file);
    if (file.empty() || p.is_absolute() || p.has_parent_path()) {
      throw Error(index_path + ": weight_map entry for tensor " + name + " names shard '" + file +
                  "', expected a file name in the model directory");
    }
    weight_map[name] = file;
  }
  if (weight_map.empty()) throw Error(index_path + ": weight_map is empty");
  return weight_map;
}

}  // namespace

WeightStore WeightStore::open(const std::string& model_dir) {
  WeightStore store;
  fs::path dir(model_dir);
  fs::path index_path = dir / kIndexFile;
  fs::path single_path = dir / kSingleFile;

  if (fs::exists(index_path)) {
    store.source_ = index_path.string();
    std::map<std::string, std::string> weight_map = read_weight_map(store.source_);
    std::map<std::string, const SafetensorsFile*> shards;
    for (const auto& [name, shard] : weight_map) {
      auto it = shards.find(shard);
      if (it == shards.end()) {
        fs::path shard_path = dir / shard;
        if (!fs::exists(shard_path)) {
          throw Error(store.source_ + ": tensor " + name + " is in shard " + shard + ", but " +
                      shard_path.string() + " does not exist");
        }
        store.files_.push_back(SafetensorsFile::open(shard_path.string()));
        it = shards.emplace(shard, store.files_.back().get()).first;
      }
      if (!it->second->has(name)) {
        throw Error(store.source_ + ": tensor " + name + " is listed in shard " + shard + ", but " +
                    it->second->path() + " does not contain it");
      }
      store.files_by_name_[name] = it->second;
    }
    // Tensors present in a shard but absent from the index are invisible, as in transformers.
    return store;
  }

  if (fs::exists(single_path)) {
    store.source_ = single_path.string();
    store.files_.push_back(SafetensorsFile::open(store.source_));
    for (const auto& [name, entry] : store.files_.back()->entries()) {
      store.files_by_name_[name] = store.files_.back().get();
    }
    return store;
  }

  std::string hint;
  if (fs::exists(dir / "pytorch_model.bin") || fs::exists(dir / "pytorch_model.bin.index.json")) {
    hint = " (found pytorch_model.bin: PyTorch pickles are not supported, convert to safetensors)";
  }
  throw Error(model_dir + ": no weights found: expected " + kSingleFile + " or " + kIndexFile +
              hint);
}

const SafetensorsFile& WeightStore::file_or_throw(const std::string& name) const {
  auto it = files_by_name_.find(name);
  if (it == files_by_name_.end()) throw Error(source_ + ": tensor " + name + " is missing");
  return *it->second;
}

Tensor WeightStore::get(const std::string& name) const { return file_or_throw(name).get(name); }

SafetensorsFile::Raw WeightStore::raw(const std::string& name) const {
  return file_or_throw(name).raw(name);
}

const std::map<std::string, std::string>& WeightStore::metadata_of(const std::string& name) const {
  return file_or_throw(name).metadata();
}

void WeightStore::release_pages(const Tensor& t) const {
  if (!t.defined()) return;
  const auto* begin = static_cast<const std::byte*>(t.data);
  const std::byte* end = begin + t.nbytes();
  for (const auto& file : files_) {
    const std::byte* map_begin = file->mapping_begin();
    if (begin < map_begin || end > map_begin + file->mapping_size()) continue;
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
    const uintptr_t last = reinterpret_cast<uintptr_t>(end) / page * page;
    // Private read-only file pages: dropped, and faulted in from the file again on a read.
    if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
    return;
  }
}

const SafetensorsFile::Entry& WeightStore::entry(const std::string& name) const {
  return file_or_throw(name).entries().at(name);
}

float WeightStore::read_scalar(const std::string& name) const {
  return file_or_throw(name).read_scalar(name);
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(files_by_name_.size());
  for (const auto& [name, file] : files_by_name_) out.push_back(name);
  return out;
}

std::string WeightStore::file_of(const std::string& name) const {
  return file_or_throw(name).path();
}

}  // namespace attnres
