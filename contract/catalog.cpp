#include "contract/catalog.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <map>
#include <regex>
#include <set>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/validation.hpp"
#include "common/yaml_json.hpp"
#include "contract/mig_cards.hpp"
#include "contract/pins.hpp"
#include "contract/step_params.hpp"

namespace factory::catalog {

// Defined in the file CMake generates from catalog/catalog.yaml (cmake/embed_text.cmake).
extern const char kBuiltinCatalogYaml[];

using nlohmann::json;
using validation::bad;
using validation::is_http_url;
using validation::join;
using validation::only_keys;
using validation::type_name;

namespace {

constexpr int kCatalogVersion = 1;
constexpr int kMaxRetries = 10;

std::vector<std::string> keys_of(const json& o) {
  std::vector<std::string> k;
  for (auto& [key, _] : o.items()) k.push_back(key);
  return k;
}

// ---------------------------------------------------------------------------
// ${...} references. A tier names its versions and settings once; steps refer
// to them, so the versions `catalog show` prints are the ones the guest
// installs. Only the roots below are references: anything else (a shell's
// ${HOME} in a script step) is left as written, and "$${" is a literal "${".

const std::array<std::string, 4> kRefRoots = {"vm", "versions", "settings", "item"};

bool is_ref_name(const std::string& name) {
  std::string root = name.substr(0, name.find('.'));
  return std::find(kRefRoots.begin(), kRefRoots.end(), root) != kRefRoots.end();
}

Result<json> lookup(const json& scope, const std::string& name, const std::string& where) {
  const json* cur = &scope;
  size_t pos = 0;
  while (true) {
    size_t dot = name.find('.', pos);
    std::string part = name.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (!cur->is_object() || !cur->contains(part)) {
      std::string root = name.substr(0, name.find('.'));
      std::vector<std::string> known;
      if (scope.contains(root) && scope[root].is_object())
        for (auto& k : keys_of(scope[root])) known.push_back(root + "." + k);
      else if (scope.contains(root))
        known.push_back(root);
      return bad(where, "unknown reference ${" + name + "}" +
                            (known.empty() ? std::string(" (this tier has no '" + root + "')")
                                           : " (known: " + join(known) + ")"));
    }
    cur = &(*cur)[part];
    if (dot == std::string::npos) return *cur;
    pos = dot + 1;
  }
}

std::string scalar_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  return v.dump();
}

Result<json> resolve_string(const std::string& s, const json& scope, const std::string& where) {
  // A string that is exactly one reference takes the referenced value's type,
  // so `count: ${settings.split_count}` stays a number and a list stays a list.
  if (s.size() > 3 && s.rfind("${", 0) == 0 && s.back() == '}' &&
      s.find("${", 2) == std::string::npos && s.find('}') == s.size() - 1) {
    std::string name = s.substr(2, s.size() - 3);
    if (is_ref_name(name)) return lookup(scope, name, where);
  }
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 3, "$${") == 0) {
      out += "${";
      i += 3;
      continue;
    }
    if (s.compare(i, 2, "${") == 0) {
      size_t end = s.find('}', i + 2);
      if (end != std::string::npos) {
        std::string name = s.substr(i + 2, end - i - 2);
        if (is_ref_name(name)) {
          auto v = lookup(scope, name, where);
          if (!v) return v.error();
          if (v->is_object() || v->is_array() || v->is_null())
            return bad(where, "${" + name + "} is " + type_name(*v) +
                                  ": it can only be used as the whole value, not inside text");
          out += scalar_text(*v);
          i = end + 1;
          continue;
        }
      }
    }
    out += s[i++];
  }
  return json(out);
}

