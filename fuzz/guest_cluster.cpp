// What the guest's own cluster answers (agent/guest/cluster.hpp): node and
// pod lists as `kubectl get -o json` prints them, with HAMi's per-pod
// resources (nvidia.com/gpu, nvidia.com/gpumem) and quantities. The cluster
// is the customer's: any JSON gives lists (maybe empty), never a crash.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "agent/guest/cluster.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  using namespace factory::agent;
  (void)parse_quantity_count(text);
  auto doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded()) return 0;
  (void)parse_node_list(doc);
  for (auto& p : parse_pod_list(doc)) {
    (void)is_hami_pod(p);
    (void)is_hami_device_plugin(p);
  }
  return 0;
}
