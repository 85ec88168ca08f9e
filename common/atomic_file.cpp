#include "common/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>

namespace factory {
namespace fs = std::filesystem;

namespace {
Status write_all(int fd, std::string_view data, const std::string& what) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("write " + what, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}
}  // namespace

Status fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_error("open dir " + dir.string(), errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return errno_error("fsync dir " + dir.string(), err);
  return {};
}

Status write_file_atomic(const fs::path& path, std::string_view data, mode_t mode) {
  fs::path dir = path.parent_path();
  thread_local std::mt19937_64 rng{std::random_device{}()};
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rng() % 1000000);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return errno_error("create " + tmp.string(), errno);
  // The umask must not widen or narrow what the caller asked for (0600 secrets).
  ::fchmod(fd, mode);
  Status st = write_all(fd, data, tmp.string());
  if (st.ok() && ::fsync(fd) != 0) st = errno_error("fsync " + tmp.string(), errno);
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    st = errno_error("rename " + tmp.string() + " to " + path.string(), errno);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return fsync_dir(dir);
}

Result<std::string> read_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    Error e = errno_error("read " + path.string(), err);
    if (err == ENOENT) e.code = Errc::not_found;
    if (err == EACCES) e.code = Errc::permission_denied;
    return e;
  }
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return errno_error("read " + path.string(), err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status ensure_dir(const fs::path& dir, mode_t mode) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Error(Errc::io, "create directory " + dir.string() + ": " + ec.message());
  if (::chmod(dir.c_str(), mode) != 0) return errno_error("chmod " + dir.string(), errno);
  return {};
}

DurableAppender::~DurableAppender() {
  close();
}
DurableAppender::DurableAppender(DurableAppender&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
DurableAppender& DurableAppender::operator=(DurableAppender&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

namespace {
// `path` opened for appending; created with `mode` when missing, and then
// its folder synced so that the new entry survives a crash.
Result<int> open_for_append(const fs::path& path, mode_t mode) {
  bool existed = fs::exists(path);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, mode);
  if (fd < 0) return errno_error("open " + path.string(), errno);
  if (!existed) {
    ::fchmod(fd, mode);
    if (auto st = fsync_dir(path.parent_path()); !st.ok()) {
      ::close(fd);
      return st.error();
    }
  }
  return fd;
}
}  // namespace

Result<DurableAppender> DurableAppender::open(const fs::path& path, mode_t mode) {
  auto fd = open_for_append(path, mode);
  if (!fd.ok()) return fd.error();
  DurableAppender a;
  a.fd_ = *fd;
  a.path_ = path;
  return a;
}

Status DurableAppender::append(std::string_view data) {
  if (fd_ < 0) return Error(Errc::internal, "append to closed file " + path_.string());
  if (auto st = write_all(fd_, data, path_.string()); !st.ok()) return st;
  if (::fdatasync(fd_) != 0) return errno_error("fdatasync " + path_.string(), errno);
  return {};
}

void DurableAppender::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

GroupCommitLog::GroupCommitLog(SyncFn sync) : sync_(sync ? sync : &::fdatasync) {}

GroupCommitLog::~GroupCommitLog() {
  close(false);
}

Status GroupCommitLog::open(const fs::path& path, mode_t mode) {
  auto opened = open_for_append(path, mode);
  if (!opened.ok()) return opened.error();
  const int fd = *opened;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size < 0) {
    const int err = errno;
    ::close(fd);
    return errno_error("seek " + path.string(), err);
  }
  close(false);
  std::lock_guard lk(mu_);
  fd_ = fd;
  path_ = path;
  written_ = synced_ = static_cast<std::uint64_t>(size);
  failure_.reset();
  return {};
}

bool GroupCommitLog::is_open() const {
  std::lock_guard lk(mu_);
  return fd_ >= 0;
}

Result<GroupCommitLog::Mark> GroupCommitLog::write(std::string_view data) {
  std::lock_guard lk(mu_);
  if (fd_ < 0) return Error(Errc::internal, "append to closed file " + path_.string());
  if (failure_) return *failure_;
  if (auto st = write_all(fd_, data, path_.string()); !st.ok()) return st.error();
  written_ += data.size();
  return Mark{file_, written_};
}

void GroupCommitLog::close(bool durable) {
  std::lock_guard lk(mu_);
  if (fd_ < 0) return;
  // A sync under way holds its own descriptor (a dup): closing this one
  // does not pull the file from under it.
  ::close(fd_);
  fd_ = -1;
  ended_[file_] = durable;
  // Waiters are short-lived: a few closed files back is plenty to answer.
  while (ended_.size() > 64) ended_.erase(ended_.begin());
  ++file_;
  written_ = synced_ = 0;
  failure_.reset();
  cv_.notify_all();
}

Status GroupCommitLog::wait_durable(Mark m) {
  std::unique_lock lk(mu_);
  for (;;) {
    if (m.file != file_) {
      auto it = ended_.find(m.file);
      if (it != ended_.end() && it->second) return {};
      return Error(Errc::io, path_.string() + " was closed before the change was synced");
    }
    if (failure_) return *failure_;
    if (synced_ >= m.end) return {};
    if (!syncing_) {
      // This thread syncs for every write made so far, its own included.
      syncing_ = true;
      const std::uint64_t file = file_, target = written_;
      const int fd = ::dup(fd_);
      lk.unlock();
      const int rc = fd < 0 ? -1 : sync_(fd);
      const int err = errno;
      if (fd >= 0) ::close(fd);
      lk.lock();
      syncing_ = false;
      ++syncs_;
      if (file == file_) {
        if (rc == 0)
          synced_ = std::max(synced_, target);
        else
          failure_ = errno_error("fdatasync " + path_.string(), err);
      }
      cv_.notify_all();
      continue;
    }
    cv_.wait(lk);
  }
}

bool GroupCommitLog::failed() const {
  std::lock_guard lk(mu_);
  return failure_.has_value();
}

std::uint64_t GroupCommitLog::synced() const {
  std::lock_guard lk(mu_);
  return synced_;
}

std::uint64_t GroupCommitLog::syncs() const {
  std::lock_guard lk(mu_);
  return syncs_;
}

}  // namespace factory