Result<json> resolve(const json& v, const json& scope, const std::string& where) {
  if (v.is_string()) return resolve_string(v.get<std::string>(), scope, where);
  if (v.is_object()) {
    json out = json::object();
    for (auto& [k, child] : v.items()) {
      auto r = resolve(child, scope, where + "." + k);
      if (!r) return r.error();
      out[k] = std::move(*r);
    }
    return out;
  }
  if (v.is_array()) {
    json out = json::array();
    for (size_t i = 0; i < v.size(); ++i) {
      auto r = resolve(v[i], scope, where + "[" + std::to_string(i) + "]");
      if (!r) return r.error();
      out.push_back(std::move(*r));
    }
    return out;
  }
  return v;
}

// ---------------------------------------------------------------------------
// Tier parsing.

const std::regex kTierName("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$");
const std::regex kStepId("^[A-Za-z0-9][A-Za-z0-9._:-]{0,62}$");
const std::regex kQuantity("^[0-9]+(\\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$");
const std::regex kResourceName("^[A-Za-z0-9.-]+/[A-Za-z0-9_.-]+$");

// `prefix` ends with its separator: "tier 'x': " for a tier's keys, "tier 'x': vm." inside vm.
Result<std::string> get_string(const json& obj, const std::string& key, const std::string& prefix,
                               bool required) {
  if (!obj.contains(key) || obj[key].is_null()) {
    if (required) return bad(prefix + key, "required");
    return std::string();
  }
  if (!obj[key].is_string())
    return bad(prefix + key, "must be a string, got " + type_name(obj[key]));
  return obj[key].get<std::string>();
}

Result<VmShape> parse_vm(const json& v, const std::string& where) {
  if (!v.is_object())
    return bad(where, "required: a map with cpu, memory, disk, image, gpus, gpu_resource");
  if (auto s = only_keys(v, {"cpu", "memory", "disk", "image", "gpus", "gpu_resource"}, where); !s)
    return s.error();
  VmShape vm;
  // `cpu: 8` and `cpu: "8"` mean the same: the VM spec wants a quantity string.
  if (v.contains("cpu") && v["cpu"].is_number_integer())
    vm.cpu = std::to_string(v["cpu"].get<int64_t>());
  else if (auto c = get_string(v, "cpu", where + ".", true); c)
    vm.cpu = *c;
  else
    return c.error();
  for (auto [key, field] : {std::pair{"memory", &vm.memory}, std::pair{"disk", &vm.disk}}) {
    auto s = get_string(v, key, where + ".", true);
    if (!s) return s.error();
    *field = *s;
  }
  for (auto [key, val] :
       {std::pair{"cpu", vm.cpu}, std::pair{"memory", vm.memory}, std::pair{"disk", vm.disk}})
    if (!std::regex_match(val, kQuantity))
      return bad(where + "." + key,
                 "'" + val + "' is not a Kubernetes quantity (e.g. 8, 500m, 16Gi)");
  auto image = get_string(v, "image", where + ".", true);
  if (!image) return image.error();
  if (!is_http_url(*image))
    return bad(where + ".image", "must be an http(s):// URL of a cloud image");
  vm.image = *image;
  if (!v.contains("gpus")) return bad(where + ".gpus", "required");
  if (!v["gpus"].is_number_integer() || v["gpus"].get<int64_t>() < 1 ||
      v["gpus"].get<int64_t>() > 16)
    return bad(where + ".gpus", "must be a whole number from 1 to 16");
  vm.gpus = v["gpus"].get<int>();
  auto res = get_string(v, "gpu_resource", where + ".", false);
  if (!res) return res.error();
  if (!res->empty() && !std::regex_match(*res, kResourceName))
    return bad(where + ".gpu_resource",
               "'" + *res +
                   "' is not a resource name like nvidia.com/AD104GL_L4 (empty: any allowlisted)");
  vm.gpu_resource = *res;
  return vm;
}

