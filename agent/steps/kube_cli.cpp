#include "agent/steps/kube_cli.hpp"

#include <unistd.h>

#include <algorithm>

#include "agent/diagnose/known.hpp"

namespace factory::agent::steps {

using nlohmann::json;

Result<Kubectl> Kubectl::find(const GuestEnv& env, const std::string& kubeconfig,
                              const std::string& bin_dir) {
  Kubectl k;
  k.kubeconfig_ = env.path(kubeconfig);
  // RKE2's own first: it matches the cluster's version (kubectl supports
  // one minor version of skew), whatever else the guest has on PATH.
  auto own = env.path(bin_dir) / "kubectl";
  if (::access(own.c_str(), X_OK) == 0)
    k.binary_ = own.string();
  else
    k.binary_ = which("kubectl");
  if (k.binary_.empty())
    return Error(Errc::not_found, "kubectl is neither on PATH nor in " +
                                      env.path(bin_dir).string() +
                                      " (RKE2 puts it there when rke2-server starts)");
  return k;
}

Result<CommandResult> Kubectl::run(std::vector<std::string> args,
                                   std::chrono::milliseconds timeout) const {
  std::error_code ec;
  if (!std::filesystem::exists(kubeconfig_, ec))
    return Error(Errc::not_found, "the guest cluster's kubeconfig " + kubeconfig_.string() +
                                      " does not exist (RKE2 writes it when rke2-server starts)");
  CommandSpec spec;
  spec.argv = {binary_, "--kubeconfig", kubeconfig_.string()};
  for (auto& a : args) spec.argv.push_back(std::move(a));
  spec.timeout = timeout;
  return run_command(spec);
}

Error classify_kube_failure(const std::string& tool, const CommandResult& r) {
  std::string last = r.tail(1);
  while (!last.empty() && (last.back() == '\n' || last.back() == ' ')) last.pop_back();
  std::string msg = tool + " " + r.describe() + (last.empty() ? "" : ": " + last);
  if (r.timed_out) return Error(Errc::unavailable, msg);
  if (r.exit_code == 127) return Error(Errc::not_found, msg);  // the shell's "command not found"
  const std::string& o = r.output;
  if (o.find("no such file or directory") != std::string::npos &&
      (o.find("stat ") != std::string::npos || o.find("kubeconfig") != std::string::npos))
    return Error(Errc::not_found, msg);
  if (o.find("connection refused") != std::string::npos ||
      o.find("was refused") != std::string::npos ||
      o.find("cluster unreachable") != std::string::npos ||
      o.find("Unable to connect to the server") != std::string::npos ||
      o.find("i/o timeout") != std::string::npos)
    return Error(Errc::unavailable, msg);
  return Error(Errc::failed_precondition, msg);
}

Result<json> Kubectl::get_json(std::vector<std::string> args,
                               std::chrono::milliseconds timeout) const {
  args.push_back("-o");
  args.push_back("json");
  auto r = run(args, timeout);
  if (!r) return r.error();
  if (!r->ok()) return classify_kube_failure("kubectl", *r);
  // kubectl may print warnings on stderr before the document (the output is
  // interleaved): parse from the first '{'.
  auto start = r->output.find('{');
  if (start == std::string::npos)
    return Error(Errc::protocol, "kubectl printed no JSON: " + r->tail(2));
  auto j = json::parse(r->output.substr(start), nullptr, false);
  if (j.is_discarded()) return Error(Errc::protocol, "kubectl printed JSON that does not parse");
  return j;
}

Result<std::vector<KubeNode>> Kubectl::nodes(std::chrono::milliseconds timeout) const {
  auto j = get_json({"get", "nodes"}, timeout);
  if (!j) return j.error();
  return parse_node_list(*j);
}

Result<std::vector<KubePod>> Kubectl::pods(std::chrono::milliseconds timeout,
                                           const std::string& ns) const {
  std::vector<std::string> args = {"get", "pods"};
  if (ns.empty())
    args.push_back("-A");
  else
    args.insert(args.end(), {"-n", ns});
  auto j = get_json(args, timeout);
  if (!j) return j.error();
  return parse_pod_list(*j);
}

bool helm_installed(const StepContext& ctx) {
  CommandSpec spec;
  spec.argv = {"helm", "version", "--short"};
  auto left = ctx.remaining();
  spec.timeout = std::max(std::min<std::chrono::milliseconds>(left, std::chrono::seconds(30)),
                          std::chrono::milliseconds(100));
  auto r = run_command(spec);
  return r && r->ok();
}

std::map<std::string, std::string> helm_env(const GuestEnv& env, const std::string& kubeconfig) {
  return {{"KUBECONFIG", env.path(kubeconfig).string()}};
}

std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

StepOutcome run_install_script(const StepContext& ctx, const std::string& what,
                               const std::string& url, const std::string& interpreter,
                               std::map<std::string, std::string> env,
                               std::chrono::milliseconds cap) {
  std::string script =
      "set -e\n"
      "f=$(mktemp)\n"
      "trap 'rm -f \"$f\"' EXIT\n"
      "curl -fsSL " +
      sh_quote(url) + " -o \"$f\"\n" + interpreter + " \"$f\"\n";
  CommandSpec spec = shell_command(script);
  spec.env = std::move(env);
  auto left = ctx.remaining();
  spec.timeout =
      left < cap ? (left > std::chrono::milliseconds(100) ? left : std::chrono::milliseconds(100))
                 : cap;
  auto r = run_command(spec);
  if (!r) return StepOutcome::failure("cannot run the " + what + ": " + r.error().message);
  if (!r->ok()) {
    std::string tail = r->tail(20);
    std::optional<Diagnosis> d;
    if (tail.find("curl: (") != std::string::npos) d = diagnoses::download_failed(url, tail);
    return StepOutcome::failure("the " + what + " " + r->describe(), tail, d);
  }
  return StepOutcome::success(r->tail(5));
}

}  // namespace factory::agent::steps
