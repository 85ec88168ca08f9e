#include "agent/health/nvml.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <mutex>

namespace factory::agent {

namespace {

// The NVML types the agent uses, as nvml.h declares them (NVML API v12). We
// define them here instead of including nvml.h so the build needs no CUDA
// toolkit; the layouts are ABI and NVIDIA keeps them.
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;
constexpr nvmlReturn_t NVML_ERROR_TIMEOUT = 10;
constexpr nvmlReturn_t NVML_ERROR_GPU_IS_LOST = 15;
using nvmlDevice_t = struct nvmlDevice_st*;
using nvmlEventSet_t = struct nvmlEventSet_st*;

// nvmlEventSetWait_v2's record. The v1 call of drivers before the MIG
// instance ids wrote the first three members only, which this layout
// begins with.
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;  // the Xid, for nvmlEventTypeXidCriticalError
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
constexpr unsigned long long nvmlEventTypeSingleBitEccError = 0x1;
constexpr unsigned long long nvmlEventTypeDoubleBitEccError = 0x2;
constexpr unsigned long long nvmlEventTypeXidCriticalError = 0x8;

// nvmlDeviceGetMemoryInfo: used counts the memory the driver and firmware
// reserve (616 MiB on an H200 with nothing running).
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
// nvmlDeviceGetMemoryInfo_v2 (R510 and later): reserved apart, as nvidia-smi shows it.
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
// NVML_STRUCT_VERSION(Memory, 2)
constexpr unsigned int nvmlMemory_v2 =
    static_cast<unsigned int>(sizeof(nvmlMemory_v2_t)) | (2u << 24);

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

// nvmlProcessInfo_t of the _v2 and _v3 calls (v1 lacks the two instance ids).
struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
constexpr unsigned long long NVML_VALUE_NOT_AVAILABLE =
    std::numeric_limits<unsigned long long>::max();

union nvmlValue_t {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  long long sllVal;
  int siVal;
  unsigned short usVal;
};
struct nvmlFieldValue_t {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;  // nvmlValueType_t
  nvmlReturn_t nvmlReturn;
  nvmlValue_t value;
};
constexpr unsigned int NVML_FI_DEV_MEMORY_TEMP = 82;
// NVLink error counters summed over the links, and the link count.
constexpr unsigned int NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38;
constexpr unsigned int NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45;
constexpr unsigned int NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52;
constexpr unsigned int NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59;
constexpr unsigned int NVML_FI_DEV_NVLINK_LINK_COUNT = 91;

constexpr int NVML_TEMPERATURE_GPU = 0;
constexpr int NVML_CLOCK_SM = 1;
constexpr int NVML_CLOCK_MEM = 2;
constexpr int NVML_MEMORY_ERROR_TYPE_CORRECTED = 0;
constexpr int NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1;
constexpr int NVML_VOLATILE_ECC = 0;
constexpr int NVML_AGGREGATE_ECC = 1;
constexpr int NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0;
constexpr int NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1;
constexpr int NVML_FEATURE_ENABLED = 1;  // nvmlEnableState_t
constexpr unsigned int NVML_DEVICE_MIG_ENABLE = 1;
constexpr int NVML_PSTATE_UNKNOWN = 32;

constexpr unsigned NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96;
constexpr unsigned NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96;
constexpr unsigned NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80;
constexpr unsigned NVML_DEVICE_SERIAL_BUFFER_SIZE = 30;

constexpr std::uint64_t kMiB = 1024ull * 1024ull;

// Whole MiB as nvidia-smi prints them: rounded up. Measured on the H200
// guest (driver 580.159.04, tests/fixtures/device/h200-2026-12-01b): NVML v2
// said reserved 644939776 B (615.06 MiB) and free 150109880320 B
// (143155.94 MiB); nvidia-smi printed Reserved 616 and Free 143156, where
// truncation gave 615 and 143155.
std::uint64_t whole_mib(std::uint64_t bytes) {
  return bytes / kMiB + (bytes % kMiB != 0);
}

}  // namespace

struct NvmlLibrary::Api {
  // Required: without these there is nothing to report.
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  nvmlReturn_t (*get_count)(unsigned int*);
  nvmlReturn_t (*get_handle)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*get_name)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*get_uuid)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*get_memory)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*driver_version)(char*, unsigned int);
  nvmlReturn_t (*get_pci)(nvmlDevice_t, nvmlPciInfo_t*);
  // Optional: a driver that lacks one leaves its figure unknown.
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*cuda_version)(int*) = nullptr;
  nvmlReturn_t (*get_memory_v2)(nvmlDevice_t, nvmlMemory_v2_t*) = nullptr;
  nvmlReturn_t (*get_minor)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*get_temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*get_field_values)(nvmlDevice_t, int, nvmlFieldValue_t*) = nullptr;
  nvmlReturn_t (*get_utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*get_power)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*get_power_limit)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*get_enforced_power_limit)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*get_clock)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*get_pstate)(nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*get_ecc)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*get_mig_mode)(nvmlDevice_t, unsigned int*, unsigned int*) = nullptr;
  nvmlReturn_t (*get_processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*) = nullptr;
  nvmlReturn_t (*process_name)(unsigned int, char*, unsigned int) = nullptr;
  // Faults.
  nvmlReturn_t (*get_serial)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*get_remapped_rows)(nvmlDevice_t, unsigned int*, unsigned int*, unsigned int*,
                                    unsigned int*) = nullptr;
  nvmlReturn_t (*get_retired_pages)(nvmlDevice_t, int, unsigned int*,
                                    unsigned long long*) = nullptr;
  nvmlReturn_t (*get_retired_pending)(nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*get_pcie_replay)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*get_clocks_event_reasons)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*get_energy)(nvmlDevice_t, unsigned long long*) = nullptr;
  // Events.
  nvmlReturn_t (*event_set_create)(nvmlEventSet_t*) = nullptr;
  nvmlReturn_t (*supported_events)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*register_events)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*event_set_wait)(nvmlEventSet_t, nvmlEventData_t*, unsigned int) = nullptr;
  nvmlReturn_t (*event_set_free)(nvmlEventSet_t) = nullptr;

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

