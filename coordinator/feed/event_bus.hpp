#pragma once
// The live half of the status feed: what GET /v1/events streams as
// Server-Sent Events. The agents module publishes (through FeedState) what
// changed: a phase, a plan's progress, a diagnosis, an agent's connection,
// its health. Each event gets an id that grows for the life of the
// coordinator and across restarts (the first id of a run is the start time
// in microseconds), and the last `history` events stay in a ring, so a
// reader that reconnects with Last-Event-ID gets exactly what it missed.
//
// Replicas (several coordinators on one PostgreSQL store, issue 26): given
// the store's feed log (store/feed_log.hpp), the bus numbers nothing itself.
// publish() hands the event to the log, and readers (and the ring) get
// events only as they come back from it, every replica's, this one's
// included, with the database's ids and in their order: every replica
// streams the same events under the same ids, and a reader may resume on
// any of them. At start the ring is filled with the log's newest `history`
// events, so a reader that moves to a replica that just started resumes
// too. A Last-Event-ID that the ring no longer holds gets the `reset` event,
// as without a log (the reader reloads GET /v1/tenants): the ring covers
// minutes of a busy fleet, and a reader away for longer wants the state,
// not the history. One this replica has not received yet (read on another
// replica a moment before) is waited for, ahead_grace at most.
//
// Publishers run on io threads and the store's writer: publish() never
// waits. It hands each subscriber its bytes through EventSink::write, which
// only queues them (the HTTP server's bounded stream queue). A reader whose
// queue is full is too slow: it is dropped with one last event saying so,
// never waited for, and the others go on.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/store/feed_log.hpp"

namespace factory::feed {

struct FeedEvent {
  std::uint64_t id = 0;
  std::string type;    // agent | phase | progress | plan | diagnosis | health
  std::string tenant;  // every event is about one tenant
  std::string data;    // one line of JSON: {"tenant", "time", ...}
  std::string origin;  // with a feed log: the replica that published it
};

// "id: N\nevent: TYPE\ndata: JSON\n\n"
std::string format_sse(const FeedEvent& e);

// Where a subscriber's bytes go. Both calls are thread-safe and never wait.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // False: the reader is gone, or too much waits for it already.
  virtual bool write(std::string chunk) = 0;
  // An event's bytes, shared with every other reader of it (and the ring):
  // a reader that does not read holds references, not copies.
  virtual bool write_shared(std::shared_ptr<const std::string> chunk) { return write(*chunk); }
  // Queues `last` whatever waits already, then ends the stream.
  virtual void close_with(std::string last) = 0;
};

struct EventBusOptions {
  std::size_t history = 4096;  // events kept for Last-Event-ID
  // ... and no more bytes than this, so that a reader's whole replay fits
  // in its stream queue (the API server's is twice this: 1 MiB, what a
  // reader that never reads may hold before it is dropped).
  std::size_t history_bytes = 512 << 10;
  std::size_t max_subscribers = 256;
  // Readers are accounted per principal (the token behind the request,
  // coordinator/api/auth.hpp), so one read-only token cannot take every
  // slot: each principal holds at most max_per_principal, and the last
  // `reserved` slots are only for readers marked reserved (the admin's).
  std::size_t max_per_principal = 64;
  std::size_t reserved = 32;
  std::chrono::milliseconds heartbeat{std::chrono::seconds(15)};
  // 0: the time the bus is made, in microseconds since the epoch.
  std::uint64_t first_id = 0;

  // --- replicas: a feed log shared through the store -------------------------
  // The store's (Store::feed_log()); null: the bus numbers its own events.
  // It must outlive the bus; the bus closes it when it is destroyed, at the
  // latest (the log must not call a bus that is gone). After close() the bus
  // ignores what comes back, but publish() still appends: an agent's
  // disconnection while the coordinator stops reaches the other replicas.
  store::FeedLog* log = nullptr;
  // How long a reader whose Last-Event-ID is past what this replica has
  // received waits for it; then it gets a `reset` (checked by heartbeat()).
  std::chrono::milliseconds ahead_grace{std::chrono::seconds(10)};
  // Called on the log's thread with each event as it comes back, before
  // readers get it, and with the replicas' notes (publish_note()): `own`
  // when this replica published it, `live` false for those read at start
  // to fill the ring. FeedState learns the other replicas' agents here.
  std::function<void(const FeedEvent& e, bool own, bool live)> on_logged;
  // Called by heartbeat(), outside the bus's lock.
  std::function<void()> on_heartbeat;
  // FeedState's: how long an agent connected to another replica is shown
  // connected after that replica was last heard from (feed_state.hpp).
  std::chrono::milliseconds replica_ttl{std::chrono::seconds(60)};
};

struct BusStats {
  std::uint64_t published = 0;
  std::uint64_t subscribers = 0;
  std::uint64_t dropped_slow = 0;  // readers dropped for not keeping up
};

