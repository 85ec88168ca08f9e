#pragma once
// A broken card as named diagnoses, from what one GPU of a health sample
// says (pure: no I/O). Each carries what the customer does in the VM and
// what the admin does on the host (details "customer" and "admin"; the fix
// says both):
//
//   gpu_lost                NVML answers NVML_ERROR_GPU_IS_LOST: the card fell off the bus
//   gpu_xid_<n>             an Xid of contract/xid_catalog.hpp, until acknowledged
//   gpu_xid_unlisted        an Xid the catalog does not name
//   gpu_row_remap_failure   a memory row could not be remapped
//   gpu_row_remap_pending   a remapping waits for the card's next reset
//   gpu_ecc_uncorrected     uncorrectable ECC errors since the driver loaded,
//                           with no Xid that explains them
//   gpu_thermal_slowdown    clocks cut for heat (software or hardware thermal slowdown)
//   gpu_power_slowdown      clocks cut by hardware (HW slowdown, power brake)
//
// The software power cap alone is no diagnosis: a card at its power limit
// under full load sets it, and that is the limit working. docs/gpu-faults.md
// has the table.
#include <vector>

#include "agent/diagnose/diagnosis.hpp"
#include "contract/health_sample.hpp"
#include "contract/xid_catalog.hpp"

namespace factory::agent {

std::vector<Diagnosis> diagnose_gpu_faults(const proto::GpuSample& gpu);

// The diagnosis for one Xid the GPU reported (what diagnose_gpu_faults
// makes for each of gpu.xids).
Diagnosis diagnose_xid(const proto::GpuSample& gpu, const proto::XidSample& xid);

}  // namespace factory::agent
