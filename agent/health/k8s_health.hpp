#pragma once
// The guest cluster's GPU health (gpu-k8s tier), as the agent reports it:
//
// collect_k8s_health(env) ->
//   {"resource": "nvidia.com/gpu",
//    "allocatable": 10, "capacity": 10,          summed over the nodes (null: none advertised)
//    "nodes": [{"name", "ready", "allocatable", "capacity", "gpu_label"}],
//    "pods": [{"namespace", "name", "phase", "status", "node",
//              "gpus", "gpumem_mib", "gpumem_percentage"}],
//             every pod with a HAMi memory limit (nvidia.com/gpumem, MiB, or
//             nvidia.com/gpumem-percentage): HAMi's per-pod share of the card
//    "diagnoses": [...]      only when nothing is advertised and the cause is known
//    "error": "..."          only when the cluster could not be asked}
//
// Read with kubectl (PATH, else RKE2's /var/lib/rancher/rke2/bin) and the
// guest cluster's kubeconfig, like the gpu-k8s steps.
#include <nlohmann/json.hpp>
#include <string>

#include "agent/guest/cluster.hpp"
#include "agent/guest/env.hpp"

namespace factory::agent {

nlohmann::json collect_k8s_health(const GuestEnv& env,
                                  const std::string& kubeconfig = kRke2Kubeconfig,
                                  const std::string& resource = "nvidia.com/gpu");

}  // namespace factory::agent
