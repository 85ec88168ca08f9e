#include "agent/cli/maintenance.hpp"

#include <spdlog/spdlog.h>

#include "common/atomic_file.hpp"
#include "common/display.hpp"
#include "common/durations.hpp"
#include "common/subprocess.hpp"

namespace factory::agent {

using nlohmann::json;
using proto::MaintenanceNotice;
using proto::MaintenanceState;

namespace {

// "in 1 minute", "in 25 minutes", "in about 3 hours"; "now" once it is due.
std::string time_left(std::chrono::system_clock::time_point deadline,
                      std::chrono::system_clock::time_point now) {
  if (deadline <= now) return "now";
  auto minutes = std::chrono::ceil<std::chrono::minutes>(deadline - now).count();
  if (minutes == 1) return "in 1 minute";
  if (minutes < 120) return "in " + std::to_string(minutes) + " minutes";
  return "in about " + std::to_string(minutes / 60) + " hours";
}

// The notice the file holds, as written by schedule(); null when there is
// none, or when it cannot be read as one (it is then replaced).
json held_notice(const std::filesystem::path& file) {
  auto text = read_file(file);
  if (!text) return json();
  auto j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("notice_id") || !j["notice_id"].is_string())
    return json();
  return j;
}

bool holds(const json& held, const MaintenanceNotice& n) {
  return held.is_object() && held.value("notice_id", json()) == n.notice_id &&
         held.value("node", json()) == n.node &&
         held.value("deadline", json()) == format_rfc3339(n.deadline) &&
         held.value("message", json()) == n.message;
}

}  // namespace

const char* outcome_name(MaintenanceOutcome o) {
  switch (o) {
    case MaintenanceOutcome::recorded:
      return "recorded";
    case MaintenanceOutcome::cancelled:
      return "cancelled";
    case MaintenanceOutcome::repeated:
      return "repeated";
    case MaintenanceOutcome::unknown:
      return "unknown";
    case MaintenanceOutcome::refused:
      return "refused";
    case MaintenanceOutcome::failed:
      return "failed";
  }
  return "unknown";
}

std::string maintenance_wall_text(const MaintenanceNotice& n,
                                  std::chrono::system_clock::time_point now) {
  const std::string when = format_rfc3339(n.deadline);
  if (n.state == MaintenanceState::cancelled)
    return "Factory: maintenance cancelled: this VM will not be stopped for host maintenance on " +
           n.node + " at " + when + ".";
  std::string text = "Factory: this VM will be stopped for host maintenance on " + n.node + " at " +
                     when + " (" + time_left(n.deadline, now) + "). Save your work.";
  if (!n.message.empty()) text += " " + n.message;
  return text;
}

MaintenanceNotices::MaintenanceNotices(GuestEnv env, EventSpool& spool, MaintenanceOptions options)
    : env_(std::move(env)), spool_(spool), options_(std::move(options)) {}

MaintenanceNotices::~MaintenanceNotices() {
  stop();
}

std::filesystem::path MaintenanceNotices::file() const {
  return env_.path("/run/factory/maintenance");
}

void MaintenanceNotices::submit(json command) {
  std::lock_guard lk(mu_);
  if (stopping_) {
    spdlog::warn(
        "maintenance: the agent is stopping; a notice is left for the coordinator's resend");
    return;
  }
  if (queue_.size() >= kMaxQueued) {
    spdlog::warn("maintenance: {} commands already waiting; one dropped", queue_.size());
    return;
  }
  queue_.push_back(std::move(command));
  if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
  cv_.notify_one();
}

void MaintenanceNotices::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // No submit() starts the thread once stopping_ is set: worker_ holds still.
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

void MaintenanceNotices::work() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left
    json command = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    handle(command);
    lk.lock();
  }
}

MaintenanceOutcome MaintenanceNotices::handle(const json& command) {
  std::lock_guard lk(handling_);
  auto n = proto::decode_maintenance_notice(command);
  if (!n) {
    spdlog::warn("maintenance: refused: {}", n.error().message);
    return MaintenanceOutcome::refused;
  }
  return n->state == MaintenanceState::scheduled ? schedule(*n) : cancel(*n);
}

MaintenanceOutcome MaintenanceNotices::schedule(const MaintenanceNotice& n) {
  const auto now = options_.now();
  const json held = held_notice(file());
  if (holds(held, n)) {
    spdlog::info("maintenance: notice {} already received; nothing to do", n.notice_id);
    return MaintenanceOutcome::repeated;
  }
  if (held.is_object() && held.value("notice_id", "") == n.notice_id)
    spdlog::info("maintenance: notice {} changed", n.notice_id);
  else if (held.is_object())
    spdlog::info("maintenance: notice {} replaces notice {}", n.notice_id,
                 display::sanitize(held.value("notice_id", "")));
  spdlog::info("maintenance: notice {}: this VM will be stopped for host maintenance on {} at {}",
               n.notice_id, n.node, format_rfc3339(n.deadline));
  wall(maintenance_wall_text(n, now));
  emit(n);
  const json record = {{"notice_id", n.notice_id},
                       {"node", n.node},
                       {"deadline", format_rfc3339(n.deadline)},
                       {"message", n.message},
                       {"received_at", format_rfc3339(now)}};
  // Readable by everyone: it is for the customer's users and their scripts.
  Status st = ensure_dir(file().parent_path(), 0755);
  if (st.ok()) st = write_file_atomic(file(), record.dump(2) + "\n", 0644);
  if (!st.ok()) {
    spdlog::error("maintenance: notice {}: could not write {}: {}", n.notice_id, file().string(),
                  st.error().message);
    return MaintenanceOutcome::failed;
  }
  return MaintenanceOutcome::recorded;
}

MaintenanceOutcome MaintenanceNotices::cancel(const MaintenanceNotice& n) {
  const json held = held_notice(file());
  if (!held.is_object() || held.value("notice_id", "") != n.notice_id) {
    spdlog::info("maintenance: cancelled notice {} is not one this guest holds; nothing to do",
                 n.notice_id);
    return MaintenanceOutcome::unknown;
  }
  spdlog::info("maintenance: notice {} cancelled", n.notice_id);
  wall(maintenance_wall_text(n, options_.now()));
  emit(n);
  std::error_code ec;
  std::filesystem::remove(file(), ec);
  if (ec) {
    spdlog::error("maintenance: notice {}: could not remove {}: {}", n.notice_id, file().string(),
                  ec.message());
    return MaintenanceOutcome::failed;
  }
  return MaintenanceOutcome::cancelled;
}

void MaintenanceNotices::wall(const std::string& text) {
  // On stdin, not as an argument: wall reads a file when its one argument
  // names one.
  CommandSpec spec;
  spec.argv = {"wall"};
  spec.stdin_data = text + "\n";
  spec.timeout = options_.wall_timeout;
  spec.max_output = 4096;
  auto r = run_command(spec);
  if (!r) {
    spdlog::warn("maintenance: could not tell the guest's users (wall): {}", r.error().message);
    return;
  }
  if (!r->ok()) {
    std::string said = r->tail(3);
    while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
    spdlog::warn("maintenance: wall {}: {}", r->describe(), display::sanitize(said));
  }
}

void MaintenanceNotices::emit(const MaintenanceNotice& n) {
  if (auto r = spool_.emit(n.event()); !r)
    spdlog::error("maintenance: notice {}: event not recorded: {}", n.notice_id, r.error().message);
}

}  // namespace factory::agent
