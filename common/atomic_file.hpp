#pragma once
// Durable file writes. Every piece of state Factory keeps on disk goes through
// here so that a crash or a power cut leaves either the old or the new file,
// never a torn one: write a temp file, fsync it, rename over, fsync the dir.
#include <sys/types.h>

#include <filesystem>
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

}  // namespace factory
