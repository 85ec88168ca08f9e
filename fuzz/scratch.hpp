#pragma once
// For fuzz targets whose input is a file the product opens by path: one
// scratch folder per fuzzing process (removed when it exits) and a plain
// write of the input into it. Plain, not common/atomic_file's fsync'd write:
// a fuzzer writes the file a million times, and nothing here must survive a
// crash.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace factory::fuzz {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : dir_(std::filesystem::temp_directory_path() /
             ("factory-fuzz-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return dir_; }
  // Empties the folder, so each input starts from nothing.
  void clear() const {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

 private:
  std::filesystem::path dir_;
};

inline void write_bytes(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace factory::fuzz
