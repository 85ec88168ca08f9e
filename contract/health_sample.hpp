#pragma once
// One health sample: what a guest's GPU, its Ollama and its own cluster are
// doing now, as the agent sends it in a `health` frame (protocol.hpp) and the
// coordinator keeps it as the tenant's latest health. Health is state, not
// history: a sample replaces the one before, and one lost in an outage is
// superseded by the next, so it is never spooled nor stored as an event.
//
// Both sides use these types: the agent's collectors fill them and send
// to_json(); the coordinator reads a frame's body back with
// decode_health_sample(), which trusts nothing. Every string has a length
// cap and may hold no control characters (a terminal escape in a GPU name
// is an attack, not a typo), every list a size cap, every number a range.
// A field that breaks its rule is dropped (read as unknown) and counted by
// reason; the rest of the sample is kept.
//
// JSON (unknown values are null; keys marked ? only when they apply):
//   {"time": RFC 3339 (the agent's clock), "hostname", "plan_hash"?,
//    "gpu": {"source": "nvml"|"nvidia-smi"|"none", "driver_version",
//            "cuda_driver_version", "via"?, "error"?, "diagnoses"?,
//            "gpus": [{"index", "name", "uuid", "pci_bus_id", "minor_number",
//                      "memory_total_mib", "memory_used_mib", "memory_free_mib",
//                      "memory_reserved_mib", "utilization_percent",
//                      "memory_utilization_percent", "temperature_c",
//                      "memory_temperature_c", "power_draw_w", "power_limit_w",
//                      "sm_clock_mhz", "memory_clock_mhz", "pstate",
//                      "ecc_errors_uncorrected_volatile", "mig_mode",
//                      "processes": [{"pid", "name", "used_memory_mib"}],
//                      "serial", "lost", "ecc_errors_corrected_volatile",
//                      "ecc_errors_corrected_aggregate", "ecc_errors_uncorrected_aggregate",
//                      "remapped_rows_correctable", "remapped_rows_uncorrectable",
//                      "remapped_rows_pending", "remapped_rows_failure",
//                      "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending",
//                      "pcie_replay_count", "clocks_event_reasons", "energy_mj",
//                      "nvlink"?: {"links", "crc_flit_errors", "crc_data_errors",
//                                  "replay_errors", "recovery_errors"},
//                      "xids": [{"xid", "count", "first_at", "last_at"}]}]},
//    "ollama"?: {"version", "models": [{"name", "size", "size_vram",
//                "gpu_percent", "context_length", "expires_at"}], "error"?, "diagnoses"?},
//    "k8s"?: {"resource", "allocatable", "capacity",
//             "nodes": [{"name", "ready", "allocatable", "capacity", "gpu_label"}],
//             "pods": [{"namespace", "name", "phase", "status", "node", "gpus",
//                       "gpumem_mib", "gpumem_percentage"}], "error"?, "diagnoses"?},
//    "endpoint"?: {"serving", "requests", "served", "unauthorized", "refused_paths",
//                  "busy", "upstream_errors", "in_flight", "certificate_expires_at",
//                  "probe": {"model", "ok", "ttft_ms", "total_ms", "at", "error"} | null}}
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "contract/guest_input.hpp"