// The first of the names the library has (newest first), or null.
template <class Fn>
void optional_symbol(void* handle, std::initializer_list<const char*> names, Fn& out) {
  for (const char* n : names)
    if (void* sym = ::dlsym(handle, n)) {
      out = reinterpret_cast<Fn>(sym);
      return;
    }
  out = nullptr;
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
  optional_symbol(handle, {"nvmlErrorString"}, a.error_string);
  optional_symbol(handle, {"nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"},
                  a.cuda_version);
  optional_symbol(handle, {"nvmlDeviceGetMemoryInfo_v2"}, a.get_memory_v2);
  optional_symbol(handle, {"nvmlDeviceGetMinorNumber"}, a.get_minor);
  optional_symbol(handle, {"nvmlDeviceGetTemperature"}, a.get_temperature);
  optional_symbol(handle, {"nvmlDeviceGetFieldValues"}, a.get_field_values);
  optional_symbol(handle, {"nvmlDeviceGetUtilizationRates"}, a.get_utilization);
  optional_symbol(handle, {"nvmlDeviceGetPowerUsage"}, a.get_power);
  optional_symbol(handle, {"nvmlDeviceGetPowerManagementLimit"}, a.get_power_limit);
  optional_symbol(handle, {"nvmlDeviceGetEnforcedPowerLimit"}, a.get_enforced_power_limit);
  optional_symbol(handle, {"nvmlDeviceGetClockInfo"}, a.get_clock);
  optional_symbol(handle, {"nvmlDeviceGetPerformanceState"}, a.get_pstate);
  optional_symbol(handle, {"nvmlDeviceGetTotalEccErrors"}, a.get_ecc);
  optional_symbol(handle, {"nvmlDeviceGetMigMode"}, a.get_mig_mode);
  // The v1 call fills a shorter struct: only the versions that fill ours.
  optional_symbol(
      handle,
      {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"},
      a.get_processes);
  optional_symbol(handle, {"nvmlSystemGetProcessName"}, a.process_name);
  optional_symbol(handle, {"nvmlDeviceGetSerial"}, a.get_serial);
  optional_symbol(handle, {"nvmlDeviceGetRemappedRows"}, a.get_remapped_rows);
  optional_symbol(handle, {"nvmlDeviceGetRetiredPages"}, a.get_retired_pages);
  optional_symbol(handle, {"nvmlDeviceGetRetiredPagesPendingStatus"}, a.get_retired_pending);
  optional_symbol(handle, {"nvmlDeviceGetPcieReplayCounter"}, a.get_pcie_replay);
  // R535 renamed the throttle reasons to clock event reasons; same bits.
  optional_symbol(
      handle,
      {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"},
      a.get_clocks_event_reasons);
  optional_symbol(handle, {"nvmlDeviceGetTotalEnergyConsumption"}, a.get_energy);
  optional_symbol(handle, {"nvmlEventSetCreate"}, a.event_set_create);
  optional_symbol(handle, {"nvmlDeviceGetSupportedEventTypes"}, a.supported_events);
  optional_symbol(handle, {"nvmlDeviceRegisterEvents"}, a.register_events);
  optional_symbol(handle, {"nvmlEventSetWait_v2", "nvmlEventSetWait"}, a.event_set_wait);
  optional_symbol(handle, {"nvmlEventSetFree"}, a.event_set_free);
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

namespace {

void read_memory(const NvmlLibrary::Api& a, nvmlDevice_t dev, GpuReading& g, nlohmann::json* raw) {
  nvmlMemory_t v1{};
  bool have_v1 = a.get_memory(dev, &v1) == NVML_SUCCESS;
  nvmlMemory_v2_t v2{};
  v2.version = nvmlMemory_v2;
  bool have_v2 = a.get_memory_v2 && a.get_memory_v2(dev, &v2) == NVML_SUCCESS;
  if (raw) {
    (*raw)["memory_v1_bytes"] =
        have_v1 ? nlohmann::json{{"total", v1.total}, {"free", v1.free}, {"used", v1.used}}
                : nlohmann::json(nullptr);
    (*raw)["memory_v2_bytes"] = have_v2 ? nlohmann::json{{"total", v2.total},
                                                         {"reserved", v2.reserved},
                                                         {"free", v2.free},
                                                         {"used", v2.used}}
                                        : nlohmann::json(nullptr);
  }
  // nvidia-smi prints whole MiB, rounded up (whole_mib). Its Total is the card's (v1's,
  // which has always matched it); the split comes from v2 where the driver
  // has it. Without v2 the driver is older than R510, whose nvidia-smi had
  // no Reserved line and counted it in Used, as v1 does: reserved stays
  // unknown rather than guessed.
  if (have_v1) g.memory_total_mib = whole_mib(v1.total);
  if (have_v2) {
    if (!have_v1) g.memory_total_mib = whole_mib(v2.total);
    g.memory_reserved_mib = whole_mib(v2.reserved);
    g.memory_used_mib = whole_mib(v2.used);
    g.memory_free_mib = whole_mib(v2.free);
  } else if (have_v1) {
    g.memory_used_mib = whole_mib(v1.used);
    g.memory_free_mib = whole_mib(v1.free);
  }
}

std::optional<int> field_int(const NvmlLibrary::Api& a, nvmlDevice_t dev, unsigned int id) {
  if (!a.get_field_values) return std::nullopt;
  nvmlFieldValue_t f{};
  f.fieldId = id;
  if (a.get_field_values(dev, 1, &f) != NVML_SUCCESS || f.nvmlReturn != NVML_SUCCESS)
    return std::nullopt;
  switch (f.valueType) {
    case 0:
      return static_cast<int>(f.value.dVal);
    case 1:
      return static_cast<int>(f.value.uiVal);
    case 2:
      return static_cast<int>(f.value.ulVal);
    case 3:
      return static_cast<int>(f.value.ullVal);
    case 4:
      return static_cast<int>(f.value.sllVal);
    case 5:
      return f.value.siVal;
    case 6:
      return static_cast<int>(f.value.usVal);
    default:
      return std::nullopt;
  }
}

std::optional<std::uint64_t> field_value_u64(const nvmlFieldValue_t& f) {
  if (f.nvmlReturn != NVML_SUCCESS) return std::nullopt;
  switch (f.valueType) {
    case 1:
      return f.value.uiVal;
    case 2:
      return f.value.ulVal;
    case 3:
      return f.value.ullVal;
    case 4:
      if (f.value.sllVal < 0) return std::nullopt;
      return static_cast<std::uint64_t>(f.value.sllVal);
    case 5:
      if (f.value.siVal < 0) return std::nullopt;
      return static_cast<std::uint64_t>(f.value.siVal);
    case 6:
      return f.value.usVal;
    default:
      return std::nullopt;
  }
}

// NVLink's error totals, for a card that has links.
std::optional<proto::NvlinkSample> read_nvlink(const NvmlLibrary::Api& a, nvmlDevice_t dev) {
  if (!a.get_field_values) return std::nullopt;
  nvmlFieldValue_t f[5] = {};
  const unsigned int ids[5] = {
      NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
      NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
      NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL};
  for (int i = 0; i < 5; ++i) f[i].fieldId = ids[i];
  if (a.get_field_values(dev, 5, f) != NVML_SUCCESS) return std::nullopt;
  auto links = field_value_u64(f[0]);
  if (!links || *links == 0) return std::nullopt;
  proto::NvlinkSample n;
  n.links = links;
  n.crc_flit_errors = field_value_u64(f[1]);
  n.crc_data_errors = field_value_u64(f[2]);
  n.replay_errors = field_value_u64(f[3]);
  n.recovery_errors = field_value_u64(f[4]);
  return n;
}

// Everything the card says about its faults. Each call a driver or a card
// lacks (NVML_ERROR_NOT_SUPPORTED) leaves its figure unknown.
void read_faults(const NvmlLibrary::Api& a, nvmlDevice_t dev, GpuReading& g) {
  unsigned long long n = 0;
  if (a.get_ecc) {
    if (a.get_ecc(dev, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &n) == NVML_SUCCESS)
      g.ecc_errors_corrected_volatile = n;
    if (a.get_ecc(dev, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC, &n) == NVML_SUCCESS)
      g.ecc_errors_corrected_aggregate = n;
    if (a.get_ecc(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC, &n) == NVML_SUCCESS)
      g.ecc_errors_uncorrected_aggregate = n;
  }
  unsigned int corr = 0, unc = 0, pending = 0, failure = 0;
  if (a.get_remapped_rows &&
      a.get_remapped_rows(dev, &corr, &unc, &pending, &failure) == NVML_SUCCESS) {
    g.remapped_rows_correctable = corr;
    g.remapped_rows_uncorrectable = unc;
    g.remapped_rows_pending = pending != 0;
    g.remapped_rows_failure = failure != 0;
  }
  if (a.get_retired_pages) {
    // A count of 0 asks for the number only; the buffer is never written.
    unsigned long long unused = 0;
    auto pages = [&](int cause) -> std::optional<std::uint64_t> {
      unsigned int count = 0;
      nvmlReturn_t rc = a.get_retired_pages(dev, cause, &count, &unused);
      if (rc != NVML_SUCCESS && rc != NVML_ERROR_INSUFFICIENT_SIZE) return std::nullopt;
      return count;
    };
    g.retired_pages_sbe = pages(NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS);
    g.retired_pages_dbe = pages(NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR);
  }
  int state = 0;
  if (a.get_retired_pending && a.get_retired_pending(dev, &state) == NVML_SUCCESS)
    g.retired_pages_pending = state == NVML_FEATURE_ENABLED;
  unsigned int u = 0;
  if (a.get_pcie_replay && a.get_pcie_replay(dev, &u) == NVML_SUCCESS) g.pcie_replay_count = u;
  if (a.get_clocks_event_reasons && a.get_clocks_event_reasons(dev, &n) == NVML_SUCCESS)
    g.clocks_event_reasons = n;
  if (a.get_energy && a.get_energy(dev, &n) == NVML_SUCCESS) g.energy_mj = n;
  g.nvlink = read_nvlink(a, dev);
}

void read_processes(const NvmlLibrary::Api& a, nvmlDevice_t dev, GpuReading& g) {
  if (!a.get_processes) return;
  std::vector<nvmlProcessInfo_t> infos(proto::health_limits::kProcesses);
  unsigned int count = static_cast<unsigned int>(infos.size());
  nvmlReturn_t rc = a.get_processes(dev, &count, infos.data());
  // More than the sample keeps: the first ones are enough to show.
  if (rc == NVML_ERROR_INSUFFICIENT_SIZE) {
    infos.resize(std::min<unsigned int>(count + 8, 4096));
    count = static_cast<unsigned int>(infos.size());
    rc = a.get_processes(dev, &count, infos.data());
  }
  if (rc != NVML_SUCCESS) return;
  for (unsigned int i = 0;
       i < count && i < infos.size() && g.processes.size() < proto::health_limits::kProcesses;
       ++i) {
    proto::GpuProcessSample p;
    p.pid = infos[i].pid;
    if (infos[i].usedGpuMemory != NVML_VALUE_NOT_AVAILABLE)
      p.used_memory_mib = whole_mib(infos[i].usedGpuMemory);
    char name[256] = {};
    if (a.process_name && a.process_name(p.pid, name, sizeof name) == NVML_SUCCESS) {
      name[sizeof name - 1] = '\0';
      p.name = name;
    }
    g.processes.push_back(std::move(p));
  }
}

}  // namespace

Result<GpuReport> NvmlLibrary::read(nlohmann::json* raw) {
  const Api& a = *api_;
  GpuReport report;
  report.source = "nvml";
  char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  if (nvmlReturn_t rc = a.driver_version(version, sizeof version); rc == NVML_SUCCESS)
    report.driver_version = version;
  int cuda = 0;
  if (a.cuda_version && a.cuda_version(&cuda) == NVML_SUCCESS && cuda > 0)
    report.cuda_driver_version =
        std::to_string(cuda / 1000) + "." + std::to_string(cuda % 1000 / 10);
  unsigned int count = 0;
  if (nvmlReturn_t rc = a.get_count(&count); rc != NVML_SUCCESS)
    return Error(Errc::failed_precondition, "nvmlDeviceGetCount_v2 failed: " + a.describe(rc));
  if (raw) *raw = nlohmann::json::array();
  if (seen_.size() < count) seen_.resize(std::min<std::size_t>(count, proto::health_limits::kGpus));
  for (unsigned int i = 0; i < count && i < proto::health_limits::kGpus; ++i) {
    GpuReading g;
    g.index = static_cast<int>(i);
    // A card that fell off the bus: what it was, and that it is lost. Its
    // other figures are unknown; the other cards are still read.
    auto lost = [&] {
      g.lost = true;
      g.name = seen_[i].name;
      g.uuid = seen_[i].uuid;
      g.pci_bus_id = seen_[i].pci_bus_id;
      g.serial = seen_[i].serial;
      g.minor_number = seen_[i].minor_number;
      report.gpus.push_back(std::move(g));
    };
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t rc = a.get_handle(i, &dev); rc != NVML_SUCCESS) {
      if (rc == NVML_ERROR_GPU_IS_LOST) {
        lost();
        continue;
      }
      return Error(Errc::failed_precondition, "nvmlDeviceGetHandleByIndex_v2(" + std::to_string(i) +
                                                  ") failed: " + a.describe(rc));
    }
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    nvmlReturn_t name_rc = a.get_name(dev, name, sizeof name);
    if (name_rc == NVML_ERROR_GPU_IS_LOST) {
      lost();
      continue;
    }
    if (name_rc == NVML_SUCCESS) g.name = name;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (a.get_uuid(dev, uuid, sizeof uuid) == NVML_SUCCESS) g.uuid = uuid;
    nvmlPciInfo_t pci{};
    if (a.get_pci(dev, &pci) == NVML_SUCCESS) {
      pci.busId[sizeof pci.busId - 1] = '\0';
      g.pci_bus_id = pci.busId;
    }
    unsigned int u = 0;
    if (a.get_minor && a.get_minor(dev, &u) == NVML_SUCCESS) g.minor_number = static_cast<int>(u);
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE] = {};
    if (a.get_serial && a.get_serial(dev, serial, sizeof serial) == NVML_SUCCESS) {
      serial[sizeof serial - 1] = '\0';
      g.serial = serial;
    }
    seen_[i] = {g.name, g.uuid, g.pci_bus_id, g.serial, g.minor_number};
    nlohmann::json raw_gpu = nlohmann::json::object();
    read_memory(a, dev, g, raw ? &raw_gpu : nullptr);
    if (raw) raw->push_back({{"index", i}, {"uuid", g.uuid}, {"memory", raw_gpu}});
    if (a.get_temperature && a.get_temperature(dev, NVML_TEMPERATURE_GPU, &u) == NVML_SUCCESS)
      g.temperature_c = static_cast<int>(u);
    g.memory_temperature_c = field_int(a, dev, NVML_FI_DEV_MEMORY_TEMP);
    nvmlUtilization_t util{};
    if (a.get_utilization && a.get_utilization(dev, &util) == NVML_SUCCESS) {
      g.utilization_percent = static_cast<int>(util.gpu);
      g.memory_utilization_percent = static_cast<int>(util.memory);
    }
    // NVML speaks milliwatts; nvidia-smi prints watts with two decimals.
    if (a.get_power && a.get_power(dev, &u) == NVML_SUCCESS) g.power_draw_w = u / 1000.0;
    if (a.get_power_limit && a.get_power_limit(dev, &u) == NVML_SUCCESS)
      g.power_limit_w = u / 1000.0;
    else if (a.get_enforced_power_limit && a.get_enforced_power_limit(dev, &u) == NVML_SUCCESS)
      g.power_limit_w = u / 1000.0;
    if (a.get_clock && a.get_clock(dev, NVML_CLOCK_SM, &u) == NVML_SUCCESS)
      g.sm_clock_mhz = static_cast<int>(u);
    if (a.get_clock && a.get_clock(dev, NVML_CLOCK_MEM, &u) == NVML_SUCCESS)
      g.memory_clock_mhz = static_cast<int>(u);
    int ps = NVML_PSTATE_UNKNOWN;
    if (a.get_pstate && a.get_pstate(dev, &ps) == NVML_SUCCESS && ps >= 0 && ps <= 15)
      g.pstate = "P" + std::to_string(ps);
    unsigned long long ecc = 0;
    // Not supported (ECC off, a consumer card): unknown, as nvidia-smi's N/A.
    if (a.get_ecc &&
        a.get_ecc(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &ecc) == NVML_SUCCESS)
      g.ecc_errors_uncorrected_volatile = ecc;
    unsigned int mig = 0, mig_pending = 0;
    if (a.get_mig_mode && a.get_mig_mode(dev, &mig, &mig_pending) == NVML_SUCCESS)
      g.mig_mode = mig == NVML_DEVICE_MIG_ENABLE ? "Enabled" : "Disabled";
    read_faults(a, dev, g);
    read_processes(a, dev, g);
    report.gpus.push_back(std::move(g));
  }
  return report;
}

Result<std::unique_ptr<NvmlEventSet>> NvmlLibrary::watch_events() {
  const Api& a = *api_;
  if (!a.event_set_create || !a.register_events || !a.event_set_wait || !a.event_set_free)
    return Error(Errc::failed_precondition, path_ +
                                                " has no event calls (nvmlEventSetCreate, "
                                                "nvmlDeviceRegisterEvents, nvmlEventSetWait)");
  std::unique_ptr<NvmlEventSet> set(new NvmlEventSet());
  set->api_ = api_.get();
  nvmlEventSet_t es = nullptr;
  if (nvmlReturn_t rc = a.event_set_create(&es); rc != NVML_SUCCESS)
    return Error(Errc::failed_precondition, "nvmlEventSetCreate failed: " + a.describe(rc));
  set->set_ = es;
  unsigned int count = 0;
  if (nvmlReturn_t rc = a.get_count(&count); rc != NVML_SUCCESS)
    return Error(Errc::failed_precondition, "nvmlDeviceGetCount_v2 failed: " + a.describe(rc));
  constexpr unsigned long long wanted = nvmlEventTypeXidCriticalError |
                                        nvmlEventTypeSingleBitEccError |
                                        nvmlEventTypeDoubleBitEccError;
  bool any = false;
  std::string errors;
  for (unsigned int i = 0; i < count && i < proto::health_limits::kGpus; ++i) {
    NvmlEventSet::Registration reg;
    reg.index = static_cast<int>(i);
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t rc = a.get_handle(i, &dev); rc != NVML_SUCCESS) {
      reg.error = "nvmlDeviceGetHandleByIndex_v2: " + a.describe(rc);
    } else {
      char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
      if (a.get_uuid(dev, uuid, sizeof uuid) == NVML_SUCCESS) reg.uuid = uuid;
      unsigned long long supported = wanted;
      // Without the query, ask for all three and let registration say.
      if (a.supported_events) {
        if (a.supported_events(dev, &supported) != NVML_SUCCESS) supported = wanted;
      }
      reg.supported = supported;
      unsigned long long types = supported & wanted;
      nvmlReturn_t reg_rc = types ? a.register_events(dev, types, es) : NVML_ERROR_NOT_SUPPORTED;
      // A card without ECC events (ECC off) still has Xid events.
      if (reg_rc == NVML_ERROR_NOT_SUPPORTED && (types & nvmlEventTypeXidCriticalError) &&
          types != nvmlEventTypeXidCriticalError) {
        types = nvmlEventTypeXidCriticalError;
        reg_rc = a.register_events(dev, types, es);
      }
      if (reg_rc == NVML_SUCCESS) {
        reg.registered = types;
        any = true;
      } else {
        reg.error = "nvmlDeviceRegisterEvents: " + a.describe(reg_rc);
      }
    }
    if (!reg.error.empty())
      errors += (errors.empty() ? "" : "; ") + ("GPU " + std::to_string(i) + ": " + reg.error);
    set->devices_.push_back(dev);
    set->registrations_.push_back(std::move(reg));
  }
  if (!any)
    return Error(Errc::failed_precondition,
                 count == 0 ? std::string("NVML sees no GPU to watch")
                            : "no GPU's events could be registered (" + errors + ")");
  return set;
}

