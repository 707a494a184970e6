#include "engine/model/checkpoint_quantization.h"

#include "engine/core/error.h"
#include "engine/core/quant_format.h"

namespace attnres {
namespace {

using nlohmann::json;

// The methods Hugging Face checkpoints name that we do not read, for a precise refusal.
std::string unread_method_hint(const std::string& method) {
  if (method == "gptq" || method == "awq")
    return " (GPTQ / AWQ checkpoints are not read; a compressed-tensors W4A16 export of the "
           "same model is, or quantize the bf16 model with --quantization int4)";
  if (method == "fp8" || method == "fbgemm_fp8")
    return " (fp8 weights are not read; --quantization int8 quantizes a bf16 checkpoint)";
  return "";
}

[[noreturn]] void fail(const std::string& origin, const std::string& field,
                       const std::string& what) {
  throw Error(origin + ": quantization_config." + field + ": " + what);
}

// One config_groups entry's "weights" (compressed-tensors QuantizationArgs).
CompressedTensorsScheme parse_weights(const json& group, const std::string& format,
                                      const std::string& origin, const std::string& where) {
  for (const char* key : {"input_activations", "output_activations"}) {
    if (group.contains(key) && !group.at(key).is_null())
      fail(origin, where + "." + key,
           "activation quantization is not supported (only weight-only W8A16 / W4A16 schemes)");
  }
  if (!group.contains("weights") || !group.at("weights").is_object())
    fail(origin, where + ".weights", "missing: no weight scheme");
  const json& w = group.at("weights");
  const std::string at = where + ".weights";
  const std::string type = w.value("type", "int");
  if (type != "int")
    fail(origin, at + ".type", "\"" + type + "\": only integer weights are read (not fp8 / float)");
  CompressedTensorsScheme s;
  s.format = format;
  s.num_bits = w.value("num_bits", 8);
  if (s.num_bits != 4 && s.num_bits != 8)
    fail(origin, at + ".num_bits", std::to_string(s.num_bits) + ": only 4 and 8 are read");
  if (format == "pack-quantized" && s.num_bits != 4)
    fail(origin, at + ".num_bits",
         std::to_string(s.num_bits) + " with format pack-quantized: only 4-bit packing is read");
  if (format != "pack-quantized" && s.num_bits != 8)
    fail(origin, at + ".num_bits",
         std::to_string(s.num_bits) + " with format " + format +
             ": 4-bit weights are read "
             "only from pack-quantized");
  s.symmetric = w.value("symmetric", true);
  if (w.contains("dynamic") && w.at("dynamic").is_boolean() && w.at("dynamic").get<bool>())
    fail(origin, at + ".dynamic", "true: dynamic weight quantization is not a stored format");
  if (w.contains("actorder") && !w.at("actorder").is_null()) {
    const json& a = w.at("actorder");
    const bool off = a.is_boolean() && !a.get<bool>();
    // "static" / "weight" reorder only while quantizing: the stored groups are contiguous.
    const bool contiguous = a.is_string() && (a == "static" || a == "weight");
    if (!off && !contiguous)
      fail(origin, at + ".actorder", a.dump() + ": activation-ordered groups (g_idx) are not read");
  }
  const std::string strategy = w.value("strategy", "");
  if (strategy == "channel") {
    s.group_size = 0;
  } else if (strategy == "group") {
    if (!w.contains("group_size") || !w.at("group_size").is_number_integer())
      fail(origin, at + ".group_size", "missing for strategy \"group\"");
    s.group_size = w.at("group_size").get<int>();
    if (s.group_size <= 0 || s.group_size % kQuantBlock != 0)
      fail(origin, at + ".group_size",
           std::to_string(s.group_size) +
               ": only multiples of 32 convert exactly into our "
               "blocks of 32");
  } else {
    fail(origin, at + ".strategy",
         "\"" + strategy + "\": only \"channel\" and \"group\" weight scales are read");
  }
  if (s.num_bits == 8 && !s.symmetric)
    fail(origin, at + ".symmetric",
         "false with 8 bits: asymmetric int8 has no exact form in our symmetric int8 format");
  return s;
}

bool same_scheme(const CompressedTensorsScheme& a, const CompressedTensorsScheme& b) {
  return a.format == b.format && a.num_bits == b.num_bits && a.symmetric == b.symmetric &&
         a.group_size == b.group_size;
}

CheckpointQuantization parse_compressed_tensors(const json& q, const std::string& origin) {
  const std::string format = q.value("format", "");
  if (format != "pack-quantized" && format != "int-quantized" && format != "naive-quantized")
    fail(origin, "format",
         "\"" + format +
             "\": compressed-tensors formats read are pack-quantized (W4A16) and "
             "int-quantized / naive-quantized (W8A16)");
  const std::string status = q.value("quantization_status", "compressed");
  if (status != "compressed")
    fail(origin, "quantization_status", "\"" + status + "\": expected \"compressed\"");
  if (q.contains("sparsity_config") && !q.at("sparsity_config").is_null() &&
      !q.at("sparsity_config").empty())
    fail(origin, "sparsity_config", "sparse checkpoints are not read");
  if (q.contains("kv_cache_scheme") && !q.at("kv_cache_scheme").is_null())
    fail(origin, "kv_cache_scheme", "a quantized KV cache is not read");
  if (!q.contains("config_groups") || !q.at("config_groups").is_object() ||
      q.at("config_groups").empty())
    fail(origin, "config_groups", "missing or empty");
  std::optional<CompressedTensorsScheme> scheme;
  for (const auto& [name, group] : q.at("config_groups").items()) {
    const std::string where = "config_groups." + name;
    if (!group.is_object()) fail(origin, where, "expected an object");
    const std::string group_format = group.value("format", format);
    if (group_format != format)
      fail(origin, where + ".format",
           "\"" + group_format + "\" differs from format \"" + format +
               "\": mixed formats are not read");
    CompressedTensorsScheme s = parse_weights(group, format, origin, where);
    if (scheme && !same_scheme(*scheme, s))
      fail(origin, where, "a second weight scheme: one scheme for every layer is read");
    scheme = s;
  }
  CheckpointQuantization c;
  c.method = CheckpointQuantization::Method::CompressedTensors;
  c.scheme = *scheme;
  c.format = scheme->num_bits == 4 ? DType::Q4_B32 : DType::Q8_B32;
  return c;
}

}  // namespace

std::optional<CheckpointQuantization> CheckpointQuantization::from_json(const json& config,
                                                                        const std::string& origin) {
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const json& q = *it;
  if (!q.is_object()) throw Error(origin + ": quantization_config: expected an object");
  if (!q.contains("quant_method") || !q.at("quant_method").is_string())
    fail(origin, "quant_method", "missing");
  const std::string method = q.at("quant_method").get<std::string>();
  if (method == "attnres") {
    if (!q.contains("format") || !q.at("format").is_string())
      fail(origin, "format", "missing (int8 or int4)");
    CheckpointQuantization c;
    c.format = quant_format_from_name(q.at("format").get<std::string>(),
                                      origin + ": quantization_config.format");
    return c;
  }
  if (method == "compressed-tensors") return parse_compressed_tensors(q, origin);
  fail(origin, "quant_method",
       "\"" + method + "\" is not read (read: attnres, compressed-tensors)" +
           unread_method_hint(method));
}

std::string CheckpointQuantization::description() const {
  std::string s = quant_format_name(format);
  if (method == Method::Attnres) return s + " (attnres)";
  s += " (compressed-tensors " + scheme.format + ", ";
  s += scheme.group_size ? "group " + std::to_string(scheme.group_size) : std::string("channel");
  return s + (scheme.symmetric ? ", symmetric)" : ", asymmetric)");
}

}  // namespace attnres