namespace factory::proto {

// The caps the coordinator enforces (and the agent keeps to when it builds
// a sample, so its own samples never lose a field).
namespace health_limits {
inline constexpr std::size_t kName = 128;      // GPU, model, node, pod, process names
inline constexpr std::size_t kShort = 64;      // versions, uuid, bus id, codes, states
inline constexpr std::size_t kText = 512;      // errors, summaries, fixes
inline constexpr std::size_t kDetails = 2048;  // a diagnosis's details, serialized
inline constexpr std::size_t kGpus = 16;
inline constexpr std::size_t kProcesses = 64;    // per GPU
inline constexpr std::size_t kMigInstances = 8;  // per GPU: a MIG card has at most 7
inline constexpr std::size_t kModels = 32;
inline constexpr std::size_t kNodes = 16;
inline constexpr std::size_t kPods = 128;
inline constexpr std::size_t kDiagnoses = 16;  // per section
inline constexpr std::size_t kXids = 16;       // per GPU: distinct Xids kept until acknowledged
// A sample's JSON, well inside the protocol's 64 KiB frame cap.
inline constexpr std::size_t kSampleBytes = 48 * 1024;
}  // namespace health_limits

struct DiagnosisSample {
  std::string code;  // [a-z][a-z0-9_]*: monitoring keys on it
  std::string summary;
  std::string fix;
  nlohmann::json details = nlohmann::json::object();
  nlohmann::json to_json() const;
};

struct GpuProcessSample {
  std::uint32_t pid = 0;
  std::string name;
  std::optional<std::uint64_t> used_memory_mib;
  nlohmann::json to_json() const;
};

// One MIG slice of a GPU in MIG mode: a GPU instance with its compute
// instance, as `nvidia-smi -L` lists it, with its memory from `-lgip`.
struct MigInstanceSample {
  std::string profile;               // "1g.18gb"
  std::optional<double> memory_gib;  // 16.00 on an H200's 1g.18gb
  std::string uuid;                  // "MIG-<uuid>"
  nlohmann::json to_json() const;
};

// One Xid the driver reported for a GPU (an NVML critical-error event),
// kept by the agent with when it was first and last seen and how often,
// until someone acknowledges it (agent/health/fault_book.hpp): an Xid that
// vanished at the next restart is the complaint about dcgm-exporter.
struct XidSample {
  int xid = 0;  // 1..999 (NVML reports 999 for an Xid it does not know)
  std::uint64_t count = 0;
  std::string first_at, last_at;  // RFC 3339, the agent's clock
  nlohmann::json to_json() const;
};

// NVLink error counters summed over the card's links (NVML's *_TOTAL
// fields); sent only for a card that has links.
struct NvlinkSample {
  std::optional<std::uint64_t> links;
  std::optional<std::uint64_t> crc_flit_errors, crc_data_errors, replay_errors, recovery_errors;
  nlohmann::json to_json() const;
};

// NVML's clock event (throttle) reason bits (nvml.h, nvmlClocksEventReason*).
namespace clocks_event {
inline constexpr std::uint64_t kGpuIdle = 0x1;
inline constexpr std::uint64_t kApplicationsClocksSetting = 0x2;
inline constexpr std::uint64_t kSwPowerCap = 0x4;
inline constexpr std::uint64_t kHwSlowdown = 0x8;
inline constexpr std::uint64_t kSyncBoost = 0x10;
inline constexpr std::uint64_t kSwThermalSlowdown = 0x20;
inline constexpr std::uint64_t kHwThermalSlowdown = 0x40;
inline constexpr std::uint64_t kHwPowerBrakeSlowdown = 0x80;
inline constexpr std::uint64_t kDisplayClockSetting = 0x100;
// Every bit NVML defines; a reading with others is not one.
inline constexpr std::uint64_t kAll = 0x1ff;
}  // namespace clocks_event

struct GpuSample {
  int index = 0;
  std::string name;        // "NVIDIA H200"
  std::string uuid;        // "GPU-0108b095-..."
  std::string pci_bus_id;  // "00000000:00:06.0" (nvidia-smi's 8-digit domain)
  // The board's serial number (NVML; nvidia-smi's Serial Number): the same
  // inside the VM and on the host, where the guest's bus id is not.
  std::string serial;
  std::optional<int> minor_number;  // /dev/nvidia<minor>
  // MiB as nvidia-smi prints them. used excludes reserved (NVML's v2 memory
  // info); total = reserved + used + free, give or take rounding.
  std::optional<std::uint64_t> memory_total_mib;
  std::optional<std::uint64_t> memory_used_mib;
  std::optional<std::uint64_t> memory_free_mib;
  std::optional<std::uint64_t> memory_reserved_mib;
  std::optional<int> utilization_percent;         // GPU busy, 0..100
  std::optional<int> memory_utilization_percent;  // memory controller busy, 0..100
  std::optional<int> temperature_c;
  std::optional<int> memory_temperature_c;
  std::optional<double> power_draw_w;
  std::optional<double> power_limit_w;
  std::optional<int> sm_clock_mhz;
  std::optional<int> memory_clock_mhz;
  std::string pstate;  // "P0".."P15"; "" unknown
  std::optional<std::uint64_t> ecc_errors_uncorrected_volatile;
  std::string mig_mode;  // "Enabled" | "Disabled" as nvidia-smi writes it; "" unknown / no MIG
  std::vector<GpuProcessSample> processes;       // compute processes using it
  std::vector<MigInstanceSample> mig_instances;  // in MIG mode; sent only when there are some

