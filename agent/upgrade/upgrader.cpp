#include "agent/upgrade/upgrader.hpp"

#include <spdlog/spdlog.h>

#include "agent/link/identity.hpp"
#include "agent/link/version.hpp"
#include "agent/upgrade/agent_binary.hpp"
#include "agent/upgrade/download.hpp"
#include "agent/upgrade/guard.hpp"
#include "agent/upgrade/systemd_unit.hpp"
#include "common/atomic_file.hpp"
#include "common/display.hpp"
#include "common/durations.hpp"

namespace factory::agent {

namespace fs = std::filesystem;
using nlohmann::json;
using proto::AgentUpgradeOrder;
using proto::AgentUpgradeState;

namespace {

std::string bounded(std::string r) {
  constexpr std::size_t kMax = proto::agent_upgrade_limits::kReason;
  r = display::sanitize(r);
  if (r.size() > kMax) r.resize(kMax);
  return r;
}

// The drop-in as it was before this order wrote it, to put back if the
// order is refused after all.
struct DropInBefore {
  bool existed = false;
  std::string text;
};

}  // namespace

const char* outcome_name(UpgradeOutcome o) {
  switch (o) {
    case UpgradeOutcome::restarting:
      return "restarting";
    case UpgradeOutcome::current:
      return "current";
    case UpgradeOutcome::refused:
      return "refused";
    case UpgradeOutcome::repeated:
      return "repeated";
    case UpgradeOutcome::invalid:
      return "invalid";
  }
  return "unknown";
}

Upgrader::Upgrader(GuestEnv env, EventSpool& spool, UpgradeOptions options)
    : env_(std::move(env)), spool_(spool), options_(std::move(options)) {}

Upgrader::~Upgrader() {
  stop();
}

std::string Upgrader::running_version() const {
  return options_.running_version.empty() ? std::string(agent_version()) : options_.running_version;
}

bool Upgrader::runs_candidate(const UpgradeState& s) const {
  if (running_version() != s.to_version) return false;
  // Same version is not proof enough (a rebuild, a restamp): the executable
  // must be the candidate's slot. When it cannot be told, the version decides.
  std::error_code ec;
  const fs::path exe = fs::canonical(options_.self_exe, ec);
  if (ec) return true;
  const fs::path candidate = fs::weakly_canonical(s.candidate, ec);
  return ec || exe == candidate;
}

std::string Upgrader::trusted_ca() const {
  // What the link trusts since enrollment first: the coordinator's CA as it
  // came with this agent's certificate; then the one cloud-init wrote.
  if (auto id = load_identity(env_.state_dir); id && *id && !(*id)->ca_pem.empty())
    return (*id)->ca_pem;
  if (!options_.ca_file.empty())
    if (auto pem = read_file(options_.ca_file)) return *pem;
  return {};
}

Status Upgrader::emit(const UpgradeState& s, AgentUpgradeState what) {
  proto::AgentUpgradeEvent e;
  e.upgrade_id = s.upgrade_id;
  e.state = what;
  e.from_version = s.from_version;
  e.to_version = s.to_version;
  if (what == AgentUpgradeState::refused || what == AgentUpgradeState::rolled_back)
    e.reason = bounded(s.reason);
  auto r = spool_.emit(e.to_json());
  if (!r) {
    spdlog::error("upgrade {}: the event {} was not recorded: {}", s.upgrade_id,
                  proto::state_name(what), r.error().message);
    return r.error();
  }
  return {};
}

// The phase's final event, and `reported` once the spool has it: a crash in
// between sends it again at the next start, never loses it.
void Upgrader::report_final(UpgradeState& s) {
  AgentUpgradeState what;
  switch (s.phase) {
    case UpgradePhase::refused:
      what = AgentUpgradeState::refused;
      break;
    case UpgradePhase::confirmed:
      what = AgentUpgradeState::upgraded;
      break;
    case UpgradePhase::rolled_back:
      what = AgentUpgradeState::rolled_back;
      break;
    default:
      return;
  }
  if (!emit(s, what).ok()) return;
  s.reported = true;
  if (auto st = save_upgrade_state(layout().state_file(), s); !st.ok())
    spdlog::error("upgrade {}: {}", s.upgrade_id, st.error().message);
}

void Upgrader::on_start() {
  std::lock_guard handling(handling_);
  const fs::path file = layout().state_file();
  std::error_code ec;
  if (!fs::exists(file, ec)) return;  // never ordered: nothing to make, not even the lock
  auto lock = UpgradeStateLock::acquire(file);
  if (!lock) {
    spdlog::error("upgrade: {}", lock.error().message);
    return;
  }
  auto held = load_upgrade_state(file);
  if (!held) {
    spdlog::warn("upgrade: {}; the next order replaces it", held.error().message);
    return;
  }
  if (!*held) return;
  UpgradeState& s = **held;
  switch (s.phase) {
    case UpgradePhase::installing:
      // The switch comes after "trying" is written: nothing was changed.
      s.phase = UpgradePhase::refused;
      s.reason = "the agent stopped before " + s.to_version + " was installed";
      s.reported = false;
      spdlog::warn("upgrade {}: {}", s.upgrade_id, s.reason);
      if (auto st = save_upgrade_state(file, s); !st.ok())
        spdlog::error("upgrade {}: {}", s.upgrade_id, st.error().message);
      report_final(s);
      return;
    case UpgradePhase::trying:
      if (runs_candidate(s)) {
        on_trial_ = true;
        spdlog::info("upgrade {}: {} on trial until {}: confirmed once connected and health sent",
                     s.upgrade_id, s.to_version, format_rfc3339(*s.deadline));
        return;
      }
      // The previous binary started while the new one was on trial: the
      // agent stopped between writing the trial and the switch, or someone
      // put binary_path back. Either way the trial is over.
      if (auto st = roll_back(env_, file, s,
                              bounded(s.to_version + " did not start: " + running_version() +
                                      " started instead, before " + s.to_version + " ran"));
          !st.ok()) {
        spdlog::error("upgrade {}: cannot roll back: {}", s.upgrade_id, st.error().message);
        return;
      }
      spdlog::warn("upgrade {}: {}", s.upgrade_id, s.reason);
      report_final(s);
      return;
    case UpgradePhase::refused:
    case UpgradePhase::confirmed:
    case UpgradePhase::rolled_back:
      if (s.reported) return;
      if (s.phase == UpgradePhase::rolled_back)
        spdlog::warn("upgrade {}: rolled back: {}", s.upgrade_id, s.reason);
      report_final(s);
      return;
  }
}

UpgradeOutcome Upgrader::handle(const json& command) {
  std::lock_guard handling(handling_);
  auto order = proto::decode_agent_upgrade_order(command);
  if (!order) {
    spdlog::warn("upgrade: ignoring an invalid order: {}", order.error().message);
    return UpgradeOutcome::invalid;
  }
  try {
    return install(*order);
  } catch (const std::exception& e) {
    // A filesystem call that threw (they are meant not to): refused, not lost.
    return refuse(*order, std::string("internal error: ") + e.what(), std::nullopt);
  }
}

UpgradeOutcome Upgrader::refuse(const AgentUpgradeOrder& order, const std::string& reason,
                                std::optional<UpgradeState> state) {
  spdlog::warn("upgrade {}: refused: {}", order.upgrade_id, reason);
  UpgradeState s;
  if (state) s = std::move(*state);
  s.upgrade_id = order.upgrade_id;
  s.from_version = running_version();
  s.to_version = order.version;
  s.phase = UpgradePhase::refused;
  s.reason = bounded(reason);
  s.reported = false;
  if (!state) {
    // Another upgrade holds the state file: the refusal is only an event.
    (void)emit(s, AgentUpgradeState::refused);
    return UpgradeOutcome::refused;
  }
  auto lock = UpgradeStateLock::acquire(layout().state_file());
  if (auto st = save_upgrade_state(layout().state_file(), s); !st.ok())
    spdlog::error("upgrade {}: {}", s.upgrade_id, st.error().message);
  report_final(s);
  return UpgradeOutcome::refused;
}

UpgradeOutcome Upgrader::install(const AgentUpgradeOrder& order) {
  const UpgradeLayout at = layout();
  const fs::path file = at.state_file();
  const std::string running = running_version();

  // Once per upgrade_id, whatever became of it; one upgrade at a time.
  {
    auto lock = UpgradeStateLock::acquire(file);
    if (!lock) return refuse(order, lock.error().message, std::nullopt);
    auto held = load_upgrade_state(file);
    if (!held) spdlog::warn("upgrade: {}; replaced by this order", held.error().message);
    if (held && *held) {
      const UpgradeState& h = **held;
      if (h.upgrade_id == order.upgrade_id) {
        spdlog::info("upgrade {}: already {}; nothing to do", order.upgrade_id,
                     phase_name(h.phase));
        return UpgradeOutcome::repeated;
      }
      if (h.phase == UpgradePhase::trying || h.phase == UpgradePhase::installing)
        return refuse(
            order,
            "upgrade " + h.upgrade_id + " to " + h.to_version + " is still " +
                (h.phase == UpgradePhase::trying
                     ? "on trial until " + format_rfc3339(h.deadline.value_or(Clock::now()))
                     : std::string("installing")),
            std::nullopt);
    }
  }

  UpgradeState s;
  s.upgrade_id = order.upgrade_id;
  s.from_version = running;
  s.to_version = order.version;
  s.to_sha256 = order.sha256;
  s.binary_path = options_.binary_path;
  s.confirm_within_s = order.confirm_within_s;
  s.phase = UpgradePhase::installing;

  // What runs now, which a rollback returns to: it must exist, and carry a
  // version mark, without which it is a build older than self-update that
  // has no guard to run.
  const fs::path binary = env_.path(options_.binary_path);
  std::error_code ec;
  const fs::path current = fs::canonical(binary, ec);
  if (ec || !fs::is_regular_file(current, ec))
    return refuse(order, "binary_path " + options_.binary_path + " is not a file", s);
  if (auto v = file_agent_version(current); !v)
    return refuse(order,
                  options_.binary_path + " cannot guard a rollback (" + v.error().message + ")", s);
  auto current_sha = file_sha256(current);
  if (!current_sha) return refuse(order, current_sha.error().message, s);
  if (*current_sha == order.sha256) {
    // Nothing to install: the binary the order names is the one that runs
    // (an order sent again after its upgrade was confirmed under another id).
    s.from_sha256 = s.to_sha256;
    s.phase = UpgradePhase::confirmed;
    auto lock = UpgradeStateLock::acquire(file);
    if (auto st = save_upgrade_state(file, s); !st.ok()) {
      spdlog::error("upgrade {}: {}", order.upgrade_id, st.error().message);
      return UpgradeOutcome::current;
    }
    spdlog::info("upgrade {}: {} is what runs already", order.upgrade_id, order.version);
    report_final(s);
    return UpgradeOutcome::current;
  }
  for (const fs::path& p : {at.bin_dir(), file})
    if (!unit_safe_path(p.string()))
      return refuse(order,
                    "the state directory's path " + p.string() +
                        " cannot be written into a systemd unit (want only A-Z a-z 0-9 / . _ - +)",
                    s);

  {
    // The state file is this order's from here on (its id acted on once).
    auto lock = UpgradeStateLock::acquire(file);
    if (auto st = save_upgrade_state(file, s); !st.ok())
      return refuse(order, st.error().message, std::nullopt);
  }
  spdlog::info("upgrade {}: installing {} (from {}), {} bytes from {}", order.upgrade_id,
               order.version, running, order.size, order.url);
  (void)emit(s, AgentUpgradeState::installing);

  std::shared_ptr<net::HttpCancel> cancel;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return refuse(order, "the agent is stopping", s);
    cancel_ = cancel = std::make_shared<net::HttpCancel>();
  }
  DownloadSpec spec;
  spec.url = order.url;
  spec.size = order.size;
  spec.sha256 = order.sha256;
  spec.ca_pem = trusted_ca();
  spec.timeout = options_.download_timeout;
  spec.cancel = cancel;
  auto tmp = download_checked(spec, at.bin_dir());
  {
    std::lock_guard lk(mu_);
    cancel_.reset();
  }
  if (!tmp) return refuse(order, "download: " + tmp.error().message, s);

