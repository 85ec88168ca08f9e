#include "agent/steps/wait_allocatable.hpp"

#include <thread>

#include "agent/diagnose/k8s.hpp"
#include "agent/guest/cluster.hpp"
#include "agent/steps/step_util.hpp"

namespace factory::agent::steps {

using namespace std::chrono_literals;

namespace {

struct AllocParams {
  std::string resource;
  long long count{};
  std::string kubeconfig;
};

struct Look {
  long long found = 0;
  std::vector<KubeNode> nodes;
};

class WaitAllocatable final : public Step {
 public:
  explicit WaitAllocatable(AllocParams p) : p_(std::move(p)) {}

  Result<bool> check(StepContext& ctx) override {
    auto l = look(ctx);
    if (!l) return false;
    return l->found >= p_.count;
  }

  StepOutcome apply(StepContext& ctx) override {
    long long last = -1;
    std::string last_error;
    // Leave a moment before the deadline to gather the diagnosis.
    auto give_up = ctx.deadline - std::min<std::chrono::milliseconds>(10s, ctx.remaining() / 4);
    while (true) {
      auto l = look(ctx);
      if (l) {
        if (l->found >= p_.count) return success(*l);
        if (l->found != last) {
          emit_progress(
              ctx, {{"state", "progress"},
                    {"message", p_.resource + " allocatable: " + std::to_string(l->found) + " of " +
                                    std::to_string(p_.count)},
                    {"allocatable", l->found},
                    {"expected", p_.count}});
          last = l->found;
        }
        last_error.clear();
      } else if (l.error().message != last_error) {
        last_error = l.error().message;
        emit_progress(ctx, {{"state", "progress"},
                            {"message", "waiting for the guest cluster: " + last_error}});
      }
      if (std::chrono::steady_clock::now() + 2s >= give_up) break;
      std::this_thread::sleep_for(2s);
    }
    return shortfall(ctx, last_error);
  }

  StepOutcome verify(StepContext& ctx) override {
    auto l = look(ctx);
    if (!l) return StepOutcome::failure(l.error().message);
    if (l->found >= p_.count) return success(*l);
    return shortfall(ctx, "");
  }

 private:
  Result<Look> look(const StepContext& ctx) const {
    auto k = Kubectl::find(ctx.env, p_.kubeconfig);
    if (!k) return k.error();
    auto nodes = k->nodes(time_left(ctx, 30s));
    if (!nodes) return nodes.error();
    Look l;
    l.nodes = *nodes;
    for (const auto& n : l.nodes) {
      if (!n.ready) continue;
      auto it = n.allocatable.find(p_.resource);
      if (it != n.allocatable.end()) l.found += parse_quantity_count(it->second).value_or(0);
    }
    return l;
  }

  StepOutcome success(const Look& l) const {
    std::string per_node;
    for (const auto& n : l.nodes)
      if (n.allocatable.count(p_.resource))
        per_node += (per_node.empty() ? "" : ", ") + n.name + " " + n.allocatable.at(p_.resource);
    return StepOutcome::success(std::to_string(l.found) + " " + p_.resource + " allocatable (" +
                                per_node + ")");
  }

  StepOutcome shortfall(const StepContext& ctx, const std::string& api_error) const {
    auto k = Kubectl::find(ctx.env, p_.kubeconfig);
    if (!k) return StepOutcome::failure(k.error().message);
    // The deadline may have passed: fixed, short allowances for the look.
    auto nodes = k->nodes(15s);
    if (!nodes)
      return StepOutcome::failure("the guest cluster does not answer: " +
                                  (api_error.empty() ? nodes.error().message : api_error));
    AllocatableObservations o;
    o.resource = p_.resource;
    o.count = p_.count;
    o.nodes = *nodes;
    for (const auto& n : o.nodes)
      if (n.ready && n.allocatable.count(p_.resource))
        o.found += parse_quantity_count(n.allocatable.at(p_.resource)).value_or(0);
    std::string tail;
    if (auto pods = k->pods(15s)) {
      o.pods = *pods;
      for (const auto& p : o.pods)
        if (is_hami_pod(p) || is_nvidia_device_plugin(p) || p.phase == "Pending")
          tail += p.ns + "/" + p.name + " " + p.status +
                  (p.message.empty() ? "" : ": " + p.message) + "\n";
    }
    auto d = diagnose_allocatable(o);
    return StepOutcome::failure(d.summary, tail, d);
  }

  AllocParams p_;
};

}  // namespace

Result<std::unique_ptr<Step>> make_wait_allocatable(const StepSpec& spec) {
  auto j = normalized_params("wait_allocatable", spec);
  if (!j) return j.error();
  AllocParams p;
  p.resource = (*j)["resource"].get<std::string>();
  p.count = (*j)["count"].get<long long>();
  p.kubeconfig = (*j)["kubeconfig"].get<std::string>();
  return std::unique_ptr<Step>(new WaitAllocatable(std::move(p)));
}

}  // namespace factory::agent::steps
