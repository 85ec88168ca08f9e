// The agent's event spool as a crash, a full disk or the guest's root may
// leave it (agent/link/spool.hpp): any bytes in spool.log and spool.acked
// open into a spool (records that do not parse skipped) or an error, and the
// spool then answers what is pending. Input: spool.acked's bytes, a NUL, then
// spool.log's bytes.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "agent/link/spool.hpp"

namespace {
// A scratch folder per process, removed when it exits.
struct Scratch {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("factory-fuzz-spool-" + std::to_string(::getpid()));
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};
const std::filesystem::path& scratch() {
  static const Scratch s;
  return s.dir;
}
void write(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto nul = in.find('\0');
  std::string_view acked = nul == std::string_view::npos ? std::string_view{} : in.substr(0, nul);
  std::string_view log = nul == std::string_view::npos ? in : in.substr(nul + 1);
  const auto& dir = scratch();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write(dir / "spool.log", log);
  if (nul != std::string_view::npos) write(dir / "spool.acked", acked);
  auto spool = factory::agent::EventSpool::open(dir, 100);
  if (spool) {
    for (auto& e : (*spool)->pending_after(0, 1000)) (void)e.body.dump();
    (void)(*spool)->pending();
    (void)(*spool)->dropped();
  }
  return 0;
}
