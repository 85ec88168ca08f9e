#include "agent/endpoint/usage.hpp"

#include <nlohmann/json.hpp>

namespace factory::agent::endpoint {

using Json = nlohmann::json;

namespace {

// A count as Ollama writes it: a non-negative integer, at most a billion
// (no answer has more tokens; a bigger number is not a count).
std::optional<std::uint64_t> token_count(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return std::nullopt;
  if (!it->is_number_integer()) return std::nullopt;
  if (it->is_number_unsigned()) {
    auto u = it->get<std::uint64_t>();
    return u <= 1'000'000'000ull ? std::optional(u) : std::nullopt;
  }
  auto i = it->get<std::int64_t>();
  if (i < 0 || i > 1'000'000'000) return std::nullopt;
  return static_cast<std::uint64_t>(i);
}

}  // namespace

void UsageScanner::feed(std::string_view chunk) {
  while (!chunk.empty()) {
    const auto nl = chunk.find('\n');
    const std::string_view part = chunk.substr(0, nl);
    if (!skipping_) {
      if (pending_.size() + part.size() > kMaxLine) {
        skipping_ = true;
        pending_.clear();
      } else if (nl != std::string_view::npos) {
        if (pending_.empty()) {
          line(part);
        } else {
          pending_.append(part);
          line(pending_);
          pending_.clear();
        }
      } else {
        pending_.append(part);
      }
    }
    if (nl == std::string_view::npos) break;
    skipping_ = false;
    chunk.remove_prefix(nl + 1);
  }
}

void UsageScanner::finish() {
  if (!skipping_ && !pending_.empty()) line(pending_);
  pending_.clear();
  skipping_ = false;
}

void UsageScanner::line(std::string_view l) {
  while (!l.empty() && (l.back() == '\r' || l.back() == ' ')) l.remove_suffix(1);
  if (l.substr(0, 5) == "data:") {
    l.remove_prefix(5);
    while (!l.empty() && l.front() == ' ') l.remove_prefix(1);
  }
  // Only a line that can hold a count is parsed: not every token's.
  if (l.empty() || l.front() != '{') return;
  if (l.find("\"eval_count\"") == std::string_view::npos &&
      l.find("\"usage\"") == std::string_view::npos)
    return;
  auto j = Json::parse(l, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return;
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    auto p = token_count(*u, "prompt_tokens"), c = token_count(*u, "completion_tokens");
    if (p || c) counts_ = TokenCounts{p.value_or(0), c.value_or(0)};
    return;
  }
  auto done = j.find("done");
  if (done != j.end() && done->is_boolean() && done->get<bool>()) {
    auto p = token_count(j, "prompt_eval_count"), c = token_count(j, "eval_count");
    if (p || c) counts_ = TokenCounts{p.value_or(0), c.value_or(0)};
  }
}

std::optional<std::string> with_usage_requested(const std::string& body) {
  auto j = Json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto s = j.find("stream");
  if (s == j.end() || !s->is_boolean() || !s->get<bool>()) return std::nullopt;
  auto& so = j["stream_options"];
  if (so.is_null()) so = Json::object();
  if (!so.is_object()) return std::nullopt;  // Ollama answers 400 itself
  auto iu = so.find("include_usage");
  if (iu != so.end() && iu->is_boolean() && iu->get<bool>()) return std::nullopt;
  so["include_usage"] = true;
  return j.dump();
}

std::string UsageChunkFilter::pass(std::string_view chunk) {
  std::string out;
  pending_.append(chunk);
  std::size_t from = 0, nl;
  while ((nl = pending_.find('\n', from)) != std::string::npos) {
    std::string_view l(pending_.data() + from, nl - from);
    std::string_view bare = l;
    if (!bare.empty() && bare.back() == '\r') bare.remove_suffix(1);
    bool drop = false;
    if (bare.empty()) {
      drop = drop_blank_;
      drop_blank_ = false;
    } else if (bare.substr(0, 5) == "data:" && bare.find("\"usage\"") != std::string_view::npos) {
      auto d = bare.substr(5);
      while (!d.empty() && d.front() == ' ') d.remove_prefix(1);
      auto j = Json::parse(d, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("usage") && j["usage"].is_object()) {
        auto c = j.find("choices");
        drop = c == j.end() || (c->is_array() && c->empty());
        drop_blank_ = drop;
      }
    }
    if (!drop) out.append(pending_, from, nl - from + 1);
    from = nl + 1;
  }
  pending_.erase(0, from);
  if (pending_.size() > UsageScanner::kMaxLine) {
    out += pending_;
    pending_.clear();
  }
  return out;
}

std::string UsageChunkFilter::finish() {
  std::string out;
  out.swap(pending_);
  return out;
}

KeyUsage& UsageTally::of(const std::string& key) {
  auto it = keys_.find(key);
  if (it != keys_.end()) return it->second;
  if (keys_.size() >= kMaxKeys) return keys_.begin()->second;
  return keys_[key];
}

void UsageTally::request(const std::string& key, bool error, std::optional<TokenCounts> tokens) {
  std::lock_guard lk(mu_);
  KeyUsage& u = of(key);
  u.requests++;
  if (error) u.errors++;
  if (tokens) {
    u.prompt_tokens += tokens->prompt;
    u.completion_tokens += tokens->completion;
  }
}

void UsageTally::error(const std::string& key) {
  std::lock_guard lk(mu_);
  of(key).errors++;
}

std::map<std::string, KeyUsage> UsageTally::take() {
  std::lock_guard lk(mu_);
  std::map<std::string, KeyUsage> out;
  out.swap(keys_);
  return out;
}

}  // namespace factory::agent::endpoint
