#include "engine/runner/process_control.h"

#include <cstring>
#include <type_traits>

#include "engine/core/dtype.h"
#include "engine/core/error.h"

namespace attnres {
namespace {

class Writer {
 public:
  explicit Writer(ControlKind kind) { put(static_cast<uint8_t>(kind)); }
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void put(const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    out_ += s;
  }
  void put(const std::vector<int32_t>& v) {
    put(static_cast<uint64_t>(v.size()));
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const std::string& in, ControlKind expected) : in_(in) {
    if (control_kind(in) != expected) throw Error("control message of the wrong kind");
    pos_ = 1;
  }
  template <typename T>
  T get() {
    T value;
    need(sizeof(T));
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string get_string() {
    const size_t n = length(1);
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  void get_ints(std::vector<int32_t>& v) {
    const size_t n = length(sizeof(int32_t));
    v.resize(n);
    if (n > 0) std::memcpy(v.data(), in_.data() + pos_, n * sizeof(int32_t));
    pos_ += n * sizeof(int32_t);
  }
  void finish() const {
    if (pos_ != in_.size()) throw Error("control message: trailing bytes");
  }

 private:
  size_t length(size_t element) {
    const uint64_t n = get<uint64_t>();
    if (n > (in_.size() - pos_) / element) throw Error("control message: truncated");
    return static_cast<size_t>(n);
  }
  void need(size_t n) const {
    if (in_.size() - pos_ < n) throw Error("control message: truncated");
  }
  const std::string& in_;
  size_t pos_ = 0;
};

}  // namespace

ControlKind control_kind(const std::string& message) {
  if (message.empty()) throw Error("control message: empty");
  const auto kind = static_cast<uint8_t>(message[0]);
  if (kind < static_cast<uint8_t>(ControlKind::Load) ||
      kind > static_cast<uint8_t>(ControlKind::Exit)) {
    throw Error("control message: unknown kind " + std::to_string(kind));
  }
  return static_cast<ControlKind>(kind);
}

std::string encode_load(const LoadMessage& m) {
  Writer w(ControlKind::Load);
  w.put(m.args.model);
  w.put(m.args.device);
  w.put(static_cast<int32_t>(m.args.threads));
  w.put(static_cast<int32_t>(m.args.tensor_parallel_size));
  w.put(static_cast<int32_t>(m.args.sequence_parallel_min_tokens));
  w.put(storage_dtype_name(m.args.kv_cache_dtype));
  w.put(storage_dtype_name(m.args.depth_bank_dtype));
  w.put(static_cast<uint8_t>(m.args.bf16_linear_inputs));
  w.put(static_cast<int32_t>(m.args.max_graph_batch));
  w.put(static_cast<int32_t>(m.num_kv_blocks));
  w.put(static_cast<int32_t>(m.block_size));
  w.put(m.model_summary);
  return w.take();
}

LoadMessage decode_load(const std::string& message) {
  Reader r(message, ControlKind::Load);
  LoadMessage m;
  m.args.model = r.get_string();
  m.args.device = r.get_string();
  m.args.threads = r.get<int32_t>();
  m.args.tensor_parallel_size = r.get<int32_t>();
  m.args.sequence_parallel_min_tokens = r.get<int32_t>();
  m.args.kv_cache_dtype = storage_dtype_from_name(r.get_string(), "control message: kv cache");
  m.args.depth_bank_dtype = storage_dtype_from_name(r.get_string(), "control message: depth bank");
  m.args.bf16_linear_inputs = r.get<uint8_t>() != 0;
  m.args.max_graph_batch = r.get<int32_t>();
  m.num_kv_blocks = r.get<int32_t>();
  m.block_size = r.get<int32_t>();
  m.model_summary = r.get_string();
  r.finish();
  return m;
}

std::string encode_step(const StepBatch& step) {
  Writer w(ControlKind::Step);
  const BatchMeta& b = step.meta;
  w.put(static_cast<int32_t>(b.num_tokens));
  w.put(b.token_ids);
  w.put(b.positions);
  w.put(b.slot_mapping);
  w.put(b.query_start);
  w.put(b.context_len);
  w.put(static_cast<uint64_t>(b.block_tables.size()));
  for (const std::vector<int32_t>& table : b.block_tables) w.put(table);
  w.put(step.logit_rows);
  w.put(step.depth_rows);
  return w.take();
}

void decode_step(const std::string& message, StepBatch& out) {
  Reader r(message, ControlKind::Step);
  BatchMeta& b = out.meta;
  b.num_tokens = r.get<int32_t>();
  r.get_ints(b.token_ids);
  r.get_ints(b.positions);
  r.get_ints(b.slot_mapping);
  r.get_ints(b.query_start);
  r.get_ints(b.context_len);
  const uint64_t tables = r.get<uint64_t>();
  if (tables != b.context_len.size()) throw Error("control message: one block table per sequence");
  b.block_tables.resize(static_cast<size_t>(tables));
  for (std::vector<int32_t>& table : b.block_tables) r.get_ints(table);
  r.get_ints(out.logit_rows);
  r.get_ints(out.depth_rows);
  r.finish();
}

std::string encode_simple(ControlKind kind) {
  ATTNRES_CHECK(kind == ControlKind::Unload || kind == ControlKind::Exit,
                "encode_simple: Unload or Exit only");
  return Writer(kind).take();
}

}  // namespace attnres
