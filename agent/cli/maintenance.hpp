#pragma once
// Maintenance notices in the guest (contract/maintenance.hpp): the
// coordinator says a host drain will stop this VM, and the agent tells those
// inside it, in three ways:
//   - <root>/run/factory/maintenance (0644: for the customer's own users and
//     scripts): {"notice_id", "node", "deadline", "message", "received_at"};
//   - a `wall` to the logged-in users ("Factory: this VM will be stopped for
//     host maintenance on <node> at <deadline> (in N minutes). ...");
//   - a durable event to the coordinator (the spool), that the notice arrived.
// A cancelled notice removes the file, says so on the terminals, and is an
// event too.
//
// Once per notice: the coordinator sends a notice again after every
// reconnection, and the same notice (id, node, deadline and message) finds
// the file already saying it, so nothing is written, sent or emitted twice.
// Deciding it from the file holds across an agent restart. The file is
// written last, as the record that the rest was done: an agent that dies
// half way tells the users and the coordinator again at the resend rather
// than never. A notice of the same id with another deadline or message is
// news and is acted on again; a notice of another id replaces the one held
// (one drain at a time stops a VM).
//
// /run is a tmpfs in a real guest: a reboot clears the notice by itself,
// which is right, since the VM it announced a stop of has stopped by then.
//
// `wall` failing (absent, timed out, refused while the agent stops) is
// logged and nothing more: the file and the event matter as much.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/guest/env.hpp"
#include "agent/link/spool.hpp"
#include "contract/maintenance.hpp"

namespace factory::agent {

struct MaintenanceOptions {
  // `wall` writes to every logged-in terminal; one that is stuck must not
  // hold the notice up.
  std::chrono::milliseconds wall_timeout{std::chrono::seconds(5)};
  // What "in N minutes" and received_at are read from (tests move it).
  std::function<std::chrono::system_clock::time_point()> now = [] {
    return std::chrono::system_clock::now();
  };
};

// What handle() did with a command.
enum class MaintenanceOutcome {
  recorded,   // scheduled: wall sent (or tried), event emitted, file written
  cancelled,  // the held notice withdrawn: wall, event, file removed
  repeated,   // the notice the file already holds: nothing done
  unknown,    // cancelled, for a notice this guest does not hold: nothing done
  refused,    // not a valid notice: nothing done
  failed,     // the file could not be written or removed (logged)
};
const char* outcome_name(MaintenanceOutcome o);

// The text `wall` gets for a notice, at `now`.
std::string maintenance_wall_text(const proto::MaintenanceNotice& n,
                                  std::chrono::system_clock::time_point now);

class MaintenanceNotices {
 public:
  MaintenanceNotices(GuestEnv env, EventSpool& spool, MaintenanceOptions options = {});
  // Handles what was submitted already, then ends the thread (stop()).
  ~MaintenanceNotices();
  MaintenanceNotices(const MaintenanceNotices&) = delete;
  MaintenanceNotices& operator=(const MaintenanceNotices&) = delete;

  // <root>/run/factory/maintenance
  std::filesystem::path file() const;

  // Acts on a "maintenance" command's body now, on the caller's thread (one
  // command at a time); logs what it did or why not. Never throws.
  MaintenanceOutcome handle(const nlohmann::json& command);
  // For the link's thread, which must not wait on `wall`: the command is
  // handled on a thread of this object's, started at the first one, in the
  // order they came. Bounded: past kMaxQueued waiting, a command is dropped
  // with a warning (the coordinator sends its notices again).
  static constexpr std::size_t kMaxQueued = 16;
  void submit(nlohmann::json command);
  // Handles what was submitted, then ends the thread; later commands are
  // dropped. Called while the agent stops, inside its CommandStop, so a
  // `wall` still running is ended with the rest of its commands.
  void stop();

 private:
  void work();
  MaintenanceOutcome schedule(const proto::MaintenanceNotice& n);
  MaintenanceOutcome cancel(const proto::MaintenanceNotice& n);
  void wall(const std::string& text);
  void emit(const proto::MaintenanceNotice& n);

  GuestEnv env_;
  EventSpool& spool_;
  MaintenanceOptions options_;
  std::mutex handling_;  // one command at a time, whichever thread calls

  std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  std::deque<nlohmann::json> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace factory::agent
