// What the kernel knows about this process's mappings, for tests of memory placement.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace attnres::test_memory {

// The "VmFlags:" line of the mapping that holds addr, from /proc/self/smaps ("" if none does).
// A mapping marked MADV_HUGEPAGE carries the flag "hg" (proc(5)).
inline std::string vm_flags_at(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= a && a < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line + " ";
  }
  return "";
}

inline bool advised_huge(const void* addr) {
  return vm_flags_at(addr).find(" hg ") != std::string::npos;
}

// Whether this kernel has transparent huge pages at all (else madvise refuses them).
inline bool thp_available() {
  return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
}

}  // namespace attnres::test_memory