  // Faults. `lost`: NVML answered NVML_ERROR_GPU_IS_LOST (the card fell off
  // the bus): its other figures are unknown. A driver that does not answer
  // at all is the section's health_collector_hung instead.
  bool lost = false;
  // ECC error counts since the driver loaded (volatile) and over the card's
  // life (aggregate), DRAM and SRAM together as nvidia-smi -q totals them.
  std::optional<std::uint64_t> ecc_errors_corrected_volatile;
  std::optional<std::uint64_t> ecc_errors_corrected_aggregate;
  std::optional<std::uint64_t> ecc_errors_uncorrected_aggregate;
  // Row remapping (Ampere and later): rows remapped for correctable and
  // uncorrectable errors, a remapping waiting for a reset, one that failed.
  std::optional<std::uint64_t> remapped_rows_correctable;
  std::optional<std::uint64_t> remapped_rows_uncorrectable;
  std::optional<bool> remapped_rows_pending;
  std::optional<bool> remapped_rows_failure;
  // Dynamic page retirement (before Ampere; newer cards say not supported).
  std::optional<std::uint64_t> retired_pages_sbe;
  std::optional<std::uint64_t> retired_pages_dbe;
  std::optional<bool> retired_pages_pending;
  std::optional<std::uint64_t> pcie_replay_count;     // since the driver loaded
  std::optional<std::uint64_t> clocks_event_reasons;  // clocks_event:: bits
  std::optional<std::uint64_t> energy_mj;             // since the driver loaded, in millijoules
  std::optional<NvlinkSample> nvlink;                 // only a card with NVLinks
  std::vector<XidSample> xids;                        // not yet acknowledged, oldest first

  // The Xid seen last (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS), 0 when none.
  int last_xid() const;

