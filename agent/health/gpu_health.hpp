#pragma once
// The guest's GPUs and its Ollama, as the health sample's sections
// (contract/health_sample.hpp has their fields).
//
// The GPU: NVML first (dlopen, no link-time dependency; v2 memory info, so
// used and reserved are nvidia-smi's), then `nvidia-smi --query-gpu` on
// PATH, then `chroot /run/nvidia/driver nvidia-smi` (GPU Operator guests,
// where the driver lives in a container and nvidia-smi is not on the VM's
// PATH). When nothing answers, source "none" with the error and what is
// known to be wrong: the card never reached the guest, its driver does not
// load, nvidia-smi is missing.
//
// Ollama: /api/version and /api/ps (each loaded model's size, its share on
// the GPU, context length and expiry), or the diagnosis that it does not
// answer.
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/diagnose/diagnosis.hpp"
#include "agent/guest/env.hpp"
#include "contract/health_sample.hpp"

namespace factory::agent {

// timeout bounds each nvidia-smi run (NVML calls cannot be bounded here:
// TimedCollector, collector.hpp, is what keeps a wedged driver from holding
// anyone up).
proto::GpuSection read_gpu_section(const GuestEnv& env,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(10));
proto::OllamaSection read_ollama_section(
    const GuestEnv& env, std::chrono::milliseconds timeout = std::chrono::seconds(5));

// The same as JSON (what `factory-agent health` prints).
nlohmann::json collect_gpu_health(const GuestEnv& env);
nlohmann::json collect_ollama_health(const GuestEnv& env);

// The GPU Operator's driver root under the guest root.
std::string gpu_operator_driver_root(const GuestEnv& env);

// A diagnosis as the sample carries it.
proto::DiagnosisSample diagnosis_sample(const Diagnosis& d);

// A collector that did not answer within its deadline: `what` names what it
// was asking ("nvidia-smi / NVML", "Ollama's API"). The same words every
// sample while it lasts, so a stuck collector is one change, not one a sample.
Diagnosis collector_hung(const std::string& collector, const std::string& what,
                         std::chrono::milliseconds deadline);

}  // namespace factory::agent
