// The Tenant custom resource: its definition and its edges (tenant_resource.hpp).
#include "coordinator/tenants/tenant_resource.hpp"

#include <cctype>
#include <optional>
#include <string_view>

#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/tenants/cloud_init.hpp"
#include "coordinator/tenants/k8s_names.hpp"
#include "coordinator/tenants/vm_spec.hpp"

namespace factory::tenants {

using nlohmann::json;

namespace {

// The schema's patterns: the coordinator's own rules (k8s_names.hpp,
// request.hpp, enroll/tenant_name.hpp) written as the API server's regular
// expressions (RE2: no look-around), so a Tenant the coordinator would
// refuse is refused at `kubectl apply`. tenant_resource_test holds each
// pattern against its C++ rule over the same samples.
constexpr const char* kTenantNamePattern = "^[a-z]([-a-z0-9]*[a-z0-9])?$";
constexpr const char* kDnsLabelPattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
// A positive resource.Quantity: a number with a non-zero digit, at most one
// dot, then a binary or decimal suffix or a decimal exponent.
constexpr const char* kQuantityPattern =
    "^([0-9]*[1-9][0-9]*(\\.[0-9]*)?|[0-9]*\\.[0-9]*[1-9][0-9]*)"
    "(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$";
constexpr const char* kLabelValuePattern = "^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
constexpr const char* kResourceNamePattern =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
constexpr const char* kModelPattern = "^[a-z0-9][a-z0-9._:/-]{0,127}$";
constexpr const char* kImagePattern = "^https?://[^/\\s][^\\s]*$";
// A catalog version as `factory catalog list` shows it: printable, no spaces.
constexpr const char* kCatalogVersionPattern = "^[A-Za-z0-9][-A-Za-z0-9_.+]{0,63}$";
constexpr std::size_t kMaxSshKeyLength = 16384;

json schema_string(const char* description, std::size_t max_length, const char* pattern = nullptr) {
  json s = {{"type", "string"}, {"description", description}, {"maxLength", max_length}};
  if (pattern) s["pattern"] = pattern;
  return s;
}

json condition_schema() {
  return {
      {"type", "object"},
      {"required", {"type", "status"}},
      {"properties",
       {{"type", schema_string("Ready, Provisioned, AgentConnected or Degraded.", 64)},
        {"status", {{"type", "string"}, {"enum", {"True", "False", "Unknown"}}}},
        {"reason",
         schema_string("One CamelCase word: Factory's diagnosis code where there is one.", 128)},
        {"message", schema_string("What happened, and what to do, in a sentence.", 4096)},
        {"observedGeneration", {{"type", "integer"}, {"format", "int64"}, {"minimum", 0}}},
        {"lastTransitionTime", {{"type", "string"}, {"format", "date-time"}}}}}};
}

json spec_schema() {
  json ssh_key = {
      {"type", "object"},
      {"description",
       "One OpenSSH public key inline, or a key of a Secret in the Tenant's "
       "namespace holding keys one per line."},
      {"properties",
       {{"publicKey",
         schema_string("An OpenSSH public key (ssh-ed25519 AAAA... comment).", kMaxSshKeyLength)},
        {"secretKeyRef",
         {{"type", "object"},
          {"required", {"name", "key"}},
          {"properties",
           {{"name", schema_string("The Secret's name.", 253)},
            {"key", schema_string("The key in its data.", 253, "^[-._a-zA-Z0-9]+$")}}}}}}},
      {"x-kubernetes-validations",
       {{{"rule", "has(self.publicKey) != has(self.secretKeyRef)"},
         {"message", "give exactly one of publicKey and secretKeyRef"}}}}};
  return {{"type", "object"},
          {"required", {"tier"}},
          {"properties",
           {{"tier",
             [] {
               json t = schema_string(
                   "The catalog tier (factory catalog list): gpu-vm, gpu-k8s, gpu-k8s-mig, "
                   "model-endpoint.",
                   63, kLabelValuePattern);
               t["minLength"] = 1;
               return t;
             }()},
            {"gpus",
             {{"type", "integer"},
              {"minimum", 0},
              {"maximum", kMaxGpusPerVm},
              {"description", "GPUs for the VM; default: the tier's."}}},
            {"gpuResource",
             schema_string(
                 "An allowlisted GPU resource (nvidia.com/GH100_H200); default: the tier's, or any "
                 "allowlisted one with a free card.",
                 317, kResourceNamePattern)},
            // An int-or-string as Kubernetes writes one (controller-gen's form):
            // the pattern applies to a string, the minimum to an integer.
            {"cpu",
             {{"x-kubernetes-int-or-string", true},
              {"anyOf", {{{"type", "integer"}}, {{"type", "string"}}}},
              {"pattern", kQuantityPattern},
              {"minimum", 1},
              {"description", "CPU request (8, 500m); default: the tier's."}}},
            {"memory", schema_string("Memory (16Gi); default: the tier's.", 64, kQuantityPattern)},
            {"disk",
             schema_string("Root disk size (100Gi); default: the tier's.", 64, kQuantityPattern)},
            {"image", schema_string("Cloud image URL CDI imports; default: the tier's.", 2048,
                                    kImagePattern)},
            {"models",
             {{"type", "array"},
              {"maxItems", kMaxRequestModels},
              {"items", schema_string("An Ollama model (llama3.2:1b).", 128, kModelPattern)},
              {"description", "Models to serve instead of the tier's."}}},
            {"sshKeys",
             {{"type", "array"},
              {"maxItems", kMaxTenantSshKeys},
              {"items", ssh_key},
              {"description", "Keys for the ubuntu user (none on a tier without login)."}}},
            {"sshNodePort",
             {{"type", "integer"},
              {"minimum", kMinNodePort},
              {"maximum", kMaxNodePort},
              {"description", "NodePort for SSH; default: Kubernetes picks a free one."}}},
            {"project", schema_string("The project the tenant's usage and quotas count under.", 63,
                                      kDnsLabelPattern)},
            {"catalogVersion",
             schema_string(
                 "The catalog version the tenant was asked against; a coordinator with another "
                 "says so in a condition.",
                 64, kCatalogVersionPattern)}}}};
}

json status_schema() {
  return {
      {"type", "object"},
      {"properties",
       {{"phase",
         schema_string("Factory's phase: pending, provisioning, ready, degraded, failed...", 64)},
        {"observedGeneration", {{"type", "integer"}, {"format", "int64"}, {"minimum", 0}}},
        {"step", schema_string("The plan step the agent is on.", 128)},
        {"gpu",
         schema_string("The card the VM holds (its resource, or its bus id on a QEMU host).", 320)},
        {"endpointURL", schema_string("The model endpoint's URL (model-endpoint tiers).", 2048)},
        {"maintenance",
         {{"type", "object"},
          {"description",
           "A host drain the tenant is in (`factory host drain`): its state (noticed, "
           "stopping, drained, starting), the node and the notice's deadline."},
          {"properties",
           {{"state", schema_string("noticed, stopping, drained or starting.", 16)},
            {"node", schema_string("The node drained.", 253)},
            {"deadline", schema_string("When the VM is stopped (RFC 3339).", 40)}}}}},
        {"conditions",
         {{"type", "array"},
          {"maxItems", 16},
          {"x-kubernetes-list-type", "map"},
          {"x-kubernetes-list-map-keys", {"type"}},
          {"items", condition_schema()}}}}}};
}

// ---- reading an object ----

Error invalid_spec_field(const std::string& field, const std::string& why) {
  return Error(Errc::invalid_argument, "Tenant " + field + ": " + why);
}

// The message of a validator that names the CLI's flag, said of the field.
Error invalid_from(const std::string& field, const Error& e) {
  return invalid_spec_field(field, e.message);
}

Status read_spec_string(const json& spec, const char* key, std::string& out) {
  auto it = spec.find(key);
  if (it == spec.end() || it->is_null()) return {};
  if (!it->is_string()) return invalid_spec_field(std::string("spec.") + key, "must be a string");
  out = it->get<std::string>();
  return {};
}

Status read_int(const json& spec, const char* key, std::int64_t lo, std::int64_t hi,
                std::optional<std::int64_t>& out) {
  auto it = spec.find(key);
  if (it == spec.end() || it->is_null()) return {};
  const std::string field = std::string("spec.") + key;
  const std::string range =
      "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
  if (!it->is_number_integer()) return invalid_spec_field(field, "must be " + range);
  // Checked on the JSON number: 4294967297 must not wrap on its way into an int.
  if (it->is_number_unsigned() ? it->get<std::uint64_t>() > static_cast<std::uint64_t>(hi)
                               : (it->get<std::int64_t>() < lo || it->get<std::int64_t>() > hi))
    return invalid_spec_field(field, "is " + it->dump() + ": want " + range);
  out = it->get<std::int64_t>();
  return {};
}

Status read_ssh_keys(const json& spec, TenantResource& r) {
  auto it = spec.find("sshKeys");
  if (it == spec.end() || it->is_null()) return {};
  if (!it->is_array()) return invalid_spec_field("spec.sshKeys", "must be a list");
  if (it->size() > kMaxTenantSshKeys)
    return invalid_spec_field("spec.sshKeys", "has " + std::to_string(it->size()) +
                                                  " keys: at most " +
                                                  std::to_string(kMaxTenantSshKeys));
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& k = (*it)[i];
    const std::string field = "spec.sshKeys[" + std::to_string(i) + "]";
    if (!k.is_object())
      return invalid_spec_field(field, "must be {publicKey: ...} or {secretKeyRef: ...}");
    for (auto& [key, v] : k.items())
      if (key != "publicKey" && key != "secretKeyRef")
        return invalid_spec_field(field, "unknown field '" + key + "'");
    const bool inline_key = k.contains("publicKey"), ref = k.contains("secretKeyRef");
    if (inline_key == ref)
      return invalid_spec_field(field, "give exactly one of publicKey and secretKeyRef");
    if (inline_key) {
      const json& pk = k["publicKey"];
      if (!pk.is_string() || pk.get<std::string>().size() > kMaxSshKeyLength)
        return invalid_spec_field(field + ".publicKey", "must be one OpenSSH public key");
      if (auto st = validate_ssh_public_key(pk.get<std::string>()); !st.ok())
        return invalid_from(field + ".publicKey", st.error());
      r.request.ssh_authorized_keys.push_back(pk.get<std::string>());
      continue;
    }
    const json& s = k["secretKeyRef"];
    SecretKeyRef out;
    if (!s.is_object() || !s.contains("name") || !s.contains("key") || !s["name"].is_string() ||
        !s["key"].is_string())
      return invalid_spec_field(field + ".secretKeyRef",
                                "must be {name: <Secret>, key: <key in its data>}");
    for (auto& [key, v] : s.items())
      if (key != "name" && key != "key")
        return invalid_spec_field(field + ".secretKeyRef", "unknown field '" + key + "'");
    out.name = s["name"].get<std::string>();
    out.key = s["key"].get<std::string>();
    if (!is_dns1123_subdomain(out.name))
      return invalid_spec_field(field + ".secretKeyRef.name",
                                "is not a Secret name (a DNS-1123 subdomain)");
    bool key_ok = !out.key.empty() && out.key.size() <= 253;
    for (char c : out.key)
      key_ok = key_ok &&
               (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.');
    if (!key_ok) return invalid_spec_field(field + ".secretKeyRef.key", "is not a Secret data key");
    r.ssh_key_refs.push_back(std::move(out));
  }
  return {};
}

Status read_spec(const json& spec, TenantResource& r) {
  if (!spec.is_object()) return invalid_spec_field("spec", "must be an object");
  // The fields a spec may have are the schema's: one list for both.
  static const json kSpecFields = spec_schema()["properties"];
  for (auto& [k, v] : spec.items())
    if (!kSpecFields.contains(k)) return invalid_spec_field("spec", "unknown field '" + k + "'");
  TenantRequest& q = r.request;
  if (auto st = read_spec_string(spec, "tier", q.tier); !st.ok()) return st;
  if (q.tier.empty()) return invalid_spec_field("spec.tier", "is required (factory catalog list)");
  if (auto st = validate_label(kTierLabel, q.tier); !st.ok())
    return invalid_from("spec.tier", st.error());
  std::optional<std::int64_t> n;
  if (auto st = read_int(spec, "gpus", 0, kMaxGpusPerVm, n); !st.ok()) return st;
  if (n) q.gpus = static_cast<int>(*n);
  n.reset();
  if (auto st = read_int(spec, "sshNodePort", kMinNodePort, kMaxNodePort, n); !st.ok()) return st;
  if (n) q.ssh_node_port = static_cast<int>(*n);
  if (auto st = read_spec_string(spec, "gpuResource", q.gpu_resource); !st.ok()) return st;
  if (!q.gpu_resource.empty())
    if (auto st = validate_resource_name(q.gpu_resource); !st.ok())
      return invalid_from("spec.gpuResource", st.error());
  // cpu is an int-or-string, as Kubernetes quantities are in YAML.
  if (auto it = spec.find("cpu"); it != spec.end() && !it->is_null()) {
    if (it->is_number_integer() && !it->is_number_unsigned() && it->get<std::int64_t>() < 1)
      return invalid_spec_field("spec.cpu", "is " + it->dump() + ": want more than zero");
    if (it->is_number_integer())
      q.cpu = it->dump();
    else if (it->is_string())
      q.cpu = it->get<std::string>();
    else
      return invalid_spec_field("spec.cpu", "must be a quantity (8, 500m)");
  }
  if (auto st = read_spec_string(spec, "memory", q.memory); !st.ok()) return st;
  if (auto st = read_spec_string(spec, "disk", q.disk); !st.ok()) return st;
  for (auto [field, value] : {std::pair<const char*, const std::string*>{"spec.cpu", &q.cpu},
                              {"spec.memory", &q.memory},
                              {"spec.disk", &q.disk}})
    if (!value->empty())
      if (auto st = validate_quantity(field, *value); !st.ok())
        return Error(Errc::invalid_argument, "Tenant " + st.error().message);
  if (auto st = read_spec_string(spec, "image", q.image); !st.ok()) return st;
  if (auto it = spec.find("models"); it != spec.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > kMaxRequestModels)
      return invalid_spec_field(
          "spec.models",
          "must be a list of at most " + std::to_string(kMaxRequestModels) + " Ollama model names");
    for (const json& m : *it) {
      if (!m.is_string()) return invalid_spec_field("spec.models", "must be a list of strings");
      if (auto st = validate_model_name(m.get<std::string>()); !st.ok())
        return invalid_from("spec.models", st.error());
      q.models.push_back(m.get<std::string>());
    }
  }
  if (auto st = read_ssh_keys(spec, r); !st.ok()) return st;
  if (auto st = read_spec_string(spec, "project", r.project); !st.ok()) return st;
  if (!r.project.empty() && !is_dns1123_label(r.project))
    return invalid_spec_field("spec.project",
                              "'" + r.project.substr(0, 63) +
                                  "' is not a DNS-1123 label (lower-case letters, digits, "
                                  "'-'; at most 63)");
  q.project = r.project;
  if (auto st = read_spec_string(spec, "catalogVersion", r.catalog_version); !st.ok()) return st;
  bool version_ok = r.catalog_version.size() <= 64;
  for (std::size_t i = 0; i < r.catalog_version.size(); ++i) {
    const char c = r.catalog_version[i];
    version_ok = version_ok && (std::isalnum(static_cast<unsigned char>(c)) ||
                                (i > 0 && (c == '-' || c == '_' || c == '.' || c == '+')));
  }
  if (!version_ok) return invalid_spec_field("spec.catalogVersion", "is not a catalog version");
  return {};
}

}  // namespace