  // The new binary must say it is the version ordered: one that says
  // otherwise could never confirm, and would only be rolled back later.
  auto says = file_agent_version(*tmp);
  if (!says || *says != order.version) {
    fs::remove(*tmp, ec);
    return refuse(
        order,
        says ? "the downloaded binary is version " + *says + ", the order says " + order.version
             : "the downloaded binary: " + says.error().message,
        s);
  }
  const fs::path candidate = at.bin_dir() / slot_name(order.sha256);
  if (auto st = install_executable(*tmp, candidate); !st.ok()) {
    fs::remove(*tmp, ec);
    return refuse(order, st.error().message, s);
  }

  wait_for_plan();
  bool stopped;
  {
    std::lock_guard lk(mu_);
    stopped = stopping_;
  }
  if (stopped) {
    // A stop that came meanwhile (a SIGTERM, the plan's reboot) ends the
    // order here, before anything the stop would leave half-done.
    fs::remove(candidate, ec);
    return refuse(order, "the agent stopped before " + order.version + " was installed", s);
  }

  auto stable = keep_in_slot(current, at.bin_dir());
  if (!stable) return refuse(order, "keeping the running binary: " + stable.error().message, s);
  s.from_sha256 = stable->sha256;
  s.stable = stable->path.string();
  s.candidate = candidate.string();
  s.phase = UpgradePhase::trying;
  s.deadline = options_.now() + std::chrono::seconds(order.confirm_within_s);
  s.starts = 0;
  s.last_exit.reset();
  Status saved;
  {
    auto lock = UpgradeStateLock::acquire(file);
    saved = save_upgrade_state(file, s);
  }
  if (!saved.ok()) return refuse(order, saved.error().message, s);

