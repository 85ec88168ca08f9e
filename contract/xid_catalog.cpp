#include "contract/xid_catalog.hpp"

#include <algorithm>

namespace factory::gpu {

namespace {

// What every card fault asks of the admin first: take the card out of the
// pool, so no new tenant lands on it, and move the tenant to a healthy one.
#define TAKE_OUT                                                                   \
  "quarantine the card (`factory host quarantine --pci ADDR --reason ...`), move " \
  "the tenant to a healthy card (docs/gpu-faults.md), "

constexpr XidEntry kCatalog[] = {
    {13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP",
     XidImpact::application,
     "restart the program that failed: it made an illegal access (most often out of an array's "
     "bounds); run it under compute-sanitizer's memcheck or cuda-gdb (or with "
     "CUDA_DEVICE_WAITS_ON_EXCEPTION=1) to find the line",
     "nothing for the card; if it recurs with programs known to be correct, collect "
     "nvidia-bug-report.sh from the guest and contact NVIDIA support"},
    {31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP",
     XidImpact::application,
     "restart the program that failed: it accessed GPU memory it does not own; run it under "
     "compute-sanitizer's memcheck or cuda-gdb to find the access",
     "nothing for the card; if it recurs with programs known to be correct, collect "
     "nvidia-bug-report.sh and contact NVIDIA support (a driver or hardware fault)"},
    {43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE",
     XidImpact::application,
     "restart the program: it hit a software fault and was stopped; the GPU stays healthy",
     "nothing: the GPU remains healthy"},
    {45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors",
     "WORKFLOW_XID_45", XidImpact::application,
     "restart the program: the driver tore it down (Ctrl-C, a kill, a reset, or after another "
     "Xid); when another Xid came with it, follow that one",
     "nothing on its own; when another Xid came with it, follow that one"},
    {48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", XidImpact::card,
     "the program got an uncorrectable memory error: save what you can; the card needs a reset "
     "before it is trusted again, which the admin does (or moves you to a healthy card)",
     TAKE_OUT "then reset the card (a GPU reset or a node reboot clears it) and release it; if "
              "`nvidia-smi -q` shows the SRAM threshold exceeded, run NVIDIA's field diagnostic "
              "and follow the RMA flow"},
    {63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE", XidImpact::watch,
     "nothing: a memory row was marked for remapping after an ECC error; it takes effect at the "
     "card's next reset",
     "reset the card at a convenient time (quarantine, reset, release) so the pending remapping "
     "takes effect"},
    {64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU",
     XidImpact::card,
     "the card could not remap a failing memory row: restart your programs once the admin has "
     "reset the card or moved you to a healthy one",
     TAKE_OUT "then reset the card; if the remapping failure stays after the reset "
              "(`nvidia-smi -q -d ROW_REMAPPER`), contact NVIDIA support for a replacement"},
    {74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", XidImpact::card,
     "programs using NVLink peers may fail: restart them once the admin has reset the card",
     TAKE_OUT "then reset the card or reboot the node; the fault may be the peer's at the other "
              "end of the link (`nvidia-smi nvlink -s`); if it recurs after a reboot, contact the "
              "hardware vendor"},
    {79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM",
     XidImpact::card,
     "nothing in the VM can reach the card any more: wait for the admin to move you to a healthy "
     "card (or restart the host)",
     TAKE_OUT "then reboot the node (NVIDIA: restart the bare-metal host); read the host's "
              "kernel and system event logs for PCIe link errors and check the card's power and "
              "seating; if it recurs, contact NVIDIA support"},
    {92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE", XidImpact::watch,
     "nothing: the errors were corrected",
     "watch the card's corrected ECC count (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL); if the rate stays "
     "high, contact NVIDIA support"},
    {94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP",
     XidImpact::watch,
     "restart the program that failed: the error was contained to it; other programs are "
     "unaffected",
     "reset the card when convenient (quarantine, reset, release); programs may run until then"},
    {95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU",
     XidImpact::card,
     "every program on the card is affected: restart them once the admin has reset the card or "
     "moved you to a healthy one",
     TAKE_OUT "then reset the card before any program runs on it again, and release it"},
    {119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", XidImpact::card,
     "the card's firmware stopped answering: restart your programs once the admin has reset the "
     "card or moved you to a healthy one",
     TAKE_OUT "then reset the card, or power-cycle the node if that fails; if it recurs after a "
              "power cycle, follow NVIDIA's GPU debug guidelines (driver and firmware versions)"},
    {120, "GSP_ERROR", "GSP Error", "RESET_GPU", XidImpact::card,
     "the card's firmware failed: restart your programs once the admin has reset the card or "
     "moved you to a healthy one",
     TAKE_OUT "then reset the card, or power-cycle the node if that fails; if it recurs after a "
              "power cycle, follow NVIDIA's GPU debug guidelines (driver and firmware versions)"},
    // NVML's event carries the number alone; the recovery action it names
    // ("GPU Reset Required", "Node Reboot Required", ...) is in the kernel
    // log line only, so the card is treated as needing the admin.
    {154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154", XidImpact::card,
     "follow the Xid that came with it; the card may need a reset or a reboot before it is "
     "trusted again",
     TAKE_OUT "then read the guest's kernel log (`dmesg | grep 'Xid.*154'`) for the action it "
              "names (Drain P2P, Drain and Reset, GPU Reset Required, Node Reboot Required) and do "
              "it before releasing the card"},
};

#undef TAKE_OUT

}  // namespace

std::span<const XidEntry> xid_catalog() {
  return kCatalog;
}

const XidEntry* find_xid(int xid) {
  auto it = std::find_if(std::begin(kCatalog), std::end(kCatalog),
                         [&](const XidEntry& e) { return e.xid == xid; });
  return it == std::end(kCatalog) ? nullptr : &*it;
}

bool xid_faults_card(int xid) {
  const XidEntry* e = find_xid(xid);
  return e && e->impact == XidImpact::card;
}

std::string_view impact_name(XidImpact impact) {
  switch (impact) {
    case XidImpact::application:
      return "application";
    case XidImpact::watch:
      return "watch";
    case XidImpact::card:
      return "card";
  }
  return "card";
}

}  // namespace factory::gpu
