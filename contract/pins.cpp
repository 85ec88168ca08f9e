#include "contract/pins.hpp"

#include <algorithm>

#include "contract/step_params.hpp"

namespace factory::catalog {

using nlohmann::json;

namespace {

std::string str(const json& p, const char* key) {
  return p.contains(key) && p[key].is_string() ? p[key].get<std::string>() : std::string();
}

std::string at(const StepDef& s, const std::string& key) {
  return "step '" + s.id + "' params." + key;
}

void add(std::vector<Pin>& out, Pin p) {
  for (const auto& q : out)
    if (q.what == p.what && q.version == p.version) return;  // one Helm for two releases
  out.push_back(std::move(p));
}

// Helm itself, for a helm_release step: its release tarball at a version,
// checked against the catalog's sha256.
void helm_pin(std::vector<Pin>& out, const StepDef& s) {
  // With its defaults: a step that leaves the version out gets the built-in pin.
  auto normalized = normalize_step_params(s.kind, s.params, "step '" + s.id + "'");
  const json& p = normalized ? *normalized : s.params;
  add(out, {"Helm", str(p, "helm_version"), at(s, "helm_version"),
            p.contains("helm_sha256") ? "release tarball, sha256 checked" : ""});
}

// The GPU Operator's own driver (its driver DaemonSet): driver.version in the
// chart's values, else the chart's default for its release.
void operator_driver_pin(std::vector<Pin>& out, const StepDef& s) {
  const json& v = s.params.value("values", json::object());
  const json& d = v.value("driver", json::object());
  if (d.is_object() && d.contains("enabled") && d["enabled"] == false) return;
  std::string ver = d.is_object() ? str(d, "version") : "";
  add(out, {"GPU Operator's driver", ver, at(s, "values.driver.version"),
            ver.empty() ? "unset: the chart's default for its release" : ""});
}

void step_pins(std::vector<Pin>& out, const std::vector<StepDef>& steps) {
  for (const auto& s : steps) {
    const json& p = s.params;
    if (s.kind == "nvidia_driver") {
      add(out, {"NVIDIA driver", str(p, "version"), at(s, "version"), ""});
      std::string pkgs;
      for (const auto& n : p.value("packages", json::array()))
        if (n.is_string()) pkgs += (pkgs.empty() ? "" : " ") + n.get<std::string>();
      add(out, {"driver packages (" + pkgs + ")", str(p, "package_version"),
                at(s, "package_version"), "held after install (apt-mark hold)"});
    } else if (s.kind == "ollama_install") {
      add(out, {"Ollama", str(p, "version"), at(s, "version"), ""});
    } else if (s.kind == "ollama_model") {
      std::string m = str(p, "model");
      auto colon = m.find(':');
      add(out,
          {"model " + m.substr(0, colon), colon == std::string::npos ? "" : m.substr(colon + 1),
           at(s, "model"),
           colon == std::string::npos ? "no tag: the registry's latest" : "a tag, not a digest"});
    } else if (s.kind == "rke2") {
      add(out, {"RKE2", str(p, "version"), at(s, "version"), ""});
    } else if (s.kind == "helm_release") {
      helm_pin(out, s);
      add(out, {"chart " + str(p, "chart"), str(p, "version"), at(s, "version"), ""});
      if (str(p, "chart") == "gpu-operator") operator_driver_pin(out, s);
    }
  }
}

}  // namespace

std::vector<Pin> tier_pins(const Tier& t) {
  std::vector<Pin> out;
  // A "current" cloud image is rebuilt under the same URL.
  const std::string& img = t.vm.image;
  bool moving = img.find("/current/") != std::string::npos ||
                img.find("/daily/") != std::string::npos || img.find("latest") != std::string::npos;
  add(out, {"VM image", moving ? "" : img, "vm.image",
            moving ? img + " is rebuilt under the same URL" : ""});
  step_pins(out, t.steps);
  return out;
}

std::vector<Pin> plan_pins(const json& plan) {
  std::vector<StepDef> steps;
  if (plan.is_object() && plan.contains("steps") && plan["steps"].is_array())
    for (const auto& s : plan["steps"]) {
      if (!s.is_object()) continue;
      StepDef d;
      d.id = s.value("id", "");
      d.kind = s.value("kind", "");
      if (s.contains("params") && s["params"].is_object()) d.params = s["params"];
      steps.push_back(std::move(d));
    }
  std::vector<Pin> out;
  step_pins(out, steps);
  return out;
}

json pins_json(const std::vector<Pin>& pins) {
  json a = json::array();
  for (const auto& p : pins) {
    json j = {{"what", p.what},
              {"version", p.pinned() ? json(p.version) : json(nullptr)},
              {"pinned", p.pinned()},
              {"where", p.where}};
    if (!p.note.empty()) j["note"] = p.note;
    a.push_back(j);
  }
  return a;
}

}  // namespace factory::catalog
