#include "contract/step_params.hpp"

#include <algorithm>
#include <regex>

#include "common/cidr.hpp"
#include "common/durations.hpp"
#include "common/validation.hpp"
#include "contract/cluster_ranges.hpp"
#include "contract/mig_cards.hpp"

namespace factory::catalog {

using nlohmann::json;
using validation::bad;
using validation::type_name;

namespace {

using T = ParamType;

// The guest cluster's own kubeconfig, as RKE2 writes it: where every gpu-k8s
// step after rke2 finds the cluster.
const char* const kRke2Kubeconfig = "/etc/rancher/rke2/rke2.yaml";

Status check_type(const json& v, T t, const std::string& where) {
  auto want = [&](const char* what) {
    return bad(where, std::string("must be ") + what + ", got " + type_name(v));
  };
  switch (t) {
    case T::string:
      if (!v.is_string()) return want("a string");
      if (v.get<std::string>().empty()) return bad(where, "must not be empty");
      break;
    case T::integer:
      if (!v.is_number_integer()) return want("a whole number");
      break;
    case T::boolean:
      if (!v.is_boolean()) return want("true or false");
      break;
    case T::object:
      if (!v.is_object()) return want("a map");
      break;
    case T::string_list:
      if (!v.is_array()) return want("a list of strings");
      for (size_t i = 0; i < v.size(); ++i)
        if (!v[i].is_string() || v[i].get<std::string>().empty())
          return bad(where + "[" + std::to_string(i) + "]", "must be a non-empty string");
      break;
    case T::string_map:
      if (!v.is_object()) return want("a map of strings");
      for (auto& [k, x] : v.items())
        if (!x.is_string())
          return bad(where + "." + k, "must be a string (quote it), got " + type_name(x));
      break;
    case T::any:
      break;
  }
  return ok_status();
}

// Unknown keys refused, required ones present, types right, defaults filled
// in: for the params themselves and for a map param with fixed keys.
Status normalize_map(json& obj, const std::vector<ParamSchema>& schema, const std::string& kind,
                     const std::string& where) {
  std::vector<std::string> names;
  for (auto& p : schema) names.push_back(p.name);
  if (auto s = validation::only_keys(obj, names, where); !s) return s;
  for (auto& p : schema) {
    std::string pw = where + "." + p.name;
    if (!obj.contains(p.name)) {
      if (p.required)
        return bad(pw, p.required_hint.empty() ? "required for a " + kind + " step"
                                               : "required: " + p.required_hint);
      if (!p.default_value.is_null()) obj[p.name] = p.default_value;
      continue;
    }
    if (auto s = check_type(obj[p.name], p.type, pw); !s) return s;
    if (!p.fields.empty())
      if (auto s = normalize_map(obj[p.name], p.fields, kind, pw); !s) return s;
  }
  return ok_status();
}

Status url_param(const json& p, const std::string& key, const std::string& where, bool https_only) {
  if (!p.contains(key)) return ok_status();
  const std::string& u = p[key].get_ref<const std::string&>();
  if (https_only ? !validation::is_https_url(u) : !validation::is_http_url(u))
    return bad(where + "." + key, std::string("must be an ") +
                                      (https_only ? "https://" : "http(s)://") + " URL, got '" + u +
                                      "'");
  return ok_status();
}

Status duration_param(const json& p, const std::string& key, const std::string& where) {
  if (!p.contains(key)) return ok_status();
  auto d = parse_duration(p[key].get<std::string>());
  if (!d) return bad(where + "." + key, d.error().message);
  return ok_status();
}

Status check_gpu_present(const json& p, const std::string& where) {
  static const std::regex hex4("^[0-9a-fA-F]{4}$");
  if (!std::regex_match(p["vendor"].get<std::string>(), hex4))
    return bad(where + ".vendor", "must be a 4-digit PCI vendor ID like \"10de\" (quote it)");
  if (p["min_count"].get<int64_t>() < 1) return bad(where + ".min_count", "must be at least 1");
  return ok_status();
}

Status check_nvidia_driver(const json& p, const std::string& where) {
  if (p["packages"].empty()) return bad(where + ".packages", "must list at least one package");
  const json& repo = p["repo"];
  std::string rw = where + ".repo";
  std::string kind = repo["kind"].get<std::string>();
  if (kind != "local" && kind != "network")
    return bad(rw + ".kind", "must be local or network, got '" + kind + "'");
  if (auto s = url_param(repo, "url", rw, false); !s) return s;
  // The agent installs the file it downloads with dpkg -i, and names the
  // package after the file ("name_version_arch.deb").
  const std::string& url = repo["url"].get_ref<const std::string&>();
  std::string path = url.substr(0, url.find_first_of("?#"));
  std::string file = path.substr(path.rfind('/') + 1);
  if (file.size() < 5 || file.compare(file.size() - 4, 4, ".deb") != 0)
    return bad(rw + ".url", "must name a .deb package, got '" + url + "'");
  if (repo["cache_dir"].get<std::string>().rfind('/', 0) != 0)
    return bad(rw + ".cache_dir", "must be an absolute path");
  return ok_status();
}

Status check_ollama_install(const json& p, const std::string& where) {
  return url_param(p, "install_url", where, true);
}

// The guest cluster's own ranges: either all three fixed (they must parse,
// not overlap each other, and hold the DNS service's address) or none, and
// then the agent picks them (contract/cluster_ranges.hpp) around `ranges`: what
// the coordinator read of the host, and the pool to pick from.
Status check_rke2(const json& p, const std::string& where) {
  if (auto s = url_param(p, "install_url", where, true); !s) return s;
  const json& c = p["config"];
  std::string cw = where + ".config";
  int fixed = 0;
  for (const char* k : {"cluster-cidr", "service-cidr", "cluster-dns"})
    if (c.contains(k)) {
      if (!c[k].is_string()) return bad(cw + "." + k, "must be a string, got " + type_name(c[k]));
      ++fixed;
    }
  if (fixed != 0 && fixed != 3)
    return bad(cw,
               "set all of cluster-cidr, service-cidr and cluster-dns, or none (they are then "
               "chosen around the host cluster's ranges)");
  if (p.contains("ranges")) {
    const json& r = p["ranges"];
    std::string rw = where + ".ranges";
    if (auto s = validation::only_keys(r, {"avoid", "pool"}, rw); !s) return s;
    if (r.contains("avoid"))
      if (auto f = ranges::facts_from_json(r["avoid"], rw + ".avoid"); !f) return f.error();
    if (r.contains("pool"))
      if (auto pl = ranges::pool_from_json(r["pool"], rw + ".pool"); !pl) return pl.error();
  }
  if (fixed == 0) return ok_status();
  return check_cluster_ranges(c["cluster-cidr"].get<std::string>(),
                              c["service-cidr"].get<std::string>(),
                              c["cluster-dns"].get<std::string>(), cw);
}

// The catalog cannot see the host cluster's ranges, so it refuses the ones
// RKE2 and k3s use by default, which is what the host most likely runs: the
// runbook's guest lost its DNS to exactly that clash. (The agent checks the
// real host's DNS server when the step runs: diagnose_cidr_plan.)
Status catalog_check_rke2(const json& p, const std::string& where) {
  const json& c = p["config"];
  std::string cw = where + ".config";
  const Ipv4Cidr host_pods = *Ipv4Cidr::parse("10.42.0.0/16");
  const Ipv4Cidr host_svcs = *Ipv4Cidr::parse("10.43.0.0/16");
  for (const char* key : {"cluster-cidr", "service-cidr"}) {
    // Ranges that are missing or do not parse are check_rke2's to report.
    if (!c.contains(key) || !c[key].is_string()) continue;
    auto r = Ipv4Cidr::parse(c[key].get<std::string>());
    if (!r) continue;
    for (auto& host : {host_pods, host_svcs})
      if (r->overlaps(host))
        return bad(cw + "." + key,
                   r->str() + " overlaps " + host.str() +
                       ", a range of the host cluster (RKE2/k3s default): the guest's "
                       "DNS would clash with the host's; pick e.g. 10.52.0.0/16 and 10.53.0.0/16");
  }
  return ok_status();
}

// Helm comes from its release tarball at a pinned version, checked against
// the catalog's sha256 for the guest's architecture before it is unpacked.
Status check_helm_release(const json& p, const std::string& where) {
  if (auto s = url_param(p, "repo_url", where, false); !s) return s;
  static const std::regex semver("^v[0-9]+\\.[0-9]+\\.[0-9]+$");
  if (!std::regex_match(p["helm_version"].get<std::string>(), semver))
    return bad(where + ".helm_version", "must be a Helm release like v3.19.0, got '" +
                                            p["helm_version"].get<std::string>() + "'");
  static const std::regex sha256("^[0-9a-f]{64}$");
  const json& sums = p["helm_sha256"];
  if (sums.empty())
    return bad(where + ".helm_sha256", "must give the release tarball's sha256 for amd64");
  for (const auto& [arch, sum] : sums.items()) {
    if (arch != "amd64" && arch != "arm64")
      return bad(where + ".helm_sha256." + arch, "is not an architecture: use amd64 or arm64");
    if (!std::regex_match(sum.get<std::string>(), sha256))
      return bad(where + ".helm_sha256." + arch,
                 "must be 64 lowercase hex digits (the release's .sha256sum)");
  }
  if (auto s = url_param(p, "helm_archive_url", where, true); !s) return s;
  const std::string& url = p["helm_archive_url"].get_ref<const std::string&>();
  if (url.find("{version}") == std::string::npos || url.find("{arch}") == std::string::npos)
    return bad(where + ".helm_archive_url", "must hold {version} and {arch}, got '" + url + "'");
  return duration_param(p, "wait_timeout", where);
}

Status check_node_label(const json& p, const std::string& where) {
  if (p["labels"].empty()) return bad(where + ".labels", "must set at least one label");
  const json& n = p["nodes"];
  bool all = n.is_string() && n.get<std::string>() == "all";
  if (!all && (!check_type(n, T::string_list, where + ".nodes") || n.empty()))
    return bad(where + ".nodes", "must be all or a list of node names");
  return ok_status();
}

Status check_wait_allocatable(const json& p, const std::string& where) {
  if (p["count"].get<int64_t>() < 1) return bad(where + ".count", "must be at least 1");
  return ok_status();
}

Status check_apt_packages(const json& p, const std::string& where) {
  if (p["packages"].empty()) return bad(where + ".packages", "must list at least one package");
  return ok_status();
}

// Every MIG card has at most 7 compute slices (A30: 4), so more than 7 in
// one GPU's plan can never be created; the card's own limits (how many of a
// profile) are the agent's to check against `nvidia-smi mig -lgip`.
Status check_mig(const json& p, const std::string& where) {
  auto gpu = p["gpu"].get<int64_t>();
  if (gpu < 0 || gpu > 63) return bad(where + ".gpu", "must be a GPU index from 0 to 63");
  const json& inst = p["instances"];
  std::string iw = where + ".instances";
  if (p["enabled"].get<bool>() && inst.empty())
    return bad(iw, "must name at least one profile and its count (e.g. \"1g.18gb\": 7)");
  int slices = 0;
  for (auto& [name, n] : inst.items()) {
    if (!valid_mig_profile_name(name))
      return bad(iw + "." + name, "is not a MIG profile name like 1g.18gb or 3g.71gb");
    if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > 7)
      return bad(iw + "." + name, "must be a count from 1 to 7, got " + n.dump());
    slices += static_cast<int>(n.get<int64_t>()) * (name[0] - '0');
  }
  if (slices > 7)
    return bad(iw,
               "asks for " + std::to_string(slices) + " compute slices; a MIG GPU has at most 7");
  return ok_status();
}

Status check_none(const json&, const std::string&) {
  return ok_status();
}

Result<json> normalize(std::string_view kind, const json& params, const std::string& where,
                       bool catalog) {
  const StepKindSchema* k = find_step_kind(kind);
  if (!k)
    return bad(where, "unknown step kind '" + std::string(kind) +
                          "' (known: " + validation::join(step_kinds()) + ")");
  std::string pw = where + ": params";
  if (!params.is_object()) return bad(pw, "must be a map, got " + type_name(params));
  json out = params;
  if (auto s = normalize_map(out, k->params, k->kind, pw); !s) return s.error();
  if (catalog && k->catalog_check)
    if (auto s = k->catalog_check(out, pw); !s) return s.error();
  if (auto s = k->check(out, pw); !s) return s.error();
  return out;
}

}  // namespace