  // From here on a failure puts back what was changed before refusing.
  const fs::path drop_in = env_.path(kUpgradeDropIn);
  DropInBefore before;
  if (auto old = read_file(drop_in)) before = {true, *old};
  bool switched = false;
  auto undo = [&](const std::string& why) {
    if (switched)
      if (auto st = point_link_at(binary, s.stable); !st.ok())
        spdlog::error("upgrade {}: could not point {} back at {}: {}", order.upgrade_id,
                      options_.binary_path, s.stable, st.error().message);
    Status put_back = before.existed ? write_file_atomic(drop_in, before.text, 0644) : Status{};
    if (!before.existed) fs::remove(drop_in, ec);
    if (!put_back.ok() || !reload_systemd().ok())
      spdlog::warn("upgrade {}: the drop-in {} may not be as it was", order.upgrade_id,
                   drop_in.string());
    stop_deadline_timer();
    return refuse(order, why, s);
  };

  Status st = ensure_dir(drop_in.parent_path(), 0755);
  if (st.ok()) st = write_file_atomic(drop_in, upgrade_drop_in(s.stable, file, env_), 0644);
  if (st.ok()) st = reload_systemd();
  if (!st.ok()) return undo(st.error().message);
  if (st = point_link_at(binary, candidate); !st.ok()) return undo(st.error().message);
  switched = true;
  if (st = arm_deadline_timer(s.stable, file, order.confirm_within_s, env_); !st.ok())
    return undo(st.error().message);
  // systemd now stops this agent (SIGTERM): its graceful stop interrupts a
  // plan step still running, which the plan journal resumes at the next
  // start, the new binary's. The guard then counts the start.
  if (st = restart_agent_unit(); !st.ok()) return undo(st.error().message);
  spdlog::info("upgrade {}: {} installed at {}; {} points at it; restarting {} (deadline {})",
               order.upgrade_id, order.version, s.candidate, options_.binary_path, kAgentUnit,
               format_rfc3339(*s.deadline));
  return UpgradeOutcome::restarting;
}

