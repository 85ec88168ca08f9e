#pragma once
// NVML loaded at run time with dlopen: the agent binary has no link-time
// dependency on the NVIDIA driver, so the same binary runs on a guest before
// the driver is installed (and reports that NVML is absent) and after.
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent/guest/env.hpp"
#include "agent/guest/nvidia_smi.hpp"
#include "common/error.hpp"

namespace factory::agent {

class NvmlEventSet;

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
  //
  // A GPU that NVML answers NVML_ERROR_GPU_IS_LOST for is in the report
  // with `lost` set and the name, UUID and bus id it had when last read
  // (none when it was lost before this library first saw it); the other
  // GPUs are read as usual.
  Result<GpuReport> read(nlohmann::json* raw = nullptr);

  // An event set with every GPU's Xid (critical error) and ECC events
  // registered, as far as each GPU supports them. Must not outlive this
  // library. Errors: failed_precondition when the library has no event
  // calls or no GPU could be registered.
  Result<std::unique_ptr<NvmlEventSet>> watch_events();

  struct Api;  // the resolved entry points (nvml.cpp)

 private:
  NvmlLibrary() = default;
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
  std::string path_;
  bool initialized_ = false;
  // What each GPU was when last read, by index: a lost GPU is named by it.
  struct Identity {
    std::string name, uuid, pci_bus_id, serial;
    std::optional<int> minor_number;
  };
  std::vector<Identity> seen_;
};

// One event NVML delivered.
struct NvmlEvent {
  enum class Kind { xid, ecc_corrected, ecc_uncorrected, other };
  Kind kind = Kind::other;
  int gpu_index = -1;      // -1: a device the set did not register (should not happen)
  std::string uuid;        // as registered: a lost GPU cannot be asked any more
  std::uint64_t xid = 0;   // Kind::xid: the Xid (999: one NVML does not know)
  std::uint64_t type = 0;  // NVML's event type bits
};

// nvmlEventSetCreate / nvmlDeviceRegisterEvents / nvmlEventSetWait_v2 /
// nvmlEventSetFree. Used by one thread (fault_watcher.hpp).
class NvmlEventSet {
 public:
  ~NvmlEventSet();  // nvmlEventSetFree
  NvmlEventSet(const NvmlEventSet&) = delete;
  NvmlEventSet& operator=(const NvmlEventSet&) = delete;

  struct Registration {
    int index = 0;
    std::string uuid;
    std::uint64_t supported = 0;   // nvmlDeviceGetSupportedEventTypes
    std::uint64_t registered = 0;  // what was registered (Xid and ECC bits)
    std::string error;             // why nothing was, when nothing was
  };
  const std::vector<Registration>& registrations() const { return registrations_; }

  // The next event, or nullopt when `timeout` passed without one (NVML may
  // also return early, on an interrupt). Errors: unavailable when NVML
  // answers NVML_ERROR_GPU_IS_LOST (a card fell off the bus), failed_precondition
  // for any other failure; the set is then best dropped and made again.
  Result<std::optional<NvmlEvent>> wait(std::chrono::milliseconds timeout);

 private:
  friend class NvmlLibrary;
  NvmlEventSet() = default;
  const NvmlLibrary::Api* api_ = nullptr;
  void* set_ = nullptr;
  std::vector<Registration> registrations_;
  std::vector<void*> devices_;  // by registration, to name an event's GPU
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