class EventBus {
 public:
  explicit EventBus(EventBusOptions opts = {});
  ~EventBus();
  EventBus(const EventBus&) = delete;
  EventBus& operator=(const EventBus&) = delete;

  // Adds "tenant" and "time" to data. Returns the event's id; 0 with a
  // log, where the database gives it (readers get the event once it has).
  std::uint64_t publish(const std::string& type, const std::string& tenant, nlohmann::json data);
  // The same with data already written as one line of JSON: an object
  // holding "tenant" and "time" (a publisher on a hot path writes it
  // without a tree, common/json_writer.hpp).
  std::uint64_t publish_text(const std::string& type, const std::string& tenant, std::string text);
  // With a log: a note to the other replicas (type kNoteType), through the
  // log to their on_logged, never to a reader. Without one, nothing.
  void publish_note(nlohmann::json data);
  static constexpr const char* kNoteType = "replica";
  // Whether the events go through a feed log.
  bool logged() const { return log_ != nullptr; }
  // Whether readers get what is published: without a log, always; with
  // one, once the log's first read (the ring's backfill) came back. What
  // others published before that is only in the ring.
  bool following() const { return !log_ || following_; }

  // Who subscribes, for the limits.
  struct Reader {
    std::string principal;
    // May use the reserved slots. False in Reader{}: value-initialized (a
    // member initializer here would keep subscribe() from defaulting one).
    bool reserved;
  };
  // What subscribe() answers.
  struct Subscribed {
    std::uint64_t handle = 0;  // 0: refused, `refusal` says why
    std::size_t replayed = 0;  // events sent from the ring
    std::string refusal;
  };
  // Sends what the ring holds after `after` (a Last-Event-ID), then every
  // new event, for one tenant ("" every tenant). When the ring no longer
  // holds the event after `after` (the reader was away too long, or the id is
  // of another run), a `reset` event says so first: the reader reloads
  // GET /v1/tenants. Without `after`, only new events.
  Subscribed subscribe(std::shared_ptr<EventSink> sink, std::string tenant,
                       std::optional<std::uint64_t> after, Reader reader = {});
  void unsubscribe(std::uint64_t handle);
  // Why `reader` would be refused now ("" when it would not): asked before
  // a stream's head is sent, so a refusal can be a 503.
  std::string refusal(const Reader& reader) const;

  // A comment line to every subscriber, so proxies and readers see the
  // stream alive; the bus's own thread calls it every opts.heartbeat. With
  // a log, it also resets the readers that waited past ahead_grace, and
  // calls opts.on_heartbeat.
  void heartbeat();

  std::uint64_t last_id() const;
  BusStats stats() const;
  std::size_t max_subscribers() const { return opts_.max_subscribers; }
  // Stops the heartbeat thread and ends every stream (the coordinator
  // stopping). Never waits on the database: the log is the store's to close.
  void close();

 private:
  struct Sub {
    std::shared_ptr<EventSink> sink;
    std::string tenant;
    std::uint64_t last_sent = 0;  // the id a reader that reconnects resumes after
    Reader reader;
    // Subscribed with a Last-Event-ID: gets the log's backfill too.
    bool positioned = false;
    // With a log: its Last-Event-ID is ahead of this replica, waited for
    // until then.
    std::optional<std::chrono::steady_clock::time_point> ahead_until;
  };
  // With mu_ held: the event to its readers and into the ring. `to_all`:
  // false for the log's backfill, which only readers that gave a
  // Last-Event-ID may want.
  void distribute_locked(const FeedEvent& e, bool to_all);
  // The log's records as they come back (its thread).
  void from_log(std::vector<store::FeedRecord> records, bool live);
  // With mu_ held: why `reader` may not take a slot now ("" when it may).
  std::string refusal_locked(const Reader& reader) const;
  void erase_locked(std::map<std::uint64_t, Sub>::iterator it);
  // With mu_ held: writes or drops.
  bool deliver(Sub& s, const std::string& bytes);
  bool deliver(Sub& s, const std::shared_ptr<const std::string>& bytes);
  void drop_slow(std::map<std::uint64_t, Sub>::iterator it);
  void heartbeat_loop();

  EventBusOptions opts_;
  store::FeedLog* const log_;
  std::atomic<bool> following_{false};
  mutable std::mutex mu_;
  std::uint64_t next_id_;
  // The ring holds each event as its readers get it, formatted once and
  // shared with every reader's queue.
  struct Held {
    std::uint64_t id = 0;
    std::string tenant;
    std::shared_ptr<const std::string> sse;
  };
  std::deque<Held> ring_;
  std::size_t ring_bytes_ = 0;
  std::map<std::uint64_t, Sub> subs_;
  std::map<std::string, std::size_t> per_principal_;
  std::size_t unreserved_ = 0;  // readers not marked reserved
  std::uint64_t next_handle_ = 1;
  BusStats stats_;
  bool closed_ = false;
  std::condition_variable cv_;
  std::thread heartbeats_;
};

}  // namespace factory::feed
