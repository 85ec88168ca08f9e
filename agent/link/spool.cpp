#include "agent/link/spool.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include "common/durations.hpp"

namespace factory::agent {
namespace fs = std::filesystem;

Result<std::unique_ptr<EventSpool>> EventSpool::open(const fs::path& dir, size_t max_events) {
  std::unique_ptr<EventSpool> s(new EventSpool());
  s->dir_ = dir;
  s->max_events_ = std::max<size_t>(max_events, 16);
  if (auto st = ensure_dir(dir, 0700); !st.ok()) return st.error();
  if (auto a = read_file(dir / "spool.acked")) {
    try {
      auto j = nlohmann::json::parse(*a);
      s->acked_ = j.value("acked", uint64_t{0});
      s->last_id_ = j.value("last_id", s->acked_);
      s->dropped_ = j.value("dropped", uint64_t{0});
    } catch (...) {
      spdlog::warn(
          "spool: {} unreadable; resending everything in the log (duplicates are dropped "
          "by the coordinator)",
          (dir / "spool.acked").string());
    }
  }
  fs::path logp = dir / "spool.log";
  bool repaired = false;
  if (auto text = read_file(logp)) {
    // One JSON object per line. A line that does not end in '\n' is the one
    // a crash tore while appending: nothing after it was ever written, and
    // it was never acknowledged to its emitter, so it is cut off. A whole
    // line that does not read is damage in the middle: it is skipped, with
    // its offset, and every good record after it is kept.
    size_t pos = 0, good_end = 0;
    // A damaged record says nothing of its id, but ids are consecutive in
    // the log: the one just before a good record with id n had n - 1, and
    // so on; after the last good one, its id + 1. It was lost (never to be
    // delivered) when that id is past the acknowledged floor.
    uint64_t lost = 0, unknown = 0, prev_id = 0;
    size_t damaged = 0;
    while (pos < text->size()) {
      size_t nl = text->find('\n', pos);
      if (nl == std::string::npos) break;
      auto line = std::string_view(*text).substr(pos, nl - pos);
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("id") && j["id"].is_number_unsigned()) {
        uint64_t id = j["id"].get<uint64_t>();
        for (uint64_t k = 1; k <= unknown; ++k)
          if (id > k && id - k > s->acked_) ++lost;
        unknown = 0;
        prev_id = id;
        s->last_id_ = std::max(s->last_id_, id);
        if (id > s->acked_ && (s->pending_.empty() || id > s->pending_.back().id))
          s->pending_.push_back({id, j});
        ++s->lines_in_log_;
      } else {
        ++damaged;
        ++unknown;
        spdlog::warn(
            "spool: {} offset {}: skipping a damaged record ({} bytes); the records after "
            "it are kept",
            logp.string(), pos, line.size());
      }
      pos = nl + 1;
      good_end = pos;
    }
    for (uint64_t k = 1; k <= unknown; ++k)
      if (prev_id + k > s->acked_) ++lost;
    if (good_end < text->size()) {
      spdlog::warn("spool: cutting a torn record ({} bytes) at the end of {} (offset {})",
                   text->size() - good_end, logp.string(), good_end);
      if (::truncate(logp.c_str(), static_cast<off_t>(good_end)) != 0)
        return errno_error("truncate " + logp.string(), errno);
    }
    if (damaged > 0) {
      // What was lost is counted where losses show (heartbeats, `factory
      // status`), and the log is rewritten without the damage, so the
      // warning is given once.
      s->dropped_ += lost;
      repaired = true;
    }
  }
  if (repaired) {
    if (auto st = s->compact_locked(); !st.ok()) return st.error().with_context("spool");
    return s;
  }
  auto app = DurableAppender::open(logp, 0600);
  if (!app) return app.error();
  s->log_ = std::move(*app);
  return s;
}

