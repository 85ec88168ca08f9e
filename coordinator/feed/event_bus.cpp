#include "coordinator/feed/event_bus.hpp"

#include "common/durations.hpp"

namespace factory::feed {

std::string format_sse(const FeedEvent& e) {
  // data is one line of JSON (nlohmann escapes every newline), so one
  // `data:` line carries it whole. Sized once: the history keeps these
  // strings, and appending piece by piece left up to twice the text's size
  // allocated in each (history_bytes counts the text).
  const std::string id = std::to_string(e.id);
  constexpr std::string_view kId = "id: ", kEvent = "\nevent: ", kData = "\ndata: ", kEnd = "\n\n";
  std::string out;
  out.reserve(kId.size() + id.size() + kEvent.size() + e.type.size() + kData.size() +
              e.data.size() + kEnd.size());
  out.append(kId).append(id).append(kEvent).append(e.type).append(kData).append(e.data).append(
      kEnd);
  return out;
}

namespace {

std::uint64_t now_micros() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
          .count());
}

// An event of the stream itself, not of a tenant: no id, so a reader that
// reconnects still resumes after the last tenant event it got.
std::string control_event(const std::string& type, const nlohmann::json& data) {
  return "event: " + type + "\ndata: " + data.dump() + "\n\n";
}

}  // namespace

EventBus::EventBus(EventBusOptions opts) : opts_(std::move(opts)), log_(opts_.log) {
  // With a log, ids are the database's (from 1): the first comes back from it.
  next_id_ = log_ ? 1 : opts_.first_id ? opts_.first_id : now_micros();
  if (opts_.history == 0) opts_.history = 1;
  if (opts_.heartbeat.count() > 0) heartbeats_ = std::thread([this] { heartbeat_loop(); });
  if (log_)
    log_->start(opts_.history, [this](std::vector<store::FeedRecord> records, bool live) {
      from_log(std::move(records), live);
    });
}

EventBus::~EventBus() {
  close();
  // At the latest here (the store closes it first, off the io threads): the
  // log's thread must not hand events to a bus that is gone. Closing it may
  // wait on the database, which close() (called on an io thread) must not.
  if (log_) log_->close();
}

void EventBus::close() {
  std::map<std::uint64_t, Sub> subs;
  {
    std::lock_guard lk(mu_);
    if (closed_) return;
    closed_ = true;
    subs.swap(subs_);
    per_principal_.clear();
    unreserved_ = 0;
    stats_.subscribers = 0;
  }
  cv_.notify_all();
  if (heartbeats_.joinable()) heartbeats_.join();
  for (auto& [h, s] : subs) s.sink->close_with(": the coordinator is stopping\n\n");
}

