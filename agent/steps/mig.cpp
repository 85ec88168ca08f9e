#include "agent/steps/mig.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "agent/diagnose/known.hpp"
#include "agent/guest/facts.hpp"
#include "agent/guest/mig.hpp"
#include "agent/steps/step_util.hpp"

namespace factory::agent::steps {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

struct MigParams {
  int gpu = 0;
  std::map<std::string, int> instances;  // profile -> count
  bool enabled = true;
  bool reboot = true;
};

// A command's output, or the one line saying why there is none.
struct Ran {
  bool ok = false;
  int exit_code = -1;
  std::string output;
  std::string error;  // set when !ok
};

std::string gib(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", v);
  return buf;
}

class Mig final : public Step {
 public:
  explicit Mig(MigParams p) : p_(std::move(p)), gpu_(std::to_string(p_.gpu)) {}

  Result<bool> check(StepContext& ctx) override {
    auto mode = query_mode(ctx);
    if (!mode) return false;
    if (!p_.enabled) return mode->current == false && mode->pending.value_or(false) == false;
    if (mode->current != true) return false;
    auto gis = list_gpu_instances(ctx);
    if (!gis || counts(*gis) != p_.instances) return false;
    auto devs = list_mig_devices(ctx);
    return devs && static_cast<int>(devs->size()) == wanted_total();
  }

  StepOutcome apply(StepContext& ctx) override { return p_.enabled ? enable(ctx) : disable(ctx); }

  StepOutcome verify(StepContext& ctx) override {
    auto mode = query_mode(ctx);
    if (!mode) return StepOutcome::failure(mode.error().message);
    if (!p_.enabled) {
      if (mode->current == false && mode->pending.value_or(false) == false)
        return StepOutcome::success("MIG disabled on GPU " + gpu_);
      return StepOutcome::failure("MIG is still enabled (or pending) on GPU " + gpu_);
    }
    if (mode->current != true)
      return StepOutcome::failure("MIG mode is not enabled on GPU " + gpu_);
    auto gis = list_gpu_instances(ctx);
    if (!gis) return StepOutcome::failure(gis.error().message);
    if (counts(*gis) != p_.instances)
      return StepOutcome::failure("GPU " + gpu_ + " has " + describe_counts(counts(*gis)) +
                                  ", the plan wants " + describe_counts(p_.instances));
    auto devs = list_mig_devices(ctx);
    if (!devs) return StepOutcome::failure(devs.error().message);
    if (static_cast<int>(devs->size()) != wanted_total())
      return StepOutcome::failure("nvidia-smi -L lists " + std::to_string(devs->size()) +
                                  " MIG device(s) on GPU " + gpu_ + ", expected " +
                                  std::to_string(wanted_total()) +
                                  " (a GPU instance without its compute instance?)");
    // Memory per profile, as -lgip gives it (it is the card's, not the plan's).
    std::map<std::string, double> memory;
    if (auto prof = list_profiles(ctx))
      for (const auto& x : *prof) memory[x.name] = x.memory_gib;
    std::string what;
    for (const auto& [name, n] : p_.instances) {
      what += (what.empty() ? "" : ", ") + std::to_string(n) + " x " + name;
      if (memory.count(name)) what += " (" + gib(memory[name]) + " each)";
    }
    std::string uuids;
    for (const auto& d : *devs) uuids += (uuids.empty() ? "" : " ") + d.uuid;
    return StepOutcome::success("GPU " + gpu_ + " in MIG mode: " + what + "; " + uuids);
  }

 private:
  int wanted_total() const {
    int n = 0;
    for (const auto& [_, c] : p_.instances) n += c;
    return n;
  }

  static std::map<std::string, int> counts(const std::vector<MigGpuInstance>& gis) {
    std::map<std::string, int> out;
    for (const auto& g : gis) ++out[g.profile];
    return out;
  }

  static std::string describe_counts(const std::map<std::string, int>& c) {
    if (c.empty()) return "no GPU instance";
    std::string s;
    for (const auto& [name, n] : c) s += (s.empty() ? "" : ", ") + std::to_string(n) + " x " + name;
    return s;
  }

  Ran smi(StepContext& ctx, std::vector<std::string> args) {
    args.insert(args.begin(), "nvidia-smi");
    std::string cmd = command_line(args);
    auto r = run_in_step(ctx, args, 2min);
    Ran out;
    if (!r) {
      out.error = cmd + ": " + r.error().message;
      return out;
    }
    out.exit_code = r->exit_code;
    out.output = r->output;
    out.ok = r->ok();
    if (!out.ok) out.error = cmd + " " + r->describe() + ": " + r->tail(3);
    return out;
  }

