#pragma once
// The parts of Ollama's REST API the agent uses (https://github.com/ollama/
// ollama/blob/main/docs/api.md): version, tags, ps, pull (streamed NDJSON
// progress) and generate (to load a model). Over factory::net::HttpClient on
// loopback; the guest's Ollama listens on 127.0.0.1:11434 by default.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace factory::agent {

struct OllamaModel {  // /api/tags
  std::string name;
  std::uint64_t size = 0;
  std::string digest;
};

struct OllamaRunningModel {  // /api/ps
  std::string name;
  std::uint64_t size = 0;                      // bytes the loaded model takes
  std::uint64_t size_vram = 0;                 // of which on the GPU
  std::optional<std::int64_t> context_length;  // newer Ollamas report it
  std::string expires_at;                      // when keep_alive unloads it (RFC 3339)
  int gpu_percent() const;                     // as `ollama ps` rounds it
};

// One NDJSON line of a pull: {"status":"pulling 74701a8c35f6","digest":"sha256:...",
// "total":1321082688,"completed":1048576}.
struct PullEvent {
  std::string status;
  std::string digest;
  std::uint64_t total = 0;
  std::uint64_t completed = 0;
};

// Sums the layers a pull reports into one percentage: Ollama streams each
// layer's own completed/total, so a single line's ratio jumps back to 0 at
// every new layer.
class PullProgress {
 public:
  void add(const PullEvent& e);
  int percent() const;  // 0..100 over the layers seen so far
  std::uint64_t completed() const;
  std::uint64_t total() const;

 private:
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>>
      layers_;  // digest -> completed, total
};

// Why a pull failed, for the diagnosis.
struct PullFailure {
  int http_status = 0;       // 0 when the failure was not an HTTP status
  std::string server_error;  // Ollama's {"error": "..."} text, or what went wrong
  bool interrupted = false;  // the stream ended before "success"
  int percent = 0;
  std::string last_status;  // the last status line seen
};

class OllamaApi {
 public:
  explicit OllamaApi(std::string base_url) : base_(std::move(base_url)) {}
  const std::string& url() const { return base_; }

  Result<std::string> version(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  Result<std::vector<OllamaModel>> tags(
      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  Result<std::vector<OllamaRunningModel>> ps(
      std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // POST /api/pull {"model": name, "stream": true}; on_event sees every line.
  // idle_timeout bounds each wait for the next line, not the whole download.
  // On failure returns the PullFailure (ok() false carries it in *failure).
  Status pull(const std::string& model, const std::function<void(const PullEvent&)>& on_event,
              std::chrono::milliseconds idle_timeout, PullFailure* failure);

  // POST /api/generate {"model": name, "keep_alive": keep_alive} with no
  // prompt: Ollama loads the model and answers {"done_reason":"load"}.
  Status load(const std::string& model, const std::string& keep_alive,
              std::chrono::milliseconds timeout);

 private:
  std::string base_;
};

// The answers' bodies as the calls above read them (also what the fuzz
// target feeds: the guest's Ollama is the customer's to replace).
Result<std::vector<OllamaModel>> parse_tags(const std::string& body);
Result<std::vector<OllamaRunningModel>> parse_ps(const std::string& body);
// One NDJSON line of a pull: nothing for a blank line, else the event; an
// error carrying Ollama's {"error": ...} text, or "not JSON: ..." .
Result<std::optional<PullEvent>> parse_pull_line(const std::string& line);

// Ollama names a model "name:tag"; a bare "name" means "name:latest".
std::string normalize_model_name(const std::string& name);
bool same_model(const std::string& a, const std::string& b);

}  // namespace factory::agent
