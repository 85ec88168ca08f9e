#pragma once
// Reading and writing sysfs attributes the way the kernel lays them out:
// one value per file ("0x10de\n"), links for relations (driver, iommu_group),
// and write-only control files (bind, unbind, drivers_probe) that act on the
// write itself. Writes are one write(2) of the whole value, as `echo` does,
// and the error the kernel returns from write or close is the error we report.
#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "common/error.hpp"
#include "coordinator/host/host_root.hpp"

namespace factory::host {

// The file's content without the trailing newline.
Result<std::string> read_attr(const HostRoot& root, const std::string& host_path);

// A "0x10de"-style attribute as a number.
Result<unsigned long> read_hex_attr(const HostRoot& root, const std::string& host_path);

// The last component of a symlink's target ("nvidia" for .../drivers/nvidia),
// or nullopt when there is no link (no driver bound, no IOMMU group).
std::optional<std::string> read_link_name(const HostRoot& root, const std::string& host_path);

// Writes value + "\n" in one write(2), like `echo value > path`. The file must
// exist: sysfs never creates control files, and neither do we.
Status write_attr(const HostRoot& root, const std::string& host_path, const std::string& value);

// The PCI address written the way `echo` would, for messages and dry runs.
std::string echo_command(const std::string& value, const std::string& host_path);

// Polls pred until it is true or the deadline passes. The kernel binds a
// driver inside the write(2), but drivers that probe asynchronously finish a
// moment later, so every "did it take effect?" check allows a short settle.
bool wait_until(const std::function<bool()>& pred,
                std::chrono::milliseconds timeout = std::chrono::seconds(3));

}  // namespace factory::host