void Upgrader::wait_for_plan() {
  if (!options_.plan_busy || !options_.plan_busy()) return;
  spdlog::info("upgrade: waiting up to {} s for the plan's step to finish before the restart",
               std::chrono::duration_cast<std::chrono::seconds>(options_.plan_settle).count());
  const auto until = std::chrono::steady_clock::now() + options_.plan_settle;
  std::unique_lock lk(mu_);
  while (!stopping_ && std::chrono::steady_clock::now() < until) {
    lk.unlock();
    if (!options_.plan_busy()) return;
    lk.lock();
    cv_.wait_for(lk, std::chrono::seconds(1), [this] { return stopping_; });
  }
}

bool Upgrader::confirm() {
  std::lock_guard handling(handling_);
  const fs::path file = layout().state_file();
  UpgradeState s;
  {
    auto lock = UpgradeStateLock::acquire(file);
    if (!lock) {
      spdlog::error("upgrade: {}", lock.error().message);
      return false;
    }
    auto held = load_upgrade_state(file);
    if (!held || !*held) return false;
    s = **held;
    if (s.phase == UpgradePhase::confirmed) {
      if (!s.reported) report_final(s);
      on_trial_ = false;
      return s.reported;
    }
    if (s.phase != UpgradePhase::trying || !runs_candidate(s)) return false;
    // Written before the timer is stopped: a deadline that fires in between
    // finds the trial over (the lock orders the two).
    s.phase = UpgradePhase::confirmed;
    s.reason.clear();
    s.reported = false;
    if (auto st = save_upgrade_state(file, s); !st.ok()) {
      spdlog::error("upgrade {}: {}", s.upgrade_id, st.error().message);
      return false;
    }
    report_final(s);
  }
  on_trial_ = false;
  spdlog::info("upgrade {}: confirmed: {} runs, connected and sent health", s.upgrade_id,
               s.to_version);
  stop_deadline_timer();
  prune_slots(s);
  return true;
}

