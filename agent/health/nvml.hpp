#pragma once
// NVML loaded at run time with dlopen: the agent binary has no link-time
// dependency on the NVIDIA driver, so the same binary runs on a guest before
// the driver is installed (and reports that NVML is absent) and after.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/guest/env.hpp"
#include "agent/guest/nvidia_smi.hpp"
#include "common/error.hpp"

namespace factory::agent {

class NvmlLibrary {
 public:
  // Tries each candidate (a soname or a path) in turn. Errors: not_found when
  // none opens (NVML not installed), failed_precondition when a library opens
  // but lacks a symbol or nvmlInit_v2 fails (e.g. the driver is not loaded).
  static Result<std::unique_ptr<NvmlLibrary>> load(const std::vector<std::string>& candidates);
  ~NvmlLibrary();  // nvmlShutdown, dlclose
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  const std::string& path() const { return path_; }
  // Driver and CUDA driver versions and every GPU NVML sees, with every
  // figure the health sample has. raw, when given, gets each GPU's memory
  // info as NVML returned it, in bytes (v1 and v2), to check the MiB
  // figures against nvidia-smi's.
  Result<GpuReport> read(nlohmann::json* raw = nullptr);

  struct Api;  // the resolved entry points (nvml.cpp)

 private:
  NvmlLibrary() = default;
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
  std::string path_;
  bool initialized_ = false;
};

// Where to look for libnvidia-ml. On the real guest (root "/"), the dynamic
// loader's own search for "libnvidia-ml.so.1"; on a simulated guest only the
// library directories under its root, so a test never reads the build
// machine's GPU by accident.
std::vector<std::string> nvml_library_candidates(const GuestEnv& env);

// nvml_library_candidates + load + read. The library is loaded once and
// kept for the next call with the same candidates while it answers: loading
// it anew each sample (dlopen, nvmlInit, nvmlShutdown, dlclose) cost 25 ms
// of CPU per sample and a 31 MB peak on the H200 guest
// (bench/agent-footprint.sh). A read that fails drops it, so a driver that
// was reloaded is found again at the next call, and a library that is not
// there yet (before the plan installs the driver) is looked for again at
// each call. A call made while another is still inside NVML (a wedged
// driver) does not wait for it: it loads a library of its own, as before.
Result<GpuReport> read_gpus_via_nvml(const GuestEnv& env, nlohmann::json* raw = nullptr);

}  // namespace factory::agent
