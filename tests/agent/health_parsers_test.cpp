// nvidia-smi parsers on REAL captures (tests/fixtures/real/), and the NVML
// loader: failing cleanly where libnvidia-ml is absent (as on this machine),
// and reading through a stand-in libnvidia-ml built here from the struct
// layouts of nvml.h (it checks the loader's dlopen/dlsym/ABI path, not NVIDIA's
// library; the real one is exercised on the device machine).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "agent/guest/nvidia_smi.hpp"
#include "agent/health/nvml.hpp"
#include "tests/support/test_support.hpp"

namespace factory::agent {
namespace {

using factory::testing::fixtures_dir;
using factory::testing::slurp;

// A section of the third-party capture: the output under "# <title>".
std::string capture_section(const std::string& title) {
  std::string text = slurp(fixtures_dir() / "third-party/nvidia_gpu_exporter-h200-capture.txt");
  auto at = text.find("# " + title + "\n");
  EXPECT_NE(at, std::string::npos) << title;
  if (at == std::string::npos) return "";
  auto body = text.find("####\n", at);  // the banner line after "# $ command"
  body = text.find('\n', body) + 1;
  auto end = text.find("\n\n\n####", body);
  return text.substr(body, end == std::string::npos ? std::string::npos : end - body + 1);
}

std::vector<std::string> split_fields(const std::string& csv) {
  std::vector<std::string> out;
  std::stringstream ss(csv);
  std::string f;
  while (std::getline(ss, f, ',')) out.push_back(f);
  return out;
}

TEST(NvidiaSmiCsv, H200CaptureNoHeader) {
  // h200-passthrough-vm/nvidia-smi.txt: the csv line of a real H200 VM. The
  // capture does not list its --query-gpu fields; the first 16 are read off
  // the values and corroborated by the same machine's -q -x (uuid, name,
  // bus id, driver, fb total/used/free 143771/0/143156 MiB, gpu_temp 39 C,
  // power 128.5 W of 700 W, sm 1980 MHz, mem 3201 MHz, P0); the last three
  // are not identified and are ignored by the parser.
  std::string text = slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi.txt");
  std::string line;
  std::istringstream in(text);
  std::string csv;
  while (std::getline(in, line))
    if (line.rfind("0, GPU-", 0) == 0) csv = line + "\n";
  ASSERT_FALSE(csv.empty());
  std::vector<std::string> fields = split_fields(
      "index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,memory.free,"
      "utilization.gpu,utilization.memory,temperature.gpu,power.draw,power.limit,clocks.sm,"
      "clocks.mem,pstate,unknown.17,unknown.18,unknown.19");
  auto r = parse_nvidia_smi_csv(csv, fields);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "580.159.04");
  ASSERT_EQ(r->gpus.size(), 1u);
  const auto& g = r->gpus[0];
  EXPECT_EQ(g.index, 0);
  EXPECT_EQ(g.name, "NVIDIA H200");
  EXPECT_EQ(g.uuid, "GPU-0108b095-397f-7583-e087-ade158522fa2");
  EXPECT_EQ(g.pci_bus_id, "00000000:00:06.0");
  EXPECT_EQ(g.memory_total_mib, 143771u);
  EXPECT_EQ(g.memory_used_mib, 0u);
  EXPECT_EQ(g.temperature_c, 39);
  EXPECT_EQ(g.utilization_percent, 0);

  auto j = r->to_json();
  EXPECT_EQ(j["source"], "nvidia-smi");
  EXPECT_EQ(j["gpus"][0]["memory_total_mib"], 143771);
  EXPECT_EQ(j["gpus"][0]["pci_bus_id"], "00000000:00:06.0");
}

TEST(NvidiaSmiCsv, WrongValueCountIsAnError) {
  auto r = parse_nvidia_smi_csv("NVIDIA L4, 23034\n", nvidia_smi_query_fields());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::protocol);
  EXPECT_NE(r.error().message.find("expected 9"), std::string::npos) << r.error().message;
}

