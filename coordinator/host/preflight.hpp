#pragma once
// `factory host check`: can this machine pass a GPU through to a VM, and what
// would each card be advertised as? Step 0 of the runbook ("prove the host can
// do passthrough") plus the inventory step 2 needs, as verdicts with fixes.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/host/host_root.hpp"
#include "coordinator/host/inventory.hpp"

namespace factory::host {

enum class Verdict { ok, warn, fail };
const char* verdict_name(Verdict v);

struct Check {
  std::string name;  // "iommu", "gpu 0000:01:00.0"
  Verdict verdict = Verdict::ok;
  std::string detail;  // what was found
  std::string fix;     // one line, empty when ok
};

struct HostReport {
  std::vector<Check> checks;
  std::vector<GpuReport> gpus;  // every NVIDIA function
  // False when any check failed: passthrough cannot work on this machine as it is.
  bool passthrough_possible() const;
};

struct CheckOptions {
  std::string pci_ids_file;  // --pci-ids; empty: the distro's list under the root
};

// Errors only when the host cannot be read at all (no /sys/bus/pci) or the
// --pci-ids file is missing or unreadable; everything else is a verdict.
Result<HostReport> check_host(const HostRoot& root, const CheckOptions& opts);

// {"checks":[{"name","verdict","detail","fix"}],
//  "gpus":[{"address","vendor_id","device_id","subsystem_id","name","driver",
//           "iommu_group","group_members","override","resource_name"}]}
nlohmann::json to_json(const HostReport& r);

}  // namespace factory::host
