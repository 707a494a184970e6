// All tensors of a model directory under one name space: either one model.safetensors or
// model.safetensors.index.json plus the shards its weight_map names. Opening maps every file
// and checks that the index and the shards agree, so a later get() fails only for names that
// are truly absent.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"

namespace attnres {

class WeightStore {
 public:
  // Throws attnres::Error when no weights are found, a shard is missing, or the index lists
  // a tensor its shard does not hold.
  static WeightStore open(const std::string& model_dir);

  bool has(const std::string& name) const { return files_by_name_.count(name) != 0; }
  // Zero-copy view; throws naming the tensor and where it was looked for if missing.
  Tensor get(const std::string& name) const;
  // Any tensor's stored bytes, zero-copy (SafetensorsFile::raw).
  SafetensorsFile::Raw raw(const std::string& name) const;
  // The __metadata__ of the file that holds `name`.
  const std::map<std::string, std::string>& metadata_of(const std::string& name) const;
  // Drops from this process's resident memory the mapped pages wholly inside `t` (a view
  // into one of the store's files; anything else is left alone): for a float matrix that was
  // quantized and is no longer read. The pages are re-read from the file if touched again.
  void release_pages(const Tensor& t) const;
  // The header entry of a tensor (dtype, shape), without touching its data.
  const SafetensorsFile::Entry& entry(const std::string& name) const;
  // One-element float tensor of any float dtype read as a float (AttnRes gate biases).
  float read_scalar(const std::string& name) const;
  std::vector<std::string> names() const;              // sorted
  std::string file_of(const std::string& name) const;  // the shard's path
  // Where tensors come from, for messages: the single file or the index path.
  const std::string& source() const { return source_; }

 private:
  const SafetensorsFile& file_or_throw(const std::string& name) const;

  std::string source_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> files_by_name_;
};

}  // namespace attnres