  Result<MigMode> query_mode(StepContext& ctx) {
    std::vector<std::string> args = {"-i", gpu_};
    for (auto& a : mig_mode_query_args()) args.push_back(a);
    auto r = smi(ctx, args);
    if (!r.ok) return Error(Errc::failed_precondition, r.error);
    auto modes = parse_mig_modes(r.output);
    if (!modes) return modes.error();
    for (const auto& m : *modes)
      if (m.gpu == p_.gpu) return m;
    return Error(Errc::not_found, "nvidia-smi does not list GPU " + gpu_);
  }

  Result<std::vector<MigProfile>> list_profiles(StepContext& ctx) {
    auto r = smi(ctx, {"mig", "-i", gpu_, "-lgip"});
    if (!r.ok) return Error(Errc::failed_precondition, r.error);
    return parse_mig_profiles(r.output);
  }

  Result<std::vector<MigGpuInstance>> list_gpu_instances(StepContext& ctx) {
    auto r = smi(ctx, {"mig", "-i", gpu_, "-lgi"});
    // With none, some drivers exit non-zero saying so: that is an empty list.
    if (!r.ok && r.output.find("No GPU instances found") == std::string::npos)
      return Error(Errc::failed_precondition, r.error);
    auto gis = parse_mig_gpu_instances(r.output);
    if (!gis) return gis.error();
    std::vector<MigGpuInstance> mine;
    for (auto& g : *gis)
      if (g.gpu == p_.gpu) mine.push_back(std::move(g));
    return mine;
  }

  Result<std::vector<MigDevice>> list_mig_devices(StepContext& ctx) {
    auto r = smi(ctx, {"-L"});
    if (!r.ok) return Error(Errc::failed_precondition, r.error);
    auto devs = parse_mig_devices(r.output);
    if (!devs) return devs.error();
    std::vector<MigDevice> mine;
    for (auto& d : *devs)
      if (d.gpu == p_.gpu) mine.push_back(std::move(d));
    return mine;
  }

  std::string gpu_name(StepContext& ctx) {
    auto r = smi(ctx, {"-i", gpu_, "--query-gpu=name", "--format=csv,noheader"});
    if (!r.ok) return {};
    std::string n = r.output.substr(0, r.output.find('\n'));
    return n.size() > 64 ? n.substr(0, 64) : n;
  }

  StepOutcome not_supported(StepContext& ctx, const std::string& detail) {
    auto d = diagnoses::mig_not_supported(p_.gpu, gpu_name(ctx), detail);
    return StepOutcome::failure(d.summary, {}, d);
  }

  // `nvidia-smi -i N -mig 0|1`; pending asks for one reboot, remembered by
  // boot id so a mode that stays pending is a diagnosis, not a reboot loop.
  StepOutcome set_mode(StepContext& ctx, bool on) {
    const std::string key = on ? "enable_boot_id" : "disable_boot_id";
    json state = load_step_state(ctx);
    const std::string now = boot_id(ctx.env);
    auto r = smi(ctx, {"-i", gpu_, "-mig", on ? "1" : "0"});
    if (!r.error.empty() && r.output.empty()) return StepOutcome::failure(r.error);
    auto change = parse_mig_mode_change(r.output, r.exit_code);
    switch (change.change) {
      case MigModeChange::done:
        return StepOutcome::success();
      case MigModeChange::refused:
        if (on && change.reason.find("Not Supported") != std::string::npos)
          return not_supported(ctx, change.reason);
        return StepOutcome::failure(std::string("nvidia-smi -i ") + gpu_ + " -mig " +
                                        (on ? "1" : "0") + " refused: " + change.reason,
                                    r.output);
      case MigModeChange::pending:
        break;
    }
    std::string asked = state.value(key, "");
    if (!asked.empty() && !now.empty() && asked != now) {
      auto d = diagnoses::mig_mode_still_pending(p_.gpu, change.reason);
      return StepOutcome::failure(d.summary, r.output, d);
    }
    if (!p_.reboot)
      return StepOutcome::failure("MIG mode on GPU " + gpu_ +
                                  " is pending until the GPU is reset or the guest reboots "
                                  "(reboot: false): " +
                                  change.reason);
    state[key] = now;
    if (auto st = save_step_state(ctx, state); !st)
      return StepOutcome::failure("cannot record the reboot in the agent's state: " +
                                  st.error().message);
    return StepOutcome::reboot(std::string("MIG mode ") + (on ? "enabled" : "disabled") +
                               " on GPU " + gpu_ + " is pending: the guest reboots to apply it (" +
                               change.reason + ")");
  }