Status check_versions(const json& v, const std::string& where) {
  if (!v.is_object()) return bad(where, "must be a map of name: version");
  for (auto& [k, x] : v.items()) {
    auto scalar_ok = [](const json& e) { return e.is_string() && !e.get<std::string>().empty(); };
    bool ok = scalar_ok(x);
    if (x.is_array()) {
      ok = !x.empty();
      for (auto& e : x) ok = ok && scalar_ok(e);
    }
    if (!ok) {
      if (x.is_number())
        return bad(where + "." + k, "YAML reads " + x.dump() +
                                        " as a number: quote the version (\"" + x.dump() +
                                        "\") so it is kept exactly as written");
      return bad(where + "." + k, "must be a version string or a list of strings");
    }
  }
  return ok_status();
}

Result<std::vector<StepDef>> parse_steps(const json& steps, const json& scope,
                                         const std::string& where) {
  if (!steps.is_array() || steps.empty())
    return bad(where, "required: a list of at least one step");
  std::vector<StepDef> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = steps[i];
    std::string sw = where + "[" + std::to_string(i) + "]";
    if (!s.is_object()) return bad(sw, "must be a map with id, kind, params");
    if (s.contains("id") && s["id"].is_string()) sw = "step '" + s["id"].get<std::string>() + "'";
    if (auto st = only_keys(s, {"id", "kind", "params", "timeout", "retries", "for_each"}, sw); !st)
      return st.error();
    auto id = get_string(s, "id", sw + ": ", true);
    if (!id) return id.error();
    auto kind = get_string(s, "kind", sw + ": ", true);
    if (!kind) return kind.error();
    std::chrono::seconds timeout{std::chrono::minutes(30)};
    if (s.contains("timeout")) {
      if (!s["timeout"].is_string() && !s["timeout"].is_number_integer())
        return bad(sw + ": timeout", "must be a duration like 90s, 30m or 1h");
      auto d =
          parse_duration(s["timeout"].is_string() ? s["timeout"].get<std::string>()
                                                  : std::to_string(s["timeout"].get<int64_t>()));
      if (!d) return bad(sw + ": timeout", d.error().message);
      if (d->count() <= 0) return bad(sw + ": timeout", "must be longer than 0s");
      timeout = *d;
    }
    int retries = 0;
    if (s.contains("retries")) {
      if (!s["retries"].is_number_integer() || s["retries"].get<int64_t>() < 0 ||
          s["retries"].get<int64_t>() > kMaxRetries)
        return bad(sw + ": retries",
                   "must be a whole number from 0 to " + std::to_string(kMaxRetries));
      retries = s["retries"].get<int>();
    }
    json params = s.contains("params") && !s["params"].is_null() ? s["params"] : json::object();

    // for_each: one step per element, ${item} standing for the element (one
    // ollama_model step per model the tier lists).
    std::vector<json> items = {json()};
    bool expand = s.contains("for_each");
    if (expand) {
      auto list = resolve(s["for_each"], scope, sw + ": for_each");
      if (!list) return list.error();
      if (!list->is_array() || list->empty())
        return bad(sw + ": for_each",
                   "must be a non-empty list (or a reference to one), got " + type_name(*list));
      items.assign(list->begin(), list->end());
    }
    for (const json& item : items) {
      json sc = scope;
      if (expand)
        sc["item"] = item;
      else
        sc.erase("item");
      auto rid = resolve(*id, sc, sw + ": id");
      if (!rid) return rid.error();
      if (!rid->is_string() || !std::regex_match(rid->get<std::string>(), kStepId))
        return bad(sw + ": id",
                   "'" + scalar_text(*rid) +
                       "' must be 1-63 letters, digits or . _ : - (it names the step in "
                       "`factory tenant retry --step`)");
      StepDef def;
      def.id = rid->get<std::string>();
      std::string dw = expand ? "step '" + def.id + "'" : sw;
      if (!seen.insert(def.id).second)
        return bad(dw, "duplicate step id (ids must be unique in a tier)");
      def.kind = *kind;
      auto rp = resolve(params, sc, dw + ": params");
      if (!rp) return rp.error();
      def.params = std::move(*rp);
      def.timeout = timeout;
      def.retries = retries;
      // Checked, not normalized: the plan keeps the params as written, so its
      // hash does not change when a default does.
      if (auto st = validate_catalog_step_params(def.kind, def.params, dw); !st) return st.error();
      out.push_back(std::move(def));
    }
  }
  return out;
}

