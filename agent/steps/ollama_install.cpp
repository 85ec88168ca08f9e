#include "agent/steps/ollama_install.hpp"

#include <regex>
#include <thread>

#include "agent/diagnose/known.hpp"
#include "agent/guest/ollama_api.hpp"
#include "agent/steps/step_util.hpp"

namespace factory::agent::steps {

using namespace std::chrono_literals;

namespace {

struct InstallParams {
  std::string version;
  std::string install_url;
  std::string service;
};

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
      auto out = run_install_script(ctx, "Ollama install script", p_.install_url, "sh",
                                    {{"OLLAMA_VERSION", p_.version}}, 15min);
      if (!out.ok()) return out;
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
    return StepOutcome::failure(d.summary, service_status(), d);
  }

 private:
  std::string cli_version(StepContext& ctx) {
    auto r = run_in_step(ctx, {"ollama", "--version"}, 30s);
    if (!r) return "";
    return parse_ollama_cli_version(r->output);
  }

  // What systemd says about the service, for the failure's output tail.
  // verify waits out the step's deadline first: a short, fixed allowance for
  // the look, not what is left of the deadline (100 ms, too little for
  // systemctl on a busy guest, and the tail came back empty).
  std::string service_status() const {
    CommandSpec spec;
    spec.argv = {"systemctl", "status", "--no-pager", p_.service};
    spec.timeout = 10s;
    auto r = run_command(spec);
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
  auto j = normalized_params("ollama_install", spec);
  if (!j) return j.error();
  InstallParams p;
  p.version = (*j)["version"].get<std::string>();
  p.install_url = (*j)["install_url"].get<std::string>();
  p.service = (*j)["service"].get<std::string>();
  return std::unique_ptr<Step>(new OllamaInstall(std::move(p)));
}

}  // namespace factory::agent::steps