NvmlEventSet::~NvmlEventSet() {
  if (set_ && api_ && api_->event_set_free) api_->event_set_free(static_cast<nvmlEventSet_t>(set_));
}

Result<std::optional<NvmlEvent>> NvmlEventSet::wait(std::chrono::milliseconds timeout) {
  nvmlEventData_t data{};
  auto ms = static_cast<unsigned int>(std::clamp<long long>(timeout.count(), 0, 1'000'000));
  nvmlReturn_t rc = api_->event_set_wait(static_cast<nvmlEventSet_t>(set_), &data, ms);
  if (rc == NVML_ERROR_TIMEOUT) return std::optional<NvmlEvent>();
  if (rc == NVML_ERROR_GPU_IS_LOST)
    return Error(Errc::unavailable, "nvmlEventSetWait: " + api_->describe(rc));
  if (rc != NVML_SUCCESS)
    return Error(Errc::failed_precondition, "nvmlEventSetWait: " + api_->describe(rc));
  NvmlEvent e;
  e.type = data.eventType;
  for (std::size_t i = 0; i < devices_.size(); ++i)
    if (devices_[i] == static_cast<void*>(data.device)) {
      e.gpu_index = registrations_[i].index;
      e.uuid = registrations_[i].uuid;
    }
  if (data.eventType & nvmlEventTypeXidCriticalError) {
    e.kind = NvmlEvent::Kind::xid;
    e.xid = data.eventData;
  } else if (data.eventType & nvmlEventTypeDoubleBitEccError) {
    e.kind = NvmlEvent::Kind::ecc_uncorrected;
  } else if (data.eventType & nvmlEventTypeSingleBitEccError) {
    e.kind = NvmlEvent::Kind::ecc_corrected;
  }
  return std::optional<NvmlEvent>(std::move(e));
}

