#include "engine/core/backend_registry.h"

#include <unistd.h>

#include <map>
#include <mutex>

#include "engine/core/error.h"

namespace attnres {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, BackendFactory> factories;
  std::map<std::string, BackendTraits> traits;
};

// A function-local static: initialised on first use, whatever the order of static
// initialisation elsewhere.
Registry& registry() {
  static Registry instance;
  return instance;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

size_t host_physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) throw Error("cannot read the host's physical memory size");
  return static_cast<size_t>(pages) * static_cast<size_t>(page_size);
}

void register_backend(const std::string& name, BackendFactory factory, BackendTraits traits) {
  if (traits.display_name.empty()) traits.display_name = name;
  if (!traits.kv_memory_bytes)
    traits.kv_memory_bytes = [](int) { return host_physical_memory_bytes(); };
  if (!traits.device_available) traits.device_available = [] { return true; };
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[name] = std::move(factory);
  r.traits[name] = std::move(traits);
}

BackendTraits backend_traits(const std::string& name) {
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.traits.find(name);
    if (it != r.traits.end()) return it->second;
  }
  throw Error("no backend named '" + name + "' (registered: " + joined(registered_backends()) +
              ")");
}

bool has_backend(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.factories.count(name) > 0;
}

std::vector<std::string> registered_backends() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : r.factories) names.push_back(name);
  return names;
}

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options) {
  BackendFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    throw Error("no backend named '" + name + "' (registered: " + joined(registered_backends()) +
                ")");
  }
  return factory(options);  // outside the lock: a CUDA backend takes a while to build
}

}  // namespace attnres
