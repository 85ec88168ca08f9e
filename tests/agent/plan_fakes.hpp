#pragma once
// Test doubles for the plan engine: a guest whose state lives in files under a
// temporary root, and a step kind ("fake") that records every call there.
//
// Keeping the state in files matters: the crash tests run the agent in a
// fork()ed child that is SIGKILLed mid-step, and what survives is exactly what
// a real guest keeps: the disk (journal and effects), not the dead process's
// memory. "Booting" writes a new /proc/sys/kernel/random/boot_id under the
// root and loads what was installed, as a guest's kernel loads a freshly
// installed driver module at boot.
//
// fake step params: name (required), reboot (bool: apply installs and asks
// for a reboot; done once "loaded" after boot), observe_journal (bool: apply
// records the journal's view of the step as read from disk), sleep_ms,
// throw (bool), progress (bool).
// Files under <root>/fake/: count-<what>-<name> (one line per call), kill-at
// ("<name>:<point>" kills the process there once), fail-<name> (apply fails),
// crash-<name> (apply kills the process every time), done-/installed-/loaded-<name>.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "agent/plan/engine.hpp"
#include "common/atomic_file.hpp"
#include "tests/support/test_support.hpp"

namespace factory::agent::testfakes {

namespace fs = std::filesystem;
using nlohmann::json;

inline fs::path fake_dir(const fs::path& root) {
  return root / "fake";
}

inline int count_in(const fs::path& root, const std::string& what) {
  std::ifstream in(fake_dir(root) / ("count-" + what));
  int n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}
inline void bump_in(const fs::path& root, const std::string& what) {
  fs::create_directories(fake_dir(root));
  std::ofstream(fake_dir(root) / ("count-" + what), std::ios::app) << "x\n";
}
inline bool has_in(const fs::path& root, const std::string& flag) {
  return fs::exists(fake_dir(root) / flag);
}
inline void set_in(const fs::path& root, const std::string& flag, const std::string& content = "") {
  fs::create_directories(fake_dir(root));
  std::ofstream(fake_dir(root) / flag) << content;
}
inline void clear_in(const fs::path& root, const std::string& flag) {
  fs::remove(fake_dir(root) / flag);
}

// Kills this process (SIGKILL: no cleanup, no flush) if the test armed this point.
inline void maybe_kill(const fs::path& root, const std::string& point) {
  auto f = fake_dir(root) / "kill-at";
  std::ifstream in(f);
  std::string armed;
  if (!std::getline(in, armed) || armed != point) return;
  fs::remove(f);  // once: the restarted agent must get past this point
  ::raise(SIGKILL);
}

class FakeStep : public Step {
 public:
  explicit FakeStep(const StepSpec& spec)
      : p_(spec.params), name_(spec.params.value("name", spec.id)) {}

  Result<bool> check(StepContext& ctx) override {
    const auto& root = ctx.env.root;
    maybe_kill(root, name_ + ":check");
    bump_in(root, "check-" + name_);
    return has_in(root, (reboot() ? "loaded-" : "done-") + name_);
  }

  StepOutcome apply(StepContext& ctx) override {
    const auto& root = ctx.env.root;
    maybe_kill(root, name_ + ":apply");
    bump_in(root, "apply-" + name_);
    if (has_in(root, "crash-" + name_)) ::raise(SIGKILL);
    if (p_.value("throw", false)) throw std::runtime_error("boom in " + name_);
    if (p_.value("observe_journal", false)) observe(ctx);
    if (p_.value("progress", false)) ctx.progress({{"percent", 42}, {"message", "halfway"}});
    if (int ms = p_.value("sleep_ms", 0)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      if (ctx.remaining() <= std::chrono::milliseconds(0))
        return StepOutcome::failure("deadline passed");
    }
    if (has_in(root, "fail-" + name_)) {
      Diagnosis d{
          "simulated_failure", name_ + " failed as the test asked", "remove the fail file", {}};
      return StepOutcome::failure("simulated failure of " + name_, "line 1\nline 2: the end", d);
    }
    // Re-entrant as every real step must be: the effect happens once however
    // often apply runs.
    std::string flag = (reboot() ? "installed-" : "done-") + name_;
    if (!has_in(root, flag)) {
      bump_in(root, "effect-" + name_);
      set_in(root, flag);
    }
    maybe_kill(root, name_ + ":apply_after");
    if (reboot()) return StepOutcome::reboot(name_ + " installed; a reboot loads it");
    return StepOutcome::success("applied " + name_);
  }

  StepOutcome verify(StepContext& ctx) override {
    const auto& root = ctx.env.root;
    maybe_kill(root, name_ + ":verify");
    bump_in(root, "verify-" + name_);
    if (reboot()) {
      if (has_in(root, "loaded-" + name_)) return StepOutcome::success("loaded");
      return StepOutcome::failure(
          name_ + " installed but not loaded", "",
          Diagnosis{"driver_reboot_pending", "reboot pending", "reboot the guest", {}});
    }
    return has_in(root, "done-" + name_) ? StepOutcome::success("verified " + name_)
                                         : StepOutcome::failure(name_ + " is not done");
  }