TEST(NvidiaSmiCsv, OurQueryArguments) {
  auto args = nvidia_smi_query_args();
  ASSERT_EQ(args.size(), 2u);
  EXPECT_EQ(args[0],
            "--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,driver_version,"
            "temperature.gpu,utilization.gpu");
  EXPECT_EQ(args[1], "--format=csv,noheader,nounits");
}

TEST(NvidiaSmiCsv, ThirdPartyH200WithHeaderIdleAndLoad) {
  // nvidia_gpu_exporter's H200 capture: --format=csv with units and its
  // 200-odd field header, [N/A] and [Requested functionality ...] values.
  auto idle = parse_nvidia_smi_csv_with_header(
      capture_section("idle :: query-gpu (csv, what the exporter parses)"));
  ASSERT_TRUE(idle) << idle.error().message;
  EXPECT_EQ(idle->driver_version, "590.48.01");
  ASSERT_EQ(idle->gpus.size(), 1u);
  EXPECT_EQ(idle->gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(idle->gpus[0].pci_bus_id, "00000000:83:00.0");
  EXPECT_EQ(idle->gpus[0].memory_total_mib, 143771u);
  EXPECT_EQ(idle->gpus[0].memory_used_mib, 0u);

  auto load = parse_nvidia_smi_csv_with_header(
      capture_section("load :: query-gpu (csv, what the exporter parses)"));
  ASSERT_TRUE(load) << load.error().message;
  ASSERT_EQ(load->gpus.size(), 1u);
  EXPECT_EQ(load->gpus[0].utilization_percent, 100);
  EXPECT_GT(load->gpus[0].memory_used_mib.value_or(0), 30000u);
  EXPECT_EQ(load->gpus[0].temperature_c, 52);
}

TEST(NvidiaSmiXml, H200Capture) {
  auto r = parse_nvidia_smi_xml(slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi-q-x.xml"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "580.159.04");
  ASSERT_EQ(r->gpus.size(), 1u);
  const auto& g = r->gpus[0];
  EXPECT_EQ(g.name, "NVIDIA H200");
  EXPECT_EQ(g.uuid, "GPU-0108b095-397f-7583-e087-ade158522fa2");
  EXPECT_EQ(g.pci_bus_id, "00000000:00:06.0");
  EXPECT_EQ(g.memory_total_mib, 143771u);  // fb_memory_usage, not bar1 (262144)
  EXPECT_EQ(g.memory_used_mib, 0u);
  EXPECT_EQ(g.temperature_c, 39);
  EXPECT_EQ(g.utilization_percent, 0);
}

TEST(NvidiaSmiXml, GarbageIsAProtocolError) {
  auto r = parse_nvidia_smi_xml("<nvidia_smi_log><gpu>");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::protocol);
  auto other = parse_nvidia_smi_xml("<?xml version=\"1.0\"?><something/>");
  ASSERT_FALSE(other);
}

TEST(NvidiaSmiTable, RunbookL4IdleKmdHeader) {
  // The runbook's guest prints the newer "KMD Version:" header.
  auto r = parse_nvidia_smi_table(slurp(fixtures_dir() / "l4-runbook/tenant1-nvidia-smi-idle.txt"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "615.71.09");
  ASSERT_EQ(r->gpus.size(), 1u);
  EXPECT_EQ(r->gpus[0].name, "NVIDIA L4");
  EXPECT_EQ(r->gpus[0].pci_bus_id, "00000000:09:00.0");
  EXPECT_EQ(r->gpus[0].memory_total_mib, 23034u);
  EXPECT_EQ(r->gpus[0].memory_used_mib, 0u);
  EXPECT_EQ(r->gpus[0].temperature_c, 47);
  EXPECT_EQ(r->gpus[0].utilization_percent, 0);
}

TEST(NvidiaSmiTable, RunbookL4WithOllamaLoadedStopsAtProcesses) {
  auto r = parse_nvidia_smi_table(
      slurp(fixtures_dir() / "l4-runbook/tenant1-nvidia-smi-ollama-loaded.txt"));
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->gpus.size(), 1u);  // the process row is not a GPU
  EXPECT_EQ(r->gpus[0].memory_used_mib, 1670u);
  EXPECT_EQ(r->gpus[0].temperature_c, 51);
}

TEST(NvidiaSmiTable, HamiPodSeesItsLimit) {
  auto r = parse_nvidia_smi_table(
      slurp(fixtures_dir() / "l4-runbook/tenant2-pod-nvidia-smi-hami-1024MiB.txt"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "580.126.20");
  ASSERT_EQ(r->gpus.size(), 1u);
  EXPECT_EQ(r->gpus[0].memory_total_mib, 1024u);
}

TEST(NvidiaSmiTable, H200DriverVersionHeader) {
  auto r = parse_nvidia_smi_table(slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi.txt"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "580.159.04");
  ASSERT_EQ(r->gpus.size(), 1u);
  EXPECT_EQ(r->gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(r->gpus[0].memory_total_mib, 143771u);

  auto load = parse_nvidia_smi_table(capture_section("load :: nvidia-smi (default table)"));
  ASSERT_TRUE(load) << load.error().message;
  ASSERT_EQ(load->gpus.size(), 1u);
  EXPECT_EQ(load->gpus[0].memory_used_mib, 32362u);
  EXPECT_EQ(load->gpus[0].utilization_percent, 100);
}

TEST(NvidiaSmiTable, NoHeaderIsAnError) {
  auto r = parse_nvidia_smi_table(
      "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n");
  ASSERT_FALSE(r);
}

TEST(NvidiaSmiList, H200AndL4) {
  auto h = parse_nvidia_smi_list(slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi.txt"));
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].name, "NVIDIA H200");
  EXPECT_EQ(h[0].uuid, "GPU-0108b095-397f-7583-e087-ade158522fa2");
  auto l =
      parse_nvidia_smi_list("GPU 0: NVIDIA L4 (UUID: GPU-69f37bdd-70f5-800e-2a0d-8249c9b1cb41)\n");
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].name, "NVIDIA L4");
}

// --- NVML

TEST(Nvml, AbsentLibraryFailsCleanly) {
  // No libnvidia-ml on this machine (and none under a simulated root).
  auto lib = NvmlLibrary::load({"libnvidia-ml.so.1"});
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.error().code, Errc::not_found);
  EXPECT_NE(lib.error().message.find("NVML is not installed"), std::string::npos)
      << lib.error().message;
  EXPECT_NE(lib.error().message.find("libnvidia-ml.so.1"), std::string::npos)
      << lib.error().message;

  factory::testing::TempDir dir("nvml");
  GuestEnv env;
  env.root = dir.path();
  auto cands = nvml_library_candidates(env);
  ASSERT_FALSE(cands.empty());
  for (const auto& c : cands) EXPECT_EQ(c.rfind(dir.path().string(), 0), 0u) << c;
  auto r = read_gpus_via_nvml(env);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::not_found);
}

