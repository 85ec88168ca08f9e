#include "coordinator/tenants/request.hpp"

#include <cctype>
#include <cstdint>
#include <set>
#include <tuple>

#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/tenants/k8s_names.hpp"

namespace factory::tenants {

using nlohmann::json;

namespace {

Error invalid(std::string m) {
  return Error(Errc::invalid_argument, std::move(m));
}

const std::set<std::string> kKeys = {"name",
                                     "tier",
                                     "gpus",
                                     "cpu",
                                     "memory",
                                     "disk",
                                     "image",
                                     "gpu_resource",
                                     "namespace",
                                     "ssh_node_port",
                                     "ssh_authorized_keys",
                                     "models",
                                     "password",
                                     "project"};

Status read_string(const json& j, const char* key, std::string& out) {
  if (!j.contains(key) || j[key].is_null()) return {};
  if (!j[key].is_string()) return invalid(std::string("'") + key + "' must be a string");
  out = j[key].get<std::string>();
  return {};
}

}  // namespace

json TenantRequest::to_json(bool with_password) const {
  json j = {{"name", name}, {"tier", tier}};
  if (gpus) j["gpus"] = *gpus;
  auto put = [&](const char* k, const std::string& v) {
    if (!v.empty()) j[k] = v;
  };
  put("cpu", cpu);
  put("memory", memory);
  put("disk", disk);
  put("image", image);
  put("gpu_resource", gpu_resource);
  put("namespace", ns);
  put("project", project);
  if (ssh_node_port != 0) j["ssh_node_port"] = ssh_node_port;
  j["ssh_authorized_keys"] = ssh_authorized_keys;
  if (!models.empty()) j["models"] = models;
  if (with_password && !password.empty()) j["password"] = password;
  return j;
}

Result<TenantRequest> TenantRequest::from_json(const json& j) {
  if (!j.is_object()) return invalid("want a JSON object {\"name\": ..., \"tier\": ...}");
  for (auto& [k, v] : j.items())
    if (!kKeys.count(k)) return invalid("unknown field '" + k + "' in the tenant request");
  TenantRequest r;
  const std::pair<const char*, std::string*> strings[] = {{"name", &r.name},
                                                          {"tier", &r.tier},
                                                          {"cpu", &r.cpu},
                                                          {"memory", &r.memory},
                                                          {"disk", &r.disk},
                                                          {"image", &r.image},
                                                          {"gpu_resource", &r.gpu_resource},
                                                          {"namespace", &r.ns},
                                                          {"password", &r.password},
                                                          {"project", &r.project}};
  for (auto [key, out] : strings)
    if (auto st = read_string(j, key, *out); !st.ok()) return st.error();
  // Ranges are checked on the JSON number itself: 4294967297 must not wrap
  // to 1 on its way into an int.
  if (j.contains("gpus") && !j["gpus"].is_null()) {
    const json& g = j["gpus"];
    if (!g.is_number_integer())
      return invalid("'gpus' must be a whole number from 0 to " + std::to_string(kMaxGpusPerVm));
    if ((g.is_number_unsigned() &&
         g.get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxGpusPerVm)) ||
        g.get<std::int64_t>() < 0 || g.get<std::int64_t>() > kMaxGpusPerVm)
      return invalid("'gpus' is " + g.dump() + ": want a whole number from 0 to " +
                     std::to_string(kMaxGpusPerVm));
    r.gpus = static_cast<int>(g.get<std::int64_t>());
  }
  if (j.contains("ssh_node_port") && !j["ssh_node_port"].is_null()) {
    const json& p = j["ssh_node_port"];
    if (!p.is_number_integer())
      return invalid("'ssh_node_port' must be a whole number (a NodePort, 30000-32767)");
    if ((p.is_number_unsigned() && p.get<std::uint64_t>() > 65535) || p.get<std::int64_t>() < 0 ||
        p.get<std::int64_t>() > 65535)
      return invalid("'ssh_node_port' is " + p.dump() + ": want a NodePort, 30000-32767");
    r.ssh_node_port = static_cast<int>(p.get<std::int64_t>());
  }
  if (j.contains("ssh_authorized_keys") && !j["ssh_authorized_keys"].is_null()) {
    if (!j["ssh_authorized_keys"].is_array())
      return invalid("'ssh_authorized_keys' must be a list of OpenSSH public keys");
    for (auto& k : j["ssh_authorized_keys"]) {
      if (!k.is_string()) return invalid("'ssh_authorized_keys' must be a list of strings");
      r.ssh_authorized_keys.push_back(k.get<std::string>());
    }
  }
  if (j.contains("models") && !j["models"].is_null()) {
    if (!j["models"].is_array() || j["models"].size() > kMaxRequestModels)
      return invalid("'models' must be a list of at most " + std::to_string(kMaxRequestModels) +
                     " Ollama model names");
    for (auto& m : j["models"]) {
      if (!m.is_string()) return invalid("'models' must be a list of strings");
      if (auto st = validate_model_name(m.get<std::string>()); !st.ok()) return st.error();
      r.models.push_back(m.get<std::string>());
    }
  }
  if (!r.project.empty() && !is_dns1123_label(r.project))
    return invalid("project '" + r.project.substr(0, 63) +
                   "' is not a DNS-1123 label (lower-case letters, digits, '-'; at most 63)");
  if (r.name.empty()) return invalid("no tenant name");
  if (r.tier.empty()) return invalid("no tier for tenant " + r.name + " (--tier gpu-vm|gpu-k8s)");
  return r;
}

