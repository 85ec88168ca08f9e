#pragma once
// What an admin asks for when creating a tenant (`factory tenant create` and
// POST /v1/tenants carry the same fields), and how it becomes a VM shape: the
// tier's VM from the catalog, overridden field by field by what the request
// sets. Shared by the coordinator and by `--dry-run`, which builds the same
// objects without contacting anything.
#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "contract/catalog.hpp"
#include "coordinator/tenants/vm_spec.hpp"

namespace factory::tenants {

// When the tier names no GPU resource ("any allowlisted") and nothing is
// asked to pick one (a dry run contacts no cluster), the VM's deviceName is
// this, and the dry run's header says so. A valid resource name, so the
// printed VirtualMachine still validates.
inline constexpr const char* kAnyAllowlistedGpuPlaceholder = "factory.dev/any-allowlisted-gpu";

// At most this many models in place of a tier's.
inline constexpr std::size_t kMaxRequestModels = 8;

struct TenantRequest {
  std::string name;
  std::string tier;
  // Overrides of the tier's VM shape; unset / empty = the tier's value.
  std::optional<int> gpus;
  std::string cpu, memory, disk, image, gpu_resource;
  std::string ns;         // "" = the coordinator's kube.namespace
  int ssh_node_port = 0;  // 0 = Kubernetes picks a free one
  std::vector<std::string> ssh_authorized_keys;
  // Ollama models in place of the tier's (its ollama_model steps, and the
  // health probe's model); empty = the tier's. Only for tiers with such steps.
  std::vector<std::string> models;
  // The ubuntu user's password; "" = generated. Never stored by the
  // coordinator (it goes into the cloud-init Secret only).
  std::string password;
  // The project its GPUs count against (quotas, usage; docs/usage.md): a
  // DNS-1123 label; "" = "default".
  std::string project;

  // The wire form (POST /v1/tenants). The password is included only when
  // with_password, so a stored spec never holds it.
  nlohmann::json to_json(bool with_password = false) const;
  // Checks types and unknown keys; one line naming the field.
  static Result<TenantRequest> from_json(const nlohmann::json& j);
};

// The VM for a request: validates the tenant name, finds the tier, applies
// the overrides and checks the result (validate_vm_spec). An empty
// gpu_resource stays empty when the tier has none: the coordinator picks an
// allowlisted resource with a free card (VmProvider::preflight);
// a dry run puts kAnyAllowlistedGpuPlaceholder there instead (fill_placeholder).
Result<VmSpec> resolve_vm_spec(const catalog::Catalog& catalog, const TenantRequest& req,
                               const std::string& default_namespace,
                               bool fill_gpu_placeholder = false);

// An Ollama model name as `ollama pull` takes it ("llama3.2:1b",
// "hf.co/org/model:q4"): at most 128 characters of [a-z0-9._:/-].
Status validate_model_name(const std::string& model);

// The stored form of a resolved request: what `tenant show` prints as spec,
// and what a re-run of create is compared with.
store::TenantSpec stored_spec(const VmSpec& vm, const TenantRequest& req);

// When a create is run again for a tenant that exists, it must ask for the
// same thing: every field the new request sets must equal the stored spec.
// Returns the first difference as one line, or ok.
Status same_request(const store::TenantSpec& stored_spec, const TenantRequest& req);
// Every difference same_request would name, in the same words ("memory
// \"4Gi\", not \"8Gi\""): what a Tenant's edited spec asks that the tenant
// does not run.
std::vector<std::string> request_differences(const store::TenantSpec& stored_spec,
                                             const TenantRequest& req);

}  // namespace factory::tenants
