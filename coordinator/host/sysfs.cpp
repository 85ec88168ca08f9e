#include "coordinator/host/sysfs.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <thread>

#include "common/atomic_file.hpp"

namespace factory::host {
namespace fs = std::filesystem;

Result<std::string> read_attr(const HostRoot& root, const std::string& host_path) {
  auto r = read_file(root(host_path));
  if (!r) {
    Error e = r.error();
    e.message = "read " + host_path + ": " + e.message.substr(e.message.rfind(": ") + 2);
    return e;
  }
  std::string s = std::move(*r);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

Result<unsigned long> read_hex_attr(const HostRoot& root, const std::string& host_path) {
  auto s = read_attr(root, host_path);
  if (!s) return s.error();
  const std::string& v = *s;
  size_t start = (v.rfind("0x", 0) == 0 || v.rfind("0X", 0) == 0) ? 2 : 0;
  if (start >= v.size() || v.size() - start > 8)
    return Error(Errc::protocol,
                 host_path + ": expected a hex value like 0x10de, got \"" + v + "\"");
  unsigned long n = 0;
  for (size_t i = start; i < v.size(); ++i) {
    char c = v[i];
    int d = (c >= '0' && c <= '9')   ? c - '0'
            : (c >= 'a' && c <= 'f') ? c - 'a' + 10
            : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                     : -1;
    if (d < 0)
      return Error(Errc::protocol,
                   host_path + ": expected a hex value like 0x10de, got \"" + v + "\"");
    n = n * 16 + static_cast<unsigned long>(d);
  }
  return n;
}

std::optional<std::string> read_link_name(const HostRoot& root, const std::string& host_path) {
  std::error_code ec;
  fs::path target = fs::read_symlink(root(host_path), ec);
  if (ec) return std::nullopt;
  std::string name = target.filename().string();
  if (name.empty()) name = target.parent_path().filename().string();
  return name;
}

Status write_attr(const HostRoot& root, const std::string& host_path, const std::string& value) {
  fs::path p = root(host_path);
  int fd = ::open(p.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return errno_error(echo_command(value, host_path), errno);
  std::string data = value + "\n";
  ssize_t n;
  do {
    n = ::write(fd, data.data(), data.size());
  } while (n < 0 && errno == EINTR);
  int err = n < 0 ? errno : 0;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err) return errno_error(echo_command(value, host_path), err);
  if (static_cast<size_t>(n) != data.size())
    return Error(Errc::io, echo_command(value, host_path) + ": short write");
  return ok_status();
}

std::string echo_command(const std::string& value, const std::string& host_path) {
  return value.empty() ? "echo > " + host_path : "echo " + value + " > " + host_path;
}

bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace factory::host