std::vector<std::string> nvml_library_candidates(const GuestEnv& env) {
  if (env.root == "/" || env.root.empty()) return {"libnvidia-ml.so.1"};
  std::vector<std::string> out;
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib",
                          "/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64"})
    out.push_back((env.path(dir) / "libnvidia-ml.so.1").string());
  return out;
}

namespace {

struct KeptNvml {
  std::mutex mu;
  std::vector<std::string> candidates;
  std::unique_ptr<NvmlLibrary> lib;
};

// Never destroyed: at exit a thread may still be inside a wedged NVML, and
// an nvmlShutdown from a static destructor would wait on it.
KeptNvml& kept_nvml() {
  static auto* kept = new KeptNvml();
  return *kept;
}

}  // namespace

Result<GpuReport> read_gpus_via_nvml(const GuestEnv& env, nlohmann::json* raw) {
  auto candidates = nvml_library_candidates(env);
  KeptNvml& kept = kept_nvml();
  std::unique_lock lock(kept.mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    auto lib = NvmlLibrary::load(candidates);
    if (!lib) return lib.error();
    return (*lib)->read(raw);
  }
  if (!kept.lib || kept.candidates != candidates) {
    kept.lib.reset();
    auto lib = NvmlLibrary::load(candidates);
    if (!lib) return lib.error();
    kept.lib = std::move(*lib);
    kept.candidates = std::move(candidates);
  }
  auto report = kept.lib->read(raw);
  if (!report) kept.lib.reset();
  return report;
}

}  // namespace factory::agent
