#include "engine/tokenizer/bpe_model.h"

#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>

#include "engine/core/error.h"
#include "engine/core/json_fields.h"
#include "engine/tokenizer/unicode_util.h"

namespace attnres::tok {

BpeModel::BpeModel(const nlohmann::json& model, const std::string& origin) {
  auto fail = [&](const std::string& what) { throw Error(origin + ": " + what); };
  if (!model.is_object()) fail("\"model\" must be an object");
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) fail("BPE dropout is not supported");
  }
  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) fail("model.vocab must be an object");
  vocab_.reserve(vocab_it->size());
  int32_t max_id = -1;
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      fail("model.vocab[\"" + it.key() + "\"] must be a non-negative integer id");
    }
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_token_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[id] = token;
    has_token_[id] = true;
  }

  const JsonFields<nlohmann::json> fields(model, JsonFieldOptions::with_origin(origin));
  continuing_subword_prefix_ = fields.string("continuing_subword_prefix").value_or("");
  end_of_word_suffix_ = fields.string("end_of_word_suffix").value_or("");
  fuse_unk_ = fields.boolean("fuse_unk").value_or(false);
  byte_fallback_ = fields.boolean("byte_fallback").value_or(false);
  ignore_merges_ = fields.boolean("ignore_merges").value_or(false);
  const std::string unk = fields.string("unk_token").value_or("");
  if (!unk.empty()) {
    auto it = vocab_.find(unk);
    if (it == vocab_.end()) fields.fail("unk_token", "\"" + unk + "\" is not in the vocab");
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(std::string_view(name));
    byte_token_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  const std::string_view meta = "\xE2\x96\x81";  // U+2581 "▁"
  split_before_metaspace_ = !ignore_merges_ && continuing_subword_prefix_.empty() &&
                            end_of_word_suffix_.empty() && vocab_.count(meta) != 0;
  for (auto it = vocab_.begin(); split_before_metaspace_ && it != vocab_.end(); ++it) {
    const std::string& t = it->first;
    for (size_t pos = t.find(meta, 1); pos != std::string::npos; pos = t.find(meta, pos + 3)) {
      if (t.compare(pos - 3, 3, meta) != 0) {
        split_before_metaspace_ = false;
        break;
      }
    }
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) fail("model.merges must be an array");
  merges_.reserve(merges_it->size() * 2);
  const size_t prefix_len = continuing_subword_prefix_.size();
  uint32_t rank = 0;
  for (const auto& m : *merges_it) {
    std::string a, b;
    if (m.is_string()) {  // legacy "a b" (split at the first space, as HF does)
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) fail("merge \"" + s + "\" is not of the form \"a b\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      fail("merge #" + std::to_string(rank) + " must be \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia == vocab_.end() || ib == vocab_.end()) {
      fail("merge #" + std::to_string(rank) + " (" + a + " " + b +
           ") uses a token not in the vocab");
    }
    if (b.size() < prefix_len) fail("merge #" + std::to_string(rank) + " lacks the subword prefix");
    const std::string merged = a + b.substr(prefix_len);
    auto im = vocab_.find(merged);
    if (im == vocab_.end()) {
      fail("merge #" + std::to_string(rank) + " yields \"" + merged +
           "\", which is not in the vocab");
    }
    // Later duplicates overwrite earlier ones, as in HF's HashMap collect.
    merges_[pair_key(ia->second, ib->second)] = MergeInfo{rank, im->second};
    ++rank;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (!split_before_metaspace_ || word.size() < kMaxCachedWord) {
    tokenize_chunk(word, out);
    return;
  }
  const std::string_view meta = "\xE2\x96\x81";
  size_t begin = 0;
  for (size_t pos = word.find(meta, 1); pos != std::string_view::npos;
       pos = word.find(meta, pos + meta.size())) {
    if (word.compare(pos - meta.size(), meta.size(), meta) == 0) continue;  // inside a ▁ run
    tokenize_chunk(word.substr(begin, pos - begin), out);
    begin = pos;
  }
  tokenize_chunk(word.substr(begin), out);
}

void BpeModel::tokenize_chunk(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWord;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
  }
}

// Initial symbols: one per character (with prefix/suffix decoration), byte-fallback tokens
// for characters missing from the vocab, and (fused) unk tokens otherwise.
void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& symbols) const {
  int32_t pending_unk = -1;  // HF keeps one unk back so it can fuse the next one
  std::string decorated;
  size_t i = 0;
  while (i < word.size()) {
    char32_t cp = 0;
    int len = decode_utf8_at(word, i, &cp);
    if (len == 0) len = 1;
    const bool first = i == 0, last = i + len == word.size();
    std::string_view piece = word.substr(i, len);
    if ((!first && !continuing_subword_prefix_.empty()) || (last && !end_of_word_suffix_.empty())) {
      decorated.clear();
      if (!first) decorated += continuing_subword_prefix_;
      decorated += piece;
      if (last) decorated += end_of_word_suffix_;
      piece = decorated;
    }
    i += len;
    if (auto it = vocab_.find(piece); it != vocab_.end()) {
      if (pending_unk >= 0) symbols.push_back(pending_unk);
      pending_unk = -1;
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : piece) all = all && byte_token_ids_[b] >= 0;
      if (all) {
        // HF emits these before any pending unk (it does not flush it first); keep that order.
        for (unsigned char b : piece) symbols.push_back(byte_token_ids_[b]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) symbols.push_back(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) symbols.push_back(pending_unk);
  merge_all(symbols);
}

// Priority-queue merge over a doubly linked list of symbols (HF Word::merge_all): always apply
// the lowest-ranked merge, leftmost first; stale queue entries are skipped.
void BpeModel::merge_all(std::vector<int32_t>& symbols) const {
  const size_t n = symbols.size();
  if (n < 2) return;
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  std::vector<Candidate> storage;
  storage.reserve(n * 2);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue(std::greater<>{},
                                                                               std::move(storage));
  for (size_t k = 0; k < n; ++k) {
    prev[k] = static_cast<int32_t>(k) - 1;
    next[k] = k + 1 < n ? static_cast<int32_t>(k + 1) : -1;
  }
  auto push_pair = [&](int32_t left) {
    const int32_t right = next[left];
    if (right < 0) return;
    auto it = merges_.find(pair_key(symbols[left], symbols[right]));
    if (it != merges_.end()) {
      queue.push({it->second.rank, static_cast<uint32_t>(left), it->second.new_id});
    }
  };
  for (size_t k = 0; k + 1 < n; ++k) push_pair(static_cast<int32_t>(k));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int32_t left = static_cast<int32_t>(top.pos);
    if (!alive[left]) continue;
    const int32_t right = next[left];
    if (right < 0) continue;
    auto it = merges_.find(pair_key(symbols[left], symbols[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale entry
    symbols[left] = top.new_id;
    alive[right] = false;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    if (prev[left] >= 0) push_pair(prev[left]);
    push_pair(left);
  }
  size_t w = 0;
  for (size_t k = 0; k < n; ++k) {
    if (alive[k]) symbols[w++] = symbols[k];
  }
  symbols.resize(w);
}

}  // namespace attnres::tok
