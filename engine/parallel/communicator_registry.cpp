#include "engine/parallel/communicator_registry.h"

#include <map>
#include <mutex>

#include "engine/core/error.h"

namespace attnres {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, CommunicatorGroupFactory> factories;
  std::map<std::string, ProcessCommunicatorFactory> process_factories;
};

Registry& registry() {
  static Registry instance;  // initialised on first use
  return instance;
}

}  // namespace

void register_communicator_group(const std::string& name, CommunicatorGroupFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[name] = std::move(factory);
}

bool has_communicator_group(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.factories.count(name) > 0;
}

CommunicatorFactory make_communicator_group(const std::string& name, int size) {
  CommunicatorGroupFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) throw Error("no tensor-parallel communicator for backend '" + name + "'");
  return factory(size);
}

void register_process_communicator(const std::string& name, ProcessCommunicatorFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.process_factories[name] = std::move(factory);
}

bool has_process_communicator(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.process_factories.count(name) > 0;
}

std::unique_ptr<Communicator> make_process_communicator(const std::string& name,
                                                        ProcessGroup& group, Backend& backend) {
  ProcessCommunicatorFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.process_factories.find(name);
    if (it != r.process_factories.end()) factory = it->second;
  }
  if (!factory) throw Error("no multi-process communicator for backend '" + name + "'");
  return factory(group, backend);
}

}  // namespace attnres