Result<HealthSpec> parse_health(const json& h, const json& scope, const std::string& where) {
  if (!h.is_object()) return bad(where, "must be a map with ollama, k8s and/or probe");
  if (auto s = only_keys(h, {"ollama", "k8s", "probe"}, where); !s) return s.error();
  auto r = resolve(h, scope, where);
  if (!r) return r.error();
  const json& v = *r;
  HealthSpec spec;
  if (v.contains("ollama") && !v["ollama"].is_null()) {
    if (!v["ollama"].is_boolean()) return bad(where + ".ollama", "must be true or false");
    spec.ollama = v["ollama"].get<bool>();
  }
  if (v.contains("k8s") && !v["k8s"].is_null()) {
    const json& k = v["k8s"];
    std::string kw = where + ".k8s";
    if (k.is_boolean()) {
      spec.k8s = k.get<bool>();
    } else if (k.is_object()) {
      if (auto s = only_keys(k, {"resource", "kubeconfig"}, kw); !s) return s.error();
      spec.k8s = true;
      auto res = get_string(k, "resource", kw + ".", false);
      if (!res) return res.error();
      if (!res->empty()) {
        if (!std::regex_match(*res, kResourceName))
          return bad(kw + ".resource", "'" + *res + "' is not a resource name like nvidia.com/gpu");
        spec.k8s_resource = *res;
      }
      auto kc = get_string(k, "kubeconfig", kw + ".", false);
      if (!kc) return kc.error();
      if (!kc->empty()) {
        if (kc->front() != '/')
          return bad(kw + ".kubeconfig", "must be an absolute path in the guest");
        spec.k8s_kubeconfig = *kc;
      }
    } else {
      return bad(kw, "must be true, false or a map with resource and kubeconfig");
    }
  }
  if (v.contains("probe") && !v["probe"].is_null()) {
    const json& p = v["probe"];
    std::string pw = where + ".probe";
    if (!p.is_object()) return bad(pw, "must be a map with every, model and prompt");
    if (auto s = only_keys(p, {"every", "model", "prompt"}, pw); !s) return s.error();
    auto every = get_string(p, "every", pw + ".", true);
    if (!every) return every.error();
    auto d = parse_duration(*every);
    if (!d) return bad(pw + ".every", d.error().message);
    if (*d < std::chrono::seconds(30) && d->count() != 0)
      return bad(pw + ".every", "must be 0s (off) or at least 30s: each probe runs the model");
    spec.probe_every = *d;
    auto model = get_string(p, "model", pw + ".", true);
    if (!model) return model.error();
    if (model->empty() || model->size() > 128) return bad(pw + ".model", "must name a model");
    spec.probe_model = *model;
    auto prompt = get_string(p, "prompt", pw + ".", false);
    if (!prompt) return prompt.error();
    if (prompt->size() > 512) return bad(pw + ".prompt", "must be at most 512 bytes");
    if (!prompt->empty()) spec.probe_prompt = *prompt;
  }
  return spec;
}

Result<AccessSpec> parse_access(const json& a, const std::string& where) {
  if (!a.is_object()) return bad(where, "must be a map with login");
  if (auto s = only_keys(a, {"login"}, where); !s) return s.error();
  AccessSpec spec;
  if (a.contains("login") && !a["login"].is_null()) {
    if (!a["login"].is_boolean()) return bad(where + ".login", "must be true or false");
    spec.login = a["login"].get<bool>();
  }
  return spec;
}

