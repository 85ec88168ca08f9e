// A health frame's body as a tenant's root may send it
// (contract/health_sample.hpp): reading it never throws, what it keeps
// serializes, and what it keeps reads back with nothing more to drop.
#include "contract/health_sample.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto body = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;
  auto sample = factory::proto::decode_health_sample(body);
  if (!sample.value) return 0;
  const nlohmann::json kept = sample.value->to_json();
  (void)kept.dump();
  auto again = factory::proto::decode_health_sample(kept);
  if (!again.value || !again.rejected.empty()) std::abort();
  return 0;
}
