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

namespace factory::agent {

struct GpuReading {
  int index = 0;
  std::string name;        // "NVIDIA H200"
  std::string uuid;        // "GPU-0108b095-..."
  std::string pci_bus_id;  // "00000000:00:06.0" (nvidia-smi's 8-digit domain)
  std::optional<std::uint64_t> memory_total_mib;
  std::optional<std::uint64_t> memory_used_mib;
  std::optional<int> temperature_c;
  std::optional<int> utilization_percent;

  // Unknown values are JSON null, never made up.
  nlohmann::json to_json() const;
};

struct GpuReport {
  std::string source;          // "nvml" | "nvidia-smi"
  std::string driver_version;  // "580.159.04"
  std::vector<GpuReading> gpus;

  nlohmann::json to_json() const;  // {"source","driver_version","gpus":[...]}
};

// The fields the agent asks nvidia-smi for, in order.
const std::vector<std::string>& nvidia_smi_query_fields();
// {"--query-gpu=name,uuid,...", "--format=csv,noheader,nounits"}
std::vector<std::string> nvidia_smi_query_args();

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

// Runs `<prefix...> nvidia-smi --query-gpu=... --format=csv,noheader,nounits`
// and parses it (prefix empty: nvidia-smi from PATH). Errors: not_found when
// the command is not there, failed_precondition when it fails (driver not
// loaded: "NVIDIA-SMI has failed because it couldn't communicate with the
// NVIDIA driver"), protocol when its output does not parse.
Result<GpuReport> query_nvidia_smi(const std::vector<std::string>& prefix = {},
                                   std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace factory::agent
