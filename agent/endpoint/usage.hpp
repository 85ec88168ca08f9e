#pragma once
// Tokens per key (issue 28): what a request used, from Ollama's own counts
// in its answer, and the tally per key the agent reports.
//
// UsageScanner reads an answer's body as it passes, chunk by chunk,
// without keeping it: line by line (NDJSON lines, SSE `data:` lines, or a
// whole JSON body, which is one line), parsing only a line that can hold a
// count. Ollama's /api/generate and /api/chat give `prompt_eval_count` and
// `eval_count` in their last object (`"done": true`), streamed or not; the
// OpenAI-compatible paths give a `usage` object (streamed: in a last chunk,
// sent when the request asked `stream_options: {include_usage: true}`,
// which the proxy adds, with_usage_requested). The last count seen wins. A
// line longer than kMaxLine is skipped, not kept.
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace factory::agent::endpoint {

struct TokenCounts {
  std::uint64_t prompt = 0, completion = 0;
};

class UsageScanner {
 public:
  static constexpr std::size_t kMaxLine = 8 << 20;
  void feed(std::string_view chunk);
  // The answer is whole: a last line without its newline is read too.
  void finish();
  std::optional<TokenCounts> counts() const { return counts_; }

 private:
  void line(std::string_view l);
  std::string pending_;
  bool skipping_ = false;  // inside a line past kMaxLine
  std::optional<TokenCounts> counts_;
};

// The body of a request to an OpenAI-compatible path with "stream": true,
// changed to ask Ollama for the usage chunk; nullopt when it needs no change
// (not streamed, already asked, not a JSON object).
std::optional<std::string> with_usage_requested(const std::string& body);

// The SSE stream the client sees when the proxy asked for the usage chunk
// and the client did not: the same stream without that chunk (a `data:`
// line whose object has "usage" and no choices, and the blank line after
// it). Whole lines pass as they come; only a line cut by a chunk boundary
// waits for its end (at most kMaxLine, then it passes as it is).
class UsageChunkFilter {
 public:
  std::string pass(std::string_view chunk);
  std::string finish();

 private:
  std::string pending_;
  bool drop_blank_ = false;
};

// Per key, since the last take(): what the agent's endpoint_usage events say.
struct KeyUsage {
  std::uint64_t requests = 0, errors = 0, prompt_tokens = 0, completion_tokens = 0;
  bool empty() const {
    return requests == 0 && errors == 0 && prompt_tokens == 0 && completion_tokens == 0;
  }
};

class UsageTally {
 public:
  // At most this many keys between two takes (the coordinator allows 32
  // named ones and the default): a key past it is counted under the first.
  static constexpr std::size_t kMaxKeys = 64;
  void request(const std::string& key, bool error, std::optional<TokenCounts> tokens);
  void error(const std::string& key);  // an error of a request already counted
  std::map<std::string, KeyUsage> take();

 private:
  KeyUsage& of(const std::string& key);
  std::mutex mu_;
  std::map<std::string, KeyUsage> keys_;
};

}  // namespace factory::agent::endpoint