Result<EndpointSpec> parse_endpoint(const json& e, const std::string& where) {
  if (!e.is_object()) return bad(where, "must be a map with port");
  if (auto s = only_keys(e, {"port"}, where); !s) return s.error();
  EndpointSpec spec;
  if (e.contains("port") && !e["port"].is_null()) {
    if (!e["port"].is_number_integer() || e["port"].get<int64_t>() < 1024 ||
        e["port"].get<int64_t>() > 65535)
      return bad(where + ".port", "must be a port from 1024 to 65535");
    spec.port = e["port"].get<int>();
  }
  return spec;
}

// A MIG tier's pieces must agree, or its guest waits forever for a count the
// config never makes: the GPU Operator release's MIG config (mig.strategy
// mixed, migManager.config.data's config.yaml, mig-parted's format), the node
// label that picks one of its configs, and the allocatable counts the tier
// waits for. The config must say what happens to every GPU of the VM: one
// left out is given `mig-enabled: false`, not left to the card's current state.
Status check_mig_tier(const Tier& tier, const std::string& where) {
  const StepDef* release = nullptr;
  const json* data = nullptr;
  std::string label;
  std::map<std::string, int64_t> waits;  // resource -> count
  for (const auto& st : tier.steps) {
    if (st.kind == "helm_release") {
      // A reference into the step itself: `data` outlives this iteration.
      static const json kNone = json::object();
      const json& v = st.params.contains("values") ? st.params["values"] : kNone;
      const json* d = nullptr;
      if (v.contains("migManager") && v["migManager"].is_object() &&
          v["migManager"].contains("config") && v["migManager"]["config"].is_object() &&
          v["migManager"]["config"].contains("data"))
        d = &v["migManager"]["config"]["data"];
      if (!d) continue;
      if (release)
        return bad(where, "steps '" + release->id + "' and '" + st.id +
                              "' both carry a MIG config (migManager.config.data): keep one");
      release = &st;
      data = d;
      std::string sw = "step '" + st.id + "': params.values";
      if (!v.contains("mig") || !v["mig"].is_object() || v["mig"].value("strategy", "") != "mixed")
        return bad(sw + ".mig.strategy",
                   "must be mixed: the GPUs of a partial MIG config are not all cut alike");
      const json& cfg = v["migManager"]["config"];
      if (!cfg.value("create", false) || !cfg.value("name", std::string()).size())
        return bad(sw + ".migManager.config",
                   "set create: true and a name: the chart then makes the ConfigMap the node "
                   "label's config is read from");
    } else if (st.kind == "node_label") {
      const json& l = st.params.value("labels", json::object());
      if (l.contains("nvidia.com/mig.config") && l["nvidia.com/mig.config"].is_string())
        label = l["nvidia.com/mig.config"].get<std::string>();
    } else if (st.kind == "wait_allocatable") {
      std::string r = st.params.value("resource", "");
      if (r.rfind("nvidia.com/mig-", 0) == 0 && st.params.contains("count") &&
          st.params["count"].is_number_integer())
        waits[r] = st.params["count"].get<int64_t>();
    }
  }
  // A tier of `mig` steps: each step's params are checked on their own.
  if (!release) return ok_status();
  std::string dw = "step '" + release->id + "': params.values.migManager.config.data";
  if (!data->is_object() || !data->contains("config.yaml") || !(*data)["config.yaml"].is_string())
    return bad(dw, "must hold config.yaml, mig-parted's config as a string");
  auto doc = parse_yaml((*data)["config.yaml"].get<std::string>(), dw + ".config.yaml");
  if (!doc) return doc.error();
  dw += ".config.yaml";
  if (!doc->is_object() || !doc->contains("mig-configs") || !(*doc)["mig-configs"].is_object())
    return bad(dw, "must be mig-parted's config: version: v1 and a mig-configs map");
  if (label.empty())
    return bad(where,
               "no node_label step sets nvidia.com/mig.config: mig-manager would apply "
               "nothing");
  const json& configs = (*doc)["mig-configs"];
  if (!configs.contains(label) || !configs[label].is_array())
    return bad(dw, "has no config '" + label +
                       "', which the node label nvidia.com/mig.config "
                       "names");
  std::string cw = dw + ".mig-configs." + label;
  std::vector<int> covered(static_cast<size_t>(tier.vm.gpus), 0);
  std::map<std::string, int64_t> made;
  for (size_t i = 0; i < configs[label].size(); ++i) {
    const json& e = configs[label][i];
    std::string ew = cw + "[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("devices") || !e.contains("mig-enabled") ||
        !e["mig-enabled"].is_boolean())
      return bad(ew, "must be a map with devices and mig-enabled");
    std::vector<int64_t> devices;
    if (e["devices"].is_string() && e["devices"].get<std::string>() == "all") {
      for (int g = 0; g < tier.vm.gpus; ++g) devices.push_back(g);
    } else if (e["devices"].is_array()) {
      for (const auto& d : e["devices"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() >= tier.vm.gpus)
          return bad(ew + ".devices", "must be all or GPU indexes from 0 to " +
                                          std::to_string(tier.vm.gpus - 1) + " (vm.gpus is " +
                                          std::to_string(tier.vm.gpus) + ")");
        devices.push_back(d.get<int64_t>());
      }
    } else {
      return bad(ew + ".devices", "must be all or a list of GPU indexes");
    }
    for (auto d : devices)
      if (++covered[static_cast<size_t>(d)] > 1)
        return bad(ew + ".devices", "GPU " + std::to_string(d) + " is in two entries");
    const bool on = e["mig-enabled"].get<bool>();
    const json md = e.value("mig-devices", json::object());
    if (!on) {
      if (!md.empty()) return bad(ew, "mig-enabled: false with mig-devices");
      continue;
    }
    if (!md.is_object() || md.empty())
      return bad(ew + ".mig-devices", "must map profiles to counts (e.g. \"1g.18gb\": 7)");
    int slices = 0;
    for (auto& [name, n] : md.items()) {
      if (!valid_mig_profile_name(name))
        return bad(ew + ".mig-devices." + name, "is not a MIG profile name like 1g.18gb");
      if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > 7)
        return bad(ew + ".mig-devices." + name, "must be a count from 1 to 7");
      slices += static_cast<int>(n.get<int64_t>()) * (name[0] - '0');
      made["nvidia.com/mig-" + name] += n.get<int64_t>() * static_cast<int64_t>(devices.size());
    }
    if (slices > 7)
      return bad(ew + ".mig-devices",
                 "asks for " + std::to_string(slices) + " compute slices; a MIG GPU has at most 7");
  }
  for (int g = 0; g < tier.vm.gpus; ++g)
    if (covered[static_cast<size_t>(g)] == 0)
      return bad(cw, "says nothing about GPU " + std::to_string(g) +
                         ": give every GPU left out an entry with mig-enabled: false");
  if (waits.empty())
    return bad(where, "no wait_allocatable step waits for a nvidia.com/mig-<profile> resource");
  for (const auto& [r, n] : waits) {
    auto it = made.find(r);
    int64_t want = it == made.end() ? 0 : it->second;
    if (n != want)
      return bad(where, "waits for " + std::to_string(n) + " " + r + " but config '" + label +
                            "' makes " + std::to_string(want));
  }
  return ok_status();
}