json tenant_crd() {
  json version = {
      {"name", kTenantVersion},
      {"served", true},
      {"storage", true},
      {"subresources", {{"status", json::object()}}},
      {"additionalPrinterColumns",
       {{{"name", "Tier"}, {"type", "string"}, {"jsonPath", ".spec.tier"}},
        {{"name", "Phase"}, {"type", "string"}, {"jsonPath", ".status.phase"}},
        {{"name", "GPU"}, {"type", "string"}, {"jsonPath", ".status.gpu"}},
        {{"name", "Ready"},
         {"type", "string"},
         {"jsonPath", ".status.conditions[?(@.type==\"Ready\")].status"}},
        {{"name", "Age"}, {"type", "date"}, {"jsonPath", ".metadata.creationTimestamp"}}}},
      {"schema",
       {{"openAPIV3Schema",
         {{"type", "object"},
          {"description",
           "A Factory tenant: a VM that owns whole passed-through GPUs, provisioned as its "
           "catalog tier says. The coordinator's controller reconciles it."},
          {"required", {"spec"}},
          {"x-kubernetes-validations",
           {{{"rule", std::string("self.metadata.name.matches('") + kTenantNamePattern +
                          "') && size(self.metadata.name) <= " + std::to_string(kMaxVmNameLength)},
             {"message", "a Tenant's name is a DNS-1123 label that starts with a letter, at most " +
                             std::to_string(kMaxVmNameLength) +
                             " characters (it names the VM and its Service)"}}}},
          {"properties",
           {{"apiVersion", {{"type", "string"}}},
            {"kind", {{"type", "string"}}},
            {"metadata", {{"type", "object"}}},
            {"spec", spec_schema()},
            {"status", status_schema()}}}}}}}};
  return {{"apiVersion", "apiextensions.k8s.io/v1"},
          {"kind", "CustomResourceDefinition"},
          {"metadata",
           {{"name", kTenantCrdName},
            {"labels", {{"app.kubernetes.io/name", "factory"}, {kManagedByLabel, "factory"}}}}},
          {"spec",
           {{"group", kTenantGroup},
            {"scope", "Namespaced"},
            {"names",
             {{"kind", kTenantKind},
              {"listKind", "TenantList"},
              {"plural", kTenantPlural},
              {"singular", "tenant"},
              {"categories", {"factory"}}}},
            {"versions", {version}}}}};
}

