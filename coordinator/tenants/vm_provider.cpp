#include "coordinator/tenants/vm_provider.hpp"

namespace factory::tenants {

nlohmann::json VmObservation::to_json() const {
  nlohmann::json j = {{"exists", exists}, {"status", status}, {"phase", phase},
                      {"ip", ip},         {"node", node},     {"ssh_node_port", ssh_node_port}};
  if (!reason.empty()) j["reason"] = reason;
  if (!provider.empty()) j["provider"] = provider;
  if (!gpus.empty()) j["gpus"] = gpus;
  if (!instance.empty()) j["instance"] = instance;
  if (!running_since.empty()) j["running_since"] = running_since;
  if (!stopped_at.empty()) j["stopped_at"] = stopped_at;
  if (endpoint_node_port != 0) j["endpoint_node_port"] = endpoint_node_port;
  if (details.is_object()) j.update(details);
  return j;
}

Result<std::vector<std::string>> VmProvider::drift(const VmSpec& spec) {
  auto obs = observe(spec.name, spec.ns);
  if (!obs) return obs.error();
  if (obs->exists) return std::vector<std::string>{};
  return std::vector<std::string>{"the VM of tenant " + spec.name + " is missing"};
}

}  // namespace factory::tenants
