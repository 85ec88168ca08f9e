#include "agent/health/nvml.hpp"

#include <dlfcn.h>

#include <cstdio>

namespace factory::agent {

namespace {

// The few NVML types the agent uses, as nvml.h declares them (NVML API v12;
// nvmlPciInfo_t is the layout nvmlDeviceGetPciInfo_v3 fills). We define them
// here instead of including nvml.h so the build needs no CUDA toolkit.
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
using nvmlDevice_t = struct nvmlDevice_st*;

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

constexpr int NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32;
constexpr int NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16;
struct nvmlPciInfo_t {
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
};

struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};

using nvmlTemperatureSensors_t = int;
constexpr nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU = 0;

constexpr unsigned NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96;
constexpr unsigned NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96;
constexpr unsigned NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80;

}  // namespace

struct NvmlLibrary::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  const char* (*error_string)(nvmlReturn_t);
  nvmlReturn_t (*get_count)(unsigned int*);
  nvmlReturn_t (*get_handle)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*get_name)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*get_uuid)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*get_memory)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*driver_version)(char*, unsigned int);
  nvmlReturn_t (*get_pci)(nvmlDevice_t, nvmlPciInfo_t*);
  nvmlReturn_t (*get_temperature)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned int*);
  nvmlReturn_t (*get_utilization)(nvmlDevice_t, nvmlUtilization_t*);

  std::string describe(nvmlReturn_t rc) const {
    const char* s = error_string ? error_string(rc) : nullptr;
    return s ? std::string(s) + " (" + std::to_string(rc) + ")"
             : "NVML error " + std::to_string(rc);
  }
};

namespace {

template <class Fn>
bool resolve(void* handle, const char* name, Fn& out, std::string& missing) {
  void* sym = ::dlsym(handle, name);
  if (!sym) {
    missing += (missing.empty() ? "" : ", ") + std::string(name);
    return false;
  }
  out = reinterpret_cast<Fn>(sym);
  return true;
}

}  // namespace

Result<std::unique_ptr<NvmlLibrary>> NvmlLibrary::load(const std::vector<std::string>& candidates) {
  std::string tried;
  void* handle = nullptr;
  std::string path;
  for (const auto& c : candidates) {
    ::dlerror();
    handle = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) {
      path = c;
      break;
    }
    const char* err = ::dlerror();
    tried += (tried.empty() ? "" : "; ") + std::string(err ? err : c);
  }
  if (!handle) return Error(Errc::not_found, "NVML is not installed (" + tried + ")");

  std::unique_ptr<NvmlLibrary> lib(new NvmlLibrary());
  lib->handle_ = handle;
  lib->path_ = path;
  lib->api_ = std::make_unique<Api>();
  Api& a = *lib->api_;
  std::string missing;
  resolve(handle, "nvmlInit_v2", a.init, missing);
  resolve(handle, "nvmlShutdown", a.shutdown, missing);
  resolve(handle, "nvmlDeviceGetCount_v2", a.get_count, missing);
  resolve(handle, "nvmlDeviceGetHandleByIndex_v2", a.get_handle, missing);
  resolve(handle, "nvmlDeviceGetName", a.get_name, missing);
  resolve(handle, "nvmlDeviceGetUUID", a.get_uuid, missing);
  resolve(handle, "nvmlDeviceGetMemoryInfo", a.get_memory, missing);
  resolve(handle, "nvmlSystemGetDriverVersion", a.driver_version, missing);
  resolve(handle, "nvmlDeviceGetPciInfo_v3", a.get_pci, missing);
  resolve(handle, "nvmlDeviceGetTemperature", a.get_temperature, missing);
  resolve(handle, "nvmlDeviceGetUtilizationRates", a.get_utilization, missing);
  // Optional: only makes messages nicer.
  a.error_string =
      reinterpret_cast<const char* (*)(nvmlReturn_t)>(::dlsym(handle, "nvmlErrorString"));
  if (!missing.empty())
    return Error(Errc::failed_precondition,
                 path + " lacks " + missing + " (NVML older than the agent expects)");

  nvmlReturn_t rc = a.init();
  if (rc != NVML_SUCCESS)
    return Error(Errc::failed_precondition, "nvmlInit_v2 failed: " + a.describe(rc));
  lib->initialized_ = true;
  return lib;
}

NvmlLibrary::~NvmlLibrary() {
  if (initialized_ && api_ && api_->shutdown) api_->shutdown();
  if (handle_) ::dlclose(handle_);
}

Result<GpuReport> NvmlLibrary::read() {
  const Api& a = *api_;
  GpuReport report;
  report.source = "nvml";
  char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  if (nvmlReturn_t rc = a.driver_version(version, sizeof version); rc == NVML_SUCCESS)
    report.driver_version = version;
  unsigned int count = 0;
  if (nvmlReturn_t rc = a.get_count(&count); rc != NVML_SUCCESS)
    return Error(Errc::failed_precondition, "nvmlDeviceGetCount_v2 failed: " + a.describe(rc));
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t rc = a.get_handle(i, &dev); rc != NVML_SUCCESS)
      return Error(Errc::failed_precondition, "nvmlDeviceGetHandleByIndex_v2(" + std::to_string(i) +
                                                  ") failed: " + a.describe(rc));
    GpuReading g;
    g.index = static_cast<int>(i);
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    if (a.get_name(dev, name, sizeof name) == NVML_SUCCESS) g.name = name;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (a.get_uuid(dev, uuid, sizeof uuid) == NVML_SUCCESS) g.uuid = uuid;
    nvmlPciInfo_t pci{};
    if (a.get_pci(dev, &pci) == NVML_SUCCESS) {
      pci.busId[sizeof pci.busId - 1] = '\0';
      g.pci_bus_id = pci.busId;
    }
    nvmlMemory_t mem{};
    if (a.get_memory(dev, &mem) == NVML_SUCCESS) {
      g.memory_total_mib = mem.total / (1024ull * 1024ull);
      g.memory_used_mib = mem.used / (1024ull * 1024ull);
    }
    unsigned int temp = 0;
    if (a.get_temperature(dev, NVML_TEMPERATURE_GPU, &temp) == NVML_SUCCESS)
      g.temperature_c = static_cast<int>(temp);
    nvmlUtilization_t util{};
    if (a.get_utilization(dev, &util) == NVML_SUCCESS)
      g.utilization_percent = static_cast<int>(util.gpu);
    report.gpus.push_back(std::move(g));
  }
  return report;
}

std::vector<std::string> nvml_library_candidates(const GuestEnv& env) {
  if (env.root == "/" || env.root.empty()) return {"libnvidia-ml.so.1"};
  std::vector<std::string> out;
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib",
                          "/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64"})
    out.push_back((env.path(dir) / "libnvidia-ml.so.1").string());
  return out;
}

Result<GpuReport> read_gpus_via_nvml(const GuestEnv& env) {
  auto lib = NvmlLibrary::load(nvml_library_candidates(env));
  if (!lib) return lib.error();
  return (*lib)->read();
}

}  // namespace factory::agent
