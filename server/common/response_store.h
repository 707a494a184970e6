// The responses /v1/responses keeps for previous_response_id: a bounded, thread-safe LRU map
// from a response id to what the next turn needs (the conversation so far, as Responses input
// items) and the response object itself. When full, storing one more evicts the least recently
// used; an evicted id then reads as unknown, exactly like one that never existed. Capacity 0
// stores nothing.
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

namespace attnres::server {

struct StoredResponse {
  nlohmann::ordered_json conversation;  // input items of every turn, then this turn's output
  nlohmann::ordered_json response;      // the response object as sent
};

class ResponseStore {
 public:
  explicit ResponseStore(size_t capacity) : capacity_(capacity) {}

  size_t capacity() const { return capacity_; }
  // Stores (or replaces) `id`, making it the most recently used.
  void put(const std::string& id, StoredResponse entry);
  // A copy of the entry, which becomes the most recently used; nullopt if unknown or evicted.
  std::optional<StoredResponse> get(const std::string& id);
  size_t size() const;

 private:
  using Order = std::list<std::string>;  // most recently used first
  struct Slot {
    StoredResponse entry;
    Order::iterator position;
  };

  const size_t capacity_;
  mutable std::mutex mutex_;
  Order order_;
  std::unordered_map<std::string, Slot> slots_;
};

}  // namespace attnres::server