Status validate_model_name(const std::string& model) {
  bool ok =
      !model.empty() && model.size() <= 128 && std::isalnum(static_cast<unsigned char>(model[0]));
  for (char c : model)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                c == ':' || c == '/' || c == '-');
  if (!ok)
    return invalid("model '" + model.substr(0, 64) +
                   "' is not an Ollama model name (lower-case letters, digits and . _ : / -, e.g. "
                   "llama3.2:1b)");
  return {};
}

Result<VmSpec> resolve_vm_spec(const catalog::Catalog& catalog, const TenantRequest& req,
                               const std::string& default_namespace, bool fill_gpu_placeholder) {
  // The name is checked first, and by the rules of every place it ends up in:
  // a certificate CN (validate_tenant_name) and object names (validate_vm_name).
  if (auto st = enroll::validate_tenant_name(req.name); !st.ok())
    return st.error().with_context("tenant name");
  if (auto st = validate_vm_name(req.name); !st.ok()) return st.error();
  auto tier = catalog.tier(req.tier);
  if (!tier) return tier.error();
  const catalog::VmShape& shape = (*tier)->vm;
  VmSpec s;
  s.name = req.name;
  s.tier = (*tier)->name;
  s.ns = req.ns.empty() ? default_namespace : req.ns;
  s.cpu = req.cpu.empty() ? shape.cpu : req.cpu;
  s.memory = req.memory.empty() ? shape.memory : req.memory;
  s.disk = req.disk.empty() ? shape.disk : req.disk;
  s.image_url = req.image.empty() ? shape.image : req.image;
  // 0 is a VM without a card: a tier of script steps, or a GPU tier whose
  // first step is then expected to fail with the diagnosis that says so
  // (the real-guest test does both).
  if (req.gpus && (*req.gpus < 0 || *req.gpus > kMaxGpusPerVm))
    return Error(Errc::invalid_argument, "--gpus " + std::to_string(*req.gpus) +
                                             " is out of range: want 0-" +
                                             std::to_string(kMaxGpusPerVm));
  s.gpus = req.gpus ? *req.gpus : shape.gpus;
  s.gpu_resource = req.gpu_resource.empty() ? shape.gpu_resource : req.gpu_resource;
  if (req.ssh_node_port != 0) {
    if (auto st = validate_node_port(req.ssh_node_port); !st.ok()) return st.error();
  }
  s.ssh_node_port = req.ssh_node_port;
  // No login: no SSH Service, unless the admin asked for key-only login.
  s.ssh_service = (*tier)->access.login || !req.ssh_authorized_keys.empty();
  if (!s.ssh_service && req.ssh_node_port != 0)
    return Error(Errc::invalid_argument,
                 "--ssh-node-port: tier " + s.tier +
                     " has no login, so no SSH Service; give --ssh-key too for the admin's own");
  if ((*tier)->endpoint) s.endpoint_port = (*tier)->endpoint->port;
  if (!req.models.empty()) {
    bool has_model_steps = false;
    for (const auto& st : (*tier)->steps) has_model_steps |= st.kind == "ollama_model";
    if (!has_model_steps)
      return Error(Errc::invalid_argument,
                   "--model: tier " + s.tier + " pulls no Ollama model, so it has none to replace");
    for (const auto& m : req.models)
      if (auto st = validate_model_name(m); !st.ok()) return st.error();
  }
  // validate_vm_spec wants a resource name for a VM with GPUs; "any
  // allowlisted" is resolved later (or shown as a placeholder), so check the
  // rest with a stand-in and put the empty name back.
  const bool any_gpu = s.gpus > 0 && s.gpu_resource.empty();
  if (any_gpu) s.gpu_resource = kAnyAllowlistedGpuPlaceholder;
  if (auto st = validate_vm_spec(s); !st.ok()) return st.error();
  if (any_gpu && !fill_gpu_placeholder) s.gpu_resource.clear();
  return s;
}

