#pragma once
// Every file the host module reads or writes goes through a HostRoot, so the
// same code runs on the real machine (root "/") and on a tree built from
// captures in the tests (root "<tmp>/l4-runbook"). Paths are always written
// as the host sees them ("/sys/bus/pci/devices"); messages show them that way
// too, because that is what an admin types to look for themselves.
#include <filesystem>
#include <string>
#include <string_view>

namespace factory::host {

class HostRoot {
 public:
  explicit HostRoot(std::filesystem::path root = "/") : root_(std::move(root)) {
    if (root_.empty()) root_ = "/";
  }

  // "/sys/bus/pci" under the root.
  std::filesystem::path operator()(std::string_view host_path) const {
    std::string_view p = host_path;
    while (!p.empty() && p.front() == '/') p.remove_prefix(1);
    return p.empty() ? root_ : root_ / std::filesystem::path(p);
  }

  const std::filesystem::path& root() const { return root_; }
  // True on the real machine; the root checks and fresh reads of live state
  // only mean something there.
  bool is_real() const { return std::filesystem::path(root_).lexically_normal() == "/"; }

 private:
  std::filesystem::path root_;
};

}  // namespace factory::host
