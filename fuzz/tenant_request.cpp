// An admin API body: POST /v1/tenants (coordinator/tenants/request.hpp),
// from a CLI or a script holding the admin token. TenantRequest::from_json
// checks types and unknown keys; what it accepts is resolved against the
// built-in catalog into a VM shape (validate_vm_spec), and its stored form
// compared with the request as a re-run of create would. A bad body is one
// error line, never an exception.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "coordinator/tenants/request.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace factory;
  static const auto catalog = catalog::builtin();
  if (!catalog) std::abort();
  auto body = nlohmann::json::parse(std::string_view(reinterpret_cast<const char*>(data), size),
                                    nullptr, false);
  if (body.is_discarded()) return 0;
  auto req = tenants::TenantRequest::from_json(body);
  if (!req) return 0;
  (void)req->to_json(true).dump();
  auto vm = tenants::resolve_vm_spec(*catalog, *req, "factory", true);
  if (!vm) return 0;
  auto spec = tenants::stored_spec(*vm, *req);
  (void)spec.to_json().dump();
  (void)tenants::same_request(spec, *req);
  return 0;
}
