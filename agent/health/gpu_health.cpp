#include "agent/health/gpu_health.hpp"

#include "agent/diagnose/gpu_faults.hpp"
#include "agent/diagnose/known.hpp"
#include "agent/diagnose/rules.hpp"
#include "agent/guest/facts.hpp"
#include "agent/guest/mig.hpp"
#include "agent/guest/nvidia_smi.hpp"
#include "agent/guest/ollama_api.hpp"
#include "agent/health/fault_book.hpp"
#include "agent/health/nvml.hpp"
#include "common/durations.hpp"
#include "common/subprocess.hpp"

namespace factory::agent {

using nlohmann::json;

std::string gpu_operator_driver_root(const GuestEnv& env) {
  return env.path("/run/nvidia/driver").string();
}

proto::DiagnosisSample diagnosis_sample(const Diagnosis& d) {
  proto::DiagnosisSample s;
  s.code = d.code;
  s.summary = d.summary.substr(0, proto::health_limits::kText);
  s.fix = d.fix.substr(0, proto::health_limits::kText);
  // Details the coordinator would drop as too long are left out here.
  if (d.details.dump().size() <= proto::health_limits::kDetails) s.details = d.details;
  return s;
}

Diagnosis collector_hung(const std::string& collector, const std::string& what,
                         std::chrono::milliseconds deadline) {
  std::string fix =
      collector == "gpu"
          ? "a wedged NVIDIA driver blocks every query: look for Xid errors in the guest's kernel "
            "log (`dmesg | grep -i xid`); a GPU that fell off the bus needs the guest restarted, "
            "and the card checked on the host if it happens again"
          : "check that " + what +
                " answers inside the guest; health reports it again once it does";
  return {
      "health_collector_hung",
      what + " did not answer within " +
          format_duration(std::chrono::duration_cast<std::chrono::seconds>(deadline)) +
          ": its figures are unknown until it does",
      fix,
      {{"collector", collector},
       {"deadline_seconds", std::chrono::duration_cast<std::chrono::seconds>(deadline).count()}}};
}

namespace {

// Each GPU's Xids not yet acknowledged (the fault book: its UUID, or its
// index when it was lost before it could be named), and what is wrong with
// the card, as diagnoses.
void add_faults(const GuestEnv& env, proto::GpuSection& s) {
  // A book that cannot be read (the one-shot `health` as another user)
  // leaves the Xids out; the figures still speak.
  auto records = FaultBook(FaultBook::file_in(env.state_dir)).list();
  for (auto& g : s.gpus) {
    if (records)
      for (const auto& r : *records) {
        bool mine = r.uuid.empty() ? r.gpu_index == g.index : r.uuid == g.uuid;
        if (!mine) continue;
        proto::XidSample x;
        x.xid = r.xid;
        x.count = r.count;
        x.first_at = r.first_at;
        x.last_at = r.last_at;
        g.xids.push_back(std::move(x));
      }
    for (const auto& d : diagnose_gpu_faults(g)) s.diagnoses.push_back(diagnosis_sample(d));
  }
  if (s.diagnoses.size() > proto::health_limits::kDiagnoses)
    s.diagnoses.resize(proto::health_limits::kDiagnoses);
}

proto::GpuSection section_of(const GuestEnv& env, const GpuReport& r) {
  proto::GpuSection s = r.section();
  if (s.gpus.size() > proto::health_limits::kGpus) s.gpus.resize(proto::health_limits::kGpus);
  add_faults(env, s);
  return s;
}

// Why nothing answered, from what the guest shows: the card is not on the
// bus (a driver cannot fix that), its driver does not load, or nvidia-smi
// is missing.
std::vector<Diagnosis> nothing_answered(const GuestEnv& env, const NvidiaSmiObservations& smi) {
  GuestObservations o;
  GpuDriverObservations g;
  g.gpus = nvidia_gpus(env);
  g.module_loaded = kernel_module_loaded(env, "nvidia");
  if (!g.gpus.empty() && !g.module_loaded) g.kernel_log = kernel_log(env);
  o.gpu = std::move(g);
  o.nvidia_smi = smi;
  return diagnose(o);
}

}  // namespace

proto::GpuSection read_gpu_section(const GuestEnv& env, std::chrono::milliseconds timeout) {
  std::vector<std::string> errors;

  auto nvml = read_gpus_via_nvml(env);
  if (nvml) {
    // NVML gives the mode; the slices come from nvidia-smi.
    add_mig_instances(nvml->gpus, {}, timeout);
    return section_of(env, *nvml);
  }
  // Not installed: every path the loader tried would crowd out what follows.
  errors.push_back(nvml.error().code == Errc::not_found ? "nvml: NVML is not installed"
                                                        : "nvml: " + nvml.error().message);

  bool hung = false;
  auto on_path = query_nvidia_smi({}, timeout);
  if (on_path) return section_of(env, *on_path);
  hung |= on_path.error().code == Errc::timeout;
  errors.push_back(on_path.error().message);

  // nvidia-smi absent from PATH: a GPU Operator guest keeps it in the
  // driver container's root.
  NvidiaSmiObservations smi;
  smi.on_path = !which("nvidia-smi").empty();
  smi.driver_root = gpu_operator_driver_root(env);
  std::error_code ec;
  smi.in_driver_root =
      std::filesystem::exists(env.path("/run/nvidia/driver/usr/bin/nvidia-smi"), ec);
  proto::GpuSection out;
  if (!smi.on_path && smi.in_driver_root) {
    auto chrooted = query_nvidia_smi({"chroot", smi.driver_root}, timeout);
    if (chrooted) {
      out = section_of(env, *chrooted);
      // Where a GPU Operator guest keeps its nvidia-smi is how it is meant
      // to be, not something wrong: `via` says it, and no diagnosis does
      // (one here was an active diagnosis on every healthy gpu-k8s tenant in
      // `factory status`). The plan's rules still name it when a step needs
      // nvidia-smi on the PATH.
      out.via = "chroot " + smi.driver_root;
      return out;
    }
    hung |= chrooted.error().code == Errc::timeout;
    errors.push_back("chroot " + smi.driver_root + ": " + chrooted.error().message);
  }
  for (const auto& e : errors) out.error += (out.error.empty() ? "" : "; ") + e;
  if (out.error.size() > proto::health_limits::kText) out.error.resize(proto::health_limits::kText);
  if (hung) {
    out.diagnoses.push_back(diagnosis_sample(collector_hung("gpu", "nvidia-smi", timeout)));
    return out;
  }
  for (const auto& d : nothing_answered(env, smi)) out.diagnoses.push_back(diagnosis_sample(d));
  return out;
}

json collect_gpu_health(const GuestEnv& env) {
  return read_gpu_section(env).to_json();
}

proto::OllamaSection read_ollama_section(const GuestEnv& env, std::chrono::milliseconds timeout) {
  proto::OllamaSection out;
  OllamaApi api(env.ollama_url);
  auto version = api.version(timeout);
  if (!version) {
    out.error = version.error().message.substr(0, proto::health_limits::kText);
    out.diagnoses.push_back(
        diagnosis_sample(diagnoses::ollama_not_answering(env.ollama_url, version.error().message)));
    return out;
  }
  out.version = *version;
  auto ps = api.ps(timeout);
  if (!ps) {
    out.error = ps.error().message.substr(0, proto::health_limits::kText);
    return out;
  }
  for (const auto& m : *ps) {
    if (out.models.size() == proto::health_limits::kModels) break;
    proto::OllamaModelSample s;
    s.name = m.name;
    s.size = m.size;
    s.size_vram = m.size_vram;
    s.gpu_percent = m.gpu_percent();
    s.context_length = m.context_length;
    s.expires_at = m.expires_at;
    out.models.push_back(std::move(s));
    if (auto d = diagnose_model_placement(m.name, m.size, m.size_vram))
      out.diagnoses.push_back(diagnosis_sample(*d));
  }
  return out;
}

json collect_ollama_health(const GuestEnv& env) {
  return read_ollama_section(env).to_json();
}

}  // namespace factory::agent
