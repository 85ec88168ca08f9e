#pragma once
// Step kind `nvidia_driver`: the NVIDIA open kernel driver, pinned, built by
// DKMS, loaded after the guest's reboot (runbook step 5, 01-nvidia-driver.sh).
//
// Params (as catalog/catalog.yaml writes them; their types, defaults and
// ranges are contract/step_params.cpp's, which the catalog checks too):
//   version:         "615.71.09"            what nvidia-smi must report
//   package_version: "615.71.09-1ubuntu1"   the apt pin for every package below
//   packages:        [nvidia-headless-open, nvidia-persistenced]
//   prerequisites:   [ca-certificates, curl]  (default)
//   kernel_headers:  true                   also linux-headers-$(uname -r): DKMS builds
//                                           against them
//   repo:
//     kind:      local | network  local: NVIDIA's local repository package (~535 MiB);
//                                 network: the cuda-keyring package
//     url:       https://.../nvidia-driver-local-repo-ubuntu2404-615.71.09_1.0-1_amd64.deb
//     cache_dir: /var/cache/factory        where the .deb is downloaded (the default)
//   reboot:          true                   false: `modprobe nvidia` instead of a reboot
//
// check:  the nvidia module is loaded, every NVIDIA GPU function's driver is
//         nvidia (lspci's "Kernel driver in use"), nvidia-smi reports `version`,
//         and every package dpkg knows of `packages` is installed at
//         `package_version` (a failed upgrade leaves the previous module
//         loaded over packages of another version).
// apply:  installs what is missing, each thing only if dpkg does not already
//         have it (so a re-run after a crash installs nothing twice):
//         prerequisites + headers, the repository package (downloaded to
//         cache_dir unless already there; local repo: its keyring copied to
//         /usr/share/keyrings), apt-get update, the pinned packages (with
//         --allow-downgrades: a tier upgrade going back installs the previous
//         pin over a newer one, contract/tier_upgrade.hpp); then asks
//         for a reboot. It asks once: if the guest already booted since the
//         install and the module is still not loaded, it fails with the
//         diagnosis instead of rebooting in a loop.
// verify: module loaded, GPU bound to nvidia, nvidia-smi lists every GPU with
//         its memory at the pinned version.
// Diagnoses: gpu_not_on_pci_bus, gpu_bar0_unmapped, driver_reboot_pending,
//   driver_not_loading, gpu_not_bound_to_nvidia, driver_version_mismatch,
//   dkms_build_failed, apt_failed, download_failed.
#include <memory>

#include "agent/plan/step.hpp"

namespace factory::agent::steps {

Result<std::unique_ptr<Step>> make_nvidia_driver(const StepSpec& spec);

}  // namespace factory::agent::steps