 private:
  bool reboot() const { return p_.value("reboot", false); }
  void observe(StepContext& ctx) {
    auto text = read_file(ctx.env.state_dir / "plan" / "journal.json");
    auto st = PlanJournal::parse(text.ok() ? *text : "");
    if (!st) return;
    for (auto& s : st->steps)
      if (s.id == ctx.spec.id)
        set_in(ctx.env.root, "observed-" + name_,
               std::string(to_string(s.state)) + "/" + s.phase + "/" + std::to_string(s.entries) +
                   "/" + std::to_string(s.attempts));
  }

  json p_;
  std::string name_;
};

inline StepRegistry fake_registry() {
  StepRegistry r;
  r.add("fake", [](const StepSpec& s) -> Result<std::unique_ptr<Step>> {
    return std::unique_ptr<Step>(std::make_unique<FakeStep>(s));
  });
  return r;
}

inline json fake(const std::string& name, json params = json::object(), int retries = 0,
                 int timeout_s = 60) {
  params["name"] = name;
  return {{"id", name},
          {"kind", "fake"},
          {"params", params},
          {"timeout_seconds", timeout_s},
          {"retries", retries}};
}

inline json plan_of(std::vector<json> steps, const std::string& tier = "test-tier") {
  return {{"tier", tier}, {"steps", steps}};
}

// A simulated guest: a root with a boot id, and the agent's state dir.
class FakeGuest {
 public:
  FakeGuest() {
    env.root = dir_ / "root";
    env.state_dir = dir_ / "state";
    fs::create_directories(env.root / "proc/sys/kernel/random");
    write_boot_id();
  }
  GuestEnv env;

  std::string boot_id() const { return "boot-" + std::to_string(boots() + 1); }
  int boots() const { return count_in(env.root, "boots"); }
  // The guest restarts: new boot id; what was installed is now loaded.
  void boot() {
    bump_in(env.root, "boots");
    write_boot_id();
    for (auto& e : fs::directory_iterator(fake_dir(env.root))) {
      std::string n = e.path().filename().string();
      if (n.rfind("installed-", 0) == 0) set_in(env.root, "loaded-" + n.substr(10));
    }
  }
  int count(const std::string& what) const { return count_in(env.root, what); }
  bool has(const std::string& flag) const { return has_in(env.root, flag); }
  void set(const std::string& flag) { set_in(env.root, flag); }
  void clear(const std::string& flag) { clear_in(env.root, flag); }
  void kill_at(const std::string& point) { set_in(env.root, "kill-at", point); }
  fs::path journal_file() const { return env.state_dir / "plan" / "journal.json"; }

  // The reboot hook an agent in this guest uses: counts requests; can be
  // armed ("reboot") to kill the agent before the reboot happens.
  RebootHook reboot_hook() {
    fs::path root = env.root;
    return [root]() -> Status {
      bump_in(root, "reboot-requests");
      maybe_kill(root, "reboot");
      return ok_status();
    };
  }

  std::unique_ptr<PlanEngine> engine(std::vector<json>* events = nullptr,
                                     PlanEngineOptions opts = {}) {
    if (!opts.sleep) opts.sleep = [this](std::chrono::milliseconds d) { slept.push_back(d); };
    opts.retry_delay = std::chrono::milliseconds(1000);
    PlanEventSink sink = [events](json e) {
      if (events) events->push_back(std::move(e));
    };
    return std::make_unique<PlanEngine>(env, fake_registry(), sink, reboot_hook(), opts);
  }

  // What the agent does, as systemd runs it: at start it resumes the journal's
  // plan, or takes the coordinator's; when it asked for a reboot the guest
  // boots and the agent starts again. Returns the final outcome.
  PlanEngine::Outcome converge(const json& plan, std::vector<json>* events = nullptr,
                               int max_starts = 12) {
    PlanEngine::Outcome o = PlanEngine::Outcome::idle;
    for (int i = 0; i < max_starts; ++i) {
      auto e = engine(events);
      o = e->resume();
      if (o == PlanEngine::Outcome::idle) o = e->run(plan);
      if (o != PlanEngine::Outcome::rebooting) return o;
      boot();
    }
    return o;
  }

  std::vector<std::chrono::milliseconds> slept;

 private:
  void write_boot_id() {
    std::ofstream(env.root / "proc/sys/kernel/random/boot_id") << boot_id() << "\n";
  }
  testing::TempDir dir_{"plan"};
};

// Runs fn in a forked child process (a separate agent process that can be
// SIGKILLed) and returns its wait status.
inline int in_child(const std::function<void()>& fn) {
  fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    fn();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

inline bool killed_by_sigkill(int status) {
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

inline std::vector<json> of_kind(const std::vector<json>& events, const std::string& kind) {
  std::vector<json> out;
  for (auto& e : events)
    if (e.value("kind", "") == kind) out.push_back(e);
  return out;
}

// "step:state" for each progress event, in order (progress-state events left out).
inline std::vector<std::string> step_trail(const std::vector<json>& events) {
  std::vector<std::string> out;
  for (auto& e : of_kind(events, "progress"))
    if (e["state"] != "progress")
      out.push_back(e["step"].get<std::string>() + ":" + e["state"].get<std::string>());
  return out;
}

}  // namespace factory::agent::testfakes
