#include "agent/steps/apt_packages.hpp"

#include "agent/diagnose/rules.hpp"
#include "agent/guest/facts.hpp"
#include "agent/steps/step_util.hpp"

namespace factory::agent::steps {

using namespace std::chrono_literals;

namespace {

struct Wanted {
  std::string name;
  std::string version;  // empty: any
  std::string arg() const { return version.empty() ? name : name + "=" + version; }
};

class AptPackages final : public Step {
 public:
  AptPackages(std::vector<Wanted> pkgs, bool update) : pkgs_(std::move(pkgs)), update_(update) {}

  Result<bool> check(StepContext&) override { return missing().empty(); }

  StepOutcome apply(StepContext& ctx) override {
    auto need = missing();
    if (need.empty()) return StepOutcome::success("already installed");
    const std::map<std::string, std::string> env = {{"DEBIAN_FRONTEND", "noninteractive"}};
    const std::vector<std::string> apt = {"apt-get", "-o", "DPkg::Lock::Timeout=600"};
    if (update_) {
      auto argv = apt;
      argv.push_back("update");
      if (auto out = run(ctx, argv, env); !out.ok()) return out;
    }
    auto argv = apt;
    argv.insert(argv.end(), {"install", "-y"});
    for (const auto& w : need) argv.push_back(w.arg());
    return run(ctx, argv, env);
  }

  StepOutcome verify(StepContext&) override {
    auto need = missing();
    if (need.empty()) return StepOutcome::success();
    std::string names;
    for (const auto& w : need) names += (names.empty() ? "" : ", ") + w.arg();
    return StepOutcome::failure("not installed after apt-get: " + names);
  }

 private:
  std::vector<Wanted> missing() const {
    std::vector<Wanted> out;
    for (const auto& w : pkgs_) {
      auto st = dpkg_package(w.name);
      if (!st.installed || (!w.version.empty() && st.version != w.version)) out.push_back(w);
    }
    return out;
  }

  StepOutcome run(StepContext& ctx, const std::vector<std::string>& argv,
                  const std::map<std::string, std::string>& env) {
    std::string cmd = command_line(argv);
    auto r = run_in_step(ctx, argv, 40min, env);
    if (!r) return StepOutcome::failure(cmd + ": " + r.error().message);
    if (r->ok()) return StepOutcome::success();
    auto kernel = run_in_step(ctx, {"uname", "-r"}, 10s);
    std::string kr =
        kernel && kernel->ok() ? kernel->output.substr(0, kernel->output.find('\n')) : "";
    auto d = diagnose_package_failure(cmd, r->output, kr);
    return StepOutcome::failure(cmd + " " + r->describe(), r->tail(20), d);
  }

  std::vector<Wanted> pkgs_;
  bool update_;
};

}  // namespace

Result<std::unique_ptr<Step>> make_apt_packages(const StepSpec& spec) {
  auto p = normalized_params("apt_packages", spec);
  if (!p) return p.error();
  std::vector<Wanted> pkgs;
  for (const auto& name : (*p)["packages"].get<std::vector<std::string>>()) {
    auto eq = name.find('=');
    pkgs.push_back(eq == std::string::npos ? Wanted{name, ""}
                                           : Wanted{name.substr(0, eq), name.substr(eq + 1)});
  }
  return std::unique_ptr<Step>(new AptPackages(std::move(pkgs), (*p)["update"].get<bool>()));
}

}  // namespace factory::agent::steps