namespace {
// An event must fit in one frame (64 KiB). Long strings (command output) keep
// their tail, which is where the error usually is.
void fit_in_a_frame(nlohmann::json& event) {
  constexpr size_t kMaxEventBytes = 48 * 1024, kKeepTail = 4096;
  if (event.dump().size() <= kMaxEventBytes) return;
  for (auto& [k, v] : event.items()) {
    if (v.is_string() && v.get_ref<const std::string&>().size() > kKeepTail) {
      const auto& s = v.get_ref<const std::string&>();
      v = "[truncated]..." + s.substr(s.size() - kKeepTail);
    }
  }
  if (event.dump().size() > kMaxEventBytes)
    event = {{"kind", event.value("kind", "unknown")}, {"truncated", true}};
}
}  // namespace

Result<uint64_t> EventSpool::emit(nlohmann::json event) {
  fit_in_a_frame(event);
  std::function<void()> notify;
  uint64_t id;
  {
    std::lock_guard lk(mu_);
    id = last_id_ + 1;
    event["id"] = id;
    if (!event.contains("time")) event["time"] = format_rfc3339(Clock::now());
    if (auto st = log_.append(event.dump() + "\n"); !st.ok())
      return st.error().with_context("spool");
    last_id_ = id;
    ++lines_in_log_;
    pending_.push_back({id, std::move(event)});
    if (pending_.size() > max_events_) {
      // Bounded: the oldest undelivered event goes. It is counted, and the
      // count travels with every heartbeat so the loss is visible.
      size_t drop = pending_.size() - max_events_;
      uint64_t new_floor = pending_[drop - 1].id;
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(drop));
      dropped_ += drop;
      acked_ = std::max(acked_, new_floor);
      if (lines_in_log_ > 2 * max_events_) (void)compact_locked();
    }
    notify = listener_;
  }
  if (notify) notify();
  return id;
}

std::vector<SpooledEvent> EventSpool::pending_after(uint64_t after, size_t max) const {
  std::lock_guard lk(mu_);
  std::vector<SpooledEvent> out;
  for (auto& e : pending_) {
    if (e.id <= after) continue;
    out.push_back(e);
    if (out.size() >= max) break;
  }
  return out;
}

Status EventSpool::ack_through(uint64_t id) {
  std::lock_guard lk(mu_);
  if (id <= acked_) return {};
  id = std::min(id, last_id_);
  acked_ = id;
  while (!pending_.empty() && pending_.front().id <= id) pending_.erase(pending_.begin());
  nlohmann::json j = {{"acked", acked_}, {"last_id", last_id_}, {"dropped", dropped_}};
  if (auto st = write_file_atomic(dir_ / "spool.acked", j.dump(), 0600); !st.ok()) return st;
  // Rewrite the log only when most of it is delivered history.
  if (lines_in_log_ > 256 && pending_.size() * 2 < lines_in_log_) return compact_locked();
  return {};
}

Status EventSpool::compact_locked() {
  std::string data;
  for (auto& e : pending_) data += e.body.dump() + "\n";
  nlohmann::json j = {{"acked", acked_}, {"last_id", last_id_}, {"dropped", dropped_}};
  if (auto st = write_file_atomic(dir_ / "spool.acked", j.dump(), 0600); !st.ok()) return st;
  log_.close();
  if (auto st = write_file_atomic(dir_ / "spool.log", data, 0600); !st.ok()) return st;
  auto app = DurableAppender::open(dir_ / "spool.log", 0600);
  if (!app) return app.error();
  log_ = std::move(*app);
  lines_in_log_ = pending_.size();
  return {};
}

uint64_t EventSpool::acked() const {
  std::lock_guard lk(mu_);
  return acked_;
}
uint64_t EventSpool::last_id() const {
  std::lock_guard lk(mu_);
  return last_id_;
}
size_t EventSpool::pending() const {
  std::lock_guard lk(mu_);
  return pending_.size();
}
uint64_t EventSpool::dropped() const {
  std::lock_guard lk(mu_);
  return dropped_;
}
void EventSpool::set_listener(std::function<void()> f) {
  std::lock_guard lk(mu_);
  listener_ = std::move(f);
}

}  // namespace factory::agent
