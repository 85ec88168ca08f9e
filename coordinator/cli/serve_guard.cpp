#include "coordinator/cli/serve_guard.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/atomic_file.hpp"
#include "common/net/server.hpp"

namespace factory::cli {
namespace fs = std::filesystem;

namespace {

std::string lock_path(const std::string& state_dir) {
  return (fs::path(state_dir) / kServeLockFile).string();
}

// The holder wrote its pid when it took the lock; "" when it is unreadable.
std::string holder_pid(int fd) {
  char buf[32] = {0};
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string pid(buf, static_cast<size_t>(n));
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid;
}

}  // namespace

StateDirLock& StateDirLock::operator=(StateDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

StateDirLock::~StateDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

Result<StateDirLock> StateDirLock::lock(int fd, const std::string& path) {
  StateDirLock held(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (err != EWOULDBLOCK) return errno_error("lock " + path, err);
    std::string pid = holder_pid(fd);
    return Error(Errc::failed_precondition,
                 "another `factory serve` (" + (pid.empty() ? "pid unknown" : "pid " + pid) +
                     ") is using state_dir " + fs::path(path).parent_path().string() +
                     " (it holds " + path + "); stop it, or give this one its own state_dir");
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0)
    return errno_error("write " + path, errno);
  return held;
}

Result<StateDirLock> StateDirLock::take_existing(const std::string& state_dir) {
  const std::string path = lock_path(state_dir);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return StateDirLock(-1);
    return errno_error("open " + path, errno);
  }
  return lock(fd, path);
}

Result<StateDirLock> StateDirLock::take(const std::string& state_dir) {
  if (auto st = ensure_dir(state_dir, 0700); !st.ok())
    return st.error().with_context("state_dir (run as a user that can write it, or set state_dir)");
  const std::string path = lock_path(state_dir);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return errno_error("open " + path, errno);
  return lock(fd, path);
}

Status check_can_listen(const std::string& listen, const std::string& what) {
  auto hp = net::split_host_port(listen);
  if (!hp) return hp.error().with_context(what);
  std::string host = hp->first == "localhost" ? "127.0.0.1" : hp->first;
  if (host.empty()) host = "0.0.0.0";
  sockaddr_storage addr{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(hp->second);
    len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(hp->second);
    len = sizeof *v6;
  } else {
    return Error(Errc::invalid_argument, what + " " + listen + ": not an IP address");
  }
  int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno_error(what + " " + listen + ": socket", errno);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // bind and listen, as the server does: with SO_REUSEADDR either can be the
  // call that finds the port taken.
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  if (rc == 0) rc = ::listen(fd, 1);
  int err = errno;
  ::close(fd);
  if (rc != 0)
    return Error(Errc::unavailable,
                 "cannot listen on " + listen + " (" + what + "): " + std::strerror(err));
  return {};
}

}  // namespace factory::cli
