#include "agent/steps/ollama_model.hpp"

#include <algorithm>

#include "agent/diagnose/known.hpp"
#include "agent/diagnose/rules.hpp"
#include "agent/guest/ollama_api.hpp"
#include "agent/steps/step_util.hpp"

namespace factory::agent::steps {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr auto kProgressInterval = 500ms;  // at most 2 progress events a second
constexpr const char* kKeepAlive = "10m";

class OllamaModelStep final : public Step {
 public:
  OllamaModelStep(std::string model, bool require_full_gpu)
      : model_(std::move(model)), require_full_gpu_(require_full_gpu) {}

  Result<bool> check(StepContext& ctx) override {
    OllamaApi api(ctx.env.ollama_url);
    auto tags = api.tags(time_left(ctx, 10s));
    if (!tags) return tags.error().with_context("ollama");
    return listed(*tags);
  }

  StepOutcome apply(StepContext& ctx) override {
    OllamaApi api(ctx.env.ollama_url);
    ProgressLimiter limiter(kProgressInterval);
    PullProgress sum;
    std::string tail;  // the last status lines, for a failure report
    std::string last_status;
    int last_percent = -1;
    auto on_event = [&](const PullEvent& e) {
      sum.add(e);
      if (!e.status.empty() && e.status != last_status) {
        tail += e.status + "\n";
        last_status = e.status;
      }
      // Ollama announces layers as it gets to them, so the summed total
      // grows and the raw ratio can step back; the user sees it only grow,
      // and 100 only once Ollama says "success".
      bool final = e.status == "success";
      int pct = final ? 100 : std::min(99, std::max(std::max(last_percent, 0), sum.percent()));
      if ((pct != last_percent || final) && limiter.due(final)) {
        last_percent = pct;
        emit_progress(ctx, {{"state", "progress"},
                            {"percent", pct},
                            {"completed", sum.completed()},
                            {"total", sum.total()},
                            {"message", "pulling " + model_ + ": " + e.status}});
      }
    };
    PullFailure failure;
    // The idle timeout bounds each wait for the next progress line; the
    // download as a whole is bounded by the step's deadline.
    auto st = api.pull(model_, on_event, time_left(ctx, 2min), &failure);
    if (st) return StepOutcome::success("pulled " + model_);

    // No HTTP answer at all: the service is not there.
    if (failure.http_status == 0) return not_answering(api, st.error().message);
    // The server said why ({"error": ...} or an HTTP error): an unknown name,
    // or a registry problem mid-download.
    if (!failure.interrupted) {
      auto d =
          diagnose_pull_failure(model_, failure.http_status, failure.server_error, failure.percent);
      return StepOutcome::failure("pull " + model_ + ": " + d.summary, last_lines(tail, 10), d);
    }
    auto d = diagnoses::model_download_interrupted(model_, failure.percent, failure.server_error);
    return StepOutcome::failure(d.summary, last_lines(tail, 10), d);
  }

  StepOutcome verify(StepContext& ctx) override {
    OllamaApi api(ctx.env.ollama_url);
    auto tags = api.tags(time_left(ctx, 10s));
    if (!tags) return not_answering(api, tags.error().message);
    if (!listed(*tags))
      return StepOutcome::failure(model_ + " is not in Ollama's model list after the pull");

    emit_progress(ctx, {{"state", "progress"}, {"message", "loading " + model_}});
    if (auto st = api.load(model_, kKeepAlive, time_left(ctx, 10min)); !st) {
      if (st.error().code == Errc::not_found) {
        auto d = diagnoses::model_not_found(model_, st.error().message);
        return StepOutcome::failure(d.summary, {}, d);
      }
      if (st.error().code == Errc::unavailable || st.error().code == Errc::timeout)
        return not_answering(api, st.error().message);
      return StepOutcome::failure(st.error().message);
    }

    auto ps = api.ps(time_left(ctx, 10s));
    if (!ps) return not_answering(api, ps.error().message);
    auto it = std::find_if(ps->begin(), ps->end(),
                           [&](const OllamaRunningModel& m) { return same_model(m.name, model_); });
    if (it == ps->end())
      return StepOutcome::failure(
          model_ + " was loaded but GET /api/ps does not list it (unloaded at once?)");
    std::string where =
        diagnoses::human_bytes(it->size) + ", " + std::to_string(it->gpu_percent()) + "% GPU";
    if (auto d = diagnose_model_placement(model_, it->size, it->size_vram)) {
      if (require_full_gpu_) return StepOutcome::failure(d->summary, {}, *d);
      return StepOutcome::success(model_ + " loaded (" + where + "; " + d->summary + ")");
    }
    return StepOutcome::success(model_ + " loaded: " + where);
  }

 private:
  bool listed(const std::vector<OllamaModel>& tags) const {
    return std::any_of(tags.begin(), tags.end(),
                       [&](const OllamaModel& m) { return same_model(m.name, model_); });
  }

  StepOutcome not_answering(const OllamaApi& api, const std::string& error) {
    auto d = diagnoses::ollama_not_answering(api.url(), error);
    return StepOutcome::failure(d.summary, {}, d);
  }

  std::string model_;
  bool require_full_gpu_;
};

}  // namespace

Result<std::unique_ptr<Step>> make_ollama_model(const StepSpec& spec) {
  auto p = normalized_params("ollama_model", spec);
  if (!p) return p.error();
  return std::unique_ptr<Step>(
      new OllamaModelStep((*p)["model"].get<std::string>(), (*p)["require_full_gpu"].get<bool>()));
}

}  // namespace factory::agent::steps