// Keeps the stable and the candidate (the previous binary stays for a later
// rollback by hand, docs/agent-upgrades.md) and what binary_path names;
// deletes older slots and temp files a crash left.
void Upgrader::prune_slots(const UpgradeState& s) {
  std::error_code ec;
  const fs::path in_use = fs::canonical(env_.path(s.binary_path), ec);
  for (const auto& e : fs::directory_iterator(layout().bin_dir(), ec)) {
    const fs::path& p = e.path();
    if (p == fs::path(s.stable) || p == fs::path(s.candidate) || p == in_use) continue;
    const std::string name = p.filename().string();
    if (name.rfind("factory-agent-", 0) != 0 && name.rfind(".", 0) != 0) continue;
    std::error_code rm;
    if (fs::remove(p, rm))
      spdlog::info("upgrade: deleted {}", p.string());
    else if (rm)
      spdlog::warn("upgrade: could not delete {}: {}", p.string(), rm.message());
  }
}

void Upgrader::submit(json command) {
  std::lock_guard lk(mu_);
  if (stopping_) {
    spdlog::warn("upgrade: the agent is stopping; an order is left for the coordinator's resend");
    return;
  }
  if (queue_.size() >= kMaxQueued) {
    spdlog::warn("upgrade: {} orders already waiting; one dropped", queue_.size());
    return;
  }
  queue_.push_back(std::move(command));
  if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
  cv_.notify_all();
}

void Upgrader::on_health_sent() {
  if (!on_trial_ || confirm_asked_.exchange(true)) return;
  std::lock_guard lk(mu_);
  if (stopping_) return;
  confirm_pending_ = true;
  if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
  cv_.notify_all();
}

void Upgrader::stop() {
  std::shared_ptr<net::HttpCancel> cancel;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    cancel = cancel_;
  }
  if (cancel) cancel->cancel();
  cv_.notify_all();
  // No submit() starts the thread once stopping_ is set: worker_ holds still.
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

void Upgrader::work() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stopping_ || confirm_pending_ || !queue_.empty(); });
    // Orders not begun are left for the coordinator's resend; a trial not
    // confirmed is confirmed at the next start.
    if (stopping_) return;
    if (confirm_pending_) {
      confirm_pending_ = false;
      lk.unlock();
      // Not confirmed (a disk error): the next health sample tries again.
      if (!confirm() && on_trial_) confirm_asked_ = false;
      lk.lock();
      continue;
    }
    json command = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    handle(command);
    lk.lock();
  }
}

}  // namespace factory::agent
