#include "coordinator/tenants/agent_binary.hpp"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/pki.hpp"
#include "contract/agent_upgrade.hpp"

namespace factory::tenants {

using nlohmann::json;

json AgentBinarySnapshot::to_json() const {
  json j = {{"path", path}};
  if (readable()) {
    j["sha256"] = sha256;
    j["size"] = size;
  }
  if (!version.empty())
    j["version"] = version;
  else
    j["no_version"] = no_version;
  if (mtime_ns != 0)
    j["mtime"] = format_rfc3339(Clock::time_point(
        std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(mtime_ns))));
  j["read_at"] = read_at;
  return j;
}

std::string AgentBinarySnapshot::cannot_upgrade() const {
  if (!readable()) return "cannot upgrade: " + no_version;
  if (version.empty()) return "cannot upgrade: " + no_version;
  return "";
}

namespace {

struct FileId {
  std::int64_t mtime_ns = 0;
  std::uint64_t size = 0, inode = 0;
  bool ok = false;
};

FileId file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
          static_cast<std::uint64_t>(st.st_size), static_cast<std::uint64_t>(st.st_ino), true};
}

}  // namespace

std::shared_ptr<const AgentBinarySnapshot> read_agent_binary(const std::string& path) {
  auto s = std::make_shared<AgentBinarySnapshot>();
  s->path = path;
  s->read_at = format_rfc3339(Clock::now());
  const FileId id = file_id(path);
  auto bin = read_file(path);
  if (!bin) {
    s->no_version = path + " is not readable (" + bin.error().message + ")";
    return s;
  }
  s->mtime_ns = id.mtime_ns;
  s->inode = id.inode;
  s->sha256 = pki::sha256_hex(*bin);
  s->size = bin->size();
  if (auto v = proto::agent_binary_version(*bin)) {
    s->version = *v;
  } else if (v.error().code == Errc::not_found) {
    s->no_version = path + " carries no factory-agent version mark";
  } else {
    s->no_version = path + ": " + v.error().message;
  }
  s->bytes = std::make_shared<const std::string>(std::move(*bin));
  return s;
}

AgentBinary::AgentBinary(std::string path) : path_(std::move(path)) {
  current_ = read_agent_binary(path_);
  last_look_ = std::chrono::steady_clock::now();
}

std::shared_ptr<const AgentBinarySnapshot> AgentBinary::current() const {
  std::lock_guard lk(mu_);
  return current_;
}

std::shared_ptr<const AgentBinarySnapshot> AgentBinary::by_sha256(const std::string& sha) const {
  std::lock_guard lk(mu_);
  if (current_ && current_->readable() && current_->sha256 == sha) return current_;
  if (ordered_ && ordered_->sha256 == sha) return ordered_;
  return nullptr;
}

std::shared_ptr<const AgentBinarySnapshot> AgentBinary::refresh() {
  std::lock_guard one(refresh_mu_);
  std::shared_ptr<const AgentBinarySnapshot> was = current();
  const FileId id = file_id(path_);
  {
    std::lock_guard lk(mu_);
    last_look_ = std::chrono::steady_clock::now();
    look_queued_ = false;
  }
  const bool same = id.ok ? (was->readable() && was->mtime_ns == id.mtime_ns &&
                             was->size == id.size && was->inode == id.inode)
                          : !was->readable();
  if (same) return was;
  auto now = read_agent_binary(path_);
  if (now->readable() && was->readable() && now->sha256 == was->sha256) {
    // Touched, not changed: keep the bytes, note the new mtime.
    auto same_bytes = std::make_shared<AgentBinarySnapshot>(*was);
    same_bytes->mtime_ns = now->mtime_ns;
    same_bytes->inode = now->inode;
    now = same_bytes;
  } else if (now->readable()) {
    spdlog::info("agent binary {} changed: now {} (sha256 {})", path_,
                 now->version.empty() ? "without a version mark" : now->version, now->sha256);
  } else {
    spdlog::warn("agent binary {}: {}", path_, now->no_version);
  }
  std::function<void(const AgentBinarySnapshot&)> notify;
  {
    std::lock_guard lk(mu_);
    current_ = now;
    notify = on_change_;
  }
  if (notify) notify(*now);
  return now;
}

std::shared_ptr<const AgentBinarySnapshot> AgentBinary::refresh_if_due() {
  {
    std::lock_guard lk(mu_);
    if (std::chrono::steady_clock::now() - last_look_ < kRecheckEvery) return current_;
  }
  return refresh();
}

bool AgentBinary::refresh_due() {
  std::lock_guard lk(mu_);
  if (look_queued_ || std::chrono::steady_clock::now() - last_look_ < kRecheckEvery) return false;
  look_queued_ = true;
  return true;
}

void AgentBinary::keep_for_orders(std::shared_ptr<const AgentBinarySnapshot> s) {
  std::lock_guard lk(mu_);
  ordered_ = std::move(s);
}

void AgentBinary::on_change(std::function<void(const AgentBinarySnapshot&)> f) {
  std::shared_ptr<const AgentBinarySnapshot> now;
  {
    std::lock_guard lk(mu_);
    on_change_ = f;
    now = current_;
  }
  if (f && now) f(*now);
}

}  // namespace factory::tenants
