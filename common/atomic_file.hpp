#pragma once
// Durable file writes. Every piece of state Factory keeps on disk goes through
// here so that a crash or a power cut leaves either the old or the new file,
// never a torn one: write a temp file, fsync it, rename over, fsync the dir.
#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory {

Status write_file_atomic(const std::filesystem::path& path, std::string_view data,
                         mode_t mode = 0644);
Result<std::string> read_file(const std::filesystem::path& path);
// Creates the directory (and parents) if missing and sets its mode.
Status ensure_dir(const std::filesystem::path& dir, mode_t mode = 0755);
Status fsync_dir(const std::filesystem::path& dir);

// An append-only file whose appends are durable when append() returns.
class DurableAppender {
 public:
  DurableAppender() = default;
  ~DurableAppender();
  DurableAppender(const DurableAppender&) = delete;
  DurableAppender& operator=(const DurableAppender&) = delete;
  DurableAppender(DurableAppender&& o) noexcept;
  DurableAppender& operator=(DurableAppender&& o) noexcept;

  static Result<DurableAppender> open(const std::filesystem::path& path, mode_t mode = 0600);
  Status append(std::string_view data);  // write all + fdatasync
  void close();
  bool is_open() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
  std::filesystem::path path_;
};

// An append-only file whose appends are made durable in groups. write()
// puts bytes in the file (no sync) and says where they end; wait_durable()
// returns once an fdatasync that began after those bytes were written has
// finished. The first waiter syncs for everyone whose bytes are written by
// then; the others wait for it. N changes from N threads at once cost one
// or two syncs instead of N, and each caller still returns only when its
// change is on disk.
//
// Writes and close() are the caller's to serialize (one lock around them);
// wait_durable() is called without that lock, from any thread. A failed
// sync fails every change written to that file and not yet known durable
// (Linux may have dropped their pages): the caller closes the file and cuts
// it back to synced() before it appends again.
class GroupCommitLog {
 public:
  // Where a write ended: which opening of the file, and the byte offset.
  struct Mark {
    std::uint64_t file = 0;
    std::uint64_t end = 0;
  };
  using SyncFn = int (*)(int fd);  // ::fdatasync, or a test's slower disk

  explicit GroupCommitLog(SyncFn sync = nullptr);
  ~GroupCommitLog();
  GroupCommitLog(const GroupCommitLog&) = delete;
  GroupCommitLog& operator=(const GroupCommitLog&) = delete;

  // Opens the file for appending; what it holds already counts as durable.
  Status open(const std::filesystem::path& path, mode_t mode = 0600);
  bool is_open() const;
  Result<Mark> write(std::string_view data);
  // Ends this opening of the file. `durable`: everything written to it is
  // on disk by other means (a snapshot written since): its waiters succeed;
  // otherwise they fail.
  void close(bool durable);
  Status wait_durable(Mark m);

  bool failed() const;           // a sync of the open file failed
  std::uint64_t synced() const;  // the open file's bytes known durable
  std::uint64_t syncs() const;   // fdatasync calls made, for tests and metrics

 private:
  SyncFn sync_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int fd_ = -1;
  std::filesystem::path path_;
  std::uint64_t file_ = 0;  // bumped by every close
  std::uint64_t written_ = 0, synced_ = 0;
  bool syncing_ = false;
  std::optional<Error> failure_;
  std::map<std::uint64_t, bool> ended_;  // a closed file: were its bytes durable
  std::uint64_t syncs_ = 0;
};

}  // namespace factory
