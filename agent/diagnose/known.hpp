#pragma once
// The named diagnoses the agent knows, one constructor each, so a code, its
// summary and its fix are written once and every step and health probe that
// meets the failure says the same thing. Codes are stable: monitoring and the
// coordinator key on them.
#include <cstdint>
#include <string>

#include "agent/diagnose/diagnosis.hpp"

namespace factory::agent::diagnoses {

// No NVIDIA function on the guest's PCI bus: installing a driver cannot create one.
Diagnosis gpu_not_on_pci_bus(const nlohmann::json& pci_functions_seen = nlohmann::json::array());

// The driver package is installed but the kernel module is not loaded yet.
Diagnosis driver_reboot_pending(const std::string& package, const std::string& version);

// The guest rebooted after the install and the module still did not load
// (and the kernel log does not say why in a way we recognise).
Diagnosis driver_not_loading(const std::string& kernel_log_tail);

// "NVRM: BAR0 is 0M": the guest firmware could not map a large-BAR card.
Diagnosis gpu_bar0_unmapped(const std::string& log_line, const std::string& pci_address);

// The module loaded but the GPU function is bound to another driver (or none).
Diagnosis gpu_not_bound_to_nvidia(const std::string& pci_address, const std::string& driver);

// nvidia-smi runs but reports another driver version than the catalog pins.
Diagnosis driver_version_mismatch(const std::string& expected, const std::string& found);

// DKMS could not build the module for the running kernel.
Diagnosis dkms_build_failed(const std::string& kernel, const std::string& output_tail);

// apt-get / dpkg failed for another reason.
Diagnosis apt_failed(const std::string& command, const std::string& output_tail);

// A download (the NVIDIA repository package) did not complete.
Diagnosis download_failed(const std::string& url, const std::string& output_tail);
// A pinned download whose sha256 is not the catalog's: altered in transit or
// at the source, or the pin is wrong. Nothing of it was unpacked.
Diagnosis checksum_mismatch(const std::string& url, const std::string& want,
                            const std::string& got);

// nvidia-smi is not on PATH and no GPU Operator driver root exists either.
Diagnosis nvidia_smi_not_on_path();

// nvidia-smi is not on PATH because the GPU Operator runs the driver in a
// container: it works through chroot /run/nvidia/driver.
Diagnosis gpu_operator_nvidia_smi_chroot(const std::string& driver_root);

// The Ollama service does not answer its REST API.
Diagnosis ollama_not_answering(const std::string& url, const std::string& last_error);

// Ollama answers but reports another version than the catalog pins.
Diagnosis ollama_version_mismatch(const std::string& expected, const std::string& found);

// The registry does not know the model name.
Diagnosis model_not_found(const std::string& model, const std::string& server_error);

// The model download stopped before it completed.
Diagnosis model_download_interrupted(const std::string& model, int percent,
                                     const std::string& detail);

// The loaded model does not fit on the GPU: part (or all) of it runs on the CPU.
Diagnosis model_partly_on_cpu(const std::string& model, std::uint64_t size,
                              std::uint64_t size_vram);

// The card has no MIG (nvidia-smi's mig.mode is [N/A], or -mig 1 says Not
// Supported): the L4 of the runbook, say. Only A30, A100, H100 and H200 class cards do.
Diagnosis mig_not_supported(int gpu, const std::string& name, const std::string& detail);

// MIG mode stayed pending across the reboot that should have applied it.
Diagnosis mig_mode_still_pending(int gpu, const std::string& detail);

// Sizes as Ollama prints them (decimal units: "1.6 GB"), so the diagnosis
// reads like `ollama ps`.
std::string human_bytes(std::uint64_t bytes);

}  // namespace factory::agent::diagnoses
