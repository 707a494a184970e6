#include "engine/model/safetensors_writer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"

namespace attnres {
namespace {

size_t element_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  throw Error("safetensors writer: dtype " + dtype + " is not written");
}

}  // namespace

void SafetensorsWriter::add(const std::string& name, const std::string& dtype_name,
                            const Shape& shape, const void* data, size_t nbytes) {
  const size_t size = element_bytes(dtype_name);
  size_t elements = 1;
  for (int64_t d : shape) elements *= static_cast<size_t>(d);
  ATTNRES_CHECK(elements * size == nbytes, "safetensors writer: " + name + " " + shape_str(shape) +
                                               " " + dtype_name + " is not " +
                                               std::to_string(nbytes) + " bytes");
  items_.push_back({name, dtype_name, shape, data, nbytes, size});
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<const Item*> order;
  for (const Item& item : items_) order.push_back(&item);
  std::stable_sort(order.begin(), order.end(), [](const Item* a, const Item* b) {
    return a->element_bytes > b->element_bytes;
  });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  size_t offset = 0;
  for (const Item* item : order) {
    header[item->name] = {{"dtype", item->dtype_name},
                          {"shape", item->shape},
                          {"data_offsets", {offset, offset + item->nbytes}}};
    offset += item->nbytes;
  }
  std::string text = header.dump();
  text.append((64 - (8 + text.size()) % 64) % 64, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(path + ": cannot open for writing");
  const uint64_t n = text.size();
  char size[8];
  for (int i = 0; i < 8; ++i) size[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(size, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const Item* item : order)
    out.write(static_cast<const char*>(item->data), static_cast<std::streamsize>(item->nbytes));
  out.close();
  if (!out) throw Error(path + ": write failed (disk full?)");
}

}  // namespace attnres
