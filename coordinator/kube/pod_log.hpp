#pragma once
// A container's log (GET /api/v1/namespaces/NS/pods/NAME/log), bounded: the
// one read that answers text/plain, not a Kubernetes object, so it sits
// beside KubeClient and uses the same access (server, TLS, token) and the
// same one-line errors.
#include <chrono>
#include <string>

#include "common/error.hpp"
#include "coordinator/kube/kubeconfig.hpp"

namespace factory::kube {

struct LogOptions {
  std::string container;  // empty: the pod's only container
  bool previous = false;  // the last terminated instance (a crash-looping one's reason)
  int tail_lines = 0;     // 0: all
  long long limit_bytes = 64 * 1024;
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
};

Result<std::string> pod_log(const ClusterAccess& access, const std::string& ns,
                            const std::string& pod, const LogOptions& opts = {});

}  // namespace factory::kube
