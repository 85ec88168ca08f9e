#include "agent/plan/runner.hpp"

#include <spdlog/spdlog.h>

#include "contract/protocol.hpp"

namespace factory::agent {

PlanRunner::PlanRunner(GuestEnv env, StepRegistry steps, PlanEventSink sink,
                       PlanEngineOptions engine_options, RebootHook reboot,
                       FinishedHook on_finished)
    : sink_(std::move(sink)), on_finished_(std::move(on_finished)) {
  RebootHook hook = [this, reboot]() -> Status {
    // From here on the guest is going down: run nothing else.
    rebooting_ = true;
    return reboot();
  };
  engine_ = std::make_unique<PlanEngine>(std::move(env), std::move(steps), sink_, hook,
                                         std::move(engine_options));
}

PlanRunner::~PlanRunner() {
  // The thread uses this object to the end: it is joined, never left behind.
  stop();
}

void PlanRunner::start() {
  {
    std::lock_guard lk(mu_);
    queue_.push_back({Work::Kind::resume, nullptr});
  }
  thread_ = std::thread([this] { loop(); });
}

void PlanRunner::submit_plan(const nlohmann::json& body) {
  if (!body.contains("plan") || !body["plan"].is_object()) {
    spdlog::warn("plan: ignoring a plan frame without a plan");
    return;
  }
  std::lock_guard lk(mu_);
  // A newer plan replaces one still waiting: only the latest matters.
  for (auto it = queue_.begin(); it != queue_.end();)
    it = it->kind == Work::Kind::plan ? queue_.erase(it) : std::next(it);
  queue_.push_back({Work::Kind::plan, body["plan"]});
  cv_.notify_one();
}

void PlanRunner::submit_command(const nlohmann::json& cmd) {
  std::string action = cmd.value("action", "");
  if (action != proto::action::kRetry && action != proto::action::kTierUpgrade) {
    spdlog::warn("plan: ignoring unknown command '{}'", action);
    return;
  }
  std::lock_guard lk(mu_);
  queue_.push_back(
      {action == proto::action::kRetry ? Work::Kind::retry : Work::Kind::tier_upgrade, cmd});
  cv_.notify_one();
}

void PlanRunner::interrupt() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  engine_->interrupt();
  cv_.notify_all();
}

void PlanRunner::stop() {
  interrupt();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

nlohmann::json PlanRunner::summary() const {
  auto s = engine_->status_json();
  return {{"plan_hash", s.value("plan_hash", "")},
          {"plan_state", s.value("state", "none")},
          {"steps_done", s.value("steps_done", 0)},
          {"steps_total", s.value("steps_total", 0)}};
}

nlohmann::json PlanRunner::status() const {
  return engine_->status_json();
}

void PlanRunner::loop() {
  while (!stopping_ && !rebooting_) {
    Work w;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      w = std::move(queue_.front());
      queue_.pop_front();
    }
    PlanEngine::Outcome outcome = PlanEngine::Outcome::idle;
    try {
      switch (w.kind) {
        case Work::Kind::resume:
          outcome = engine_->resume();
          break;
        case Work::Kind::plan:
          outcome = engine_->run(w.body);
          break;
        case Work::Kind::tier_upgrade:
          outcome = engine_->tier_upgrade(w.body);
          break;
        case Work::Kind::retry: {
          std::optional<std::string> step;
          if (w.body.contains("step") && w.body["step"].is_string())
            step = w.body["step"].get<std::string>();
          auto r = engine_->retry(step);
          if (!r) {
            spdlog::warn("plan: retry: {}", r.error().message);
            sink_({{"kind", "log"},
                   {"level", "warning"},
                   {"message", "retry: " + r.error().message}});
            continue;
          }
          outcome = *r;
          break;
        }
      }
    } catch (const std::exception& e) {
      // The engine catches step errors itself; this is a bug, but the agent stays up.
      spdlog::error("plan: unexpected error: {}", e.what());
      sink_({{"kind", "log"},
             {"level", "error"},
             {"message", std::string("plan runner: ") + e.what()}});
    }
    {
      std::lock_guard lk(mu_);
      last_outcome_ = PlanEngine::to_string(outcome);
    }
    if (outcome == PlanEngine::Outcome::rebooting || rebooting_) {
      spdlog::info("plan: the guest is rebooting; the plan resumes after boot");
      return;
    }
    if (outcome == PlanEngine::Outcome::stopped) return;
    if ((outcome == PlanEngine::Outcome::succeeded || outcome == PlanEngine::Outcome::failed) &&
        on_finished_)
      on_finished_(outcome);
  }
}

}  // namespace factory::agent
