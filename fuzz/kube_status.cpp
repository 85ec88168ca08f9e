// What the host's API server says when it refuses
// (coordinator/kube/status_error.hpp): any body with any HTTP status turns
// into one error line, never a crash. The first two bytes are the status.
#include <cstddef>
#include <cstdint>

#include "coordinator/kube/status_error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  int status = 100 + (data[0] << 8 | data[1]) % 500;
  std::string body(reinterpret_cast<const char*>(data) + 2, size - 2);
  factory::kube::RequestInfo req;
  req.verb = "patch";
  req.ns = "kubevirt";
  req.name = "kubevirt";
  req.server = "https://127.0.0.1:6443";
  auto kind = factory::kube::resource_for({"kubevirt.io/v1", "KubeVirt"});
  if (kind) req.resource = *kind;
  (void)factory::kube::status_error(status, body, req).message;
  (void)factory::kube::status_reason(body);
  return 0;
}
