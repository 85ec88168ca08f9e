#include "agent/upgrade/download.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <random>

#include "agent/upgrade/agent_binary.hpp"
#include "common/atomic_file.hpp"

namespace factory::agent {

namespace fs = std::filesystem;

Result<fs::path> download_checked(const DownloadSpec& spec, const fs::path& dir) {
  if (spec.ca_pem.empty())
    return Error(Errc::failed_precondition,
                 "no coordinator CA to check the download against (ca_file, or the identity "
                 "from enrollment)");
  if (auto st = ensure_dir(dir, 0700); !st.ok()) return st.error();
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const fs::path tmp = dir / (".download-" + std::to_string(rng()));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno_error("create " + tmp.string(), errno);
  auto fail = [&](Error e) -> Result<fs::path> {
    if (fd >= 0) ::close(fd);
    std::error_code ec;
    fs::remove(tmp, ec);
    return e;
  };

  net::TlsClientOptions tls;
  tls.ca_pem = spec.ca_pem;
  net::HttpClient client(tls);
  net::HttpRequest req;
  req.url = spec.url;
  req.timeout = spec.timeout;
  req.idle_timeout = spec.timeout;
  req.cancel = spec.cancel;
  Sha256 sha;
  std::uint64_t got = 0;
  std::optional<Error> broke;  // why the body was cut short on our side
  int http_status = 0;
  auto status = client.stream(
      req,
      [&](std::string_view chunk) {
        if (got + chunk.size() > spec.size) {
          broke = Error(Errc::protocol, spec.url + ": more than the " + std::to_string(spec.size) +
                                            " bytes the order says");
          return false;
        }
        sha.update(chunk);
        got += chunk.size();
        while (!chunk.empty()) {
          ssize_t n = ::write(fd, chunk.data(), chunk.size());
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) {
            broke = errno_error("write " + tmp.string(), errno);
            return false;
          }
          chunk.remove_prefix(static_cast<std::size_t>(n));
        }
        return true;
      },
      [&](const net::HttpResponse& head) {
        http_status = head.status;
        return head.status == 200;
      });
  if (broke) return fail(*broke);
  if (!status) return fail(status.error());
  if (http_status != 200)
    return fail(Error(Errc::unavailable, spec.url + ": HTTP " + std::to_string(http_status)));
  if (got != spec.size)
    return fail(Error(Errc::protocol, spec.url + ": got " + std::to_string(got) +
                                          " bytes, the order says " + std::to_string(spec.size)));
  const std::string hex = sha.hex();
  if (hex != spec.sha256)
    return fail(Error(Errc::protocol,
                      spec.url + ": SHA-256 is " + hex + ", the order says " + spec.sha256));
  if (::fsync(fd) != 0) return fail(errno_error("fsync " + tmp.string(), errno));
  ::close(fd);
  fd = -1;
  return tmp;
}

}  // namespace factory::agent
