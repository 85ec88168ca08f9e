#pragma once
// A stand-in libnvidia-ml.so.1 for tests, compiled with the system's C
// compiler into a test's own directory: the loader's dlopen/dlsym/ABI path
// on struct layouts typed out independently of agent/health/nvml.cpp (the
// real library is exercised on the device machine).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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
//
// The faults a test injects come from a control file (fake_nvml_control()
// in the library's directory, FakeNvmlControl writes it), read at every
// call, so a running agent sees them change: one "key values..." per line,
// the last line of a key wins, a key absent is the healthy H200's answer:
//   lost 1                   nvmlDeviceGetHandleByIndex answers GPU_IS_LOST (15)
//   lost 2                   the handle works, the device calls answer 15
//   remapped C U P F         nvmlDeviceGetRemappedRows (default 0 0 0 0; no values: not supported)
//   retired S D P            retired pages by cause and pending (default: not supported, as Hopper)
//   replay N                 nvmlDeviceGetPcieReplayCounter (default 0)
//   reasons BITS             nvmlDeviceGetCurrentClocksEventReasons (default 0x1, idle)
//   energy MJ                nvmlDeviceGetTotalEnergyConsumption (default 123456789)
//   ecc CV CA UV UA          corrected / uncorrected, volatile / aggregate (default 0)
//   nvlink L F D R V         link count and the four error totals (default: no links)
//   event xid N | dbe | sbe | lost
//                            one event each, delivered once and in order by
//                            nvmlEventSetWait_v2 (lost: it answers 15); what was
//                            delivered is counted in <control>.delivered, so a
//                            restarted agent is not told twice
inline const char* kFakeNvml = R"C(
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define MIB 1048576ULL
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem2_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gi, ci; } proc_t;
typedef struct { unsigned int fieldId, scopeId; long long timestamp, latencyUsec; int valueType, nvmlReturn; union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; } value; } field_t;
typedef struct { void* device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId; } event_t;
/* Initializations not yet shut down: NVML counts them, and shuts down only
   when the count reaches zero (nvmlShutdown's documentation), so a watcher
   that lets go of the library leaves the probe's handle working; a
   shutdown more than the inits is not an error. */