Result<TenantResource> tenant_from_object(const json& object) {
  if (!object.is_object()) return invalid_spec_field("object", "must be a JSON object");
  const json api = object.value("apiVersion", json()), kind = object.value("kind", json());
  if (api != kTenantApiVersion || kind != kTenantKind)
    return invalid_spec_field("object", std::string("want apiVersion ") + kTenantApiVersion +
                                            ", kind " + kTenantKind + "; not " + api.dump() + ", " +
                                            kind.dump());
  const json meta = object.value("metadata", json::object());
  if (!meta.is_object()) return invalid_spec_field("metadata", "must be an object");
  TenantResource r;
  const json name = meta.value("name", json());
  if (!name.is_string()) return invalid_spec_field("metadata.name", "is required");
  r.request.name = name.get<std::string>();
  if (auto st = enroll::validate_tenant_name(r.request.name); !st.ok())
    return invalid_from("metadata.name", st.error());
  if (auto st = validate_vm_name(r.request.name); !st.ok())
    return invalid_from("metadata.name", st.error());
  const json ns = meta.value("namespace", json());
  if (!ns.is_null()) {
    if (!ns.is_string()) return invalid_spec_field("metadata.namespace", "must be a string");
    r.request.ns = ns.get<std::string>();
    if (auto st = validate_namespace_name(r.request.ns); !st.ok())
      return invalid_from("metadata.namespace", st.error());
  }
  if (const json g = meta.value("generation", json()); !g.is_null()) {
    if (!g.is_number_integer() || (!g.is_number_unsigned() && g.get<std::int64_t>() < 0))
      return invalid_spec_field("metadata.generation", "must be a whole number");
    r.generation = g.get<std::int64_t>();
  }
  if (const json u = meta.value("uid", json()); u.is_string()) r.uid = u.get<std::string>();
  auto spec = object.find("spec");
  if (spec == object.end()) return invalid_spec_field("spec", "is required");
  if (auto st = read_spec(*spec, r); !st.ok()) return st.error();
  return r;
}

