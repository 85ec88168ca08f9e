// The feed log on PostgreSQL (feed_log.hpp): the table `feed_log` that the
// store's schema makes (postgres_store.cpp), a writer thread that appends
// what the event bus queues, and a listener thread that reads every
// replica's rows back in id order. Its own two connections, beside the
// store's: the store's writer batches agents' events that wait for their
// acknowledgement, and a feed that fell behind must never hold one up.
#include <libpq-fe.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "common/log.hpp"
#include "coordinator/store/feed_log.hpp"
#include "coordinator/store/postgres_conninfo.hpp"

namespace factory::store {

namespace {

constexpr const char* kFeedChannel = "factory_feed";
// Taken by each append's transaction before its ids are drawn, held until it
// commits: the replicas' appends commit one after the other, in the order of
// their ids, so a listener that has read up to id N can never later find a
// smaller id committed (it would skip it for good). A batch holds it for one
// INSERT and one NOTIFY. The store's schema key (postgres_store.cpp) plus 16.
constexpr const char* kAppendLock = "SELECT pg_advisory_xact_lock(19793809657049481)";

struct FeedStatement {
  const char* name;
  const char* sql;
};
// Values travel as parameters. A batch is one INSERT of arrays, its rows
// numbered in the order they were queued (ORDER BY the ordinality: the ids
// are drawn in that order). (origin, origin_seq) is the record's own key, so
// a batch tried again after a commit whose answer was lost adds nothing.
const FeedStatement kFeedStatements[] = {
    {"feed_append",
     "INSERT INTO feed_log(origin, origin_seq, type, tenant, data, appended_unix) "
     "SELECT $1::text, u.seq, u.type, u.tenant, u.data, $6::bigint "
     "FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY "
     "AS u(seq, type, tenant, data, n) ORDER BY u.n "
     "ON CONFLICT (origin, origin_seq) DO NOTHING RETURNING id"},
    {"feed_notify", "SELECT pg_notify('factory_feed', $1)"},
    {"feed_after",
     "SELECT id, origin, type, tenant, data FROM feed_log WHERE id > $1::bigint ORDER BY id "
     "LIMIT $2::bigint"},
    {"feed_tail",
     "SELECT id, origin, type, tenant, data FROM feed_log ORDER BY id DESC LIMIT $1::bigint"},
    {"feed_last", "SELECT coalesce(max(id), 0) FROM feed_log"},
    {"feed_prune_rows",
     "DELETE FROM feed_log WHERE id <= (SELECT max(id) FROM feed_log) - $1::bigint"},
    {"feed_prune_age", "DELETE FROM feed_log WHERE appended_unix < $1::bigint"},
};

struct FeedResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using FeedPgResult = std::unique_ptr<PGresult, FeedResultDeleter>;

std::string feed_cell(const PGresult* r, int row, int col) {
  return std::string(PQgetvalue(r, row, col), static_cast<std::size_t>(PQgetlength(r, row, col)));
}
std::uint64_t cell_u64(const PGresult* r, int row, int col) {
  return std::strtoull(PQgetvalue(r, row, col), nullptr, 10);
}

// An array parameter in PostgreSQL's syntax, every element quoted (a JSON
// text holds quotes and backslashes: escaped).
template <typename Get>
std::string array_of(const std::vector<FeedRecord>& rs, Get get) {
  std::string out = "{";
  for (std::size_t i = 0; i < rs.size(); ++i) {
    if (i) out += ',';
    out += '"';
    for (char ch : get(rs[i])) {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch;
    }
    out += '"';
  }
  out += '}';
  return out;
}

std::string new_origin() {
  std::random_device rd;
  std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::vector<FeedRecord> read_rows(const PGresult* r) {
  std::vector<FeedRecord> out;
  out.reserve(static_cast<std::size_t>(PQntuples(r)));
  for (int i = 0; i < PQntuples(r); ++i)
    out.push_back({cell_u64(r, i, 0), feed_cell(r, i, 1), feed_cell(r, i, 2), feed_cell(r, i, 3),
                   feed_cell(r, i, 4)});
  return out;
}

class PostgresFeedLog final : public FeedLog {
 public:
  PostgresFeedLog(std::string conninfo, std::string where, FeedLogOptions opts)
      : conninfo_(std::move(conninfo)),
        secret_(password_of(conninfo_)),
        where_(std::move(where)),
        opts_(opts),
        wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (opts_.max_batch == 0) opts_.max_batch = 1;
    if (opts_.read_batch == 0) opts_.read_batch = 1;
    writer_ = std::thread([this] { writer_loop(); });
  }
  ~PostgresFeedLog() override {
    close();
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }
  PostgresFeedLog(const PostgresFeedLog&) = delete;
  PostgresFeedLog& operator=(const PostgresFeedLog&) = delete;

  const std::string& origin() const override { return origin_; }

  void append(FeedRecord r) override {
    {
      std::lock_guard lk(mu_);
      if (!closed_ && queue_.size() < opts_.queue_limit) {
        r.id = 0;
        r.origin = origin_;
        seqs_.push_back(++next_seq_);
        queue_.push_back(std::move(r));
        cv_.notify_one();
        return;
      }
      ++stats_.dropped;
    }
    if (auto v = drop_log_.admit(); v.log)
      spdlog::warn(
          "feed: the feed log's queue is full ({} records) or closed; an event of "
          "tenant {} is left out of /v1/events{}",
          opts_.queue_limit, r.tenant, v.note());
  }

  void start(std::size_t backfill, Delivery deliver) override {
    std::lock_guard lk(mu_);
    if (closed_ || listener_.joinable()) return;
    deliver_ = std::move(deliver);
    listener_ = std::thread([this, backfill] { listener_loop(backfill); });
  }

  FeedLogStats stats() const override {
    std::lock_guard lk(mu_);
    return stats_;
  }

  void close() override {
    // Held throughout: a second caller (the bus, as the store closes it)
    // returns only once the threads are gone.
    std::lock_guard closing(close_mu_);
    {
      std::lock_guard lk(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_all();
    listen_stop_ = true;
    wake();
    if (writer_.joinable()) writer_.join();
    if (listener_.joinable()) listener_.join();
    disconnect(wconn_);
    disconnect(lconn_);
  }

 private:
  // --- connections -------------------------------------------------------------
  Result<PGconn*> connect(const char* app) const {
    auto opened = open_connection(conninfo_, app, "feed log", where_, secret_);
    if (!opened) return opened.error();
    PGconn* c = *opened;
    for (const auto& p : kFeedStatements) {
      FeedPgResult r(PQprepare(c, p.name, p.sql, 0, nullptr));
      if (PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
        Error e = pg_error(c, r.get(), std::string("prepare ") + p.name);
        PQfinish(c);
        return e;
      }
    }
    return c;
  }

  Error pg_error(PGconn* c, const PGresult* r, const std::string& what) const {
    const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    std::string_view code = state ? state : "";
    Errc errc = Errc::io;
    if (!c || PQstatus(c) == CONNECTION_BAD || code.starts_with("08") || code.starts_with("57P"))
      errc = Errc::unavailable;
    std::string msg = first_line(r ? PQresultErrorMessage(r) : PQerrorMessage(c));
    return Error(errc, scrub("feed log: " + where_ + ": " + what + ": " + msg, secret_));
  }

  Result<FeedPgResult> run(PGconn* c, const char* name,
                           const std::vector<std::string>& params) const {
    std::vector<const char*> values;
    for (auto& p : params) values.push_back(p.c_str());
    FeedPgResult r(PQexecPrepared(c, name, static_cast<int>(values.size()), values.data(), nullptr,
                                  nullptr, 0));
    auto st = PQresultStatus(r.get());
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) return pg_error(c, r.get(), name);
    return r;
  }

  Result<FeedPgResult> exec(PGconn* c, const char* sql) const {
    FeedPgResult r(PQexec(c, sql));
    auto st = PQresultStatus(r.get());
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) return pg_error(c, r.get(), sql);
    return r;
  }

  static void disconnect(PGconn*& c) {
    if (c) PQfinish(c);
    c = nullptr;
  }

  void wake() const {
    const std::uint64_t one = 1;
    if (wake_fd_ < 0) return;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  }
  void wait_wake(std::chrono::milliseconds d) const {
    pollfd p{wake_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(d.count())) > 0) {
      std::uint64_t v;
      [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
    }
  }

  // --- the writer ----------------------------------------------------------------
  void writer_loop();
  // One transaction: the batch, then its notification.
  Status write_batch(const std::vector<FeedRecord>& batch, const std::vector<std::uint64_t>& seqs);
  Status prune();
  // The writer's connection, made again when lost.
  Status writer_connected() {
    if (wconn_ && PQstatus(wconn_) == CONNECTION_OK) return {};
    disconnect(wconn_);
    auto c = connect("factory-coordinator-feed-writer");
    if (!c) return c.error();
    wconn_ = *c;
    return {};
  }

  // --- the listener --------------------------------------------------------------
  void listener_loop(std::size_t backfill);
  // Delivers the rows past last_seen_, in batches, until none is left;
  // false when the connection failed.
  bool catch_up();
  // Whether a notification of the log waits in libpq's queue (all taken).
  bool announced();
  // Live rows only when there are some; the initial read always, empty or
  // not (the reader learns the log is followed).
  void deliver(std::vector<FeedRecord> rs, bool live) {
    if (rs.empty() && live) return;
    if (!rs.empty()) last_seen_ = rs.back().id;
    {
      std::lock_guard lk(mu_);
      stats_.delivered += rs.size();
    }
    if (deliver_) deliver_(std::move(rs), live);
  }

  const std::string conninfo_;  // holds the password: never logged, never in a message
  const std::string secret_;
  const std::string where_;
  FeedLogOptions opts_;
  const std::string origin_ = new_origin();
  const int wake_fd_;

  std::mutex close_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<FeedRecord> queue_;
  std::deque<std::uint64_t> seqs_;  // each queued record's origin_seq
  std::uint64_t next_seq_ = 0;
  bool closed_ = false;
  FeedLogStats stats_;
  std::thread writer_;
  PGconn* wconn_ = nullptr;  // the writer's

  std::thread listener_;
  std::atomic<bool> listen_stop_{false};
  PGconn* lconn_ = nullptr;  // the listener's
  Delivery deliver_;
  std::uint64_t last_seen_ = 0;  // the listener's: the last id delivered

  LogThrottle drop_log_{3, std::chrono::seconds(60)};
  LogThrottle write_log_{3, std::chrono::seconds(60)};
  LogThrottle listen_log_{3, std::chrono::seconds(60)};
};

void PostgresFeedLog::writer_loop() {
  using namespace std::chrono;
  auto backoff = milliseconds(100);
  auto next_prune = steady_clock::now() + opts_.prune_every;
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait_until(lk, next_prune, [&] { return closed_ || !queue_.empty(); });
    if (!queue_.empty()) {
      // Copied, not taken: they stay queued (and counted against the limit)
      // until they are committed.
      const std::size_t n = std::min(queue_.size(), opts_.max_batch);
      std::vector<FeedRecord> batch(queue_.begin(), queue_.begin() + static_cast<long>(n));
      std::vector<std::uint64_t> seqs(seqs_.begin(), seqs_.begin() + static_cast<long>(n));
      const bool last_try = closed_;
      lk.unlock();
      Status st = writer_connected();
      if (st.ok()) st = write_batch(batch, seqs);
      lk.lock();
      if (st.ok()) {
        queue_.erase(queue_.begin(), queue_.begin() + static_cast<long>(n));
        seqs_.erase(seqs_.begin(), seqs_.begin() + static_cast<long>(n));
        stats_.appended += n;
        backoff = milliseconds(100);
        continue;
      }
      ++stats_.failures;
      if (auto v = write_log_.admit(); v.log)
        spdlog::warn("{} ({} feed events wait; trying again){}", st.error().message, queue_.size(),
                     v.note());
      if (last_try) {
        // Stopping, and the database does not take them: said, not waited for.
        stats_.dropped += queue_.size();
        spdlog::warn("feed: {} events of the feed were not written to the log before stopping",
                     queue_.size());
        queue_.clear();
        seqs_.clear();
        return;
      }
      cv_.wait_for(lk, backoff, [&] { return closed_; });
      backoff = std::min<milliseconds>(backoff * 2, seconds(5));
      continue;
    }
    if (closed_) return;
    if (steady_clock::now() >= next_prune) {
      next_prune = steady_clock::now() + opts_.prune_every;
      lk.unlock();
      Status st = writer_connected();
      if (st.ok()) st = prune();
      if (!st.ok())
        spdlog::warn("{} (pruning the feed log; trying again later)", st.error().message);
      lk.lock();
    }
  }
}

Status PostgresFeedLog::write_batch(const std::vector<FeedRecord>& batch,
                                    const std::vector<std::uint64_t>& seqs) {
  auto fail = [&](Error e) -> Status {
    if (PQstatus(wconn_) == CONNECTION_OK)
      PQclear(PQexec(wconn_, "ROLLBACK"));
    else
      disconnect(wconn_);
    return e;
  };
  std::string seq_array = "{";
  for (std::size_t i = 0; i < seqs.size(); ++i)
    seq_array += (i ? "," : "") + std::to_string(seqs[i]);
  seq_array += "}";
  const auto now_unix = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  if (auto r = exec(wconn_, "BEGIN"); !r) return fail(r.error());
  if (auto r = exec(wconn_, kAppendLock); !r) return fail(r.error());
  auto ins = run(wconn_, "feed_append",
                 {origin_, seq_array, array_of(batch, [](auto& r) { return r.type; }),
                  array_of(batch, [](auto& r) { return r.tenant; }),
                  array_of(batch, [](auto& r) { return r.data; }), std::to_string(now_unix)});
  if (!ins) return fail(ins.error());
  // Delivered only if the transaction commits; the payload (the batch's
  // last id) is for people watching, the listeners read the table.
  if (const int rows = PQntuples(ins->get()); rows > 0)
    if (auto r = run(wconn_, "feed_notify", {feed_cell(ins->get(), rows - 1, 0)}); !r)
      return fail(r.error());
  if (auto r = exec(wconn_, "COMMIT"); !r) return fail(r.error());
  return {};
}

Status PostgresFeedLog::prune() {
  const auto cutoff = std::chrono::duration_cast<std::chrono::seconds>(
                          (std::chrono::system_clock::now() - opts_.max_age).time_since_epoch())
                          .count();
  std::uint64_t gone = 0;
  for (auto [name, arg] : {std::pair{"feed_prune_rows", std::to_string(opts_.keep_rows)},
                           std::pair{"feed_prune_age", std::to_string(cutoff)}}) {
    auto r = run(wconn_, name, {arg});
    if (!r) {
      if (PQstatus(wconn_) != CONNECTION_OK) disconnect(wconn_);
      return r.error();
    }
    gone += std::strtoull(PQcmdTuples(r->get()), nullptr, 10);
  }
  std::lock_guard lk(mu_);
  stats_.pruned += gone;
  return {};
}

bool PostgresFeedLog::catch_up() {
  for (;;) {
    auto r =
        run(lconn_, "feed_after", {std::to_string(last_seen_), std::to_string(opts_.read_batch)});
    if (!r) return false;
    auto rows = read_rows(r->get());
    const bool more = rows.size() == opts_.read_batch;
    deliver(std::move(rows), true);
    if (!more || listen_stop_) return true;
  }
}

// Waits on its connection's socket (and the wake eventfd, so close() stops
// it at once). A lost connection is made again with a backoff (100 ms to
// 5 s); what was appended meanwhile is read from the table once it is back,
// after last_seen_, so nothing is missed and nothing comes twice.
void PostgresFeedLog::listener_loop(std::size_t backfill) {
  using namespace std::chrono;
  auto backoff = milliseconds(100);
  bool started = false;
  // A read that failed on a connection just made: said, then tried again on
  // a new one after the backoff (a failure that stays must not spin).
  auto read_failed = [&] {
    if (auto v = listen_log_.admit(); v.log)
      spdlog::warn("feed log: reading {} failed ({}); trying again{}", where_,
                   scrub(first_line(PQerrorMessage(lconn_)), secret_), v.note());
    disconnect(lconn_);
    wait_wake(backoff);
    backoff = std::min<milliseconds>(backoff * 2, seconds(5));
  };
  while (!listen_stop_) {
    if (!lconn_) {
      auto c = connect("factory-coordinator-feed");
      // LISTEN before the first read: a row committed after that read is
      // announced on this connection.
      if (c) {
        if (auto l = exec(*c, (std::string("LISTEN ") + kFeedChannel).c_str()); !l) {
          PQfinish(*c);
          c = l.error();
        }
      }
      if (!c) {
        if (auto v = listen_log_.admit(); v.log)
          spdlog::warn("{} (the feed log's listener; trying again){}", c.error().message, v.note());
        wait_wake(backoff);
        backoff = std::min<milliseconds>(backoff * 2, seconds(5));
        continue;
      }
      lconn_ = *c;
      if (!started) {
        // Where this replica's feed begins: the newest `backfill` rows (its
        // bus's Last-Event-ID ring), or only what comes next.
        auto r = backfill ? run(lconn_, "feed_tail", {std::to_string(backfill)})
                          : run(lconn_, "feed_last", {});
        if (!r) {
          read_failed();
          continue;
        }
        if (backfill) {
          auto rows = read_rows(r->get());
          std::reverse(rows.begin(), rows.end());
          deliver(std::move(rows), false);
        } else {
          last_seen_ = cell_u64(r->get(), 0, 0);
          deliver({}, false);
        }
        started = true;
      } else {
        std::lock_guard lk(mu_);
        ++stats_.reconnects;
      }
      if (!catch_up()) {
        read_failed();
        continue;
      }
      backoff = milliseconds(100);
    }
    // A notification that came while a read ran is in libpq's queue, no
    // longer on the socket: taken before waiting on the socket, or a row
    // committed during that read would wait for the next notification.
    if (announced()) {
      if (!catch_up()) read_failed();
      continue;
    }
    pollfd fds[2] = {{PQsocket(lconn_), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    ::poll(fds, 2, -1);
    if (listen_stop_) break;
    if (fds[1].revents & POLLIN) {
      std::uint64_t v;
      [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
    }
    if (!PQconsumeInput(lconn_) || PQstatus(lconn_) == CONNECTION_BAD) {
      if (auto v = listen_log_.admit(); v.log)
        spdlog::warn("feed log: the listener's connection to {} was lost ({}); reconnecting{}",
                     where_, scrub(first_line(PQerrorMessage(lconn_)), secret_), v.note());
      disconnect(lconn_);
    }
  }
}

bool PostgresFeedLog::announced() {
  bool ours = false;
  while (PGnotify* note = PQnotifies(lconn_)) {
    ours = ours || (note->relname && std::string(note->relname) == kFeedChannel);
    PQfreemem(note);
  }
  return ours;
}

}  // namespace

std::unique_ptr<FeedLog> open_postgres_feed_log(const std::string& conninfo,
                                                const std::string& where, FeedLogOptions opts) {
  return std::make_unique<PostgresFeedLog>(conninfo, where, opts);
}

}  // namespace factory::store