store::TenantSpec stored_spec(const VmSpec& vm, const TenantRequest& req) {
  store::TenantSpec s = vm_spec_to_stored(vm);
  s.ssh_authorized_keys = req.ssh_authorized_keys;
  if (!req.models.empty()) s.models = req.models;
  s.project = req.project.empty() ? "default" : req.project;
  return s;
}

namespace {

template <class T>
json stored_value(const std::optional<T>& v) {
  return v ? json(*v) : json();
}

}  // namespace

std::vector<std::string> request_differences(const store::TenantSpec& stored,
                                             const TenantRequest& req) {
  std::vector<std::string> out;
  auto differs = [&](const char* key, const json& have, const json& want) {
    if (have == want) return;
    out.push_back(std::string(key) + " " + (have.is_null() ? "unset" : have.dump()) + ", not " +
                  want.dump());
  };
  differs("tier", stored_value(stored.tier), req.tier);
  if (req.gpus) differs("gpus", stored_value(stored.gpus), *req.gpus);
  const std::tuple<const char*, const std::optional<std::string>*, const std::string*> overrides[] =
      {{"cpu", &stored.cpu, &req.cpu},
       {"memory", &stored.memory, &req.memory},
       {"disk", &stored.disk, &req.disk},
       {"image", &stored.image, &req.image},
       {"gpu_resource", &stored.gpu_resource, &req.gpu_resource},
       {"namespace", &stored.ns, &req.ns}};
  for (auto [key, have, val] : overrides)
    if (!val->empty()) differs(key, stored_value(*have), *val);
  if (req.ssh_node_port != 0)
    differs("ssh_node_port", stored_value(stored.ssh_node_port), req.ssh_node_port);
  if (!req.ssh_authorized_keys.empty())
    differs("ssh_authorized_keys", stored_value(stored.ssh_authorized_keys),
            req.ssh_authorized_keys);
  if (!req.models.empty()) differs("models", stored_value(stored.models), req.models);
  if (!req.project.empty())
    differs("project", json(stored.project.value_or("default")), req.project);
  return out;
}

Status same_request(const store::TenantSpec& stored, const TenantRequest& req) {
  auto d = request_differences(stored, req);
  if (d.empty()) return {};
  return Error(Errc::already_exists,
               "tenant " + req.name + " exists with a different spec (" + d.front() +
                   "): repeat the original create, or `factory tenant delete " + req.name +
                   "` first");
}

}  // namespace factory::tenants
