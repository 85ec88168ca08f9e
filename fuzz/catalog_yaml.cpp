// An admin's catalog file (contract/catalog.hpp): any YAML is either a valid
// catalog or one clear error, never a crash or an exception.
#include <cstddef>
#include <cstdint>

#include "contract/catalog.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto c = factory::catalog::parse(text, "fuzz");
  if (c)
    for (auto& t : c->tiers) (void)factory::catalog::plan_hash(t.plan());
  return 0;
}
