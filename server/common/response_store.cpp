#include "server/common/response_store.h"

namespace attnres::server {

void ResponseStore::put(const std::string& id, StoredResponse entry) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = slots_.find(id); it != slots_.end()) {
    order_.erase(it->second.position);
    slots_.erase(it);
  }
  while (slots_.size() >= capacity_) {
    slots_.erase(order_.back());
    order_.pop_back();
  }
  order_.push_front(id);
  slots_.emplace(id, Slot{std::move(entry), order_.begin()});
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return std::nullopt;
  order_.splice(order_.begin(), order_, it->second.position);
  return it->second.entry;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_.size();
}

}  // namespace attnres::server