Result<Tier> parse_tier(const json& t, const std::string& where_in) {
  std::string where = where_in;
  if (!t.is_object()) return bad(where, "must be a map with name, description, vm, steps");
  if (t.contains("name") && t["name"].is_string())
    where = "tier '" + t["name"].get<std::string>() + "'";
  if (auto s = only_keys(t,
                         {"name", "description", "cost", "vm", "versions", "settings", "steps",
                          "health", "access", "endpoint"},
                         where);
      !s)
    return s.error();
  Tier tier;
  auto name = get_string(t, "name", where + ": ", true);
  if (!name) return name.error();
  if (!std::regex_match(*name, kTierName))
    return bad(where + ": name",
               "must be a DNS-1123 label (lower-case letters, digits and '-', at most 63)");
  tier.name = *name;
  auto desc = get_string(t, "description", where + ": ", true);
  if (!desc) return desc.error();
  tier.description = *desc;
  auto cost = get_string(t, "cost", where + ": ", false);
  if (!cost) return cost.error();
  tier.cost = *cost;
  auto vm = parse_vm(t.contains("vm") ? t["vm"] : json(), where + ": vm");
  if (!vm) return vm.error();
  tier.vm = *vm;
  if (t.contains("versions") && !t["versions"].is_null()) {
    if (auto s = check_versions(t["versions"], where + ": versions"); !s) return s.error();
    tier.versions = t["versions"];
  }
  if (t.contains("settings") && !t["settings"].is_null()) {
    if (!t["settings"].is_object()) return bad(where + ": settings", "must be a map");
    tier.settings = t["settings"];
  }
  json scope = {
      {"vm", tier.vm.to_json()}, {"versions", tier.versions}, {"settings", tier.settings}};
  auto steps = parse_steps(t.contains("steps") ? t["steps"] : json(), scope, "steps");
  if (!steps) return steps.error().context(where);
  tier.steps = std::move(*steps);
  if (t.contains("health") && !t["health"].is_null()) {
    auto h = parse_health(t["health"], scope, "health");
    if (!h) return h.error().context(where);
    tier.health = std::move(*h);
  }
  if (t.contains("access") && !t["access"].is_null()) {
    auto a = parse_access(t["access"], "access");
    if (!a) return a.error().context(where);
    tier.access = *a;
  }
  if (t.contains("endpoint") && !t["endpoint"].is_null()) {
    auto e = parse_endpoint(t["endpoint"], "endpoint");
    if (!e) return e.error().context(where);
    tier.endpoint = *e;
    // The endpoint is Ollama behind a key: without Ollama there is nothing to serve.
    if (!tier.health || !tier.health->ollama)
      return bad(where + ": endpoint", "needs health.ollama: true (the endpoint serves Ollama)");
  }
  if (tier_needs_mig(tier))
    if (auto st = check_mig_tier(tier, where); !st) return st.error();
  return tier;
}

}  // namespace

