#pragma once
// Drives one step kind directly (no plan engine): builds its StepSpec from
// the built-in catalog's gpu-vm tier, so the params are exactly what the
// coordinator sends, and collects the step's progress events.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "agent/plan/step.hpp"
#include "agent/steps/builtin.hpp"
#include "contract/catalog.hpp"

namespace factory::testing {

inline agent::StepSpec catalog_step(const std::string& tier, const std::string& id) {
  auto cat = catalog::builtin();
  EXPECT_TRUE(cat) << cat.error().message;
  agent::StepSpec spec;
  if (!cat) return spec;
  auto t = cat->tier(tier);
  EXPECT_TRUE(t) << t.error().message;
  if (!t) return spec;
  for (const auto& s : (*t)->steps) {
    if (s.id != id) continue;
    spec.id = s.id;
    spec.kind = s.kind;
    spec.params = s.params;
    spec.timeout = s.timeout;
    spec.retries = s.retries;
    return spec;
  }
  ADD_FAILURE() << "no step '" << id << "' in tier " << tier;
  return spec;
}

class StepHarness {
 public:
  StepHarness(agent::GuestEnv env, agent::StepSpec spec)
      : env_(std::move(env)), spec_(std::move(spec)) {
    agent::StepRegistry reg;
    agent::register_builtin_steps(reg);
    auto s = reg.create(spec_);
    EXPECT_TRUE(s) << s.error().message;
    if (s) step_ = std::move(*s);
  }

  agent::Step& step() { return *step_; }
  bool ok() const { return step_ != nullptr; }

  agent::StepContext context(std::chrono::milliseconds timeout = std::chrono::minutes(2)) {
    return agent::StepContext{env_, spec_,
                              [this](nlohmann::json j) { events.push_back(std::move(j)); },
                              std::chrono::steady_clock::now() + timeout};
  }

  Result<bool> check() {
    auto c = context();
    return step_->check(c);
  }
  agent::StepOutcome apply() {
    auto c = context();
    return step_->apply(c);
  }
  agent::StepOutcome verify(std::chrono::milliseconds timeout = std::chrono::minutes(2)) {
    auto c = context(timeout);
    return step_->verify(c);
  }

  std::vector<nlohmann::json> events;

 private:
  agent::GuestEnv env_;
  agent::StepSpec spec_;
  std::unique_ptr<agent::Step> step_;
};

inline std::string describe(const agent::StepOutcome& o) {
  std::string k = o.kind == agent::StepOutcome::Kind::ok       ? "ok"
                  : o.kind == agent::StepOutcome::Kind::failed ? "failed"
                                                               : "reboot_required";
  return k + ": " + o.message + (o.diagnosis ? " [" + o.diagnosis->code + "]" : "") +
         (o.output_tail.empty() ? "" : "\n--- output tail ---\n" + o.output_tail);
}

}  // namespace factory::testing
