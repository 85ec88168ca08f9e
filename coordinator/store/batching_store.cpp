// The store's memory and its writer, the same for every backend
// (batching_store.hpp): the database is only reached through StoreBackend.
#include "coordinator/store/batching_store.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>

namespace factory::store {

std::string cursor_key(const std::string& tenant, const std::string& agent) {
  return tenant + '\0' + agent;
}

BatchingStore::BatchingStore(std::unique_ptr<StoreBackend> backend, Snapshot loaded,
                             StoreOptions opts)
    : backend_(std::move(backend)), opts_(opts) {
  publish(std::move(loaded), true);
  writer_ = std::thread([this] {
    writer_id_ = std::this_thread::get_id();
    writer_loop();
  });
  if (backend_->shared()) backend_->listen([this](Invalidation what) { reload(std::move(what)); });
}

BatchingStore::~BatchingStore() {
  close();
}

// --- reads from memory -------------------------------------------------------

std::vector<TenantRecord> BatchingStore::list_tenants() const {
  std::shared_lock lk(mu_);
  std::vector<TenantRecord> out;
  out.reserve(tenants_.size());
  for (const auto& [_, t] : tenants_) out.push_back(t);
  return out;
}

std::vector<TenantRecord> BatchingStore::tenants_where(
    const std::function<bool(const TenantRecord&)>& keep) const {
  std::shared_lock lk(mu_);
  std::vector<TenantRecord> out;
  for (const auto& [_, t] : tenants_)
    if (keep(t)) out.push_back(t);
  return out;
}

std::optional<TenantRecord> BatchingStore::get_tenant(const std::string& name) const {
  std::shared_lock lk(mu_);
  auto it = tenants_.find(name);
  if (it == tenants_.end()) return std::nullopt;
  return it->second;
}

std::uint64_t BatchingStore::last_event_id(const std::string& tenant,
                                           const std::string& agent) const {
  std::shared_lock lk(mu_);
  auto it = cursors_.find(cursor_key(tenant, agent));
  return it == cursors_.end() ? 0 : it->second;
}

std::size_t BatchingStore::event_count(const std::string& tenant) const {
  std::shared_lock lk(mu_);
  auto it = counts_.find(tenant);
  return it == counts_.end() ? 0 : it->second;
}

std::shared_ptr<const LatestHealth> BatchingStore::get_health(const std::string& tenant) const {
  std::lock_guard lk(health_mu_);
  auto it = health_.find(tenant);
  return it == health_.end() ? nullptr : it->second.sample;
}

StoreStats BatchingStore::stats() const {
  std::lock_guard lk(queue_mu_);
  StoreStats s = stats_;
  s.queued = queue_.size();
  return s;
}

std::vector<StoredEvent> BatchingStore::recent_events(const std::string& tenant,
                                                      std::size_t max) const {
  return backend_->recent_events(tenant, max);
}

std::vector<ArchivedUsage> BatchingStore::archived_usage() const {
  std::vector<ArchivedUsage> out;
  for (const auto& body : backend_->archived_usage()) {
    auto j = nlohmann::json::parse(body, nullptr, false);
    auto u = j.is_object() ? GpuUsage::from_json(j.value("gpu_usage", nlohmann::json::object()))
                           : Result<GpuUsage>(Error(Errc::invalid_argument, "not an object"));
    if (!u) {
      spdlog::error("store: an archived usage row is not readable: {}", u.error().message);
      continue;
    }
    ArchivedUsage a;
    a.tenant = j.value("tenant", "");
    a.tier = j.value("tier", "");
    a.project = j.value("project", "default");
    a.created_at = j.value("created_at", "");
    a.deleted_at = j.value("deleted_at", "");
    a.usage = std::move(*u);
    if (auto e = j.find("endpoint_usage"); e != j.end()) {
      auto eu = EndpointUsage::from_json(*e);
      if (!eu)
        spdlog::error("store: the archived key usage of {} is not readable: {}", a.tenant,
                      eu.error().message);
      else
        a.endpoint_usage = std::move(*eu);
    }
    out.push_back(std::move(a));
  }
  return out;
}

// --- writes ------------------------------------------------------------------

Status BatchingStore::put_tenant(const TenantRecord& t) {
  if (auto st = refuse_on_writer("put_tenant"); !st.ok()) return st;
  std::promise<Status> p;
  Op op;
  op.kind = Op::Kind::put;
  op.tenant = t.name;
  op.record = std::make_unique<TenantRecord>(t);
  op.status_done = [&p](Status st) { p.set_value(std::move(st)); };
  enqueue(std::move(op));
  return p.get_future().get();
}

Status BatchingStore::delete_tenant(const std::string& name) {
  if (auto st = refuse_on_writer("delete_tenant"); !st.ok()) return st;
  std::promise<Status> p;
  Op op;
  op.kind = Op::Kind::remove;
  op.tenant = name;
  op.status_done = [&p](Status st) { p.set_value(std::move(st)); };
  enqueue(std::move(op));
  return p.get_future().get();
}

Result<TenantRecord> BatchingStore::update_tenant(const std::string& name,
                                                  std::function<Status(TenantRecord&)> change) {
  if (auto st = refuse_on_writer("update_tenant"); !st.ok()) return st.error();
  std::promise<Result<TenantRecord>> p;
  update_tenant_async(name, std::move(change),
                      [&p](Result<TenantRecord> r) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

void BatchingStore::update_tenant_async(const std::string& name,
                                        std::function<Status(TenantRecord&)> change,
                                        std::function<void(Result<TenantRecord>)> done) {
  Op op;
  op.kind = Op::Kind::update;
  op.tenant = name;
  op.change = std::move(change);
  op.update_done = std::move(done);
  enqueue(std::move(op));
}

void BatchingStore::append_event(const std::string& tenant, StoredEvent e, Projection project,
                                 std::function<void(Result<AppendOutcome>)> done,
                                 std::function<bool()> still_wanted) {
  Op op;
  op.kind = Op::Kind::append;
  op.tenant = tenant;
  op.event = std::move(e);
  op.project = std::move(project);
  op.append_done = std::move(done);
  op.still_wanted = std::move(still_wanted);
  enqueue(std::move(op));
}

void BatchingStore::put_health(const std::string& tenant,
                               std::shared_ptr<const LatestHealth> sample) {
  if (!sample) return;
  std::lock_guard lk(health_mu_);
  auto& h = health_[tenant];
  h.sample = std::move(sample);
  h.dirty = true;
}

void BatchingStore::reload(Invalidation what) {
  Op op;
  op.kind = Op::Kind::reload;
  op.reload = std::move(what);
  enqueue(std::move(op));
}

void BatchingStore::close() {
  bool writer_running = false;
  {
    std::lock_guard lk(queue_mu_);
    if (stopping_) return;
  }
  // No reload is asked for once the writer is told to stop.
  backend_->stop_listening();
  {
    std::lock_guard lk(queue_mu_);
    if (stopping_) return;
    stopping_ = true;
    writer_running = writer_.joinable();
  }
  if (writer_running) {
    queue_cv_.notify_all();
    writer_.join();
  }
  backend_->close();
}

// --- the writer --------------------------------------------------------------

Status BatchingStore::refuse_on_writer(const char* what) const {
  if (std::this_thread::get_id() == writer_id_.load())
    return Error(Errc::internal, std::string("store: ") + what +
                                     " called from a store callback would wait for itself");
  return {};
}

void BatchingStore::enqueue(Op op) {
  bool wake = false;
  {
    std::lock_guard lk(queue_mu_);
    if (stopping_) {
      fail_op(op, Error(Errc::unavailable, "store: closed"));
      return;
    }
    wake = queue_.empty();
    if (wake) queue_since_ = std::chrono::steady_clock::now();
    queue_.push_back(std::move(op));
    // The writer waits on the condition only for a first operation, or for
    // a full batch while it waits for company: any other wake is a context
    // switch per event for nothing.
    wake = wake || queue_.size() >= opts_.max_batch;
  }
  if (wake) queue_cv_.notify_one();
}

void BatchingStore::fail_op(Op& op, const Error& e) {
  switch (op.kind) {
    case Op::Kind::append:
      if (op.append_done) op.append_done(e);
      break;
    case Op::Kind::update:
      if (op.update_done) op.update_done(e);
      break;
    case Op::Kind::put:
    case Op::Kind::remove:
      if (op.status_done) op.status_done(e);
      break;
    case Op::Kind::reload:
      break;
  }
}

void BatchingStore::publish(Snapshot snap, bool with_health) {
  {
    std::unique_lock lk(mu_);
    tenants_ = std::move(snap.tenants);
    cursors_ = std::move(snap.cursors);
    counts_ = std::move(snap.counts);
  }
  if (!with_health) return;
  std::lock_guard lk(health_mu_);
  for (auto& [tenant, h] : snap.health) health_[tenant] = {std::move(h), false};
}

std::optional<TenantRecord> BatchingStore::current(const Overlay& ov,
                                                   const std::string& name) const {
  if (auto it = ov.tenants.find(name); it != ov.tenants.end()) return it->second;
  std::shared_lock lk(mu_);
  auto it = tenants_.find(name);
  if (it == tenants_.end()) return std::nullopt;
  return it->second;
}

std::uint64_t BatchingStore::current_cursor(const Overlay& ov, const std::string& key) const {
  if (auto it = ov.cursors.find(key); it != ov.cursors.end()) return it->second;
  std::shared_lock lk(mu_);
  auto it = cursors_.find(key);
  return it == cursors_.end() ? 0 : it->second;
}

std::int64_t BatchingStore::current_count(const Overlay& ov, const std::string& tenant) const {
  if (auto it = ov.counts.find(tenant); it != ov.counts.end()) return it->second;
  std::shared_lock lk(mu_);
  auto it = counts_.find(tenant);
  return it == counts_.end() ? 0 : static_cast<std::int64_t>(it->second);
}

// Memory takes the backend's figure: with a shared database another
// coordinator's events count too.
Status BatchingStore::add_count(Overlay& ov, const std::string& tenant, std::int64_t delta) {
  auto n = backend_->add_count(tenant, delta, current_count(ov, tenant));
  if (!n) return n.error();
  ov.counts[tenant] = *n;
  ov.changed.insert(tenant);
  return {};
}

void BatchingStore::wait_for_company(std::unique_lock<std::mutex>& lk,
                                     std::chrono::steady_clock::time_point last_commit) {
  const auto delay = opts_.commit_delay;
  if (delay.count() <= 0 || stopping_ || queue_.empty() || queue_.size() >= opts_.max_batch) return;
  // Busy lately: the last transaction ended less than a delay before this
  // one's first operation came. Otherwise nothing suggests company is coming.
  if (queue_since_ - last_commit >= delay) return;
  queue_cv_.wait_until(lk, queue_since_ + delay,
                       [&] { return stopping_ || queue_.size() >= opts_.max_batch; });
}

void BatchingStore::writer_loop() {
  auto next_maintenance = std::chrono::steady_clock::now() + opts_.maintenance_every;
  auto next_health = std::chrono::steady_clock::now() + opts_.health_flush;
  // When the last batch of operations ended; long ago at the start.
  auto last_commit = std::chrono::steady_clock::time_point{};
  for (;;) {
    std::deque<Op> batch;
    bool stopping = false;
    {
      std::unique_lock lk(queue_mu_);
      auto wake = std::min(next_maintenance, next_health);
      if (deferred_reload_) wake = std::min(wake, next_reload_retry_);
      queue_cv_.wait_until(lk, wake, [&] { return stopping_ || !queue_.empty(); });
      wait_for_company(lk, last_commit);
      stopping = stopping_;
      while (!queue_.empty() && batch.size() < opts_.max_batch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    auto now = std::chrono::steady_clock::now();
    bool maintenance = now >= next_maintenance;
    bool health = now >= next_health || stopping;
    if (maintenance) next_maintenance = now + opts_.maintenance_every;
    if (health) next_health = now + opts_.health_flush;
    const bool reload_due = deferred_reload_ && now >= next_reload_retry_;
    if (!batch.empty() || maintenance || health || reload_due)
      run_batch(batch, maintenance, health);
    if (!batch.empty()) last_commit = std::chrono::steady_clock::now();
    if (stopping) {
      std::lock_guard lk(queue_mu_);
      if (queue_.empty()) return;
    }
  }
}

TenantRecord* BatchingStore::batch_record(Overlay& ov, const std::string& name) const {
  auto it = ov.tenants.find(name);
  if (it == ov.tenants.end()) it = ov.tenants.emplace(name, current(ov, name)).first;
  return it->second ? &*it->second : nullptr;
}

void BatchingStore::record_replaced(Overlay& ov, const std::string& name, bool removed) {
  ov.projected.erase(name);
  if (removed) {
    ov.count_moves.erase(name);
    ov.record_wanted.erase(name);
  }
}

Status BatchingStore::write_whole_record(Overlay& ov, const std::string& name,
                                         const TenantRecord& rec) {
  if (auto w = backend_->write_record(rec); !w.ok()) return w;
  ++ov.records_written;
  record_replaced(ov, name, false);
  ov.changed.insert(name);
  ov.tenants[name] = rec;
  return {};
}

Status BatchingStore::apply_append(Op& op, Overlay& ov, Outcome& out, std::int64_t now_unix,
                                   std::uint64_t& stored, std::uint64_t& duplicates) {
  if (op.still_wanted && !op.still_wanted()) {
    out.status = Error(Errc::conflict, "store: cancelled (an earlier event of the session failed)");
    return {};
  }
  TenantRecord* rec = batch_record(ov, op.tenant);
  if (!rec) {
    out.status = Error(Errc::not_found, "store: no tenant " + op.tenant);
    return {};
  }
  const std::string key = cursor_key(op.tenant, op.event.agent_id);
  // Memory's cursor answers most replays without a statement; the
  // database's answers the rest (an event another coordinator stored).
  if (op.event.id <= current_cursor(ov, key)) {
    ++duplicates;
    return {};
  }
  auto ins = backend_->insert_event(op.tenant, op.event, now_unix);
  if (!ins) return ins.error();
  if (!ins->stored) {
    ++duplicates;
    if (ins->cursor) ov.cursors[key] = *ins->cursor;
    return {};
  }
  out.append.seq = ins->seq;
  ov.cursors[key] = op.event.id;
  ov.changed.insert(op.tenant);
  ++ov.count_moves[op.tenant];
  if (op.project) {
    // In place, in the batch's copy: a thousand events of one tenant in a
    // batch are one copy of its record and one write, not a thousand.
    bool did = false;
    try {
      did = op.project(*rec);
    } catch (const std::exception& e) {
      // The projection's assignments are each whole: what it did before it
      // threw stays, a record still valid, and the event is stored.
      spdlog::error("store: projection of an event of {} threw: {}", op.tenant, e.what());
      did = true;
    }
    if (did) {
      ov.projected.insert(op.tenant);
      ov.record_wanted[op.tenant].push_back(&out.append);
    }
  }
  out.append.stored = true;
  ++stored;
  return {};
}

Status BatchingStore::finish_appends(Overlay& ov) {
  for (const auto& [tenant, n] : ov.count_moves)
    if (auto st = add_count(ov, tenant, n); !st.ok()) return st;
  ov.count_moves.clear();
  for (const auto& tenant : ov.projected) {
    const TenantRecord* rec = batch_record(ov, tenant);
    if (!rec) continue;
    if (auto st = backend_->write_record(*rec); !st.ok()) return st;
    ++ov.records_written;
    ov.changed.insert(tenant);
  }
  ov.projected.clear();
  for (auto& [tenant, outcomes] : ov.record_wanted) {
    const TenantRecord* rec = batch_record(ov, tenant);
    if (!rec) continue;
    auto shared = std::make_shared<const TenantRecord>(*rec);
    for (AppendOutcome* o : outcomes) o->record = shared;
  }
  ov.record_wanted.clear();
  return {};
}

Status BatchingStore::apply_ops(std::deque<Op>& batch, Overlay& ov, std::vector<Outcome>& outcomes,
                                std::int64_t now_unix, std::uint64_t& stored,
                                std::uint64_t& duplicates) {
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Op& op = batch[i];
    Outcome& out = outcomes[i];
    switch (op.kind) {
      case Op::Kind::append:
        if (auto st = apply_append(op, ov, out, now_unix, stored, duplicates); !st.ok()) return st;
        break;
      case Op::Kind::update: {
        auto rec = current(ov, op.tenant);
        if (!rec) {
          out.status = Error(Errc::not_found, "no tenant " + op.tenant);
          break;
        }
        Status st;
        try {
          st = op.change(*rec);
        } catch (const std::exception& e) {
          st = Error(Errc::internal, std::string("store: update threw: ") + e.what());
        }
        if (!st.ok()) {
          out.status = st;
          break;
        }
        if (auto w = write_whole_record(ov, op.tenant, *rec); !w.ok()) return w;
        out.record = std::move(*rec);
        break;
      }
      case Op::Kind::put:
        if (auto w = write_whole_record(ov, op.tenant, *op.record); !w.ok()) return w;
        break;
      case Op::Kind::reload:  // done first, with the locks (lock_and_reload)
        break;
      case Op::Kind::remove:
        // Its usage (GPU time, its keys' counts) outlives it, in the same
        // transaction: never lost, never both archived and still in a record.
        if (auto rec = current(ov, op.tenant);
            rec && (rec->status.gpu_usage || (rec->endpoint && rec->endpoint->usage))) {
          nlohmann::json body = {
              {"tenant", rec->name},
              {"tier", rec->tier},
              {"project", rec->spec.project.value_or("default")},
              {"created_at", rec->created_at},
              {"deleted_at", format_rfc3339(Clock::from_time_t(now_unix))},
              {"gpu_usage", rec->status.gpu_usage.value_or(GpuUsage{}).to_json()}};
          if (rec->endpoint && rec->endpoint->usage)
            body["endpoint_usage"] = rec->endpoint->usage->to_json();
          if (auto w = backend_->archive_usage(op.tenant, now_unix, body.dump()); !w.ok()) return w;
        }
        if (auto w = backend_->delete_tenant(op.tenant); !w.ok()) return w;
        record_replaced(ov, op.tenant, true);
        ov.changed.insert(op.tenant);
        ov.tenants[op.tenant] = std::nullopt;
        ov.counts.erase(op.tenant);
        for (auto it = ov.cursors.begin(); it != ov.cursors.end();)
          it = it->first.rfind(op.tenant + '\0', 0) == 0 ? ov.cursors.erase(it) : std::next(it);
        ov.deleted.push_back(op.tenant);
        {
          std::lock_guard lk(health_mu_);
          health_.erase(op.tenant);
        }
        break;
    }
  }
  return finish_appends(ov);
}

// A shared database: the records this batch changes are read as the
// database has them and locked until it commits, so a change another
// replica committed is never overwritten with memory's older copy (two
// replicas' read-modify-writes of one record serialize on its row). Then
// what other replicas changed is read, in the same transaction, into the
// overlay: published with the batch, after whatever this store committed
// before.
Status BatchingStore::lock_and_reload(std::deque<Op>& batch, Overlay& ov) {
  std::set<std::string> names;
  std::optional<Invalidation> reload = deferred_reload_;
  for (const Op& op : batch) {
    if (op.kind == Op::Kind::reload) {
      if (!reload) reload.emplace();
      reload->merge(op.reload);
    } else {
      names.insert(op.tenant);
    }
  }
  if (!names.empty()) {
    auto locked = backend_->lock_records({names.begin(), names.end()});
    if (!locked) return locked.error();
    for (const auto& name : names) {
      auto it = locked->find(name);
      if (it == locked->end())
        ov.tenants[name] = std::nullopt;
      else
        ov.tenants[name] = std::move(it->second);
    }
  }
  if (!reload) return {};
  auto snap = backend_->load_tenants(*reload);
  if (!snap) return snap.error();
  std::set<std::string> scope = reload->tenants;
  if (reload->all) {
    std::shared_lock lk(mu_);
    for (const auto& [name, _] : tenants_) scope.insert(name);
    for (const auto& [name, _] : counts_) scope.insert(name);
  }
  for (const auto& [name, _] : snap->tenants) scope.insert(name);
  for (const auto& [name, _] : snap->counts) scope.insert(name);
  for (const auto& name : scope) {
    auto it = snap->tenants.find(name);
    if (it == snap->tenants.end()) {
      ov.tenants[name] = std::nullopt;
      // Deleted by another replica: its latest health goes with it.
      std::lock_guard lk(health_mu_);
      health_.erase(name);
    } else {
      ov.tenants[name] = std::move(it->second);
    }
    // Its cursors and count are the database's: memory's are dropped first.
    ov.deleted.push_back(name);
    if (auto n = snap->counts.find(name); n != snap->counts.end())
      ov.counts[name] = static_cast<std::int64_t>(n->second);
  }
  for (auto& [key, id] : snap->cursors) ov.cursors[key] = id;
  // Another replica's agent sample, saved at its health flush, unless this
  // store holds a newer one of its own, not yet saved.
  std::lock_guard lk(health_mu_);
  for (auto& [name, sample] : snap->health) {
    auto& h = health_[name];
    if (!h.dirty) h.sample = std::move(sample);
  }
  return {};
}

Status BatchingStore::try_batch(std::deque<Op>& batch, Overlay& ov, std::vector<Outcome>& outcomes,
                                bool maintenance_due, bool health_due,
                                HealthWritten& health_written, std::uint64_t& stored,
                                std::uint64_t& duplicates, std::uint64_t& expired) {
  const auto now = Clock::now();
  std::optional<Snapshot> reloaded;
  Status st = backend_->reconnect_if_lost(reloaded);
  // A batch whose COMMIT was sent but not answered may have been stored:
  // what the database holds is the truth, and replays of it read as such.
  if (reloaded) publish(std::move(*reloaded), false);
  if (!st.ok()) return st;
  const bool shared = backend_->shared();
  if (auto b = backend_->begin(); !b.ok()) return b;
  if (shared) st = lock_and_reload(batch, ov);
  if (st.ok()) st = apply_ops(batch, ov, outcomes, unix_seconds(now), stored, duplicates);
  // The cap is applied every batch (only tenants over it are touched); the
  // age rule at maintenance.
  if (st.ok() && (maintenance_due || stored > 0)) st = apply_retention(ov, expired);
  if (st.ok() && maintenance_due) st = expire_old(ov, now, expired);
  if (st.ok() && health_due) st = flush_health(health_written);
  if (shared)
    for (const auto& [tenant, _] : health_written) ov.changed.insert(tenant);
  if (st.ok() && shared && !ov.changed.empty()) st = backend_->announce(ov.changed);
  if (st.ok()) st = backend_->commit();
  if (!st.ok()) backend_->rollback();
  return st;
}

void BatchingStore::run_batch(std::deque<Op>& batch, bool maintenance_due, bool health_due) {
  Overlay ov;
  std::vector<Outcome> outcomes;
  std::uint64_t stored = 0, duplicates = 0, expired = 0;
  Status st;
  // A deadlock or serialization failure against another replica's
  // transaction is tried again whole (its changes re-read what the other
  // committed), a few times, before the batch fails.
  for (int attempt = 0;; ++attempt) {
    ov = Overlay{};
    outcomes.assign(batch.size(), Outcome{});
    stored = duplicates = expired = 0;
    HealthWritten health_written;
    st = try_batch(batch, ov, outcomes, maintenance_due, health_due, health_written, stored,
                   duplicates, expired);
    if (!st.ok()) {
      // Health samples that were not written stay dirty for the next try.
      std::lock_guard lk(health_mu_);
      for (auto& [tenant, _] : health_written)
        if (auto it = health_.find(tenant); it != health_.end()) it->second.dirty = true;
    }
    if (st.ok() || st.error().code != Errc::conflict || attempt == 2) break;
  }
  if (!st.ok()) {
    const Error& e = st.error();
    if (auto v = write_failure_log_.admit(); v.log) spdlog::error("{}{}", e.message, v.note());
    {
      std::lock_guard lk(queue_mu_);
      ++stats_.write_failures;
    }
    // What other replicas changed is still to be read: with the next batch,
    // or by itself after a backoff if none comes.
    for (auto& op : batch) {
      if (op.kind != Op::Kind::reload) continue;
      if (!deferred_reload_) deferred_reload_.emplace();
      deferred_reload_->merge(op.reload);
    }
    if (deferred_reload_) {
      next_reload_retry_ = std::chrono::steady_clock::now() + reload_retry_backoff_;
      reload_retry_backoff_ =
          std::min<std::chrono::milliseconds>(reload_retry_backoff_ * 2, std::chrono::seconds(5));
    }
    for (auto& op : batch) fail_op(op, e);
    return;
  }
  deferred_reload_.reset();
  reload_retry_backoff_ = std::chrono::milliseconds(100);
  // Committed: publish, then tell.
  publish_batch(ov);
  {
    std::lock_guard lk(queue_mu_);
    stats_.events_stored += stored;
    stats_.events_duplicate += duplicates;
    stats_.events_expired += expired;
    stats_.records_written += ov.records_written;
    ++stats_.transactions;
  }
  tell(batch, outcomes);
}

void BatchingStore::publish_batch(Overlay& ov) {
  std::unique_lock lk(mu_);
  for (auto& [name, rec] : ov.tenants) {
    if (rec)
      tenants_[name] = std::move(*rec);
    else
      tenants_.erase(name);
  }
  for (auto& name : ov.deleted) {
    for (auto it = cursors_.begin(); it != cursors_.end();)
      it = it->first.rfind(name + '\0', 0) == 0 ? cursors_.erase(it) : std::next(it);
    counts_.erase(name);
  }
  for (auto& [k, v] : ov.cursors) cursors_[k] = v;
  for (auto& [t, n] : ov.counts) counts_[t] = static_cast<std::size_t>(n);
}

void BatchingStore::tell(std::deque<Op>& batch, std::vector<Outcome>& outcomes) {
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Op& op = batch[i];
    Outcome& out = outcomes[i];
    switch (op.kind) {
      case Op::Kind::append:
        if (!op.append_done) break;
        if (out.status.ok())
          op.append_done(std::move(out.append));
        else
          op.append_done(out.status.error());
        break;
      case Op::Kind::update:
        if (!op.update_done) break;
        if (out.status.ok())
          op.update_done(std::move(*out.record));
        else
          op.update_done(out.status.error());
        break;
      case Op::Kind::put:
      case Op::Kind::remove:
        if (op.status_done) op.status_done(out.status);
        break;
      case Op::Kind::reload:
        break;
    }
  }
}

// Tenants over their cap lose their oldest events, in the same transaction.
Status BatchingStore::apply_retention(Overlay& ov, std::uint64_t& expired) {
  const auto cap = static_cast<std::int64_t>(opts_.max_events_per_tenant);
  std::vector<std::string> over;
  for (auto& [tenant, n] : ov.counts)
    if (n > cap) over.push_back(tenant);
  for (auto& tenant : over) {
    auto removed = backend_->trim_tenant(tenant, cap);
    if (!removed) return removed.error();
    expired += static_cast<std::uint64_t>(*removed);
    if (auto st = add_count(ov, tenant, -*removed); !st.ok()) return st;
  }
  return {};
}

Status BatchingStore::expire_old(Overlay& ov, Clock::time_point now, std::uint64_t& expired) {
  auto gone = backend_->expire_before(unix_seconds(now) - opts_.max_event_age.count());
  if (!gone) return gone.error();
  for (auto& [tenant, k] : *gone) {
    if (auto st = add_count(ov, tenant, -k); !st.ok()) return st;
    expired += static_cast<std::uint64_t>(k);
  }
  return {};
}

Status BatchingStore::flush_health(HealthWritten& written) {
  {
    std::lock_guard lk(health_mu_);
    for (auto& [tenant, h] : health_) {
      if (!h.dirty) continue;
      written.emplace_back(tenant, h.sample);
      h.dirty = false;
    }
  }
  for (auto& [tenant, sample] : written)
    if (auto st = backend_->put_health(tenant, sample->to_text()); !st.ok()) return st;
  return {};
}

}  // namespace factory::store
