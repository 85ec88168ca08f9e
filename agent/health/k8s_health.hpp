#pragma once
// The guest cluster's GPU health (gpu-k8s tier), as the health sample's k8s
// section (contract/health_sample.hpp): each node's capacity and allocatable
// of the resource (nvidia.com/gpu: HAMi's slices of the card), their sums,
// and every pod with a HAMi memory limit (nvidia.com/gpumem, MiB, or
// nvidia.com/gpumem-percentage) with its nvidia.com/gpu: HAMi's per-pod
// share of the card. Diagnoses only when nothing is advertised and the cause
// is known; the error when the cluster could not be asked.
//
// Read with kubectl (PATH, else RKE2's /var/lib/rancher/rke2/bin) and the
// guest cluster's kubeconfig, like the gpu-k8s steps.
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/guest/cluster.hpp"
#include "agent/guest/env.hpp"
#include "contract/health_sample.hpp"

namespace factory::agent {

// timeout bounds each kubectl call (there are two).
proto::K8sSection read_k8s_section(const GuestEnv& env,
                                   const std::string& kubeconfig = kRke2Kubeconfig,
                                   const std::string& resource = "nvidia.com/gpu",
                                   std::chrono::milliseconds timeout = std::chrono::seconds(15));

// The same as JSON.
nlohmann::json collect_k8s_health(const GuestEnv& env,
                                  const std::string& kubeconfig = kRke2Kubeconfig,
                                  const std::string& resource = "nvidia.com/gpu");

}  // namespace factory::agent