static int inited;
/* The control file's values for key (at most n): their count, -1 when the key is absent. */
static int ctl(const char* key, unsigned long long* v, int n) {
  FILE* f = fopen(FAKE_NVML_CONTROL, "r");
  if (!f) return -1;
  char line[256]; int got = -1; size_t kl = strlen(key);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, kl) != 0 || (line[kl] != ' ' && line[kl] != '\n' && line[kl] != 0)) continue;
    char* p = line + kl; got = 0;
    while (got < n) { char* end; unsigned long long x = strtoull(p, &end, 0); if (end == p) break; v[got++] = x; p = end; }
  }
  fclose(f);
  return got;
}
static unsigned long long lost_mode(void) { unsigned long long v = 0; return ctl("lost", &v, 1) > 0 ? v : 0; }
int nvmlInit_v2(void) { __atomic_add_fetch(&inited, 1, __ATOMIC_SEQ_CST); return 0; }
int nvmlShutdown(void) { int n = __atomic_load_n(&inited, __ATOMIC_SEQ_CST); while (n > 0 && !__atomic_compare_exchange_n(&inited, &n, n - 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} return 0; }
const char* nvmlErrorString(int r) { return r == 15 ? "GPU is lost" : r == 10 ? "Timeout" : r ? "Unknown Error" : "Success"; }
int nvmlSystemGetCudaDriverVersion_v2(int* v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned int* n) { if (!__atomic_load_n(&inited, __ATOMIC_SEQ_CST)) return 1; *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** d) { if (i) return 2; if (lost_mode() == 1) return 15; *d = (void*)0x1; return 0; }
int nvmlDeviceGetName(void* d, char* b, unsigned int n) { if (lost_mode()) return 15; strncpy(b, "NVIDIA H200", n); return 0; }
int nvmlDeviceGetUUID(void* d, char* b, unsigned int n) { if (lost_mode()) return 15; strncpy(b, "GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2", n); return 0; }
int nvmlDeviceGetMinorNumber(void* d, unsigned int* m) { *m = 0; return 0; }
int nvmlDeviceGetSerial(void* d, char* b, unsigned int n) { if (lost_mode()) return 15; strncpy(b, "1654923011234", n); return 0; }
int nvmlDeviceGetMemoryInfo(void* d, mem_t* m) { m->total = 150754820096ULL; m->free = 150109880320ULL; m->used = 644939776ULL; return 0; }
int nvmlDeviceGetMemoryInfo_v2(void* d, mem2_t* m) { if (m->version != (sizeof(mem2_t) | (2u << 24))) return 25; m->total = 150754820096ULL; m->reserved = 644939776ULL; m->used = 0; m->free = 150109880320ULL; return 0; }
int nvmlSystemGetDriverVersion(char* b, unsigned int n) { strncpy(b, "580.159.04", n); return 0; }
int nvmlDeviceGetPciInfo_v3(void* d, pci_t* p) { memset(p, 0, sizeof *p); strcpy(p->busId, "00000000:00:06.0"); p->pciDeviceId = 0x233510DE; return 0; }
int nvmlDeviceGetTemperature(void* d, int s, unsigned int* t) { HANG *t = 35; return 0; }
/* One field: memory temperature (82) and, with an nvlink line, the link count (91) and the error totals (38, 45, 52, 59). */
static void field_one(field_t* f, const unsigned long long* l, int links) {
  f->nvmlReturn = 0; f->valueType = 3;
  switch (f->fieldId) {
    case 82: f->valueType = 1; f->value.ui = 33; return;
    case 91: if (links) { f->value.ull = l[0]; return; } break;
    case 38: if (links) { f->value.ull = l[1]; return; } break;
    case 45: if (links) { f->value.ull = l[2]; return; } break;
    case 52: if (links) { f->value.ull = l[3]; return; } break;
    case 59: if (links) { f->value.ull = l[4]; return; } break;
  }
  f->nvmlReturn = 3;
}
int nvmlDeviceGetFieldValues(void* d, int n, field_t* f) { unsigned long long l[5] = {0, 0, 0, 0, 0}; int links = ctl("nvlink", l, 5) == 5; for (int i = 0; i < n; ++i) field_one(&f[i], l, links); return 0; }
int nvmlDeviceGetUtilizationRates(void* d, util_t* u) { u->gpu = 0; u->memory = 0; return 0; }
int nvmlDeviceGetPowerUsage(void* d, unsigned int* mw) { *mw = 121850; return 0; }
int nvmlDeviceGetPowerManagementLimit(void* d, unsigned int* mw) { *mw = 700000; return 0; }
int nvmlDeviceGetClockInfo(void* d, int type, unsigned int* mhz) { *mhz = type == 1 ? 525 : type == 2 ? 3201 : 0; return 0; }
int nvmlDeviceGetPerformanceState(void* d, int* p) { *p = 0; return 0; }
int nvmlDeviceGetTotalEccErrors(void* d, int type, int counter, unsigned long long* n) { unsigned long long v[4] = {0, 0, 0, 0}; ctl("ecc", v, 4); *n = v[type * 2 + counter]; return 0; }
int nvmlDeviceGetMigMode(void* d, unsigned int* cur, unsigned int* pend) { *cur = 0; *pend = 0; return 0; }
int nvmlDeviceGetComputeRunningProcesses_v3(void* d, unsigned int* n, proc_t* p) { if (*n < 1) { *n = 1; return 7; } *n = 1; p[0].pid = 4242; p[0].usedGpuMemory = 1024 * MIB; return 0; }
int nvmlSystemGetProcessName(unsigned int pid, char* b, unsigned int n) { strncpy(b, "python3", n); return 0; }
int nvmlDeviceGetRemappedRows(void* d, unsigned int* c, unsigned int* u, unsigned int* p, unsigned int* f) { unsigned long long v[4] = {0, 0, 0, 0}; if (lost_mode()) return 15; if (ctl("remapped", v, 4) == 0) return 3; *c = v[0]; *u = v[1]; *p = v[2]; *f = v[3]; return 0; }
int nvmlDeviceGetRetiredPages(void* d, int cause, unsigned int* count, unsigned long long* a) { unsigned long long v[3]; if (ctl("retired", v, 3) != 3) return 3; unsigned int want = v[cause ? 1 : 0]; if (*count < want) { *count = want; return 7; } *count = want; return 0; }
int nvmlDeviceGetRetiredPagesPendingStatus(void* d, int* pending) { unsigned long long v[3]; if (ctl("retired", v, 3) != 3) return 3; *pending = v[2] ? 1 : 0; return 0; }
int nvmlDeviceGetPcieReplayCounter(void* d, unsigned int* n) { unsigned long long v = 0; ctl("replay", &v, 1); *n = (unsigned int)v; return 0; }
int nvmlDeviceGetCurrentClocksEventReasons(void* d, unsigned long long* r) { unsigned long long v = 0x1; ctl("reasons", &v, 1); *r = v; return 0; }
int nvmlDeviceGetTotalEnergyConsumption(void* d, unsigned long long* e) { unsigned long long v = 123456789ULL; ctl("energy", &v, 1); *e = v; return 0; }
/* Events. */
static unsigned long long registered;
int nvmlEventSetCreate(void** set) { *set = (void*)0x2; return 0; }
int nvmlDeviceGetSupportedEventTypes(void* d, unsigned long long* t) { if (lost_mode()) return 15; *t = 0xf; return 0; }
int nvmlDeviceRegisterEvents(void* d, unsigned long long types, void* set) { if (lost_mode()) return 15; registered |= types; return 0; }
int nvmlEventSetFree(void* set) { return 0; }
/* The next event line not delivered yet: 1 with its kind and value, else 0. */
static int next_event(char* kind, unsigned long long* val) {
  FILE* f = fopen(FAKE_NVML_CONTROL, "r");
  if (!f) return 0;
  char path[4096]; snprintf(path, sizeof path, "%s.delivered", FAKE_NVML_CONTROL);
  long done = 0; FILE* d = fopen(path, "r");
  if (d) { if (fscanf(d, "%ld", &done) != 1) done = 0; fclose(d); }
  char line[256]; long i = 0; int found = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "event ", 6) != 0) continue;
    if (i++ < done) continue;
    *val = 0;
    if (sscanf(line + 6, "%15s %llu", kind, val) >= 1) found = 1;
    break;
  }
  fclose(f);
  if (found) { d = fopen(path, "w"); if (d) { fprintf(d, "%ld\n", done + 1); fclose(d); } }
  return found;
}
int nvmlEventSetWait_v2(void* set, event_t* e, unsigned int ms) {
  for (unsigned int waited = 0;; waited += 5) {
    char kind[16] = {0}; unsigned long long v = 0;
    if (next_event(kind, &v)) {
      memset(e, 0, sizeof *e); e->device = (void*)0x1; e->gpuInstanceId = e->computeInstanceId = 0xFFFFFFFFu;
      if (!strcmp(kind, "lost")) return 15;
      if (!strcmp(kind, "xid")) { e->eventType = 0x8; e->eventData = v; }
      else if (!strcmp(kind, "dbe")) e->eventType = 0x2;
      else e->eventType = 0x1;
      return 0;
    }
    if (waited >= ms) return 10;
    usleep(5000);
  }
}
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

