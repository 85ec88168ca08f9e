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
  factory::proto::HealthRejects rejects;
  auto sample = factory::proto::parse_health_sample(body, rejects);
  const nlohmann::json kept = sample.to_json();
  (void)kept.dump();
  factory::proto::HealthRejects again;
  factory::proto::parse_health_sample(kept, again);
  if (!again.empty()) std::abort();
  return 0;
}
