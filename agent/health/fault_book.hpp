#pragma once
// The Xids the guest's GPUs reported, each kept with how often and when it
// was first and last seen, until someone acknowledges it: dcgm-exporter's
// users complain of the opposite (an Xid that is stale until a restart, or
// gone after one). The book is a file in the agent's state directory
// (0600), written whole and atomically at each change and read whole at
// each sample, so an agent restart or a guest reboot keeps it and `factory-agent
// faults ack` (another process) clears it for the running agent too. Changes
// from several processes are serialized by flock on a lock file beside it.
//
// Records are by GPU UUID, so a card that comes back at another index keeps
// its Xids, and a tenant moved to a healthy card does not carry the old
// card's Xids to the new one (the sample shows those of the GPUs it sees).
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/durations.hpp"
#include "common/error.hpp"

namespace factory::agent {

struct XidRecord {
  std::string uuid;    // "" when the GPU could not be named (lost before it was seen)
  int gpu_index = -1;  // NVML's index when it was seen: names a GPU without a UUID
  int xid = 0;
  std::uint64_t count = 0;
  std::string first_at, last_at;  // RFC 3339
};

class FaultBook {
 public:
  // The book of an agent whose state directory is `state_dir`.
  static std::filesystem::path file_in(const std::filesystem::path& state_dir);

  explicit FaultBook(std::filesystem::path file) : file_(std::move(file)) {}
  const std::filesystem::path& file() const { return file_; }

  // One more occurrence of `xid` on the GPU. Bounded: at most kPerGpu
  // distinct Xids per GPU and kTotal in all; past that the one seen least
  // recently goes.
  Status record(const std::string& uuid, int gpu_index, int xid, Clock::time_point at);
  // Every record, oldest first (by first_at). No file: none.
  Result<std::vector<XidRecord>> list() const;
  // Forgets the records that match (`uuid` empty: every GPU; `xid` 0: every
  // Xid); returns how many went.
  Result<std::size_t> acknowledge(const std::string& uuid, int xid);

  static constexpr std::size_t kPerGpu = 16;
  static constexpr std::size_t kTotal = 64;

 private:
  std::filesystem::path file_;
};

}  // namespace factory::agent
