#include "agent/diagnose/rules.hpp"

#include <algorithm>
#include <cctype>

#include "agent/diagnose/known.hpp"

namespace factory::agent {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// "NVRM: BAR0 is 0M @ 0x0 (PCI:0000:08:00.0)" -> "0000:08:00.0"
std::string pci_address_in(const std::string& line) {
  auto at = line.find("(PCI:");
  if (at == std::string::npos) return "";
  auto end = line.find(')', at);
  return line.substr(at + 5, end == std::string::npos ? std::string::npos : end - at - 5);
}

// Kernel log lines carry a "[   72.161022] " timestamp or a syslog prefix;
// the diagnosis quotes the message from "NVRM:" on.
std::string from_nvrm(const std::string& line) {
  auto at = line.find("NVRM:");
  return at == std::string::npos ? line : line.substr(at);
}

}  // namespace

std::optional<Diagnosis> diagnose_gpu_driver(const GpuDriverObservations& o) {
  if (o.gpus.empty()) return diagnoses::gpu_not_on_pci_bus();

  bool all_bound = std::all_of(o.gpus.begin(), o.gpus.end(),
                               [](const PciFunction& f) { return f.driver == "nvidia"; });
  bool working = o.module_loaded && all_bound;

  if (!working) {
    std::string bar0 = find_line(o.kernel_log, "BAR0 is 0M");
    if (!bar0.empty()) {
      std::string addr = pci_address_in(bar0);
      if (addr.empty()) addr = o.gpus.front().address;
      return diagnoses::gpu_bar0_unmapped(from_nvrm(bar0), addr);
    }
  }
  if (!o.module_loaded && o.package.installed) {
    if (o.rebooted_since_install.value_or(false))
      return diagnoses::driver_not_loading(last_lines(o.kernel_log, 15));
    return diagnoses::driver_reboot_pending(o.driver_package, o.package.version);
  }
  if (o.module_loaded && !all_bound) {
    for (const auto& f : o.gpus)
      if (f.driver != "nvidia") return diagnoses::gpu_not_bound_to_nvidia(f.address, f.driver);
  }
  if (working && !o.smi_version.empty() && !o.expected_version.empty() &&
      o.smi_version != o.expected_version)
    return diagnoses::driver_version_mismatch(o.expected_version, o.smi_version);
  return std::nullopt;
}

Diagnosis diagnose_package_failure(const std::string& command, const std::string& output,
                                   const std::string& kernel_release) {
  // DKMS runs inside the driver package's postinst, so its failure surfaces as
  // an apt/dpkg failure; these are the lines dkms itself prints.
  static const char* const dkms_markers[] = {"Bad return status for module build",
                                             "Error! Build of", "make.log",
                                             "Error! Your kernel headers"};
  for (const char* m : dkms_markers) {
    if (output.find(m) != std::string::npos)
      return diagnoses::dkms_build_failed(kernel_release, last_lines(output, 15));
  }
  return diagnoses::apt_failed(command, last_lines(output, 15));
}

std::optional<Diagnosis> diagnose_nvidia_smi(const NvidiaSmiObservations& o) {
  if (o.on_path) return std::nullopt;
  if (o.in_driver_root) return diagnoses::gpu_operator_nvidia_smi_chroot(o.driver_root);
  return diagnoses::nvidia_smi_not_on_path();
}

std::optional<Diagnosis> diagnose_model_placement(const std::string& model, std::uint64_t size,
                                                  std::uint64_t size_vram) {
  if (size > 0 && size_vram >= size) return std::nullopt;
  return diagnoses::model_partly_on_cpu(model, size, size_vram);
}

bool is_unknown_model_error(int http_status, const std::string& server_error) {
  if (http_status == 404) return true;
  std::string e = lower(server_error);
  // Ollama relays the registry's answer: "pull model manifest: file does not
  // exist" for an unknown name or tag; a local lookup says "not found".
  return e.find("file does not exist") != std::string::npos ||
         e.find("manifest unknown") != std::string::npos ||
         e.find("not found") != std::string::npos;
}

Diagnosis diagnose_pull_failure(const std::string& model, int http_status,
                                const std::string& server_error, int percent) {
  if (is_unknown_model_error(http_status, server_error))
    return diagnoses::model_not_found(model, server_error);
  return diagnoses::model_download_interrupted(model, percent, server_error);
}

std::vector<Diagnosis> diagnose(const GuestObservations& o) {
  std::vector<Diagnosis> out;
  if (o.gpu) {
    if (auto d = diagnose_gpu_driver(*o.gpu)) out.push_back(std::move(*d));
  }
  // nvidia-smi's whereabouts only matter when a GPU is there to ask about.
  bool gpu_absent = o.gpu && o.gpu->gpus.empty();
  if (o.nvidia_smi && !gpu_absent) {
    if (auto d = diagnose_nvidia_smi(*o.nvidia_smi)) out.push_back(std::move(*d));
  }
  if (o.ollama_error) out.push_back(diagnoses::ollama_not_answering(o.ollama_url, *o.ollama_error));
  for (const auto& m : o.models) {
    if (auto d = diagnose_model_placement(m.name, m.size, m.size_vram))
      out.push_back(std::move(*d));
  }
  return out;
}

}  // namespace factory::agent
