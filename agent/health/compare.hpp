#pragma once
// The agent's GPU figures against nvidia-smi's, read in the same run on the
// same machine: how the H200 check (scripts/h200-health-check.sh) decides,
// and what tests replay on committed captures. Memory must be exact (both
// print whole MiB, truncated, from the same driver counters); figures that
// move between two reads a second apart get a stated tolerance.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent/guest/nvidia_smi.hpp"
#include "common/error.hpp"

namespace factory::agent {

struct FigureCheck {
  int gpu = 0;
  std::string figure;  // nvidia-smi's name: memory.used, temperature.gpu, ...
  std::string source;  // "query-gpu" or "-q -d MEMORY"
  std::string agent;   // as the agent reported it ("unknown" when null)
  std::string nvidia_smi;
  std::string tolerance;  // "exact", "±3 C", ...
  bool ok = false;
};

struct SmiComparison {
  std::vector<FigureCheck> checks;
  std::vector<std::string> problems;  // a GPU one side lacks, an unreadable input
  bool ok() const;
  nlohmann::json to_json()
      const;                    // {"verdict": "agree"|"differ", "checks": [...], "problems": [...]}
  std::string to_text() const;  // a table and the verdict line
};

// The tolerance of each figure --query-gpu can report (nvidia-smi's names).
// Figures not listed are not compared.
struct Tolerance {
  double absolute = 0;  // |agent - smi| <= max(absolute, relative * |smi|)
  double relative = 0;
  std::string text;
};
const std::vector<std::pair<std::string, Tolerance>>& figure_tolerances();

// agent_health: what `factory-agent health -o json` printed ({"gpu": {"gpus": [...]}}).
// smi: nvidia-smi --query-gpu parsed (parse_nvidia_smi_csv with the fields
// asked), memory: `nvidia-smi -q -d MEMORY` parsed. GPUs are matched by
// UUID where both sides have one, else by position.
SmiComparison compare_with_nvidia_smi(const nlohmann::json& agent_health, const GpuReport& smi,
                                      const std::vector<std::string>& fields,
                                      const std::vector<FbMemory>& memory);

// What `nvidia-smi -q` prints of a card's faults, per GPU in order; unknown
// (N/A, or a driver that prints no such line) stays unset.
struct SmiFaults {
  std::string serial;                    // Serial Number
  std::optional<std::uint64_t> replays;  // PCI: Replays Since Reset
  std::optional<std::uint64_t> reasons;  // Clocks Event Reasons, as NVML's bits
  std::optional<std::uint64_t> ecc_corrected_volatile, ecc_uncorrected_volatile;
  std::optional<std::uint64_t> ecc_corrected_aggregate, ecc_uncorrected_aggregate;
  std::optional<std::uint64_t> retired_sbe, retired_dbe;  // Retired Pages
  std::optional<bool> retired_pending;
  std::optional<std::uint64_t> remapped_correctable, remapped_uncorrectable;  // Remapped Rows
  std::optional<bool> remapped_pending, remap_failure;
};
// ECC counts are SRAM and DRAM together, as NVML's totals count them:
// corrected = SRAM Correctable + DRAM Correctable, uncorrected = SRAM
// Uncorrectable Parity + SRAM Uncorrectable SEC-DED + DRAM Uncorrectable.
std::vector<SmiFaults> parse_nvidia_smi_q_faults(const std::string& q_output);

// Adds a check, exact, for each fault figure both sides report (or that
// nvidia-smi says N/A for, where the agent must say unknown too).
void compare_faults(SmiComparison& out, const nlohmann::json& agent_health,
                    const std::vector<SmiFaults>& q);

}  // namespace factory::agent
