#include "agent/plan/runner.hpp"

#include <spdlog/spdlog.h>

#include "agent/health/gpu_health.hpp"
#include "agent/health/k8s_health.hpp"
#include "agent/link/spool.hpp"
#include "agent/steps/builtin.hpp"

namespace factory::agent {

PlanRunner::PlanRunner(GuestEnv env, EventSpool& spool, std::chrono::milliseconds health_interval,
                       PlanEngineOptions engine_options, RebootHook reboot)
    : env_(std::move(env)), spool_(spool), health_interval_(health_interval) {
  StepRegistry registry;
  register_builtin_steps(registry);
  RebootHook hook = [this, reboot]() -> Status {
    // From here on the guest is going down: run nothing else.
    rebooting_ = true;
    return reboot();
  };
  engine_ = std::make_unique<PlanEngine>(
      env_, std::move(registry), [this](nlohmann::json e) { emit(std::move(e)); }, hook,
      std::move(engine_options));
}

PlanRunner::~PlanRunner() {
  stop();
  if (thread_.joinable()) thread_.detach();
}

void PlanRunner::emit(nlohmann::json event) {
  if (auto r = spool_.emit(std::move(event)); !r)
    spdlog::error("plan: event not recorded: {}", r.error().message);
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
  if (action != "retry") {
    spdlog::warn("plan: ignoring unknown command '{}'", action);
    return;
  }
  std::lock_guard lk(mu_);
  queue_.push_back({Work::Kind::retry, cmd});
  cv_.notify_one();
}

void PlanRunner::stop() {
  stopping_ = true;
  cv_.notify_all();
}

nlohmann::json PlanRunner::summary() const {
  auto s = engine_->status_json();
  return {{"plan_hash", s.value("plan_hash", "")},
          {"plan_state", s.value("state", "none")},
          {"steps_done", s.value("steps_done", 0)},
          {"steps_total", s.value("steps_total", 0)}};
}

void PlanRunner::report_health() {
  nlohmann::json h = {{"kind", "health"}, {"gpu", collect_gpu_health(env_)}};
  auto status = engine_->status_json();
  bool serves_models = false, runs_k8s = false;
  for (auto& s : status.value("steps", nlohmann::json::array())) {
    if (s.value("kind", "").rfind("ollama", 0) == 0) serves_models = true;
    if (s.value("kind", "") == "rke2") runs_k8s = true;
  }
  if (serves_models) h["ollama"] = collect_ollama_health(env_);
  if (runs_k8s) h["k8s"] = collect_k8s_health(env_);
  h["plan_hash"] = status.value("plan_hash", "");
  emit(std::move(h));
}

void PlanRunner::loop() {
  auto next_health = std::chrono::steady_clock::now() + health_interval_;
  while (!stopping_ && !rebooting_) {
    Work w;
    {
      std::unique_lock lk(mu_);
      cv_.wait_until(lk, next_health, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      if (queue_.empty()) {
        w = {Work::Kind::health, nullptr};
      } else {
        w = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    PlanEngine::Outcome outcome = PlanEngine::Outcome::idle;
    try {
      switch (w.kind) {
        case Work::Kind::resume: outcome = engine_->resume(); break;
        case Work::Kind::plan: outcome = engine_->run(w.body); break;
        case Work::Kind::retry: {
          std::optional<std::string> step;
          if (w.body.contains("step") && w.body["step"].is_string()) step = w.body["step"].get<std::string>();
          auto r = engine_->retry(step);
          if (!r) {
            spdlog::warn("plan: retry: {}", r.error().message);
            emit({{"kind", "log"}, {"level", "warning"}, {"message", "retry: " + r.error().message}});
            continue;
          }
          outcome = *r;
          break;
        }
        case Work::Kind::health: break;
      }
    } catch (const std::exception& e) {
      // The engine catches step errors itself; this is a bug, but the agent stays up.
      spdlog::error("plan: unexpected error: {}", e.what());
      emit({{"kind", "log"}, {"level", "error"}, {"message", std::string("plan runner: ") + e.what()}});
    }
    if (w.kind != Work::Kind::health) {
      std::lock_guard lk(mu_);
      last_outcome_ = PlanEngine::to_string(outcome);
    }
    if (outcome == PlanEngine::Outcome::rebooting || rebooting_) {
      spdlog::info("plan: the guest is rebooting; the plan resumes after boot");
      return;
    }
    if (outcome == PlanEngine::Outcome::succeeded || w.kind == Work::Kind::health ||
        outcome == PlanEngine::Outcome::failed) {
      report_health();
      next_health = std::chrono::steady_clock::now() + health_interval_;
    }
  }
}

}  // namespace factory::agent
