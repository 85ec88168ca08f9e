#pragma once
// Turns observations into diagnoses. Pure functions of what was observed (no
// I/O here), so each rule is unit-tested on constructed observations, and the
// steps and health probes gather the observations and call these.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "agent/diagnose/diagnosis.hpp"
#include "agent/guest/facts.hpp"

namespace factory::agent {

// What the guest shows about its GPU and the NVIDIA driver.
struct GpuDriverObservations {
  std::vector<PciFunction> gpus;  // NVIDIA display functions on the PCI bus
  bool module_loaded = false;     // the nvidia kernel module
  std::string driver_package;     // the package that carries the module, e.g. nvidia-headless-open
  PackageState package;           // dpkg's view of it
  // true/false when the agent knows whether the guest booted since the
  // install (it records the boot id at install); unknown otherwise.
  std::optional<bool> rebooted_since_install;
  std::string kernel_log;
  std::string expected_version;  // the pinned driver version
  std::string smi_version;       // what nvidia-smi reported; empty when it did not run
};

// The most fundamental thing wrong, or nullopt when the driver looks healthy.
// Order matters: no card beats everything (a driver cannot fix it); a BAR the
// firmware could not map beats "reboot pending" (the module fails to load
// because of it, and rebooting again would not help).
std::optional<Diagnosis> diagnose_gpu_driver(const GpuDriverObservations& o);

// A failed package command (apt-get, dpkg): a DKMS build failure when the
// output says so, else apt_failed with the output tail.
Diagnosis diagnose_package_failure(const std::string& command, const std::string& output,
                                   const std::string& kernel_release);

// nvidia-smi's whereabouts: on PATH, or only inside the GPU Operator's driver root.
struct NvidiaSmiObservations {
  bool on_path = false;
  bool in_driver_root = false;  // <driver_root>/usr/bin/nvidia-smi exists
  std::string driver_root = "/run/nvidia/driver";
};
std::optional<Diagnosis> diagnose_nvidia_smi(const NvidiaSmiObservations& o);

// A loaded model: fully on the GPU or not.
std::optional<Diagnosis> diagnose_model_placement(const std::string& model, std::uint64_t size,
                                                  std::uint64_t size_vram);

// A pull that failed: the registry does not know the name (the server's
// error says the manifest does not exist, or HTTP 404), or it was cut.
Diagnosis diagnose_pull_failure(const std::string& model, int http_status,
                                const std::string& server_error, int percent);
bool is_unknown_model_error(int http_status, const std::string& server_error);

// Everything at once, for a report: each part is optional.
struct GuestObservations {
  std::optional<GpuDriverObservations> gpu;
  std::optional<NvidiaSmiObservations> nvidia_smi;
  struct ModelPlacement {
    std::string name;
    std::uint64_t size = 0;
    std::uint64_t size_vram = 0;
  };
  std::vector<ModelPlacement> models;
  std::optional<std::string> ollama_error;  // set when the Ollama API did not answer
  std::string ollama_url;
};
std::vector<Diagnosis> diagnose(const GuestObservations& o);

}  // namespace factory::agent
