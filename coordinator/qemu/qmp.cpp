#include "coordinator/qemu/qmp.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace factory::qemu {

namespace {

using Steady = std::chrono::steady_clock;

class Conn {
 public:
  Conn(std::string socket, Steady::time_point deadline)
      : socket_(std::move(socket)), deadline_(deadline) {}
  ~Conn() {
    if (fd_ >= 0) ::close(fd_);
    if (dir_ >= 0) ::close(dir_);
  }

  Status open() {
    // A socket's path may hold 107 bytes and a state directory can be
    // longer: connect through the folder's descriptor instead
    // (/proc/self/fd/N/qmp.sock is short whatever N names).
    const auto slash = socket_.rfind('/');
    const std::string folder = slash == std::string::npos ? "." : socket_.substr(0, slash + 1);
    dir_ = ::open(folder.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir_ < 0) return Error(Errc::unavailable, "QMP " + socket_ + ": " + std::strerror(errno));
    const std::string via = "/proc/self/fd/" + std::to_string(dir_) + "/" +
                            (slash == std::string::npos ? socket_ : socket_.substr(slash + 1));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (via.size() >= sizeof addr.sun_path)
      return Error(Errc::invalid_argument, "QMP socket name too long: " + socket_);
    std::memcpy(addr.sun_path, via.c_str(), via.size() + 1);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return errno_error("socket", errno);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      return Error(Errc::unavailable, "QMP " + socket_ + ": " + std::strerror(errno));
    return {};
  }

  Status send(const nlohmann::json& j) {
    std::string line = j.dump() + "\r\n";
    size_t off = 0;
    while (off < line.size()) {
      if (auto st = wait(POLLOUT); !st.ok()) return st;
      ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return Error(Errc::unavailable, "QMP " + socket_ + ": send: " + std::strerror(errno));
      }
      off += static_cast<size_t>(n);
    }
    return {};
  }

  // The next reply (a line with "return" or "error"), skipping events.
  Result<nlohmann::json> reply(bool greeting = false) {
    while (true) {
      auto line = read_line();
      if (!line) return line.error();
      auto j = nlohmann::json::parse(*line, nullptr, false);
      if (!j.is_object()) return Error(Errc::protocol, "QMP " + socket_ + ": not JSON: " + *line);
      if (greeting && j.contains("QMP")) return j;
      if (j.contains("return")) return j["return"];
      if (j.contains("error")) {
        const auto& e = j["error"];
        return Error(Errc::failed_precondition,
                     "QMP: " + (e.is_object() ? e.value("desc", e.dump()) : e.dump()));
      }
    }
  }

 private:
  Status wait(short events) {
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Steady::now());
      if (left.count() <= 0) return Error(Errc::timeout, "QMP " + socket_ + ": no answer in time");
      pollfd p{fd_, events, 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r > 0) return {};
      if (r < 0 && errno != EINTR) return errno_error("poll", errno);
    }
  }

  Result<std::string> read_line() {
    while (true) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        return line;
      }
      // Replies are small; a peer that sends megabytes without a newline is not QEMU.
      if (buf_.size() > (1 << 20))
        return Error(Errc::protocol, "QMP " + socket_ + ": line too long");
      if (auto st = wait(POLLIN); !st.ok()) return st.error();
      char chunk[4096];
      ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n == 0) return Error(Errc::unavailable, "QMP " + socket_ + ": closed by QEMU");
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return Error(Errc::unavailable, "QMP " + socket_ + ": recv: " + std::strerror(errno));
      }
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

  std::string socket_;
  Steady::time_point deadline_;
  int fd_ = -1;
  int dir_ = -1;
  std::string buf_;
};

}  // namespace

Result<nlohmann::json> qmp_execute(const std::string& socket, const std::string& command,
                                   const nlohmann::json& arguments,
                                   std::chrono::milliseconds timeout) {
  Conn c(socket, Steady::now() + timeout);
  if (auto st = c.open(); !st.ok()) return st.error();
  if (auto g = c.reply(/*greeting=*/true); !g) return g.error();
  if (auto st = c.send({{"execute", "qmp_capabilities"}}); !st.ok()) return st.error();
  if (auto r = c.reply(); !r) return r.error();
  nlohmann::json cmd = {{"execute", command}};
  if (!arguments.empty()) cmd["arguments"] = arguments;
  if (auto st = c.send(cmd); !st.ok()) return st.error();
  return c.reply();
}

}  // namespace factory::qemu
