#include "agent/steps/ollama_install.hpp"

#include <regex>
#include <thread>

#include "agent/diagnose/known.hpp"
#include "agent/steps/ollama_api.hpp"
#include "agent/steps/step_util.hpp"

namespace factory::agent::steps {

using namespace std::chrono_literals;

namespace {

struct InstallParams {
  std::string version;
  std::string install_url;
  std::string service;
};

// Single-quotes a value for sh.
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

class OllamaInstall final : public Step {
 public:
  explicit OllamaInstall(InstallParams p) : p_(std::move(p)) {}

  Result<bool> check(StepContext& ctx) override {
    if (cli_version(ctx) != p_.version) return false;
    OllamaApi api(ctx.env.ollama_url);
    auto v = api.version(time_left(ctx, 5s));
    return v && *v == p_.version;
  }

  StepOutcome apply(StepContext& ctx) override {
    if (cli_version(ctx) != p_.version) {
      emit_progress(ctx, {{"state", "progress"}, {"message", "installing Ollama " + p_.version}});
      // Download, then run: the runbook pipes curl into sh, which runs an
      // empty script (and "succeeds") when the download fails.
      std::string script =
          "set -e\n"
          "f=$(mktemp)\n"
          "trap 'rm -f \"$f\"' EXIT\n"
          "curl -fsSL " +
          sh_quote(p_.install_url) +
          " -o \"$f\"\n"
          "sh \"$f\"\n";
      CommandSpec spec = shell_command(script);
      spec.env["OLLAMA_VERSION"] = p_.version;
      spec.timeout = time_left(ctx, 15min);
      auto r = run_command(spec);
      if (!r)
        return StepOutcome::failure("cannot run the Ollama install script: " + r.error().message);
      if (!r->ok()) {
        std::string tail = r->tail(20);
        std::optional<Diagnosis> d;
        if (tail.find("curl: (") != std::string::npos)
          d = diagnoses::download_failed(p_.install_url, tail);
        return StepOutcome::failure("the Ollama install script " + r->describe(), tail, d);
      }
    }
    auto r = run_in_step(ctx, {"systemctl", "enable", "--now", p_.service}, 2min);
    if (!r) return StepOutcome::failure("systemctl: " + r.error().message);
    if (!r->ok())
      return StepOutcome::failure("systemctl enable --now " + p_.service + " " + r->describe(),
                                  r->tail(20));
    return StepOutcome::success("Ollama " + p_.version + " installed, " + p_.service + " enabled");
  }

  StepOutcome verify(StepContext& ctx) override {
    OllamaApi api(ctx.env.ollama_url);
    auto give_up = std::chrono::steady_clock::now() + time_left(ctx, 2min);
    std::string last_error;
    std::string found;
    while (true) {
      auto v = api.version(3s);
      if (v && *v == p_.version)
        return StepOutcome::success("Ollama " + *v + " answers at " + api.url());
      if (v)
        found = *v;
      else
        last_error = v.error().message;
      if (std::chrono::steady_clock::now() >= give_up) break;
      std::this_thread::sleep_for(250ms);
    }
    if (!found.empty()) {
      auto d = diagnoses::ollama_version_mismatch(p_.version, found);
      return StepOutcome::failure(d.summary, {}, d);
    }
    auto d = diagnoses::ollama_not_answering(api.url(), last_error);
    return StepOutcome::failure(d.summary, service_status(ctx), d);
  }

 private:
  std::string cli_version(StepContext& ctx) {
    auto r = run_in_step(ctx, {"ollama", "--version"}, 30s);
    if (!r) return "";
    return parse_ollama_cli_version(r->output);
  }

  // What systemd says about the service, for the failure's output tail.
  std::string service_status(StepContext& ctx) {
    auto r = run_in_step(ctx, {"systemctl", "status", "--no-pager", p_.service}, 10s);
    return r ? r->tail(15) : r.error().message;
  }

  InstallParams p_;
};

}  // namespace

std::string parse_ollama_cli_version(const std::string& output) {
  static const std::regex re(R"(version (?:is )?v?([0-9]+\.[0-9]+[0-9A-Za-z.+-]*))");
  std::string found;
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it)
    found = (*it)[1];  // the last one: the client's own version comes last
  return found;
}

Result<std::unique_ptr<Step>> make_ollama_install(const StepSpec& spec) {
  InstallParams p;
  auto v = string_param(spec.params, "version", spec.id);
  if (!v) return v.error();
  p.version = *v;
  auto url = string_param(spec.params, "install_url", spec.id, "https://ollama.com/install.sh");
  if (!url) return url.error();
  p.install_url = *url;
  auto svc = string_param(spec.params, "service", spec.id, "ollama");
  if (!svc) return svc.error();
  p.service = *svc;
  return std::unique_ptr<Step>(new OllamaInstall(std::move(p)));
}

}  // namespace factory::agent::steps
