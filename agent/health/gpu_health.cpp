#include "agent/health/gpu_health.hpp"

#include "agent/diagnose/known.hpp"
#include "agent/diagnose/rules.hpp"
#include "agent/guest/ollama_api.hpp"
#include "agent/health/nvml.hpp"
#include "common/subprocess.hpp"

namespace factory::agent {

using nlohmann::json;

std::string gpu_operator_driver_root(const GuestEnv& env) {
  return env.path("/run/nvidia/driver").string();
}

json collect_gpu_health(const GuestEnv& env) {
  std::vector<std::string> errors;

  auto nvml = read_gpus_via_nvml(env);
  if (nvml) return nvml->to_json();
  errors.push_back("nvml: " + nvml.error().message);

  auto on_path = query_nvidia_smi();
  if (on_path) return on_path->to_json();
  errors.push_back(on_path.error().message);

  // nvidia-smi absent from PATH: a GPU Operator guest keeps it in the
  // driver container's root.
  NvidiaSmiObservations smi;
  smi.on_path = !which("nvidia-smi").empty();
  smi.driver_root = gpu_operator_driver_root(env);
  std::error_code ec;
  smi.in_driver_root =
      std::filesystem::exists(env.path("/run/nvidia/driver/usr/bin/nvidia-smi"), ec);
  json diags = json::array();
  if (!smi.on_path && smi.in_driver_root) {
    auto chrooted = query_nvidia_smi({"chroot", smi.driver_root});
    if (chrooted) {
      json out = chrooted->to_json();
      out["via"] = "chroot " + smi.driver_root;
      out["diagnoses"] =
          json::array({diagnoses::gpu_operator_nvidia_smi_chroot(smi.driver_root).to_json()});
      return out;
    }
    errors.push_back("chroot " + smi.driver_root + ": " + chrooted.error().message);
  }
  if (auto d = diagnose_nvidia_smi(smi)) diags.push_back(d->to_json());

  std::string error;
  for (const auto& e : errors) error += (error.empty() ? "" : "; ") + e;
  return {{"source", "none"},
          {"driver_version", nullptr},
          {"gpus", json::array()},
          {"error", error},
          {"diagnoses", diags}};
}

json collect_ollama_health(const GuestEnv& env) {
  OllamaApi api(env.ollama_url);
  auto version = api.version(std::chrono::seconds(5));
  if (!version) {
    return {{"version", nullptr},
            {"models", json::array()},
            {"error", version.error().message},
            {"diagnoses",
             json::array({diagnoses::ollama_not_answering(env.ollama_url, version.error().message)
                              .to_json()})}};
  }
  json out = {{"version", *version}, {"models", json::array()}};
  auto ps = api.ps(std::chrono::seconds(5));
  if (!ps) {
    out["error"] = ps.error().message;
    return out;
  }
  json diags = json::array();
  for (const auto& m : *ps) {
    out["models"].push_back({{"name", m.name},
                             {"size", m.size},
                             {"size_vram", m.size_vram},
                             {"gpu_percent", m.gpu_percent()}});
    if (auto d = diagnose_model_placement(m.name, m.size, m.size_vram))
      diags.push_back(d->to_json());
  }
  if (!diags.empty()) out["diagnoses"] = diags;
  return out;
}

}  // namespace factory::agent
