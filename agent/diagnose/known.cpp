#include "agent/diagnose/known.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace factory::agent::diagnoses {

using nlohmann::json;

Diagnosis gpu_not_on_pci_bus(const json& pci_functions_seen) {
  return {"gpu_not_on_pci_bus",
          "the VM never received the card: no NVIDIA function (vendor 0x10de, display class) "
          "is on the guest's PCI bus",
          "check on the host that the card is on vfio-pci and that deviceName matches the "
          "allowlisted resource; installing a driver in the guest cannot create a PCI device",
          {{"pci_functions", pci_functions_seen}}};
}

Diagnosis driver_reboot_pending(const std::string& package, const std::string& version) {
  return {"driver_reboot_pending",
          "the NVIDIA driver (" + package + " " + version +
              ") is installed but its kernel module is not loaded: the guest has not rebooted "
              "since the install",
          "reboot the guest (the plan does this itself; if it was interrupted, "
          "`factory tenant retry` resumes it)",
          {{"package", package}, {"version", version}}};
}

Diagnosis driver_not_loading(const std::string& kernel_log_tail) {
  return {"driver_not_loading",
          "the guest rebooted after the driver install and the nvidia module still is not loaded",
          "run `modprobe nvidia` in the guest and read `dmesg | grep -i nvrm`; check that DKMS "
          "built the module for the running kernel (`dkms status`)",
          {{"kernel_log_tail", kernel_log_tail}}};
}

Diagnosis gpu_bar0_unmapped(const std::string& log_line, const std::string& pci_address) {
  // Seen with 24 GB+ cards (H100/H200 class) behind OVMF/EFI guest firmware:
  // the firmware's 64-bit PCI MMIO window is too small for the card's BARs, so
  // it leaves them unassigned and the driver's probe fails. The fix is on the
  // host (VM definition), never in the guest. References: kubevirt/kubevirt
  // #11093 (EFI + large-VRAM GPU), harvester/harvester#8972 (firmware sizes the
  // MMIO window from the CPU's physical address bits), kubevirt/kubevirt#9968
  // (OVMF's X-PciMmio64Mb).
  return {"gpu_bar0_unmapped",
          "the guest firmware could not map the card's memory (" + log_line +
              "): a large-BAR GPU needs a bigger 64-bit PCI MMIO window than the VM has",
          "fix the VM on the host: give the guest firmware a 64-bit MMIO window large enough "
          "for the card (KubeVirt with EFI: use cpu model host-passthrough so OVMF sizes the "
          "window from the host's physical address bits, or pass OVMF "
          "-fw_cfg opt/ovmf/X-PciMmio64Mb=262144 through a hook sidecar; or boot the VM with "
          "BIOS instead of EFI), then restart the VM",
          {{"kernel_log_line", log_line}, {"pci_address", pci_address}}};
}

Diagnosis gpu_not_bound_to_nvidia(const std::string& pci_address, const std::string& driver) {
  return {"gpu_not_bound_to_nvidia",
          "the nvidia module is loaded but the GPU at " + pci_address + " is bound to " +
              (driver.empty() ? std::string("no driver") : "'" + driver + "'"),
          "read `dmesg | grep -i nvrm` for the probe error; if nouveau holds the card, blacklist "
          "it and reboot",
          {{"pci_address", pci_address}, {"driver", driver}}};
}

Diagnosis driver_version_mismatch(const std::string& expected, const std::string& found) {
  return {"driver_version_mismatch",
          "nvidia-smi reports driver " + found + ", the catalog pins " + expected,
          "remove the other driver (apt-get purge 'nvidia-*') and retry the plan, or pin the "
          "installed version in the catalog",
          {{"expected", expected}, {"found", found}}};
}

Diagnosis dkms_build_failed(const std::string& kernel, const std::string& output_tail) {
  return {"dkms_build_failed",
          "DKMS could not build the nvidia module for kernel " + kernel,
          "check that linux-headers-" + kernel +
              " is installed and matches the running kernel; read "
              "/var/lib/dkms/nvidia/*/build/make.log in the guest; a kernel newer than the "
              "driver supports needs a newer pinned driver",
          {{"kernel", kernel}, {"output_tail", output_tail}}};
}

Diagnosis apt_failed(const std::string& command, const std::string& output_tail) {
  return {"apt_failed",
          "`" + command + "` failed",
          "read the output tail; check the guest's network and package sources, then "
          "`factory tenant retry`",
          {{"command", command}, {"output_tail", output_tail}}};
}

Diagnosis download_failed(const std::string& url, const std::string& output_tail) {
  return {"download_failed",
          "downloading " + url + " did not complete",
          "check the guest's network access to the URL (or put the file in /var/cache "
          "beforehand), then `factory tenant retry`",
          {{"url", url}, {"output_tail", output_tail}}};
}

Diagnosis checksum_mismatch(const std::string& url, const std::string& want,
                            const std::string& got) {
  return {"checksum_mismatch",
          "the sha256 of " + url + " is not the one the catalog pins",
          "nothing was installed from it; if the guest reaches the URL through a proxy or "
          "mirror, check that it serves the original file; if the pin is wrong, fix the "
          "catalog's checksum from the release's published .sha256sum; then `factory tenant "
          "retry`",
          {{"url", url}, {"want", want}, {"got", got}}};
}

