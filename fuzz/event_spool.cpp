// The agent's event spool as a crash, a full disk or the guest's root may
// leave it (agent/link/spool.hpp): any bytes in spool.log and spool.acked
// open into a spool (records that do not parse skipped) or an error, and the
// spool then answers what is pending. Input: spool.acked's bytes, a NUL, then
// spool.log's bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "agent/link/spool.hpp"
#include "fuzz/scratch.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const factory::fuzz::ScratchDir scratch("spool");
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto nul = in.find('\0');
  scratch.clear();
  const auto& dir = scratch.path();
  if (nul == std::string_view::npos) {
    factory::fuzz::write_bytes(dir / "spool.log", in);
  } else {
    factory::fuzz::write_bytes(dir / "spool.acked", in.substr(0, nul));
    factory::fuzz::write_bytes(dir / "spool.log", in.substr(nul + 1));
  }
  auto spool = factory::agent::EventSpool::open(dir, 100);
  if (spool) {
    for (auto& e : (*spool)->pending_after(0, 1000)) (void)e.body.dump();
    (void)(*spool)->pending();
    (void)(*spool)->dropped();
  }
  return 0;
}
