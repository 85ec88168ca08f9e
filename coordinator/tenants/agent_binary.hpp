#pragma once
// The agent binary the coordinator serves (agents.binary): what guests
// download at GET /v1/agent/binary, whose hash new tenants' user-data pins,
// and what an agent self-update installs (agent_rollout.hpp). A snapshot
// holds the file as it was read: its bytes (shared, served from memory, so
// a download never reads the disk on an io thread), its sha256 and size,
// the version it carries after proto::kAgentVersionMark, or why it carries
// none, and the file's mtime.
//
// The file may be replaced while the coordinator runs (a new release
// copied over it). refresh() looks again (stat, and a read only when the
// mtime, size or inode changed) and waits on the disk: a worker's or the
// maintenance thread's call, never an io thread's. An io thread asks
// refresh_due() (at most once every 10 s it says yes) and posts the
// refresh to a worker; what it serves meanwhile is current().
//
// An upgrade order names its binary by sha256 (the URL carries
// ?sha256=...): the holder keeps the snapshot an upgrade last ordered
// (keep_for_orders) beside the current one, so an order already out stays
// downloadable after the file changed, until the next rollout.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace factory::tenants {

struct AgentBinarySnapshot {
  std::string path;
  std::shared_ptr<const std::string> bytes;  // null when the file could not be read
  std::string sha256;                        // "" when not read
  std::uint64_t size = 0;
  std::string version;     // "" when it carries none
  std::string no_version;  // why there is no version (or why the file is unreadable)
  std::int64_t mtime_ns = 0;
  std::uint64_t inode = 0;
  std::string read_at;  // RFC 3339

  bool readable() const { return bytes != nullptr; }
  // {"path","sha256","size","version" | "no_version","mtime","read_at"}
  nlohmann::json to_json() const;
  // What an upgrade with this binary is refused for, "" when it can be
  // ordered: "cannot upgrade: <path> carries no factory-agent version mark".
  std::string cannot_upgrade() const;
};

// Reads `path` into a snapshot (waits on the disk).
std::shared_ptr<const AgentBinarySnapshot> read_agent_binary(const std::string& path);

class AgentBinary {
 public:
  static constexpr std::chrono::seconds kRecheckEvery{10};

  // Reads the file once (waits on the disk: at start, before serving).
  explicit AgentBinary(std::string path);

  const std::string& path() const { return path_; }
  // The snapshot served now; never waits on the disk.
  std::shared_ptr<const AgentBinarySnapshot> current() const;
  // The snapshot whose sha256 is `sha` (the current one, or the one an
  // upgrade last ordered), or null; never waits on the disk.
  std::shared_ptr<const AgentBinarySnapshot> by_sha256(const std::string& sha) const;
  // The file looked at again now, and read again if it changed; the
  // snapshot served from now on. Waits on the disk.
  std::shared_ptr<const AgentBinarySnapshot> refresh();
  // refresh() when the last look was kRecheckEvery ago or more, else current().
  std::shared_ptr<const AgentBinarySnapshot> refresh_if_due();
  // True (once per kRecheckEvery) when a look is due: for an io thread,
  // which then posts refresh() to a worker.
  bool refresh_due();
  // The snapshot an upgrade ordered, kept downloadable by its hash.
  void keep_for_orders(std::shared_ptr<const AgentBinarySnapshot> s);
  // Called (on the refreshing thread) with every new snapshot, and once now.
  void on_change(std::function<void(const AgentBinarySnapshot&)> f);

 private:
  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const AgentBinarySnapshot> current_, ordered_;
  std::chrono::steady_clock::time_point last_look_{};
  bool look_queued_ = false;
  std::function<void(const AgentBinarySnapshot&)> on_change_;
  std::mutex refresh_mu_;  // one refresh at a time
};

}  // namespace factory::tenants