Diagnosis nvidia_smi_not_on_path() {
  return {"nvidia_smi_not_on_path",
          "nvidia-smi is not on PATH and no GPU Operator driver root exists",
          "install the NVIDIA driver (its utilities provide nvidia-smi)", json::object()};
}

Diagnosis mig_not_supported(int gpu, const std::string& name, const std::string& detail) {
  return {"mig_not_supported",
          "GPU " + std::to_string(gpu) + (name.empty() ? "" : " (" + name + ")") +
              " does not support MIG: " + detail,
          "give this tenant a MIG-capable card (A30, A100, H100, H200) or a tier without MIG",
          {{"gpu", gpu}, {"name", name}}};
}

Diagnosis mig_mode_still_pending(int gpu, const std::string& detail) {
  return {"mig_mode_still_pending",
          "MIG mode on GPU " + std::to_string(gpu) +
              " is still pending after the guest rebooted: " + detail,
          "stop what holds the GPU (nvidia-persistenced, DCGM, monitoring) and reset it "
          "(nvidia-smi --gpu-reset -i " +
              std::to_string(gpu) + "), or reboot the host's VM from outside",
          {{"gpu", gpu}}};
}

Diagnosis gpu_operator_nvidia_smi_chroot(const std::string& driver_root) {
  return {"gpu_operator_nvidia_smi_chroot",
          "nvidia-smi is not on the VM's PATH: the GPU Operator runs the driver in a container "
          "rooted at " +
              driver_root,
          "use `chroot " + driver_root + " nvidia-smi` (health does this itself)",
          {{"driver_root", driver_root}}};
}

Diagnosis ollama_not_answering(const std::string& url, const std::string& last_error) {
  // The HTTP client's errors start with the URL it dialled: said once.
  const bool names_url = last_error.rfind(url, 0) == 0;
  return {"ollama_not_answering",
          "Ollama does not answer at " + (names_url ? last_error : url + ": " + last_error),
          "check the service in the guest (`systemctl status ollama`, `journalctl -u ollama`); "
          "OLLAMA_HOST must match the URL the agent uses",
          {{"url", url}, {"last_error", last_error}}};
}

Diagnosis ollama_version_mismatch(const std::string& expected, const std::string& found) {
  return {"ollama_version_mismatch",
          "Ollama reports version " + found + ", the catalog pins " + expected,
          "reinstall with OLLAMA_VERSION=" + expected + " or pin " + found + " in the catalog",
          {{"expected", expected}, {"found", found}}};
}

Diagnosis model_not_found(const std::string& model, const std::string& server_error) {
  return {"model_not_found",
          "the registry has no model named '" + model + "' (" + server_error + ")",
          "fix the model name in the catalog (see ollama.com/library), then "
          "`factory tenant retry`",
          {{"model", model}, {"server_error", server_error}}};
}

Diagnosis model_download_interrupted(const std::string& model, int percent,
                                     const std::string& detail) {
  return {"model_download_interrupted",
          "the download of '" + model + "' stopped at " + std::to_string(percent) + "%: " + detail,
          "check the guest's network access to registry.ollama.ai; `factory tenant retry` "
          "resumes the download where it stopped",
          {{"model", model}, {"percent", percent}, {"detail", detail}}};
}

Diagnosis model_partly_on_cpu(const std::string& model, std::uint64_t size,
                              std::uint64_t size_vram) {
  // The same arithmetic as `ollama ps` (PROCESSOR column), so both agree.
  int cpu_percent = size == 0 ? 100
                              : static_cast<int>(std::lround(
                                    100.0 * static_cast<double>(size - std::min(size, size_vram)) /
                                    static_cast<double>(size)));
  std::string summary = "model '" + model + "' is not fully on the GPU: " + human_bytes(size_vram) +
                        " of " + human_bytes(size) + " on the GPU, " + std::to_string(cpu_percent) +
                        "% on the CPU";
  std::string fix = size_vram == 0
                        ? "Ollama found no usable GPU: check the nvidia_driver step and "
                          "`nvidia-smi`, then `systemctl restart ollama` (Ollama picks GPUs "
                          "when it starts)"
                        : "the GPU lacks free memory for the whole model: check `nvidia-smi` "
                          "for other processes, or choose a smaller model or quantization";
  return {"model_partly_on_cpu",
          summary,
          fix,
          {{"model", model},
           {"size", size},
           {"size_vram", size_vram},
           {"cpu_percent", cpu_percent},
           {"gpu_percent", 100 - cpu_percent}}};
}

std::string human_bytes(std::uint64_t b) {
  // Ollama's format.HumanBytes: decimal units, one decimal below 10.
  struct Unit {
    double size;
    const char* name;
  };
  static const Unit units[] = {{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "KB"}};
  for (const auto& u : units) {
    if (static_cast<double>(b) >= u.size) {
      double v = static_cast<double>(b) / u.size;
      char buf[32];
      if (v >= 10 || v == std::trunc(v))
        std::snprintf(buf, sizeof buf, "%d %s", static_cast<int>(v), u.name);
      else
        std::snprintf(buf, sizeof buf, "%.1f %s", v, u.name);
      return buf;
    }
  }
  return std::to_string(b) + " B";
}

}  // namespace factory::agent::diagnoses
