#pragma once
// The guest's health as the agent reports it: its GPUs and its Ollama.
//
// collect_gpu_health(env) ->
//   {"source": "nvml" | "nvidia-smi",
//    "driver_version": "580.159.04",
//    "gpus": [{"index", "name", "uuid", "pci_bus_id", "memory_total_mib",
//              "memory_used_mib", "temperature_c", "utilization_percent"}],
//    "via": "chroot /run/nvidia/driver"        (only when read that way)
//    "diagnoses": [ ... ]                       (only when something is wrong)
//    "error": "..."                             (only when nothing could be read; source "none")}
//
// NVML first (dlopen, no link-time dependency), then `nvidia-smi` on PATH,
// then `chroot /run/nvidia/driver nvidia-smi` (GPU Operator guests, where the
// driver lives in a container and nvidia-smi is not on the VM's PATH).
//
// collect_ollama_health(env) ->
//   {"version": "0.40.2",
//    "models": [{"name", "size", "size_vram", "gpu_percent"}],
//    "error"/"diagnoses" when the API does not answer}
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/guest/env.hpp"
#include "agent/guest/nvidia_smi.hpp"

namespace factory::agent {

nlohmann::json collect_gpu_health(const GuestEnv& env);
nlohmann::json collect_ollama_health(const GuestEnv& env);

// The GPU Operator's driver root under the guest root.
std::string gpu_operator_driver_root(const GuestEnv& env);

}  // namespace factory::agent
