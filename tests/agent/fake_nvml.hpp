#pragma once
// A stand-in libnvidia-ml.so.1 for tests, compiled with the system's C
// compiler into a test's own directory: the loader's dlopen/dlsym/ABI path
// on struct layouts typed out independently of agent/health/nvml.cpp (the
// real library is exercised on the device machine).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/test_support.hpp"

namespace factory::agent {

// A stand-in libnvidia-ml.so.1 compiled here (C, the nvml.h layouts typed
// out independently of nvml.cpp), answering with an H200's values: the
// 2026-12-01 capture's (h200-passthrough-vm/2026-12-01: 143771 MiB total,
// Reserved 616 MiB, Used 0, Free 143156, 35 C, memory 33 C, 121.85 W of
// 700 W, 525 / 3201 MHz, P0, MIG disabled). The memory byte counts are the
// real NVML's on that machine (tests/fixtures/device/h200-2026-12-01b,
// `factory-agent health --raw`): v1 counts the reserved 644939776 B as used
// (the old agent's memory_used_mib 615), v2 splits it out; nvidia-smi
// printed them rounded up to Reserved 616 MiB, Free 143156 MiB.
inline const char* kFakeNvml = R"C(
#include <string.h>
#include <unistd.h>
#define MIB 1048576ULL
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem2_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gi, ci; } proc_t;
typedef struct { unsigned int fieldId, scopeId; long long timestamp, latencyUsec; int valueType, nvmlReturn; union { double d; unsigned int ui; unsigned long long ull; } value; } field_t;
static int inited;
int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
const char* nvmlErrorString(int r) { return r ? "Unknown Error" : "Success"; }
int nvmlSystemGetCudaDriverVersion_v2(int* v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned int* n) { if (!inited) return 1; *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** d) { if (i) return 2; *d = (void*)0x1; return 0; }
int nvmlDeviceGetName(void* d, char* b, unsigned int n) { strncpy(b, "NVIDIA H200", n); return 0; }
int nvmlDeviceGetUUID(void* d, char* b, unsigned int n) { strncpy(b, "GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2", n); return 0; }
int nvmlDeviceGetMinorNumber(void* d, unsigned int* m) { *m = 0; return 0; }
int nvmlDeviceGetMemoryInfo(void* d, mem_t* m) { m->total = 150754820096ULL; m->free = 150109880320ULL; m->used = 644939776ULL; return 0; }
int nvmlDeviceGetMemoryInfo_v2(void* d, mem2_t* m) { if (m->version != (sizeof(mem2_t) | (2u << 24))) return 25; m->total = 150754820096ULL; m->reserved = 644939776ULL; m->used = 0; m->free = 150109880320ULL; return 0; }
int nvmlSystemGetDriverVersion(char* b, unsigned int n) { strncpy(b, "580.159.04", n); return 0; }
int nvmlDeviceGetPciInfo_v3(void* d, pci_t* p) { memset(p, 0, sizeof *p); strcpy(p->busId, "00000000:00:06.0"); p->pciDeviceId = 0x233510DE; return 0; }
int nvmlDeviceGetTemperature(void* d, int s, unsigned int* t) { HANG *t = 35; return 0; }
int nvmlDeviceGetFieldValues(void* d, int n, field_t* f) { if (f->fieldId != 82) { f->nvmlReturn = 3; return 0; } f->valueType = 1; f->value.ui = 33; f->nvmlReturn = 0; return 0; }
int nvmlDeviceGetUtilizationRates(void* d, util_t* u) { u->gpu = 0; u->memory = 0; return 0; }
int nvmlDeviceGetPowerUsage(void* d, unsigned int* mw) { *mw = 121850; return 0; }
int nvmlDeviceGetPowerManagementLimit(void* d, unsigned int* mw) { *mw = 700000; return 0; }
int nvmlDeviceGetClockInfo(void* d, int type, unsigned int* mhz) { *mhz = type == 1 ? 525 : type == 2 ? 3201 : 0; return 0; }
int nvmlDeviceGetPerformanceState(void* d, int* p) { *p = 0; return 0; }
int nvmlDeviceGetTotalEccErrors(void* d, int type, int counter, unsigned long long* n) { *n = 0; return 0; }
int nvmlDeviceGetMigMode(void* d, unsigned int* cur, unsigned int* pend) { *cur = 0; *pend = 0; return 0; }
int nvmlDeviceGetComputeRunningProcesses_v3(void* d, unsigned int* n, proc_t* p) { if (*n < 1) { *n = 1; return 7; } *n = 1; p[0].pid = 4242; p[0].usedGpuMemory = 1024 * MIB; return 0; }
int nvmlSystemGetProcessName(unsigned int pid, char* b, unsigned int n) { strncpy(b, "python3", n); return 0; }
)C";

// The stand-in with a line taken out (a symbol an older driver lacks), or
// its HANG hook set (a driver that never answers).
inline std::string fake_nvml_source(const std::string& without = "", const std::string& hang = "") {
  std::string src = kFakeNvml;
  if (!without.empty()) {
    auto at = src.find(without);
    EXPECT_NE(at, std::string::npos) << without;
    src.erase(at, src.find('\n', at) - at);
  }
  auto h = src.find("HANG");
  src.replace(h, 4, hang);
  return src;
}

inline std::string build_fake_nvml(const std::filesystem::path& dir, const std::string& source) {
  auto src = dir / "fake_nvml.c";
  std::ofstream(src) << source;
  auto so = dir / "libnvidia-ml.so.1";
  auto r = factory::testing::run({"cc", "-shared", "-fPIC", "-o", so.string(), src.string()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return so.string();
}

// Puts the stand-in where an agent with this guest root looks for NVML.
inline void install_fake_nvml(const std::filesystem::path& root, const std::string& so) {
  std::filesystem::create_directories(root / "usr/lib/x86_64-linux-gnu");
  std::filesystem::copy_file(so, root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                             std::filesystem::copy_options::overwrite_existing);
}

}  // namespace factory::agent