TEST(Nvml, RealRootUsesTheDynamicLoader) {
  GuestEnv env;  // root "/"
  auto cands = nvml_library_candidates(env);
  ASSERT_EQ(cands.size(), 1u);
  EXPECT_EQ(cands[0], "libnvidia-ml.so.1");
}

// A stand-in libnvidia-ml.so.1 compiled here (C, the nvml.h layouts typed
// out independently of nvml.cpp), answering with the real H200 VM's values
// (h200-passthrough-vm/: driver 580.159.04, 150754820096 bytes from
// host-facts.txt's pynvml reading, 39 C).
const char* kFakeNvml = R"C(
#include <string.h>
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;
typedef struct { unsigned int gpu, memory; } util_t;
static int inited;
int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
const char* nvmlErrorString(int r) { return r ? "Unknown Error" : "Success"; }
int nvmlDeviceGetCount_v2(unsigned int* n) { if (!inited) return 1; *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** d) { if (i) return 2; *d = (void*)0x1; return 0; }
int nvmlDeviceGetName(void* d, char* b, unsigned int n) { strncpy(b, "NVIDIA H200", n); return 0; }
int nvmlDeviceGetUUID(void* d, char* b, unsigned int n) { strncpy(b, "GPU-0108b095-397f-7583-e087-ade158522fa2", n); return 0; }
int nvmlDeviceGetMemoryInfo(void* d, mem_t* m) { m->total = 150754820096ULL; m->used = 0; m->free = m->total; return 0; }
int nvmlSystemGetDriverVersion(char* b, unsigned int n) { strncpy(b, "580.159.04", n); return 0; }
int nvmlDeviceGetPciInfo_v3(void* d, pci_t* p) { memset(p, 0, sizeof *p); strcpy(p->busId, "00000000:00:06.0"); p->pciDeviceId = 0x233510DE; return 0; }
int nvmlDeviceGetTemperature(void* d, int s, unsigned int* t) { *t = 39; return 0; }
int nvmlDeviceGetUtilizationRates(void* d, util_t* u) { u->gpu = 0; u->memory = 0; return 0; }
)C";