  nlohmann::json to_json() const;
};

struct GpuSection {
  std::string source = "none";  // "nvml" | "nvidia-smi" | "none"
  std::string driver_version;
  std::string cuda_driver_version;  // "13.0"
  std::string via;                  // "chroot /run/nvidia/driver" when read that way
  std::vector<GpuSample> gpus;
  std::string error;  // why nothing could be read (source "none")
  std::vector<DiagnosisSample> diagnoses;
  nlohmann::json to_json() const;
};

struct OllamaModelSample {
  std::string name;
  std::uint64_t size = 0;       // bytes the loaded model takes
  std::uint64_t size_vram = 0;  // of which on the GPU
  int gpu_percent = 0;          // as `ollama ps` rounds it
  std::optional<std::int64_t> context_length;
  std::string expires_at;  // RFC 3339, as Ollama writes it
  nlohmann::json to_json() const;
};

struct OllamaSection {
  std::string version;  // "" when the API does not answer
  std::vector<OllamaModelSample> models;
  std::string error;
  std::vector<DiagnosisSample> diagnoses;
  nlohmann::json to_json() const;
};

struct K8sNodeSample {
  std::string name;
  bool ready = false;
  std::optional<std::int64_t> allocatable;  // of the section's resource
  std::optional<std::int64_t> capacity;
  std::string gpu_label;  // the node's `gpu` label (HAMi schedules on gpu=on)
  nlohmann::json to_json() const;
};

struct K8sPodSample {
  std::string ns, name, phase, status, node;
  std::optional<std::int64_t> gpus;               // its nvidia.com/gpu limit
  std::optional<std::int64_t> gpumem_mib;         // HAMi's nvidia.com/gpumem
  std::optional<std::int64_t> gpumem_percentage;  // nvidia.com/gpumem-percentage
  nlohmann::json to_json() const;
};

struct K8sSection {
  std::string resource = "nvidia.com/gpu";
  std::optional<std::int64_t> allocatable;  // summed over the nodes; null: none advertised
  std::optional<std::int64_t> capacity;
  std::vector<K8sNodeSample> nodes;
  std::vector<K8sPodSample> pods;  // pods with a HAMi memory limit
  std::string error;
  std::vector<DiagnosisSample> diagnoses;
  nlohmann::json to_json() const;
};

// The probe health sends through Ollama every few minutes (catalog
// health.probe): a small prompt, timed to its first token and to its end.
struct ProbeSample {
  std::string model;
  bool ok = false;
  std::optional<double> ttft_ms;
  std::optional<double> total_ms;
  std::string at;  // when it ran, RFC 3339
  std::string error;
  nlohmann::json to_json() const;
};

// A model endpoint's proxy (agent/endpoint) as the guest sees it: whether it
// serves, and its counters since the agent started; the probe's last result
// (also on a tier without an endpoint that turned the probe on).
struct EndpointSection {
  bool serving = false;
  std::uint64_t requests = 0, served = 0, unauthorized = 0, refused_paths = 0, busy = 0,
                upstream_errors = 0, in_flight = 0;
  std::string certificate_expires_at;
  std::optional<ProbeSample> probe;
  nlohmann::json to_json() const;
};

struct HealthSample {
  std::string time;  // when the agent sampled, RFC 3339 on its clock
  std::string hostname;
  std::string plan_hash;
  GpuSection gpu;
  std::optional<OllamaSection> ollama;
  std::optional<K8sSection> k8s;
  std::optional<EndpointSection> endpoint;

  nlohmann::json to_json() const;
  // The same JSON as bytes, written without a tree (the coordinator's feed
  // and store take every sample of the fleet): keys in the order of the
  // list above rather than sorted, the value equal to to_json()'s.
  std::string to_text() const;
  // Every diagnosis of every section, in order.
  std::vector<const DiagnosisSample*> all_diagnoses() const;
};

// The formats of a sample's coded fields, written out by hand: as
// std::regex they cost 2 % of the coordinator's steady load at 10,000
// agents. The regular expression each one is stands beside it, and
// tests/contract/health_sample_test.cpp holds each to it.
namespace health_formats {
bool diagnosis_code(std::string_view s);  // [a-z][a-z0-9_]{0,63}
bool pstate(std::string_view s);          // P([0-9]|1[0-5])
bool mig_uuid(std::string_view s);        // MIG-[0-9A-Za-z-]{1,60}
bool k8s_resource(std::string_view s);    // [A-Za-z0-9.-]+/[A-Za-z0-9_.-]+
}  // namespace health_formats

// A health frame's body, from a stranger, read with the one reader of
// guest input (guest_input.hpp): never throws; what breaks a rule is
// dropped and listed in `rejected`, the rest kept. No value (a refusal)
// only when the body is not an object.
Decoded<HealthSample> decode_health_sample(const nlohmann::json& body);

// What the agent does to its own sample before it sends it: every string cut
// to its cap (at a UTF-8 character boundary) with control characters and
// bytes that are not UTF-8 replaced by '?', every list cut to its cap (and,
// should the whole still exceed kSampleBytes, the per-process and per-pod
// lists and diagnosis details dropped first), so
// nothing it reads from the guest (a process name, a kernel log line in a
// diagnosis) makes the coordinator drop a field, or the JSON unprintable.
void make_sendable(HealthSample& sample);
// One string as make_sendable leaves it.
std::string clip_text(const std::string& s, std::size_t max);

}  // namespace factory::proto