// ---------------------------------------------------------------------------

json VmShape::to_json() const {
  return {{"cpu", cpu},     {"memory", memory}, {"disk", disk},
          {"image", image}, {"gpus", gpus},     {"gpu_resource", gpu_resource}};
}

json StepDef::to_plan_json() const {
  return {{"id", id},
          {"kind", kind},
          {"params", params},
          {"timeout_seconds", timeout.count()},
          {"retries", retries}};
}

json HealthSpec::to_plan_json() const {
  json j = {{"ollama", ollama}, {"k8s", nullptr}};
  if (k8s) j["k8s"] = {{"resource", k8s_resource}, {"kubeconfig", k8s_kubeconfig}};
  // Only when on, so the plans (and hashes) of tiers without a probe stay as they were.
  if (probe_every.count() > 0)
    j["probe"] = {
        {"every_seconds", probe_every.count()}, {"model", probe_model}, {"prompt", probe_prompt}};
  return j;
}

json Tier::plan() const {
  json steps_json = json::array();
  for (auto& s : steps) steps_json.push_back(s.to_plan_json());
  json p = {{"tier", name}, {"steps", steps_json}};
  if (health) p["health"] = health->to_plan_json();
  if (endpoint) p["endpoint"] = {{"port", endpoint->port}};
  return p;
}

