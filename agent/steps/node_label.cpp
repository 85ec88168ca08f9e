#include "agent/steps/node_label.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "agent/guest/cluster.hpp"
#include "agent/steps/step_util.hpp"

namespace factory::agent::steps {

using namespace std::chrono_literals;

namespace {

struct LabelParams {
  std::map<std::string, std::string> labels;
  std::vector<std::string> nodes;  // empty: all
  std::string kubeconfig;
};

class NodeLabel final : public Step {
 public:
  explicit NodeLabel(LabelParams p) : p_(std::move(p)) {}

  Result<bool> check(StepContext& ctx) override {
    auto missing = missing_labels(ctx);
    // No cluster to ask yet: not done (apply says why).
    if (!missing) return false;
    return missing->empty();
  }

  StepOutcome apply(StepContext& ctx) override {
    auto k = Kubectl::find(ctx.env, p_.kubeconfig);
    if (!k) return StepOutcome::failure(k.error().message);
    std::vector<std::string> args = {"label", "node"};
    if (p_.nodes.empty())
      args.push_back("--all");
    else
      args.insert(args.end(), p_.nodes.begin(), p_.nodes.end());
    for (const auto& [key, value] : p_.labels) args.push_back(key + "=" + value);
    args.push_back("--overwrite");
    auto r = k->run(args, time_left(ctx, 2min));
    if (!r) return StepOutcome::failure("kubectl: " + r.error().message);
    if (!r->ok()) {
      auto e = classify_kube_failure("kubectl " + command_line(args), *r);
      return StepOutcome::failure(e.message, r->tail(20));
    }
    return StepOutcome::success(r->tail(5));
  }

  StepOutcome verify(StepContext& ctx) override {
    auto missing = missing_labels(ctx);
    if (!missing) return StepOutcome::failure(missing.error().message);
    if (!missing->empty()) {
      std::string what;
      for (const auto& m : *missing) what += (what.empty() ? "" : "; ") + m;
      return StepOutcome::failure("nodes still without their labels: " + what);
    }
    std::string labels;
    for (const auto& [k, v] : p_.labels) labels += (labels.empty() ? "" : ",") + k + "=" + v;
    return StepOutcome::success(
        "labelled " + labels + " on " +
        (p_.nodes.empty() ? std::string("every node") : command_line(p_.nodes)));
  }

 private:
  // "node: label=value (has: other)" per targeted node lacking a label; an
  // error when the cluster cannot be asked.
  Result<std::vector<std::string>> missing_labels(const StepContext& ctx) const {
    auto k = Kubectl::find(ctx.env, p_.kubeconfig);
    if (!k) return k.error();
    auto nodes = k->nodes(time_left(ctx, 30s));
    if (!nodes) return nodes.error();
    std::vector<std::string> missing;
    std::vector<std::string> seen;
    for (const auto& n : *nodes) {
      if (!p_.nodes.empty() &&
          std::find(p_.nodes.begin(), p_.nodes.end(), n.name) == p_.nodes.end())
        continue;
      seen.push_back(n.name);
      for (const auto& [key, value] : p_.labels)
        if (!n.has_label(key, value))
          missing.push_back(
              n.name + ": " + key + "=" + value +
              (n.labels.count(key) ? " (has " + key + "=" + n.labels.at(key) + ")" : ""));
    }
    for (const auto& want : p_.nodes)
      if (std::find(seen.begin(), seen.end(), want) == seen.end())
        missing.push_back(want + ": no such node");
    if (seen.empty() && p_.nodes.empty()) missing.push_back("the cluster lists no node");
    return missing;
  }

  LabelParams p_;
};

}  // namespace

Result<std::unique_ptr<Step>> make_node_label(const StepSpec& spec) {
  auto j = normalized_params("node_label", spec);
  if (!j) return j.error();
  LabelParams p;
  p.labels = (*j)["labels"].get<std::map<std::string, std::string>>();
  // "all", or the names of the nodes to label.
  if ((*j)["nodes"].is_array()) p.nodes = (*j)["nodes"].get<std::vector<std::string>>();
  p.kubeconfig = (*j)["kubeconfig"].get<std::string>();
  return std::unique_ptr<Step>(new NodeLabel(std::move(p)));
}

}  // namespace factory::agent::steps