json tenant_object(const TenantResource& r) {
  const TenantRequest& q = r.request;
  json meta = {{"name", q.name}};
  if (!q.ns.empty()) meta["namespace"] = q.ns;
  json spec = {{"tier", q.tier}};
  if (q.gpus) spec["gpus"] = *q.gpus;
  if (!q.gpu_resource.empty()) spec["gpuResource"] = q.gpu_resource;
  if (!q.cpu.empty()) spec["cpu"] = q.cpu;
  if (!q.memory.empty()) spec["memory"] = q.memory;
  if (!q.disk.empty()) spec["disk"] = q.disk;
  if (!q.image.empty()) spec["image"] = q.image;
  if (!q.models.empty()) spec["models"] = q.models;
  if (q.ssh_node_port != 0) spec["sshNodePort"] = q.ssh_node_port;
  json keys = json::array();
  for (const auto& k : q.ssh_authorized_keys) keys.push_back({{"publicKey", k}});
  for (const auto& ref : r.ssh_key_refs)
    keys.push_back({{"secretKeyRef", {{"name", ref.name}, {"key", ref.key}}}});
  if (!keys.empty()) spec["sshKeys"] = std::move(keys);
  if (!r.project.empty())
    spec["project"] = r.project;
  else if (!q.project.empty())
    spec["project"] = q.project;
  if (!r.catalog_version.empty()) spec["catalogVersion"] = r.catalog_version;
  return {{"apiVersion", kTenantApiVersion},
          {"kind", kTenantKind},
          {"metadata", std::move(meta)},
          {"spec", std::move(spec)}};
}

}  // namespace factory::tenants