json Tier::to_json() const {
  json steps_json = json::array();
  for (auto& s : steps)
    steps_json.push_back({{"id", s.id},
                          {"kind", s.kind},
                          {"timeout", format_duration(s.timeout)},
                          {"retries", s.retries},
                          {"params", s.params}});
  return {{"name", name},
          {"description", description},
          {"cost", cost},
          {"vm", vm.to_json()},
          {"versions", versions},
          {"settings", settings},
          {"plan_hash", plan_hash(plan())},
          // Every version the steps depend on, and those left unpinned (pins.hpp).
          {"pins", pins_json(tier_pins(*this))},
          {"health", health ? health->to_plan_json() : json(nullptr)},
          {"access", {{"login", access.login}}},
          {"endpoint", endpoint ? json{{"port", endpoint->port}} : json(nullptr)},
          {"steps", steps_json}};
}

const Tier* Catalog::find(std::string_view name) const {
  for (auto& t : tiers)
    if (t.name == name) return &t;
  return nullptr;
}

Result<const Tier*> Catalog::tier(std::string_view name) const {
  if (const Tier* t = find(name)) return t;
  return Error(Errc::not_found,
               "unknown tier '" + std::string(name) + "' (known: " + join(names()) + ")");
}

std::vector<std::string> Catalog::names() const {
  std::vector<std::string> n;
  for (auto& t : tiers) n.push_back(t.name);
  return n;
}

Result<Catalog> from_json(const json& doc, const std::string& source) {
  const std::string where = "catalog " + source;
  if (!doc.is_object()) return bad(where, "must be a YAML map with 'version: 1' and 'tiers'");
  if (auto s = only_keys(doc, {"version", "tiers"}, where); !s) return s.error();
  if (!doc.contains("version") || !doc["version"].is_number_integer())
    return bad(where, "'version: " + std::to_string(kCatalogVersion) + "' is required");
  if (doc["version"].get<int64_t>() != kCatalogVersion)
    return bad(where, "unsupported catalog version " + doc["version"].dump() +
                          " (this factory reads version " + std::to_string(kCatalogVersion) + ")");
  if (!doc.contains("tiers") || !doc["tiers"].is_array() || doc["tiers"].empty())
    return bad(where, "'tiers' must be a list of at least one tier");
  Catalog cat;
  cat.source = source;
  for (size_t i = 0; i < doc["tiers"].size(); ++i) {
    auto t = parse_tier(doc["tiers"][i], "tiers[" + std::to_string(i) + "]");
    if (!t) return t.error().context(where);
    if (cat.find(t->name)) return bad(where, "tier '" + t->name + "' is defined twice");
    cat.tiers.push_back(std::move(*t));
  }
  return cat;
}

Result<Catalog> parse(const std::string& yaml_text, const std::string& source) {
  auto doc = parse_yaml(yaml_text, "catalog " + source);
  if (!doc) return doc.error();
  return from_json(*doc, source);
}

std::string_view builtin_yaml() {
  return kBuiltinCatalogYaml;
}

Result<Catalog> builtin() {
  return parse(std::string(builtin_yaml()), "built-in");
}

Result<Catalog> load_file(const std::string& path) {
  auto text = read_file(path);
  if (!text) return text.error().with_context("catalog");
  return parse(*text, path);
}

Result<Catalog> load(const std::string& path) {
  return path.empty() ? builtin() : load_file(path);
}

Result<json> plan_for(const Catalog& catalog, std::string_view tier) {
  auto t = catalog.tier(tier);
  if (!t) return t.error();
  return (*t)->plan();
}

std::string canonical_json(const json& j) {
  // nlohmann's objects keep keys sorted; ASCII escapes make the bytes
  // independent of how a peer's library chose to encode non-ASCII text.
  return j.dump(-1, ' ', true, json::error_handler_t::replace);
}

std::string plan_hash(const json& plan) {
  return sha256_hex(canonical_json(plan));
}

std::string sha256_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("EVP_Digest(sha256) failed");  // only on OpenSSL misconfiguration
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 0xf];
  }
  return out;
}

}  // namespace factory::catalog
