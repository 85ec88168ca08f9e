#include <fcntl.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <map>

#include <spdlog/spdlog.h>

#include "common/atomic_file.hpp"
#include "coordinator/store/store.hpp"

namespace factory::store {
namespace fs = std::filesystem;

nlohmann::json TenantRecord::to_json() const {
  return {{"name", name},   {"tier", tier},     {"phase", phase}, {"created_at", created_at},
          {"spec", spec},   {"agent", agent},   {"status", status}};
}

Result<TenantRecord> TenantRecord::from_json(const nlohmann::json& j) {
  try {
    TenantRecord t;
    t.name = j.at("name").get<std::string>();
    t.tier = j.value("tier", "");
    t.phase = j.value("phase", "pending");
    t.created_at = j.value("created_at", "");
    t.spec = j.value("spec", nlohmann::json::object());
    t.agent = j.value("agent", nlohmann::json::object());
    t.status = j.value("status", nlohmann::json::object());
    return t;
  } catch (const nlohmann::json::exception& e) {
    return Error(Errc::invalid_argument, std::string("tenant record: ") + e.what());
  }
}

namespace {

class FileStore final : public Store {
 public:
  explicit FileStore(fs::path dir) : dir_(std::move(dir)) {}

  Status open() {
    for (auto sub : {"tenants", "events"})
      if (auto st = ensure_dir(dir_ / sub, 0700); !st.ok()) return st;
    if (auto st = ensure_dir(dir_, 0700); !st.ok()) return st;
    for (auto& entry : fs::directory_iterator(dir_ / "tenants")) {
      if (entry.path().extension() != ".json") continue;
      auto text = read_file(entry.path());
      if (!text) return text.error();
      auto j = nlohmann::json::parse(*text, nullptr, false);
      if (j.is_discarded())
        return Error(Errc::io, entry.path().string() +
                                   " is not valid JSON; restore it from a backup or remove it");
      auto t = TenantRecord::from_json(j);
      if (!t) return t.error().with_context(entry.path().string());
      tenants_[t->name] = std::move(*t);
    }
    for (auto& entry : fs::directory_iterator(dir_ / "events")) {
      if (entry.path().extension() != ".jsonl") continue;
      if (auto st = load_events(entry.path().stem().string(), entry.path()); !st.ok()) return st;
    }
    return {};
  }

  std::vector<TenantRecord> list_tenants() const override {
    std::vector<TenantRecord> out;
    for (auto& [_, t] : tenants_) out.push_back(t);
    return out;
  }

  std::optional<TenantRecord> get_tenant(const std::string& name) const override {
    auto it = tenants_.find(name);
    if (it == tenants_.end()) return std::nullopt;
    return it->second;
  }

  Status put_tenant(const TenantRecord& t) override {
    auto st = write_file_atomic(dir_ / "tenants" / (t.name + ".json"), t.to_json().dump(2), 0600);
    if (!st.ok()) return st.error().with_context("store tenant " + t.name);
    tenants_[t.name] = t;
    return {};
  }

  Status delete_tenant(const std::string& name) override {
    std::error_code ec;
    fs::remove(dir_ / "tenants" / (name + ".json"), ec);
    if (ec) return Error(Errc::io, "remove tenant " + name + ": " + ec.message());
    appenders_.erase(name);
    fs::remove(dir_ / "events" / (name + ".jsonl"), ec);
    if (auto st = fsync_dir(dir_ / "tenants"); !st.ok()) return st;
    tenants_.erase(name);
    events_.erase(name);
    return {};
  }

  Result<bool> append_event(const std::string& tenant, const StoredEvent& e) override {
    auto& log = events_[tenant];
    uint64_t& last = log.last_id[e.agent_id];
    if (e.id <= last) return false;
    auto& app = appenders_[tenant];
    if (!app.is_open()) {
      auto a = DurableAppender::open(dir_ / "events" / (tenant + ".jsonl"), 0600);
      if (!a) return a.error();
      app = std::move(*a);
    }
    nlohmann::json line = {{"agent_id", e.agent_id},
                           {"id", e.id},
                           {"received_at", e.received_at},
                           {"event", e.event}};
    if (auto st = app.append(line.dump() + "\n"); !st.ok())
      return st.error().with_context("store event for " + tenant);
    last = e.id;
    ++log.count;
    log.recent.push_back(e);
    if (log.recent.size() > kRecentKept) log.recent.pop_front();
    return true;
  }

  uint64_t last_event_id(const std::string& tenant, const std::string& agent_id) const override {
    auto it = events_.find(tenant);
    if (it == events_.end()) return 0;
    auto a = it->second.last_id.find(agent_id);
    return a == it->second.last_id.end() ? 0 : a->second;
  }

  std::vector<StoredEvent> recent_events(const std::string& tenant, size_t max) const override {
    auto it = events_.find(tenant);
    if (it == events_.end()) return {};
    auto& r = it->second.recent;
    size_t skip = r.size() > max ? r.size() - max : 0;
    return {r.begin() + static_cast<long>(skip), r.end()};
  }

  size_t event_count(const std::string& tenant) const override {
    auto it = events_.find(tenant);
    return it == events_.end() ? 0 : it->second.count;
  }

 private:
  static constexpr size_t kRecentKept = 500;

  struct EventLog {
    std::map<std::string, uint64_t> last_id;  // per agent identity
    size_t count = 0;
    std::deque<StoredEvent> recent;
  };

  Status load_events(const std::string& tenant, const fs::path& path) {
    auto text = read_file(path);
    if (!text) return text.error();
    auto& log = events_[tenant];
    size_t pos = 0, good_end = 0;
    while (pos < text->size()) {
      size_t nl = text->find('\n', pos);
      if (nl == std::string::npos) break;  // torn tail: no newline, written during a crash
      auto j = nlohmann::json::parse(std::string_view(*text).substr(pos, nl - pos), nullptr, false);
      if (j.is_discarded() || !j.contains("id")) break;
      StoredEvent e;
      e.agent_id = j.value("agent_id", "");
      e.id = j.value("id", uint64_t{0});
      e.received_at = j.value("received_at", "");
      e.event = j.value("event", nlohmann::json::object());
      uint64_t& last = log.last_id[e.agent_id];
      last = std::max(last, e.id);
      ++log.count;
      log.recent.push_back(std::move(e));
      if (log.recent.size() > kRecentKept) log.recent.pop_front();
      pos = nl + 1;
      good_end = pos;
    }
    if (good_end < text->size()) {
      spdlog::warn("store: {}: cutting {} bytes of a torn last record (crash during a write)",
                   path.string(), text->size() - good_end);
      if (::truncate(path.c_str(), static_cast<off_t>(good_end)) != 0)
        return errno_error("truncate " + path.string(), errno);
    }
    return {};
  }

  fs::path dir_;
  std::map<std::string, TenantRecord> tenants_;
  std::map<std::string, EventLog> events_;
  std::map<std::string, DurableAppender> appenders_;
};

}  // namespace

Result<std::unique_ptr<Store>> open_file_store(const std::string& dir) {
  auto s = std::make_unique<FileStore>(dir);
  if (auto st = s->open(); !st.ok()) return st.error().with_context("store " + dir);
  return std::unique_ptr<Store>(std::move(s));
}

}  // namespace factory::store