  // -dci then -dgi: compute instances live inside GPU instances.
  StepOutcome destroy_instances(StepContext& ctx) {
    auto gis = list_gpu_instances(ctx);
    if (!gis) return StepOutcome::failure(gis.error().message);
    if (gis->empty()) return StepOutcome::success();
    emit_progress(ctx,
                  {{"state", "progress"},
                   {"message", "destroying " + describe_counts(counts(*gis)) + " on GPU " + gpu_}});
    auto ci = smi(ctx, {"mig", "-i", gpu_, "-dci"});
    if (!ci.ok && ci.output.find("No compute instances") == std::string::npos)
      return StepOutcome::failure(ci.error, ci.output);
    auto gi = smi(ctx, {"mig", "-i", gpu_, "-dgi"});
    if (!gi.ok) return StepOutcome::failure(gi.error, gi.output);
    return StepOutcome::success();
  }

  StepOutcome enable(StepContext& ctx) {
    auto mode = query_mode(ctx);
    if (!mode) return StepOutcome::failure(mode.error().message);
    if (!mode->current.has_value())
      return not_supported(ctx, "nvidia-smi reports mig.mode.current [N/A]");
    if (!*mode->current) {
      if (auto out = set_mode(ctx, true); !out.ok()) return out;
      auto again = query_mode(ctx);
      if (!again) return StepOutcome::failure(again.error().message);
      if (again->current != true)
        return StepOutcome::failure("nvidia-smi said MIG mode was enabled on GPU " + gpu_ +
                                    " but mig.mode.current still reads Disabled");
    }

    auto profiles = list_profiles(ctx);
    if (!profiles) return StepOutcome::failure(profiles.error().message);
    std::map<std::string, const MigProfile*> by_name;
    for (const auto& x : *profiles)
      if (x.gpu == p_.gpu) by_name[x.name] = &x;
    std::vector<std::pair<std::string, int>> wanted(p_.instances.begin(), p_.instances.end());
    for (const auto& [name, n] : wanted) {
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        std::string offered;
        for (const auto& [k, _] : by_name) offered += (offered.empty() ? "" : ", ") + k;
        return StepOutcome::failure("GPU " + gpu_ + " offers no MIG profile " + name +
                                    " (it offers: " + offered + ")");
      }
      if (n > it->second->total)
        return StepOutcome::failure("GPU " + gpu_ + " holds at most " +
                                    std::to_string(it->second->total) + " x " + name + ", the " +
                                    "plan wants " + std::to_string(n));
    }

    auto gis = list_gpu_instances(ctx);
    if (!gis) return StepOutcome::failure(gis.error().message);
    if (counts(*gis) != p_.instances) {
      if (auto out = destroy_instances(ctx); !out.ok()) return out;
      // Larger slices first: each must find an aligned placement, which
      // small ones created earlier could take.
      std::sort(wanted.begin(), wanted.end(), [](const auto& a, const auto& b) {
        return mig_profile_slices(a.first) > mig_profile_slices(b.first);
      });
      std::string ids;
      for (const auto& [name, n] : wanted)
        for (int i = 0; i < n; ++i)
          ids += (ids.empty() ? "" : ",") + std::to_string(by_name[name]->id);
      emit_progress(ctx, {{"state", "progress"},
                          {"message", "creating " + describe_counts(p_.instances) + " on GPU " +
                                          gpu_ + " (profile IDs " + ids + ")"}});
      auto r = smi(ctx, {"mig", "-i", gpu_, "-cgi", ids, "-C"});
      auto created = parse_mig_create(r.output);
      if (!r.ok || !created.failure.empty() ||
          static_cast<int>(created.gpu_instances.size()) != wanted_total())
        return StepOutcome::failure(
            "nvidia-smi mig -cgi " + ids + " -C on GPU " + gpu_ +
                " failed: " + (created.failure.empty() ? r.error : created.failure),
            r.output);
    }
    return verify(ctx);
  }

  StepOutcome disable(StepContext& ctx) {
    auto mode = query_mode(ctx);
    if (!mode) return StepOutcome::failure(mode.error().message);
    if (!mode->current.has_value()) return StepOutcome::success("GPU " + gpu_ + " has no MIG");
    if (*mode->current) {
      if (auto out = destroy_instances(ctx); !out.ok()) return out;
    }
    if (*mode->current || mode->pending.value_or(false))
      if (auto out = set_mode(ctx, false); !out.ok()) return out;
    return verify(ctx);
  }

  MigParams p_;
  std::string gpu_;
};

}  // namespace

Result<std::unique_ptr<Step>> make_mig(const StepSpec& spec) {
  auto j = normalized_params("mig", spec);
  if (!j) return j.error();
  MigParams p;
  p.gpu = static_cast<int>((*j)["gpu"].get<std::int64_t>());
  for (auto& [name, n] : (*j)["instances"].items())
    p.instances[name] = static_cast<int>(n.get<std::int64_t>());
  p.enabled = (*j)["enabled"].get<bool>();
  p.reboot = (*j)["reboot"].get<bool>();
  return std::unique_ptr<Step>(new Mig(std::move(p)));
}

}  // namespace factory::agent::steps