// Where the stand-in built in `dir` reads its control file.
inline std::filesystem::path fake_nvml_control(const std::filesystem::path& dir) {
  return dir / "fake-nvml.control";
}

inline std::string build_fake_nvml(const std::filesystem::path& dir, const std::string& source) {
  auto src = dir / "fake_nvml.c";
  std::ofstream(src) << source;
  auto so = dir / "libnvidia-ml.so.1";
  auto r = factory::testing::run({"cc", "-shared", "-fPIC",
                                  "-DFAKE_NVML_CONTROL=\"" + fake_nvml_control(dir).string() + "\"",
                                  "-o", so.string(), src.string()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return so.string();
}

// Writes the stand-in's control file (the keys above), whole and by rename,
// so the library never reads half of it.
class FakeNvmlControl {
 public:
  // Starts from what the file says already: two writers in turn add up.
  explicit FakeNvmlControl(std::filesystem::path file) : file_(std::move(file)) {
    std::ifstream in(file_);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) lines_.push_back(line);
  }
  // `key values`, replacing the key's line.
  void set(const std::string& key, const std::string& values) {
    drop(key);
    lines_.push_back(key + " " + values);
    write();
  }
  void clear(const std::string& key) {
    drop(key);
    write();
  }
  // One more event: "xid 79", "dbe", "sbe", "lost".
  void event(const std::string& what) {
    lines_.push_back("event " + what);
    write();
  }

 private:
  void drop(const std::string& key) {
    std::erase_if(lines_, [&](const std::string& l) { return l.rfind(key + " ", 0) == 0; });
  }
  void write() {
    auto tmp = file_;
    tmp += ".tmp";
    {
      std::ofstream out(tmp);
      for (const auto& l : lines_) out << l << "\n";
    }
    std::filesystem::rename(tmp, file_);
  }
  std::filesystem::path file_;
  std::vector<std::string> lines_;
};

// Puts the stand-in where an agent with this guest root looks for NVML.
inline void install_fake_nvml(const std::filesystem::path& root, const std::string& so) {
  std::filesystem::create_directories(root / "usr/lib/x86_64-linux-gnu");
  std::filesystem::copy_file(so, root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                             std::filesystem::copy_options::overwrite_existing);
}

}  // namespace factory::agent
