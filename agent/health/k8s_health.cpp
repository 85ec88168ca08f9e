#include "agent/health/k8s_health.hpp"

#include "agent/diagnose/k8s.hpp"
#include "agent/guest/cluster.hpp"
#include "agent/health/gpu_health.hpp"

namespace factory::agent {

using nlohmann::json;

namespace {

std::optional<std::int64_t> resource_count_of(const std::map<std::string, std::string>& res,
                                              const std::string& key) {
  auto it = res.find(key);
  if (it == res.end()) return std::nullopt;
  auto n = parse_quantity_count(it->second);
  if (!n) return std::nullopt;
  return static_cast<std::int64_t>(*n);
}

std::optional<std::int64_t> limit_of(const KubePod& p, const std::string& key) {
  auto it = p.limits.find(key);
  if (it == p.limits.end()) return std::nullopt;
  return static_cast<std::int64_t>(it->second);
}

}  // namespace

proto::K8sSection read_k8s_section(const GuestEnv& env, const std::string& kubeconfig,
                                   const std::string& resource, std::chrono::milliseconds timeout) {
  proto::K8sSection out;
  out.resource = resource;
  auto k = Kubectl::find(env, kubeconfig);
  if (!k) {
    out.error = proto::clip_text(k.error().message, proto::health_limits::kText);
    return out;
  }
  auto nodes = k->nodes(timeout);
  if (!nodes) {
    out.error = proto::clip_text(nodes.error().message, proto::health_limits::kText);
    return out;
  }
  std::int64_t alloc = 0, cap = 0;
  bool any_alloc = false, any_cap = false;
  for (const auto& n : *nodes) {
    proto::K8sNodeSample s;
    s.name = n.name;
    s.ready = n.ready;
    s.allocatable = resource_count_of(n.allocatable, resource);
    s.capacity = resource_count_of(n.capacity, resource);
    if (s.allocatable) alloc += *s.allocatable, any_alloc = true;
    if (s.capacity) cap += *s.capacity, any_cap = true;
    if (auto it = n.labels.find("gpu"); it != n.labels.end()) s.gpu_label = it->second;
    if (out.nodes.size() < proto::health_limits::kNodes) out.nodes.push_back(std::move(s));
  }
  if (any_alloc) out.allocatable = alloc;
  if (any_cap) out.capacity = cap;

  auto pods = k->pods(timeout);
  if (!pods) {
    out.error = proto::clip_text("pods: " + pods.error().message, proto::health_limits::kText);
    return out;
  }
  for (const auto& p : *pods) {
    bool mem =
        p.limits.count("nvidia.com/gpumem") || p.limits.count("nvidia.com/gpumem-percentage");
    if (!mem || out.pods.size() == proto::health_limits::kPods) continue;
    proto::K8sPodSample s;
    s.ns = p.ns;
    s.name = p.name;
    s.phase = p.phase;
    s.status = p.status;
    s.node = p.node;
    s.gpus = limit_of(p, resource);
    s.gpumem_mib = limit_of(p, "nvidia.com/gpumem");
    s.gpumem_percentage = limit_of(p, "nvidia.com/gpumem-percentage");
    out.pods.push_back(std::move(s));
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
    out.diagnoses.push_back(diagnosis_sample(diagnose_allocatable(o)));
  }
  return out;
}

json collect_k8s_health(const GuestEnv& env, const std::string& kubeconfig,
                        const std::string& resource) {
  return read_k8s_section(env, kubeconfig, resource).to_json();
}

}  // namespace factory::agent
