#pragma once
// What the guest's GPUs are, whichever way it was read (NVML, nvidia-smi's
// CSV query, its XML, or its table), the parsers for nvidia-smi's outputs,
// and the query itself: health reports it, the driver step verifies with it.
// The parsers are tested on real captures (tests/fixtures/real/).
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "contract/health_sample.hpp"

namespace factory::agent {

// One GPU, whichever way it was read: the health sample's own type, so what
// the parsers and NVML fill is exactly what the agent sends.
using GpuReading = proto::GpuSample;

struct GpuReport {
  std::string source;               // "nvml" | "nvidia-smi"
  std::string driver_version;       // "580.159.04"
  std::string cuda_driver_version;  // "13.0" (NVML, the table's header, the XML)
  std::vector<GpuReading> gpus;

  proto::GpuSection section() const;  // source, versions, gpus
  nlohmann::json to_json() const { return section().to_json(); }
};

// The fields the agent asks nvidia-smi for, in order: every figure of the
// health sample that --query-gpu knows.
const std::vector<std::string>& nvidia_smi_query_fields();
// The few every nvidia-smi since R470 knows: asked when an older one refuses
// the full list ("Field \"memory.reserved\" is not a valid field to query.").
const std::vector<std::string>& nvidia_smi_basic_query_fields();
// {"--query-gpu=name,uuid,...", "--format=csv,noheader,nounits"}
std::vector<std::string> nvidia_smi_query_args(
    const std::vector<std::string>& fields = nvidia_smi_query_fields());

// `nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`: one line
// per GPU, values in the order of fields. Fields the report does not use are
// ignored; a line with the wrong number of values is an error.
Result<GpuReport> parse_nvidia_smi_csv(const std::string& output,
                                       const std::vector<std::string>& fields);

// `--format=csv` with its header row ("memory.total [MiB]"): the field names
// come from the header and the units are stripped from the values.
Result<GpuReport> parse_nvidia_smi_csv_with_header(const std::string& output);

// `nvidia-smi -q -x`.
Result<GpuReport> parse_nvidia_smi_xml(const std::string& xml);

// Plain `nvidia-smi`: the table. Gives driver version, index, name, bus id,
// memory, temperature and utilization (no UUID: the table does not show it).
// Both header styles are understood: "Driver Version:" and the newer
// "KMD Version:".
Result<GpuReport> parse_nvidia_smi_table(const std::string& output);

// `nvidia-smi -L`: "GPU 0: NVIDIA H200 (UUID: GPU-...)" -> index, name, uuid.
std::vector<GpuReading> parse_nvidia_smi_list(const std::string& output);

// `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory
// --format=csv,noheader,nounits`: each process onto the GPU of its UUID.
// Lines that do not parse are skipped (a process may end while it prints).
void apply_nvidia_smi_compute_apps(const std::string& output, std::vector<GpuReading>& gpus);

// `nvidia-smi -q -d MEMORY` (and the FB Memory Usage block of `nvidia-smi -q`):
// per GPU, in order, its frame buffer Total / Reserved / Used / Free in MiB.
struct FbMemory {
  std::optional<std::uint64_t> total, reserved, used, free;
};
std::vector<FbMemory> parse_nvidia_smi_q_memory(const std::string& output);

// Runs `<prefix...> nvidia-smi --query-gpu=... --format=csv,noheader,nounits`
// (the basic fields when it refuses the full list) and its compute apps, and
// parses them (prefix empty: nvidia-smi from PATH). Errors: not_found when
// the command is not there, failed_precondition when it fails (driver not
// loaded: "NVIDIA-SMI has failed because it couldn't communicate with the
// NVIDIA driver"), timeout when it hangs (a wedged driver), protocol when its
// output does not parse.
Result<GpuReport> query_nvidia_smi(const std::vector<std::string>& prefix = {},
                                   std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace factory::agent
