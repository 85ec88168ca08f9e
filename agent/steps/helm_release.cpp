#include "agent/steps/helm_release.hpp"

#include <algorithm>
#include <thread>

#include "agent/diagnose/k8s.hpp"
#include "agent/diagnose/known.hpp"
#include "agent/guest/cluster.hpp"
#include "agent/guest/nvidia_smi.hpp"
#include "agent/steps/step_util.hpp"
#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/yaml_json.hpp"

namespace factory::agent::steps {

using namespace std::chrono_literals;
using nlohmann::json;

namespace {

struct HelmParams {
  std::string release;
  std::string chart;
  std::string repo_name;
  std::string repo_url;
  std::string version;
  std::string ns;
  bool create_namespace{};
  std::chrono::seconds wait_timeout{};
  std::string kubeconfig;
  std::string helm_version;      // v3.19.0
  std::string helm_sha256;       // of the tarball for this guest's architecture
  std::string helm_archive_url;  // {version} and {arch} filled in
  json values;
  std::string driver_version;  // "" none to check
};

struct ReleaseState {
  bool found = false;
  std::string status;         // deployed, failed, pending-install, ...
  std::string chart_version;  // chart.metadata.version
  json values = json::object();
  std::optional<Clock::time_point> last_deployed;
};

// The JSON document in helm's output: from the first line that starts one
// (helm may print warnings first, e.g. about a group-readable kubeconfig).
json json_document(const std::string& output) {
  size_t pos = 0;
  while (pos < output.size()) {
    char c = output[pos];
    if (c == '{' || c == '[' || output.compare(pos, 4, "null") == 0)
      return json::parse(output.substr(pos), nullptr, false);
    size_t nl = output.find('\n', pos);
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return json::value_t::discarded;
}

// Helm prints "Error: ..." last; that line is the reason.
std::string helm_error_line(const CommandResult& r) {
  std::string last;
  size_t pos = 0;
  while (pos < r.output.size()) {
    size_t nl = r.output.find('\n', pos);
    std::string line = r.output.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if (line.rfind("Error: ", 0) == 0) last = line.substr(7);
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return last;
}

// The version `helm version --short` prints ("v3.19.0+g3d8990f" -> "v3.19.0"),
// or "" when helm does not run: not installed.
std::string installed_helm_version(const StepContext& ctx) {
  auto r = run_in_step(ctx, {"helm", "version", "--short"}, std::chrono::seconds(30));
  if (!r || !r->ok()) return "";
  std::string v = r->output.substr(0, r->output.find_first_of("+\n \r"));
  return v.empty() ? "?" : v;
}

// The architecture the agent was built for is the guest's: it runs there.
constexpr const char* kGuestArch =
#if defined(__aarch64__)
    "arm64";
#else
    "amd64";
#endif

std::string fill(std::string url, const std::string& key, const std::string& value) {
  for (auto at = url.find(key); at != std::string::npos; at = url.find(key, at + value.size()))
    url.replace(at, key.size(), value);
  return url;
}

// Downloads Helm's release tarball, checks its sha256 against the catalog's
// BEFORE unpacking anything, and puts the one binary in place atomically (a
// half-written helm never sits on PATH). The checksum is the point: the
// installer script from Helm's branch fetched whatever version was newest and
// checked it against a sum from the same server.
StepOutcome install_pinned_helm(const StepContext& ctx, const HelmParams& p) {
  const std::string dir = ctx.env.path("/usr/local/bin").string();
  const std::string member = std::string("linux-") + kGuestArch + "/helm";
  std::string script =
      "set -e\n"
      "d=$(mktemp -d)\n"
      "trap 'rm -rf \"$d\"' EXIT\n"
      "curl -fsSL --retry 3 " +
      sh_quote(p.helm_archive_url) +
      " -o \"$d/helm.tar.gz\"\n"
      "got=$(sha256sum \"$d/helm.tar.gz\" | cut -d' ' -f1)\n"
      "if [ \"$got\" != " +
      sh_quote(p.helm_sha256) +
      " ]; then echo \"factory: sha256 mismatch: got $got\" >&2; exit 65; fi\n"
      "tar -xzf \"$d/helm.tar.gz\" -C \"$d\" " +
      sh_quote(member) +
      "\n"
      "mkdir -p " +
      sh_quote(dir) +
      "\n"
      "cp \"$d/\"" +
      sh_quote(member) + " " + sh_quote(dir + "/.helm.new") +
      "\n"
      "chmod 0755 " +
      sh_quote(dir + "/.helm.new") +
      "\n"
      "mv -f " +
      sh_quote(dir + "/.helm.new") + " " + sh_quote(dir + "/helm") + "\n";
  CommandSpec spec = shell_command(script);
  spec.timeout = time_left(ctx, std::chrono::minutes(10));
  auto r = run_command(spec);
  if (!r) return StepOutcome::failure("cannot run the Helm install: " + r.error().message);
  if (r->ok()) return StepOutcome::success();
  std::string tail = r->tail(20);
  const std::string marker = "factory: sha256 mismatch: got ";
  if (auto at = tail.find(marker); at != std::string::npos) {
    std::string got = tail.substr(at + marker.size(), 64);
    auto d = diagnoses::checksum_mismatch(p.helm_archive_url, p.helm_sha256, got);
    return StepOutcome::failure(d.summary, tail, d);
  }
  std::optional<Diagnosis> d;
  if (tail.find("curl: (") != std::string::npos)
    d = diagnoses::download_failed(p.helm_archive_url, tail);
  return StepOutcome::failure("installing Helm " + p.helm_version + " " + r->describe(), tail, d);
}

// Whether a helm process runs in the guest (<root>/proc/<pid>/comm). An
// unreadable /proc counts as "maybe": the caller then waits.
bool helm_process_running(const GuestEnv& env) {
  std::error_code ec;
  std::filesystem::directory_iterator it(env.path("/proc"), ec), end;
  if (ec) return true;
  for (; it != end; it.increment(ec)) {
    if (ec) return true;
    const auto name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto comm = read_file(it->path() / "comm");
    if (comm && (*comm == "helm\n" || *comm == "helm")) return true;
  }
  return false;
}

class HelmRelease final : public Step {
 public:
  explicit HelmRelease(HelmParams p) : p_(std::move(p)) {}

  Result<bool> check(StepContext& ctx) override {
    if (!same_chart_version(installed_helm_version(ctx), p_.helm_version)) return false;
    auto st = release_state(ctx);
    // The API not answering is "not done" here; apply says why.
    if (!st) return false;
    return in_place(*st);
  }

  StepOutcome apply(StepContext& ctx) override {
    if (auto have = installed_helm_version(ctx); !same_chart_version(have, p_.helm_version)) {
      emit_progress(ctx, {{"state", "progress"},
                          {"message", "installing Helm " + p_.helm_version +
                                          (have.empty() ? "" : " (the guest has " + have + ")")}});
      auto out = install_pinned_helm(ctx, p_);
      if (!out.ok()) return out;
      if (auto now = installed_helm_version(ctx); !same_chart_version(now, p_.helm_version))
        return StepOutcome::failure(
            "Helm " + p_.helm_version + " was put in /usr/local/bin but " +
            (now.empty() ? "`helm version` does not run"
                         : "`helm version` says " + now + " (another helm comes first on PATH?)"));
    }
    std::error_code ec;
    if (!std::filesystem::exists(ctx.env.path(p_.kubeconfig), ec))
      return StepOutcome::failure("the guest cluster's kubeconfig " +
                                  ctx.env.path(p_.kubeconfig).string() +
                                  " does not exist: RKE2 is not running yet (step kind rke2)");

    for (auto args :
         {std::vector<std::string>{"repo", "add", p_.repo_name, p_.repo_url, "--force-update"},
          std::vector<std::string>{"repo", "update", p_.repo_name}}) {
      auto r = helm(ctx, args, 5min);
      if (!r) return StepOutcome::failure("helm: " + r.error().message);
      if (!r->ok())
        return StepOutcome::failure(
            "helm " + command_line(args) + " " + r->describe() +
                (helm_error_line(*r).empty() ? "" : ": " + helm_error_line(*r)),
            r->tail(20));
    }

    auto st = release_state(ctx);
    if (!st) return StepOutcome::failure(st.error().message);
    if (st->status.rfind("pending-", 0) == 0) {
      auto out = recover_pending(ctx, *st);
      if (!out.ok()) return out;
      st = release_state(ctx);
      if (!st) return StepOutcome::failure(st.error().message);
    }
    // The helm an interrupted agent started may have finished the job.
    if (in_place(*st))
      return StepOutcome::success("release " + p_.release + " already deployed: " + p_.chart + " " +
                                  p_.version);

    auto dir = ctx.env.state_dir / "helm";
    if (auto s = ensure_dir(dir, 0700); !s) return StepOutcome::failure(s.error().message);
    auto values_file = dir / (p_.release + ".values.yaml");
    std::string values_text = p_.values.empty() ? "{}\n" : to_yaml(p_.values);
    // Values may carry credentials (a registry secret): 0600, never logged.
    if (auto s = write_file_atomic(values_file, values_text, 0600); !s)
      return StepOutcome::failure("cannot write " + values_file.string() + ": " +
                                  s.error().message);

    // Helm's own --timeout ends before the step's, so Helm reports what it
    // was waiting for instead of being killed mid-wait.
    auto left = std::chrono::duration_cast<std::chrono::seconds>(ctx.remaining()) - 30s;
    auto helm_timeout = std::max(std::min(p_.wait_timeout, left), std::chrono::seconds(10));
    std::vector<std::string> args = {
        "upgrade",   "--install", p_.release,    p_.repo_name + "/" + p_.chart,
        "--version", p_.version,  "--namespace", p_.ns};
    if (p_.create_namespace) args.push_back("--create-namespace");
    args.insert(args.end(), {"-f", values_file.string(), "--wait", "--timeout",
                             std::to_string(helm_timeout.count()) + "s"});
    emit_progress(ctx, {{"state", "progress"},
                        {"message", "helm upgrade --install " + p_.release + " " + p_.repo_name +
                                        "/" + p_.chart + " " + p_.version + " (waiting up to " +
                                        format_duration(helm_timeout) + ")"}});
    auto r = helm(ctx, args, helm_timeout + 60s);
    if (!r) return StepOutcome::failure("helm: " + r.error().message);
    if (!r->ok())
      return failed(ctx, helm_error_line(*r).empty() ? r->describe() : helm_error_line(*r),
                    r->tail(20));
    return StepOutcome::success("release " + p_.release + " deployed: " + p_.chart + " " +
                                p_.version);
  }

  StepOutcome verify(StepContext& ctx) override {
    auto st = release_state(ctx);
    if (!st) return StepOutcome::failure(st.error().message);
    if (in_place(*st)) {
      std::string msg = "release " + p_.release + " in " + p_.ns + ": " + st->status + ", chart " +
                        p_.chart + " " + st->chart_version;
      if (!p_.driver_version.empty()) {
        auto d = wait_driver(ctx);
        if (!d.ok()) return d;
        msg += "; " + d.message;
      }
      return StepOutcome::success(msg);
    }
    if (!st->found) return failed(ctx, "release: not found", "");
    if (st->status != "deployed") return failed(ctx, "", "");
    if (!same_chart_version(st->chart_version, p_.version))
      return StepOutcome::failure("release " + p_.release + " runs chart version " +
                                  st->chart_version + ", not " + p_.version);
    return StepOutcome::failure("release " + p_.release +
                                "'s values (helm get values) differ from the plan's");
  }

 private:
  // The chart's driver container, through its root as the host sees it
  // (/run/nvidia/driver: the runbook's `chroot /run/nvidia/driver
  // nvidia-smi`): its nvidia-smi must report the pinned driver. The
  // container takes minutes to build and load the module: waited for.
  StepOutcome wait_driver(StepContext& ctx) const {
    const std::string root = ctx.env.path("/run/nvidia/driver").string();
    auto give_up = std::min(ctx.deadline, std::chrono::steady_clock::now() + 10min);
    std::string last;
    ProgressLimiter limiter(30s);
    while (true) {
      auto smi = query_nvidia_smi({"chroot", root}, time_left(ctx, 60s));
      if (smi && smi->driver_version == p_.driver_version && !smi->gpus.empty())
        return StepOutcome::success("driver " + p_.driver_version +
                                    " in the driver container (nvidia-smi)");
      last = smi ? "nvidia-smi in " + root + " reports driver " + smi->driver_version
                 : "nvidia-smi in " + root + ": " + smi.error().message;
      if (limiter.due())
        emit_progress(ctx, {{"state", "progress"},
                            {"message", "waiting for the driver container's driver " +
                                            p_.driver_version + ": " + last}});
      if (std::chrono::steady_clock::now() + 2s >= give_up)
        return StepOutcome::failure("the GPU Operator's driver is not the pinned " +
                                    p_.driver_version + ": " + last);
      std::this_thread::sleep_for(2s);
    }
  }

  bool in_place(const ReleaseState& st) const {
    return st.found && st.status == "deployed" &&
           same_chart_version(st.chart_version, p_.version) && st.values == p_.values;
  }

  Result<CommandResult> helm(const StepContext& ctx, std::vector<std::string> args,
                             std::chrono::milliseconds cap) const {
    CommandSpec spec;
    spec.argv = {"helm"};
    for (auto& a : args) spec.argv.push_back(std::move(a));
    spec.argv.insert(spec.argv.end(), {"--kubeconfig", ctx.env.path(p_.kubeconfig).string()});
    spec.env = {{"KUBECONFIG", ctx.env.path(p_.kubeconfig).string()}};
    spec.timeout = time_left(ctx, cap);
    return run_command(spec);
  }

  Result<ReleaseState> release_state(const StepContext& ctx) const {
    ReleaseState st;
    auto r = helm(ctx, {"status", p_.release, "--namespace", p_.ns, "-o", "json"}, 1min);
    if (!r) return r.error();
    if (!r->ok()) {
      if (r->output.find("release: not found") != std::string::npos) return st;
      return classify_kube_failure("helm status", *r);
    }
    auto j = json_document(r->output);
    if (!j.is_object())
      return Error(Errc::protocol, "helm status printed JSON that does not parse");
    st.found = true;
    const json& info = j.value("info", json::object());
    st.status = info.value("status", "");
    if (auto t = parse_rfc3339(info.value("last_deployed", ""))) st.last_deployed = *t;
    st.chart_version =
        j.value("chart", json::object()).value("metadata", json::object()).value("version", "");

    auto v = helm(ctx, {"get", "values", p_.release, "--namespace", p_.ns, "-o", "json"}, 1min);
    if (!v) return v.error();
    if (!v->ok()) return classify_kube_failure("helm get values", *v);
    auto vj = json_document(v->output);
    if (vj.is_discarded())
      return Error(Errc::protocol, "helm get values printed JSON that does not parse");
    st.values = vj.is_null() ? json::object() : vj;
    return st;
  }

  // A release an interrupted helm left pending-*: helm refuses to touch it.
  // While a helm process runs in the guest and could still be the one that
  // left it (its --timeout from the release's last_deployed), wait; once no
  // helm runs, or that time is over, nothing will finish it.
  StepOutcome recover_pending(StepContext& ctx, ReleaseState st) {
    auto started = st.last_deployed.value_or(Clock::now());
    auto safe_after = started + p_.wait_timeout + 1min;
    while (st.status.rfind("pending-", 0) == 0 && Clock::now() < safe_after &&
           helm_process_running(ctx.env)) {
      if (ctx.remaining() < 60s) {
        auto d = diagnoses::helm_operation_in_progress(p_.release, p_.ns, st.status);
        return StepOutcome::failure(d.summary, {}, d);
      }
      emit_progress(ctx, {{"state", "progress"},
                          {"message", "release " + p_.release + " is " + st.status +
                                          ": waiting for the helm that started it"}});
      std::this_thread::sleep_for(5s);
      auto again = release_state(ctx);
      if (!again) return StepOutcome::failure(again.error().message);
      st = *again;
    }
    if (st.status.rfind("pending-", 0) != 0) return StepOutcome::success();
    // Nothing was ever deployed under a pending-install: start over. A
    // pending upgrade goes back to the last deployed revision.
    std::vector<std::string> args =
        st.status == "pending-install"
            ? std::vector<std::string>{"uninstall", p_.release, "--namespace", p_.ns}
            : std::vector<std::string>{"rollback", p_.release, "--namespace", p_.ns};
    emit_progress(ctx, {{"state", "progress"},
                        {"message", "release " + p_.release + " was left " + st.status +
                                        " by an interrupted helm: helm " + args[0]}});
    auto r = helm(ctx, args, 5min);
    if (!r) return StepOutcome::failure("helm: " + r.error().message);
    if (!r->ok()) {
      auto d = diagnoses::helm_operation_in_progress(p_.release, p_.ns, st.status);
      return StepOutcome::failure(d.summary, r->tail(20), d);
    }
    return StepOutcome::success();
  }

  StepOutcome failed(const StepContext& ctx, const std::string& error, std::string tail) const {
    std::string status;
    if (auto st = release_state(ctx); st && st->found) status = st->status;
    json not_ready = json::array();
    if (auto k = Kubectl::find(ctx.env, p_.kubeconfig)) {
      if (auto pods = k->pods(15s, p_.ns))
        for (const auto& p : *pods)
          if (!p.running() && p.status != "Completed") {
            not_ready.push_back(p.to_json());
            tail += "\n" + p.ns + "/" + p.name + " " + p.status +
                    (p.message.empty() ? "" : ": " + p.message);
          }
    }
    auto d = diagnoses::helm_release_failed(p_.release, p_.ns, status, error, not_ready);
    return StepOutcome::failure(d.summary, tail, d);
  }

  HelmParams p_;
};

}  // namespace

bool same_chart_version(const std::string& a, const std::string& b) {
  auto strip = [](const std::string& s) {
    return !s.empty() && (s[0] == 'v' || s[0] == 'V') ? s.substr(1) : s;
  };
  return !a.empty() && strip(a) == strip(b);
}

Result<std::unique_ptr<Step>> make_helm_release(const StepSpec& spec) {
  auto j = normalized_params("helm_release", spec);
  if (!j) return j.error();
  HelmParams p;
  for (auto [key, field] : {std::pair<const char*, std::string*>{"release", &p.release},
                            {"chart", &p.chart},
                            {"repo_name", &p.repo_name},
                            {"repo_url", &p.repo_url},
                            {"version", &p.version},
                            {"namespace", &p.ns},
                            {"kubeconfig", &p.kubeconfig},
                            {"helm_version", &p.helm_version}})
    *field = (*j)[key].get<std::string>();
  const json& sums = (*j)["helm_sha256"];
  if (!sums.contains(kGuestArch))
    return Error(Errc::invalid_argument, "step '" + spec.id + "': params.helm_sha256 has no " +
                                             kGuestArch + " checksum, the guest's architecture");
  p.helm_sha256 = sums[kGuestArch].get<std::string>();
  p.helm_archive_url =
      fill(fill((*j)["helm_archive_url"].get<std::string>(), "{version}", p.helm_version), "{arch}",
           kGuestArch);
  p.create_namespace = (*j)["create_namespace"].get<bool>();
  // The schema checked that it parses.
  p.wait_timeout = *parse_duration((*j)["wait_timeout"].get<std::string>());
  p.values = (*j)["values"];
  if (j->contains("driver_version")) p.driver_version = (*j)["driver_version"].get<std::string>();
  return std::unique_ptr<Step>(new HelmRelease(std::move(p)));
}

}  // namespace factory::agent::steps