std::uint64_t EventBus::publish(const std::string& type, const std::string& tenant,
                                nlohmann::json data) {
  if (!data.is_object()) data = nlohmann::json{{"value", std::move(data)}};
  data["tenant"] = tenant;
  if (!data.contains("time")) data["time"] = format_rfc3339(Clock::now());
  // What a guest sent may hold any bytes; an invalid UTF-8 sequence becomes
  // U+FFFD instead of an exception on a publisher's thread.
  return publish_text(type, tenant,
                      data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::uint64_t EventBus::publish_text(const std::string& type, const std::string& tenant,
                                     std::string text) {
  if (log_) {
    // Queued only: it reaches the readers (this replica's too) once the
    // database has numbered it (from_log).
    log_->append({0, "", type, tenant, std::move(text)});
    return 0;
  }
  std::lock_guard lk(mu_);
  const std::uint64_t id = next_id_++;
  distribute_locked({id, type, tenant, std::move(text), ""}, true);
  return id;
}

void EventBus::publish_note(nlohmann::json data) {
  if (!log_) return;
  log_->append(
      {0, "", kNoteType, "", data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)});
}

void EventBus::from_log(std::vector<store::FeedRecord> records, bool live) {
  for (auto& r : records) {
    FeedEvent e{r.id, std::move(r.type), std::move(r.tenant), std::move(r.data),
                std::move(r.origin)};
    const bool own = e.origin == log_->origin();
    // Before the readers get it: a reader that sees an agent's `connected`
    // and then reads GET /v1/tenants finds it connected there too.
    if (opts_.on_logged) opts_.on_logged(e, own, live);
    if (e.type == kNoteType) continue;
    std::lock_guard lk(mu_);
    if (closed_) return;
    // The log hands each id once, in order; this is the bus's own guard.
    if (e.id < next_id_) continue;
    next_id_ = e.id + 1;
    // This replica's own events were published since the bus was made,
    // whichever read brings them: every reader may want them.
    distribute_locked(e, live || own);
  }
  following_ = true;
}

void EventBus::distribute_locked(const FeedEvent& e, bool to_all) {
  auto bytes = std::make_shared<const std::string>(format_sse(e));
  ++stats_.published;
  for (auto it = subs_.begin(); it != subs_.end();) {
    auto cur = it++;
    Sub& s = cur->second;
    if (!s.tenant.empty() && s.tenant != e.tenant) continue;
    // A reader resuming past this event (its Last-Event-ID from another
    // replica) had it already.
    if (e.id <= s.last_sent || (!to_all && !s.positioned)) continue;
    if (!deliver(s, bytes)) {
      drop_slow(cur);
      continue;
    }
    s.last_sent = e.id;
  }
  ring_bytes_ += bytes->size();
  ring_.push_back({e.id, e.tenant, std::move(bytes)});
  while (ring_.size() > 1 && (ring_.size() > opts_.history || ring_bytes_ > opts_.history_bytes)) {
    ring_bytes_ -= ring_.front().sse->size();
    ring_.pop_front();
  }
}

bool EventBus::deliver(Sub& s, const std::string& bytes) {
  return s.sink->write(bytes);
}

bool EventBus::deliver(Sub& s, const std::shared_ptr<const std::string>& bytes) {
  return s.sink->write_shared(bytes);
}

void EventBus::drop_slow(std::map<std::uint64_t, Sub>::iterator it) {
  ++stats_.dropped_slow;
  nlohmann::json why = {{"reason", "slow_reader"},
                        {"message",
                         "this reader fell too far behind and was dropped; reconnect with "
                         "Last-Event-ID to resume"},
                        {"last_event_id", std::to_string(it->second.last_sent)}};
  it->second.sink->close_with(control_event("dropped", why));
  erase_locked(it);
}

void EventBus::erase_locked(std::map<std::uint64_t, Sub>::iterator it) {
  const Reader& r = it->second.reader;
  if (auto p = per_principal_.find(r.principal); p != per_principal_.end() && --p->second == 0)
    per_principal_.erase(p);
  if (!r.reserved) --unreserved_;
  subs_.erase(it);
  stats_.subscribers = subs_.size();
}

std::string EventBus::refusal(const Reader& reader) const {
  std::lock_guard lk(mu_);
  return refusal_locked(reader);
}

std::string EventBus::refusal_locked(const Reader& reader) const {
  if (closed_) return "the coordinator is stopping";
  if (subs_.size() >= opts_.max_subscribers)
    return "too many readers of /v1/events (" + std::to_string(opts_.max_subscribers) + ")";
  if (!reader.reserved && unreserved_ + opts_.reserved >= opts_.max_subscribers)
    return "too many readers of /v1/events with read-only tokens; the last " +
           std::to_string(opts_.reserved) + " places are kept for the admin token";
  auto p = per_principal_.find(reader.principal);
  if (p != per_principal_.end() && p->second >= opts_.max_per_principal)
    return "this token already reads /v1/events " + std::to_string(p->second) + " times (at most " +
           std::to_string(opts_.max_per_principal) + " per token)";
  return "";
}

EventBus::Subscribed EventBus::subscribe(std::shared_ptr<EventSink> sink, std::string tenant,
                                         std::optional<std::uint64_t> after, Reader reader) {
  std::lock_guard lk(mu_);
  if (auto why = refusal_locked(reader); !why.empty()) return {0, 0, std::move(why)};
  const std::uint64_t handle = next_handle_++;
  ++per_principal_[reader.principal];
  if (!reader.reserved) ++unreserved_;
  auto [it, inserted] =
      subs_.emplace(handle, Sub{std::move(sink), std::move(tenant), 0, std::move(reader)});
  stats_.subscribers = subs_.size();
  Sub& s = it->second;
  s.last_sent = after.value_or(next_id_ - 1);
  s.positioned = after.has_value();
  Subscribed out{handle, 0};
  // retry: how long a browser's EventSource waits before it reconnects.
  if (!deliver(s, "retry: 3000\n: connected\n\n")) {
    drop_slow(it);
    return {};
  }
  if (!after) return out;
  const std::uint64_t last = next_id_ - 1;
  if (log_ && *after > last) {
    // Read on a replica that is ahead of this one: what follows it comes
    // here too, soon. Until then this reader gets nothing older.
    s.ahead_until = std::chrono::steady_clock::now() + opts_.ahead_grace;
    return out;
  }
  const std::uint64_t oldest = ring_.empty() ? next_id_ : ring_.front().id;
  // Resumable: the ring still holds the event right after `after` (or
  // nothing happened since), and `after` is an id this run gave.
  const bool resumable = *after <= last && *after + 1 >= oldest;
  if (!resumable) {
    // The reader reloads the whole state; history would add nothing to it.
    nlohmann::json why = {{"reason", *after > last ? "unknown_id" : "too_old"},
                          {"message", "events after " + std::to_string(*after) +
                                          " are no longer held; reload GET /v1/tenants"},
                          {"last_event_id", std::to_string(last)}};
    if (!deliver(s, control_event("reset", why))) {
      drop_slow(it);
      return {};
    }
    s.last_sent = last;
    return out;
  }
  for (const auto& e : ring_) {
    if (e.id <= *after) continue;
    if (!s.tenant.empty() && e.tenant != s.tenant) continue;
    if (!deliver(s, e.sse)) {
      drop_slow(it);
      return {};
    }
    s.last_sent = e.id;
    ++out.replayed;
  }
  return out;
}

void EventBus::unsubscribe(std::uint64_t handle) {
  std::lock_guard lk(mu_);
  if (auto it = subs_.find(handle); it != subs_.end()) erase_locked(it);
}

void EventBus::heartbeat() {
  {
    std::lock_guard lk(mu_);
    if (closed_) return;
    const std::string bytes = ": heartbeat " + format_rfc3339(Clock::now()) + "\n\n";
    const auto now = std::chrono::steady_clock::now();
    const std::uint64_t last = next_id_ - 1;
    for (auto it = subs_.begin(); it != subs_.end();) {
      auto cur = it++;
      Sub& s = cur->second;
      if (s.ahead_until && last >= s.last_sent) s.ahead_until.reset();  // caught up
      if (s.ahead_until && now >= *s.ahead_until) {
        // Still not here: not an id of this feed (another database, or the
        // numbering of a coordinator without replicas).
        s.ahead_until.reset();
        nlohmann::json why = {{"reason", "unknown_id"},
                              {"message", "events after " + std::to_string(s.last_sent) +
                                              " are not known here; reload GET /v1/tenants"},
                              {"last_event_id", std::to_string(last)}};
        s.last_sent = last;
        if (!deliver(s, control_event("reset", why))) {
          drop_slow(cur);
          continue;
        }
      }
      if (!deliver(s, bytes)) drop_slow(cur);
    }
  }
  if (opts_.on_heartbeat) opts_.on_heartbeat();
}

void EventBus::heartbeat_loop() {
  std::unique_lock lk(mu_);
  while (!closed_) {
    cv_.wait_for(lk, opts_.heartbeat, [this] { return closed_; });
    if (closed_) return;
    lk.unlock();
    heartbeat();
    lk.lock();
  }
}

std::uint64_t EventBus::last_id() const {
  std::lock_guard lk(mu_);
  return next_id_ - 1;
}

BusStats EventBus::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace factory::feed
