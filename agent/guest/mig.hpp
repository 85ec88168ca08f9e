#pragma once
// NVIDIA Multi-Instance GPU as nvidia-smi shows it: the parsers for what the
// `mig` step and health read (`nvidia-smi mig -lgip`, `-lgi`, `-lci`, `-cgi
// ... -C`, `nvidia-smi -L` with MIG devices, `-mig 0|1` and the MIG mode
// query), and the profile names' own rule ("1g.18gb", "1g.18gb+me").
//
// The guest is the customer's, so its nvidia-smi may print anything: every
// parser is bounded (kMigMaxOutput bytes, kMigMaxEntries rows), returns typed
// values or an error, and never throws. Tested on the real H200's capture
// (tests/fixtures/real/h200-passthrough-vm/2026-12-01/) and on NVIDIA's
// documented output (the MIG user guide) where no capture exists.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "contract/health_sample.hpp"

namespace factory::agent {

// More than any nvidia-smi prints for 8 GPUs of 7 slices each, with room.
inline constexpr std::size_t kMigMaxOutput = 256 * 1024;
inline constexpr std::size_t kMigMaxEntries = 512;

// One row of `nvidia-smi mig -lgip`: a GPU instance profile this card offers.
// The IDs differ per model (19 is 1g.18gb on an H200, 1g.10gb on an H100 80GB):
// a plan names profiles, never IDs.
struct MigProfile {
  int gpu = 0;
  std::string name;  // "1g.18gb", "1g.18gb+me" (without the "MIG " prefix)
  int id = 0;
  int free = 0;
  int total = 0;
  double memory_gib = 0;
  int sm = 0;
};

// One row of `nvidia-smi mig -lgi`.
struct MigGpuInstance {
  int gpu = 0;
  std::string profile;  // "1g.18gb"
  int profile_id = 0;
  int instance_id = 0;
  int placement_start = 0;
  int placement_size = 0;
};

// One row of `nvidia-smi mig -lci`.
struct MigComputeInstance {
  int gpu = 0;
  int gpu_instance_id = 0;
  std::string profile;
  int profile_id = 0;
  int instance_id = 0;
};

// A MIG device line of `nvidia-smi -L`, under its GPU's line:
// "  MIG 1g.18gb     Device  0: (UUID: MIG-...)".
struct MigDevice {
  int gpu = 0;
  std::string profile;
  int device = 0;
  std::string uuid;  // "MIG-<uuid>"
};

// `nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending
// --format=csv,noheader`: one line per GPU.
struct MigMode {
  int gpu = 0;
  std::optional<bool> current;  // nullopt: "[N/A]" (a card without MIG)
  std::optional<bool> pending;
};

// What `nvidia-smi -i N -mig 0|1` said.
enum class MigModeChange {
  done,     // "Enabled MIG Mode for GPU ..." / "Disabled MIG Mode for GPU ..."
  pending,  // "Warning: MIG mode is in pending enable state ...": a reset or reboot applies it
  refused,  // "Unable to enable MIG Mode ...", "Not Supported", anything else
};
struct MigModeResult {
  MigModeChange change = MigModeChange::refused;
  std::string reason;  // the line nvidia-smi gave, for the refused and pending cases
};

// The query's args: {"--query-gpu=index,mig.mode.current,mig.mode.pending",
// "--format=csv,noheader"}.
std::vector<std::string> mig_mode_query_args();

// A GPU instance profile's name: "<slices>g.<memory>gb" with an optional
// "+<suffix>" of letters ("1g.18gb", "7g.141gb", "1g.18gb+me").
bool valid_mig_profile_name(const std::string& name);
// The compute slices a profile name claims: "3g.71gb" -> 3; 0 when invalid.
int mig_profile_slices(const std::string& name);

Result<std::vector<MigProfile>> parse_mig_profiles(const std::string& output);
// "No MIG-enabled devices found." / "No GPU instances found." are an empty list.
Result<std::vector<MigGpuInstance>> parse_mig_gpu_instances(const std::string& output);
Result<std::vector<MigComputeInstance>> parse_mig_compute_instances(const std::string& output);
// The MIG devices of `nvidia-smi -L` (the GPU lines themselves are
// parse_nvidia_smi_list's); a MIG line before any GPU line is an error.
Result<std::vector<MigDevice>> parse_mig_devices(const std::string& output);
Result<std::vector<MigMode>> parse_mig_modes(const std::string& output);
MigModeResult parse_mig_mode_change(const std::string& output, int exit_code);

// `nvidia-smi mig -i N -cgi 9,19 -C`: the GPU instance IDs it reports created
// ("Successfully created GPU instance ID  2 on GPU  0 using profile MIG
// 3g.71gb (ID  9)"), and the first line that says it failed, if any.
struct MigCreateResult {
  std::vector<int> gpu_instances;
  int compute_instances = 0;
  std::string failure;
};
MigCreateResult parse_mig_create(const std::string& output);

// For health: each GPU whose mig_mode is "Enabled" gets its MIG slices
// (`<prefix...> nvidia-smi -L` for the devices and their UUIDs, `nvidia-smi
// mig -lgip` for each profile's memory). Nothing is asked when no GPU is in
// MIG mode; output that does not parse leaves the slices out (the GPU's
// own figures stand).
void add_mig_instances(std::vector<proto::GpuSample>& gpus, const std::vector<std::string>& prefix,
                       std::chrono::milliseconds timeout);

}  // namespace factory::agent
