#pragma once
// Turns what the API server says when it refuses (a Kubernetes `Status`
// object, or a bare HTTP status) into one line a platform admin can act on.
#include <string>

#include "common/error.hpp"
#include "coordinator/kube/resources.hpp"

namespace factory::kube {

// What we were doing, so the message can say it in RBAC's terms.
struct RequestInfo {
  std::string verb;  // get, list, watch, create, update, patch, delete
  Resource resource;
  std::string ns;      // empty for cluster-scoped kinds or all namespaces
  std::string name;    // empty for collection requests
  std::string server;  // "https://10.0.0.1:6443"
};

// 401 -> unauthenticated, 403 -> permission_denied ("forbidden: the
// coordinator's account cannot patch kubevirts.kubevirt.io in namespace
// kubevirt: grant it with RBAC (see deploy/)"), 404 -> not_found, 409 ->
// already_exists / conflict, 400/422 -> invalid_argument, 410 -> conflict
// (expired), 429/5xx -> unavailable; each with the server's own message.
Error status_error(int http_status, const std::string& body, const RequestInfo& req);

// The "reason" field of a Status body ("AlreadyExists", "Expired"), or "".
std::string status_reason(const std::string& body);

}  // namespace factory::kube
