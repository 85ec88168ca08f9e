#include "agent/health/k8s_health.hpp"

#include "agent/diagnose/k8s.hpp"
#include "agent/guest/cluster.hpp"

namespace factory::agent {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

json count_or_null(const std::map<std::string, std::string>& res, const std::string& key) {
  auto it = res.find(key);
  if (it == res.end()) return nullptr;
  auto n = parse_quantity_count(it->second);
  return n ? json(*n) : json(nullptr);
}

}  // namespace

json collect_k8s_health(const GuestEnv& env, const std::string& kubeconfig,
                        const std::string& resource) {
  json out = {{"resource", resource},
              {"allocatable", nullptr},
              {"capacity", nullptr},
              {"nodes", json::array()},
              {"pods", json::array()}};
  auto k = Kubectl::find(env, kubeconfig);
  if (!k) {
    out["error"] = k.error().message;
    return out;
  }
  auto nodes = k->nodes(30s);
  if (!nodes) {
    out["error"] = nodes.error().message;
    return out;
  }
  long long alloc = 0, cap = 0;
  bool any_alloc = false, any_cap = false;
  for (const auto& n : *nodes) {
    json a = count_or_null(n.allocatable, resource);
    json c = count_or_null(n.capacity, resource);
    if (a.is_number()) alloc += a.get<long long>(), any_alloc = true;
    if (c.is_number()) cap += c.get<long long>(), any_cap = true;
    out["nodes"].push_back(
        {{"name", n.name},
         {"ready", n.ready},
         {"allocatable", a},
         {"capacity", c},
         {"gpu_label", n.labels.count("gpu") ? json(n.labels.at("gpu")) : json(nullptr)}});
  }
  if (any_alloc) out["allocatable"] = alloc;
  if (any_cap) out["capacity"] = cap;

  auto pods = k->pods(30s);
  if (!pods) {
    out["error"] = "pods: " + pods.error().message;
    return out;
  }
  for (const auto& p : *pods) {
    bool mem =
        p.limits.count("nvidia.com/gpumem") || p.limits.count("nvidia.com/gpumem-percentage");
    if (!mem) continue;
    auto limit = [&](const char* key) {
      auto it = p.limits.find(key);
      return it == p.limits.end() ? json(nullptr) : json(it->second);
    };
    out["pods"].push_back({{"namespace", p.ns},
                           {"name", p.name},
                           {"phase", p.phase},
                           {"status", p.status},
                           {"node", p.node},
                           {"gpus", limit(resource.c_str())},
                           {"gpumem_mib", limit("nvidia.com/gpumem")},
                           {"gpumem_percentage", limit("nvidia.com/gpumem-percentage")}});
  }
  // Nothing advertised although HAMi is installed: say why.
  bool hami = false;
  for (const auto& p : *pods) hami |= is_hami_pod(p);
  if (!any_alloc && hami) {
    AllocatableObservations o;
    o.resource = resource;
    o.count = 1;
    o.nodes = *nodes;
    o.pods = *pods;
    out["diagnoses"] = json::array({diagnose_allocatable(o).to_json()});
  }
  return out;
}

}  // namespace factory::agent
