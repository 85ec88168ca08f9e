#pragma once
// Shared by the gpu-k8s step tests: a simulated runbook tenant-2 guest
// (tests/guestsim, profile l4-k8s: a SIMULATION, see tests/guestsim/README.md)
// with the guest's PATH in this process's environment (steps run commands
// through the agent's own PATH: without it they would run this machine's
// kubectl and helm), and helpers that bring it to a given point by running
// the built-in catalog's own gpu-k8s steps.
#include <gtest/gtest.h>

#include <memory>

#include "tests/agent/step_harness.hpp"
#include "tests/guestsim/guest_sim.hpp"

namespace factory::testing {

class K8sGuest : public ::testing::Test {
 protected:
  // ready_delay: seconds from rke2-server's start to a Ready node (the
  // simulator's default is 1; most tests do not need to wait for it).
  void make(const std::string& ready_delay = "0") {
    sim_ = std::make_unique<GuestSim>(dir_.path(), GuestSim::Options{"l4-k8s", 0});
    path_ = std::make_unique<GuestSim::PathScope>(sim_->path());
    if (!ready_delay.empty()) sim_->set_knob("rke2_ready_delay", ready_delay);
  }
  void TearDown() override {
    path_.reset();
    sim_.reset();
  }

  StepHarness step(const std::string& id) {
    return StepHarness(sim_->env(), catalog_step("gpu-k8s", id));
  }
  StepHarness step(agent::StepSpec spec) { return StepHarness(sim_->env(), std::move(spec)); }

  // Runs a catalog step's apply and verify, which must succeed.
  void done(const std::string& id) {
    auto h = step(id);
    ASSERT_TRUE(h.ok());
    auto a = h.apply();
    ASSERT_TRUE(a.ok()) << id << ": " << describe(a);
    auto v = h.verify();
    ASSERT_TRUE(v.ok()) << id << ": " << describe(v);
  }

  // kubectl in the guest, as RKE2 ships it (not on PATH).
  CommandResult kubectl(std::vector<std::string> args) const {
    std::vector<std::string> argv = {(sim_->root() / "var/lib/rancher/rke2/bin/kubectl").string(),
                                     "--kubeconfig",
                                     (sim_->root() / "etc/rancher/rke2/rke2.yaml").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return sim_->sh(argv);
  }

  TempDir dir_{"k8s"};
  std::unique_ptr<GuestSim> sim_;
  std::unique_ptr<GuestSim::PathScope> path_;
};

inline bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

}  // namespace factory::testing