Status check_cluster_ranges(const std::string& cluster_cidr, const std::string& service_cidr,
                            const std::string& cluster_dns, const std::string& where) {
  auto pods = Ipv4Cidr::parse(cluster_cidr);
  if (!pods) return bad(where + ".cluster-cidr", pods.error().message);
  auto svcs = Ipv4Cidr::parse(service_cidr);
  if (!svcs) return bad(where + ".service-cidr", svcs.error().message);
  auto dns = Ipv4Cidr::parse_address(cluster_dns);
  if (!dns) return bad(where + ".cluster-dns", dns.error().message);
  if (pods->overlaps(*svcs))
    return bad(where, "cluster-cidr " + pods->str() + " overlaps service-cidr " + svcs->str());
  if (!svcs->contains(*dns))
    return bad(where + ".cluster-dns",
               Ipv4Cidr::format_address(*dns) + " is outside service-cidr " + svcs->str());
  return ok_status();
}

const std::vector<StepKindSchema>& step_kind_schemas() {
  static const std::vector<StepKindSchema> schemas = {
      {"gpu_present",
       {{"vendor", T::string, false, "10de"}, {"min_count", T::integer, false, 1}},
       check_gpu_present},
      {"apt_packages",
       {{"packages", T::string_list, true}, {"update", T::boolean, false, true}},
       check_apt_packages},
      {"nvidia_driver",
       {{"version", T::string, true},
        {"package_version", T::string, true},
        {"packages", T::string_list, true},
        {"prerequisites", T::string_list, false, json::array({"ca-certificates", "curl"})},
        {"kernel_headers", T::boolean, false, true},
        {"repo",
         T::object,
         true,
         nullptr,
         {{"kind",
           T::string,
           true,
           nullptr,
           {},
           "local (NVIDIA's local repository package) or network (the cuda-keyring package)"},
          {"url", T::string, true, nullptr, {}, "the URL of the repository package (.deb)"},
          // The agent's own folder of the system's cache (FHS: /var/cache/<package>):
          // a 535 MiB download is never left loose among other packages' files.
          {"cache_dir", T::string, false, "/var/cache/factory"}}},
        {"reboot", T::boolean, false, true}},
       check_nvidia_driver},
      {"ollama_install",
       {{"version", T::string, true},
        {"install_url", T::string, false, "https://ollama.com/install.sh"},
        {"service", T::string, false, "ollama"}},
       check_ollama_install},
      {"ollama_model",
       {{"model", T::string, true}, {"require_full_gpu", T::boolean, false, true}},
       check_none},
      {"rke2",
       {{"version", T::string, true},
        {"install_url", T::string, false, "https://get.rke2.io"},
        {"service", T::string, false, "rke2-server"},
        {"kubeconfig", T::string, false, kRke2Kubeconfig},
        {"bin_dir", T::string, false, "/var/lib/rancher/rke2/bin"},
        {"config", T::object, false, json::object()},
        // The coordinator's, never the catalog's: {avoid: [{range, source}], pool}.
        {"ranges", T::object, false}},
       check_rke2,
       catalog_check_rke2},
      {"helm_release",
       {{"release", T::string, true},
        {"chart", T::string, true},
        {"repo_name", T::string, true},
        {"repo_url", T::string, true},
        {"version", T::string, true},
        {"namespace", T::string, true},
        {"create_namespace", T::boolean, false, true},
        {"wait_timeout", T::string, false, "5m"},  // Helm's own default
        {"kubeconfig", T::string, false, kRke2Kubeconfig},
        // Helm v3.19.0's published checksums (get.helm.sh/helm-v3.19.0-linux-*.tar.gz.sha256sum).
        {"helm_version", T::string, false, "v3.19.0"},
        {"helm_sha256", T::string_map, false,
         json{{"amd64", "a7f81ce08007091b86d8bd696eb4d86b8d0f2e1b9f6c714be62f82f96a594496"},
              {"arm64", "440cf7add0aee27ebc93fada965523c1dc2e0ab340d4348da2215737fc0d76ad"}}},
        {"helm_archive_url", T::string, false,
         "https://get.helm.sh/helm-{version}-linux-{arch}.tar.gz"},
        {"values", T::object, false, json::object()},
        // The NVIDIA driver the chart's driver container must run (the GPU
        // Operator's driver.version): verified in its nvidia-smi.
        {"driver_version", T::string, false}},
       check_helm_release},
      {"node_label",
       {{"labels", T::string_map, true},
        {"nodes", T::any, false, "all"},
        {"kubeconfig", T::string, false, kRke2Kubeconfig}},
       check_node_label},
      {"wait_allocatable",
       {{"resource", T::string, true},
        {"count", T::integer, true},
        {"kubeconfig", T::string, false, kRke2Kubeconfig}},
       check_wait_allocatable},
      {"mig",
       {{"gpu", T::integer, false, 0},
        {"instances", T::object, false, json::object()},
        {"enabled", T::boolean, false, true},
        {"reboot", T::boolean, false, true}},
       check_mig},
      {"script",
       {{"check", T::string, false},
        {"run", T::string, true},
        {"verify", T::string, false},
        {"reboot", T::boolean, false, false},
        {"env", T::string_map, false, json::object()}},
       check_none},
  };
  return schemas;
}

const StepKindSchema* find_step_kind(std::string_view kind) {
  const auto& all = step_kind_schemas();
  auto it =
      std::find_if(all.begin(), all.end(), [&](const StepKindSchema& k) { return k.kind == kind; });
  return it == all.end() ? nullptr : &*it;
}

const std::vector<std::string>& step_kinds() {
  static const std::vector<std::string> kinds = [] {
    std::vector<std::string> k;
    for (auto& s : step_kind_schemas()) k.push_back(s.kind);
    return k;
  }();
  return kinds;
}

Result<json> normalize_step_params(std::string_view kind, const json& params,
                                   const std::string& where) {
  return normalize(kind, params, where, false);
}

Result<json> validate_catalog_step_params(std::string_view kind, const json& params,
                                          const std::string& where) {
  return normalize(kind, params, where, true);
}

}  // namespace factory::catalog