std::string build_fake_nvml(const std::filesystem::path& dir, const std::string& source) {
  auto src = dir / "fake_nvml.c";
  std::ofstream(src) << source;
  auto so = dir / "libnvidia-ml.so.1";
  auto r = factory::testing::run({"cc", "-shared", "-fPIC", "-o", so.string(), src.string()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return so.string();
}

TEST(Nvml, ReadsThroughAStandInLibrary) {
  factory::testing::TempDir dir("nvml");
  auto so = build_fake_nvml(dir.path(), kFakeNvml);
  auto lib = NvmlLibrary::load({(dir.path() / "absent.so").string(), so});
  ASSERT_TRUE(lib) << lib.error().message;
  EXPECT_EQ((*lib)->path(), so);
  auto r = (*lib)->read();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->source, "nvml");
  EXPECT_EQ(r->driver_version, "580.159.04");
  ASSERT_EQ(r->gpus.size(), 1u);
  EXPECT_EQ(r->gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(r->gpus[0].uuid, "GPU-0108b095-397f-7583-e087-ade158522fa2");
  EXPECT_EQ(r->gpus[0].pci_bus_id, "00000000:00:06.0");
  EXPECT_EQ(r->gpus[0].memory_total_mib, 143771u);  // 150754820096 / 2^20
  EXPECT_EQ(r->gpus[0].temperature_c, 39);

  // Under a simulated root, the library is found in the root's lib directory.
  GuestEnv env;
  env.root = dir.path() / "root";
  std::filesystem::create_directories(env.root / "usr/lib/x86_64-linux-gnu");
  std::filesystem::copy_file(so, env.root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
  auto via_root = read_gpus_via_nvml(env);
  ASSERT_TRUE(via_root) << via_root.error().message;
  EXPECT_EQ(via_root->gpus.size(), 1u);
}

TEST(Nvml, MissingSymbolIsNamed) {
  factory::testing::TempDir dir("nvml");
  std::string partial = kFakeNvml;
  auto at = partial.find("int nvmlDeviceGetPciInfo_v3");
  partial.erase(at, partial.find('\n', at) - at);
  auto so = build_fake_nvml(dir.path(), partial);
  auto lib = NvmlLibrary::load({so});
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.error().code, Errc::failed_precondition);
  EXPECT_NE(lib.error().message.find("nvmlDeviceGetPciInfo_v3"), std::string::npos)
      << lib.error().message;
}

}  // namespace
}  // namespace factory::agent
