#include "coordinator/enroll/tokens.hpp"

#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "common/atomic_file.hpp"
#include "common/pki.hpp"
#include "coordinator/enroll/tenant_name.hpp"

namespace factory::enroll {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kFormatVersion = 1;
constexpr int kJournalVersion = 1;
// A journal is folded into the snapshot once it holds more records than the
// book has tokens, and never below this many.
constexpr std::uint64_t kMinCompactRecords = 256;
// Retention is applied at most this often: each pass looks at every token.
constexpr std::chrono::minutes kPruneEvery{1};

bool token_chars(std::string_view s, size_t len) {
  return s.size() == len && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
         });
}

bool lower_hex(std::string_view s, size_t len) {
  return s.size() == len && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= 'a' && c <= 'f') || (c >= '0' && c <= '9');
         });
}

// Timestamps are stored to the second (RFC 3339), so keep them that way in
// memory too: a reloaded book then equals the one that was saved.
Clock::time_point floor_seconds(Clock::time_point t) {
  return std::chrono::floor<std::chrono::seconds>(t);
}

std::string_view trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

json to_json(const TokenRecord& t) {
  json j = {{"id", t.id},
            {"tenant", t.tenant},
            {"secret_sha256", t.secret_sha256},
            {"created_at", format_rfc3339(t.created_at)},
            {"expires_at", format_rfc3339(t.expires_at)}};
  if (t.used_at) j["used_at"] = format_rfc3339(*t.used_at);
  if (t.revoked) j["revoked"] = true;
  return j;
}

Result<Clock::time_point> time_field(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string())
    return Error(Errc::invalid_argument, std::string("missing or non-string '") + key + "'");
  auto t = parse_rfc3339(j[key].get<std::string>());
  if (!t.ok()) return t.error().with_context(key);
  return *t;
}

Result<TokenRecord> from_json(const json& j) {
  if (!j.is_object()) return Error(Errc::invalid_argument, "a token entry is not an object");
  TokenRecord t;
  for (const char* key : {"id", "tenant", "secret_sha256"})
    if (!j.contains(key) || !j[key].is_string())
      return Error(Errc::invalid_argument, std::string("missing or non-string '") + key + "'");
  t.id = j["id"].get<std::string>();
  t.tenant = j["tenant"].get<std::string>();
  t.secret_sha256 = j["secret_sha256"].get<std::string>();
  if (!token_chars(t.id, kTokenIdLength))
    return Error(Errc::invalid_argument, "bad token id '" + t.id + "'");
  if (auto st = validate_tenant_name(t.tenant); !st.ok())
    return st.error().with_context("token " + t.id);
  if (!lower_hex(t.secret_sha256, 64))
    return Error(Errc::invalid_argument, "token " + t.id + ": secret_sha256 is not 64 hex digits");
  auto created = time_field(j, "created_at");
  if (!created.ok()) return created.error().with_context("token " + t.id);
  auto expires = time_field(j, "expires_at");
  if (!expires.ok()) return expires.error().with_context("token " + t.id);
  t.created_at = *created;
  t.expires_at = *expires;
  if (j.contains("used_at")) {
    auto used = time_field(j, "used_at");
    if (!used.ok()) return used.error().with_context("token " + t.id);
    t.used_at = *used;
  }
  if (j.contains("revoked")) {
    if (!j["revoked"].is_boolean())
      return Error(Errc::invalid_argument, "token " + t.id + ": 'revoked' is not a boolean");
    t.revoked = j["revoked"].get<bool>();
  }
  return t;
}

std::optional<std::uint64_t> generation_of(const json& doc, const char* key) {
  if (!doc.contains(key)) return std::nullopt;
  if (!doc[key].is_number_unsigned()) return std::nullopt;
  return doc[key].get<std::uint64_t>();
}

std::string journal_header(std::uint64_t generation) {
  return json{{"journal", kJournalVersion}, {"generation", generation}}.dump() + "\n";
}

std::vector<TokenRecord> oldest_first(const std::unordered_map<std::string, TokenRecord>& tokens) {
  std::vector<TokenRecord> all;
  all.reserve(tokens.size());
  for (const auto& [id, t] : tokens) all.push_back(t);
  std::sort(all.begin(), all.end(), [](const TokenRecord& a, const TokenRecord& b) {
    return std::tie(a.created_at, a.id) < std::tie(b.created_at, b.id);
  });
  return all;
}

bool older_than_retention(const TokenRecord& t, Clock::time_point now) {
  return now - t.expires_at > kTokenRetention || (t.used_at && now - *t.used_at > kTokenRetention);
}

Error unauthenticated(const std::string& why) {
  return Error(Errc::unauthenticated, why);
}

}  // namespace

std::string token_state(const TokenRecord& t, Clock::time_point now) {
  if (t.revoked) return "revoked";
  if (t.used_at) return "used";
  if (now >= t.expires_at) return "expired";
  return "active";
}

namespace {

// One journal line applied to the book being loaded.
Status apply_record(const json& r, std::unordered_map<std::string, TokenRecord>& tokens) {
  if (!r.is_object() || !r.contains("op") || !r["op"].is_string())
    return Error(Errc::invalid_argument, "a record without an 'op'");
  const std::string op = r["op"].get<std::string>();
  auto known = [&](const json& id) -> Result<TokenRecord*> {
    if (!id.is_string()) return Error(Errc::invalid_argument, op + ": an id that is not a string");
    auto it = tokens.find(id.get<std::string>());
    if (it == tokens.end())
      return Error(Errc::invalid_argument, op + " of unknown token " + id.get<std::string>());
    return &it->second;
  };
  if (op == "issue") {
    if (!r.contains("token")) return Error(Errc::invalid_argument, "issue without a token");
    auto t = from_json(r["token"]);
    if (!t.ok()) return t.error();
    if (tokens.contains(t->id))
      return Error(Errc::invalid_argument, "token id " + t->id + " appears twice");
    std::string id = t->id;
    tokens.emplace(std::move(id), std::move(*t));
    return {};
  }
  if (op == "use") {
    if (!r.contains("id")) return Error(Errc::invalid_argument, "use without an id");
    auto t = known(r["id"]);
    if (!t.ok()) return t.error();
    auto at = time_field(r, "at");
    if (!at.ok()) return at.error();
    (*t)->used_at = *at;
    return {};
  }
  if (op == "revoke") {
    if (!r.contains("ids") || !r["ids"].is_array())
      return Error(Errc::invalid_argument, "revoke without an 'ids' array");
    for (const json& id : r["ids"]) {
      auto t = known(id);
      if (!t.ok()) return t.error();
      (*t)->revoked = true;
    }
    return {};
  }
  return Error(Errc::invalid_argument, "unknown op '" + op + "'");
}

}  // namespace

Result<TokenBook> TokenBook::load(const fs::path& path, GroupCommitLog::SyncFn sync) {
  TokenBook book(path, sync);
  std::error_code ec;
  const bool have_snapshot = fs::exists(path, ec);
  if (ec) return Error(Errc::io, "token book " + path.string() + ": " + ec.message());
  if (have_snapshot) {
    auto text = read_file(path);
    if (!text.ok()) return text.error().with_context("load token book");
    auto corrupt = [&](const std::string& why) {
      return Error(
          Errc::failed_precondition,
          "token book " + path.string() + " is corrupt (" + why +
              "); repair it, or remove it and its journal to start empty (outstanding tokens "
              "then stop working)");
    };
    json doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return corrupt("not valid JSON");
    if (!doc.is_object() || !doc.contains("tokens") || !doc["tokens"].is_array())
      return corrupt("no 'tokens' array");
    if (!doc.contains("version") || doc["version"] != kFormatVersion)
      return corrupt("unsupported format version, expected " + std::to_string(kFormatVersion));
    if (doc.contains("generation")) {
      auto g = generation_of(doc, "generation");
      if (!g) return corrupt("'generation' is not a non-negative integer");
      book.generation_ = *g;
    }
    for (const json& entry : doc["tokens"]) {
      auto t = from_json(entry);
      if (!t.ok()) return corrupt(t.error().message);
      if (book.tokens_.contains(t->id)) return corrupt("token id " + t->id + " appears twice");
      std::string id = t->id;
      book.tokens_.emplace(std::move(id), std::move(*t));
    }
  }

  const fs::path jpath = book.journal_path();
  if (fs::exists(jpath, ec)) {
    auto text = read_file(jpath);
    if (!text.ok()) return text.error().with_context("load token journal");
    auto corrupt = [&](std::size_t offset, const std::string& why) {
      return Error(Errc::failed_precondition,
                   "token journal " + jpath.string() + " is corrupt at byte " +
                       std::to_string(offset) + " (" + why +
                       "); repair that line, or remove the journal and revoke the tokens issued "
                       "since " +
                       path.filename().string() +
                       " was written (the uses and revocations it holds are lost with it)");
    };
    std::size_t pos = 0;
    bool header = true;
    while (pos < text->size()) {
      std::size_t nl = text->find('\n', pos);
      // A last line without its newline is an append a crash cut short: it
      // was never acknowledged, so it is dropped (and cut off before the
      // next append).
      if (nl == std::string::npos) break;
      json r = json::parse(std::string_view(*text).substr(pos, nl - pos), nullptr,
                           /*allow_exceptions=*/false);
      if (header) {
        header = false;
        auto g = r.is_object() && r.value("journal", 0) == kJournalVersion
                     ? generation_of(r, "generation")
                     : std::nullopt;
        if (!g) return corrupt(pos, "not a journal header");
        if (*g > book.generation_)
          return corrupt(pos, "generation " + std::to_string(*g) + " is newer than the book's " +
                                  std::to_string(book.generation_));
        // Older: a compaction already folded it into the snapshot (a crash
        // came before the new journal replaced it). Not replayed.
        if (*g < book.generation_) break;
        book.journal_current_ = true;
      } else {
        if (r.is_discarded()) return corrupt(pos, "not valid JSON");
        if (auto st = apply_record(r, book.tokens_); !st.ok())
          return corrupt(pos, st.error().message);
        ++book.journal_lines_;
      }
      pos = nl + 1;
      book.journal_good_bytes_ = pos;
    }
  } else if (ec) {
    return Error(Errc::io, "token journal " + jpath.string() + ": " + ec.message());
  }
  book.compact_after_ = std::max<std::uint64_t>(kMinCompactRecords, book.tokens_.size());
  return book;
}

Status TokenBook::write_snapshot(const std::vector<TokenRecord>& tokens, std::uint64_t generation) {
  json doc = {{"version", kFormatVersion}, {"generation", generation}, {"tokens", json::array()}};
  for (const TokenRecord& t : tokens) doc["tokens"].push_back(to_json(t));
  std::error_code ec;
  fs::path dir = path_.parent_path();
  if (!dir.empty() && !fs::exists(dir, ec)) {
    if (auto st = ensure_dir(dir, 0700); !st.ok()) return st;
  }
  // The file holds no secrets, only their hashes; 0600 anyway, as the hashes
  // and tenant names are nobody else's business.
  return write_file_atomic(path_, doc.dump(1) + "\n", 0600);
}

Status TokenBook::open_journal() {
  if (journal_->is_open()) return {};
  const fs::path jpath = journal_path();
  std::error_code ec;
  // The folder exists once the snapshot does, which is written first.
  if (!journal_current_) {
    // A book's first change: with no snapshot and no journal nothing is on
    // disk yet, so an empty snapshot says so (and the book's file exists,
    // 0600, from the start).
    if (!fs::exists(path_, ec)) {
      if (auto st = write_snapshot({}, generation_); !st.ok()) return st;
    }
    // This generation's journal starts empty, replacing a folded one whole.
    std::string h = journal_header(generation_);
    if (auto st = write_file_atomic(jpath, h, 0600); !st.ok()) return st;
    journal_current_ = true;
    journal_lines_ = 0;
    journal_good_bytes_ = h.size();
  } else if (fs::file_size(jpath, ec) > journal_good_bytes_ && !ec) {
    // A torn tail (a crash, or an append that failed part way): cut it off
    // so the next record does not follow half a line.
    if (::truncate(jpath.c_str(), static_cast<off_t>(journal_good_bytes_)) != 0)
      return errno_error("truncate " + jpath.string(), errno);
  }
  return journal_->open(jpath, 0600);
}

void TokenBook::drop_journal() {
  if (!journal_->is_open()) return;
  // Lines written after the last good sync may or may not be on disk (and
  // their callers were told they failed): the next opening cuts them off.
  journal_good_bytes_ = std::min(journal_good_bytes_, journal_->synced());
  journal_->close(/*durable=*/false);
}

Status TokenBook::compact() {
  if (auto st = write_snapshot(oldest_first(tokens_), generation_ + 1); !st.ok()) return st;
  ++generation_;
  // The snapshot holds every change made so far, the journal's unsynced
  // ones too: their waiters are done.
  journal_->close(/*durable=*/true);
  journal_current_ = false;  // the next change starts the new generation's journal
  journal_lines_ = 0;
  compact_after_ = std::max<std::uint64_t>(kMinCompactRecords, tokens_.size());
  return {};
}

Result<GroupCommitLog::Mark> TokenBook::record(const std::string& line) {
  if (journal_->failed()) drop_journal();
  if (auto st = open_journal(); !st.ok()) return st.error();
  auto mark = journal_->write(line + "\n");
  if (!mark.ok()) {
    // What reached the file is cut off before the next append.
    drop_journal();
    return mark.error();
  }
  ++journal_lines_;
  journal_good_bytes_ += line.size() + 1;
  if (journal_lines_ >= compact_after_) {
    // The change is in the journal (durable once its sync is done): a
    // snapshot that cannot be written now is tried again after as many
    // records more.
    if (!compact().ok())
      compact_after_ += std::max<std::uint64_t>(kMinCompactRecords, tokens_.size());
  }
  return mark;
}

void TokenBook::prune(Clock::time_point now) {
  // Old used / expired entries only make the book grow; after a day a retry
  // with such a token reads "unknown token", which is just as much a refusal.
  if (now >= last_prune_ && now - last_prune_ < kPruneEvery) return;
  last_prune_ = now;
  auto n =
      std::erase_if(tokens_, [&](const auto& kv) { return older_than_retention(kv.second, now); });
  // Only a snapshot forgets: a failure leaves them in the files, where the
  // next pass finds them again.
  if (n > 0) (void)compact();
}

Result<NewToken> make_token(const std::string& tenant, std::chrono::seconds ttl,
                            Clock::time_point now) {
  if (auto st = validate_tenant_name(tenant); !st.ok())
    return st.error().with_context("create token");
  if (ttl <= std::chrono::seconds(0))
    return Error(Errc::invalid_argument, "create token: TTL must be positive (e.g. 1h)");
  now = floor_seconds(now);
  NewToken out;
  TokenRecord& rec = out.record;
  rec.id = pki::random_token_chars(kTokenIdLength);
  std::string secret = pki::random_token_chars(kTokenSecretLength);
  rec.tenant = tenant;
  rec.secret_sha256 = pki::sha256_hex(secret);
  rec.created_at = now;
  rec.expires_at = now + ttl;
  out.token = rec.id + "." + secret;
  return out;
}

Result<IssuedToken> TokenBook::issue(const std::string& tenant, std::chrono::seconds ttl,
                                     Clock::time_point now) {
  std::optional<NewToken> made;
  GroupCommitLog::Mark mark;
  {
    std::lock_guard lk(*mu_);
    auto m = make_token(tenant, ttl, now);
    if (!m) return m.error();
    prune(m->record.created_at);
    // 36^6 ids: a clash is rare but would make one of two tokens unusable.
    while (tokens_.contains(m->record.id)) {
      m = make_token(tenant, ttl, now);
      if (!m) return m.error();
    }
    made = std::move(*m);
    tokens_.emplace(made->record.id, made->record);
    auto written = record(json{{"op", "issue"}, {"token", to_json(made->record)}}.dump());
    if (!written) {
      // Never shown, so never usable: take it back out.
      tokens_.erase(made->record.id);
      return written.error().with_context("create token");
    }
    mark = *written;
  }
  // Until this returns nobody has the secret, so nobody can use the token.
  if (auto st = durable(mark); !st.ok()) {
    std::lock_guard lk(*mu_);
    tokens_.erase(made->record.id);
    return st.error().with_context("create token");
  }
  const TokenRecord& rec = made->record;
  return IssuedToken{made->token, rec.id, rec.tenant, rec.expires_at};
}

Result<TokenParts> parse_token(std::string_view token) {
  token = trim(token);
  size_t dot = token.find('.');
  if (dot == std::string_view::npos || !token_chars(token.substr(0, dot), kTokenIdLength) ||
      !token_chars(token.substr(dot + 1), kTokenSecretLength))
    return unauthenticated("token malformed (expected <6 chars>.<32 chars> of a-z0-9)");
  return TokenParts{std::string(token.substr(0, dot)), pki::sha256_hex(token.substr(dot + 1))};
}

Status judge_token(const TokenRecord* known, const TokenParts& presented, Clock::time_point now) {
  // The hash compared in constant time, so the time taken says nothing about
  // how much of the secret was right.
  if (known == nullptr || !pki::secure_equals(presented.secret_sha256, known->secret_sha256))
    return unauthenticated("unknown token '" + presented.id + "'");
  if (known->revoked) return unauthenticated("token revoked");
  if (known->used_at)
    return unauthenticated("token already used at " + format_rfc3339(*known->used_at));
  if (now >= known->expires_at)
    return unauthenticated("token expired at " + format_rfc3339(known->expires_at));
  return {};
}

Error use_not_recorded(const std::string& id, const Error& why) {
  return Error(Errc::unavailable, "could not record token '" + id + "' as used (" + why.message +
                                      "); it is refused, create a new token");
}

Result<TokenRecord*> TokenBook::find_valid(std::string_view token, Clock::time_point now) {
  auto parts = parse_token(token);
  if (!parts) return parts.error();
  auto it = tokens_.find(parts->id);
  TokenRecord* known = it == tokens_.end() ? nullptr : &it->second;
  if (auto st = judge_token(known, *parts, now); !st.ok()) return st.error();
  return known;
}

Result<std::string> TokenBook::check(std::string_view token, Clock::time_point now) const {
  std::lock_guard lk(*mu_);
  auto t = const_cast<TokenBook*>(this)->find_valid(token, floor_seconds(now));
  if (!t) return t.error();
  return (*t)->tenant;
}

Result<std::string> TokenBook::redeem(std::string_view token, Clock::time_point now) {
  std::string tenant, id;
  GroupCommitLog::Mark mark;
  {
    std::lock_guard lk(*mu_);
    now = floor_seconds(now);
    prune(now);
    auto found = find_valid(token, now);
    if (!found) return found.error();
    TokenRecord& t = **found;
    // Fail closed: once we try to record the use, the token stays used in
    // this process even if the write failed (the admin makes a new token).
    t.used_at = now;
    tenant = t.tenant;
    id = t.id;
    json r = {{"op", "use"}, {"id", id}, {"at", format_rfc3339(now)}};
    auto written = record(r.dump());
    if (!written) return use_not_recorded(id, written.error());
    mark = *written;
  }
  // Enrollments at once wait here together, for one sync.
  if (auto st = durable(mark); !st.ok()) return use_not_recorded(id, st.error());
  return tenant;
}

std::vector<TokenRecord> TokenBook::list() const {
  std::lock_guard lk(*mu_);
  return oldest_first(tokens_);
}

Result<size_t> TokenBook::revoke_tenant(const std::string& tenant, Clock::time_point now) {
  std::size_t revoked = 0;
  GroupCommitLog::Mark mark;
  {
    std::lock_guard lk(*mu_);
    now = floor_seconds(now);
    prune(now);
    json ids = json::array();
    for (auto& [id, t] : tokens_) {
      if (t.tenant == tenant && !t.used_at && !t.revoked) {
        t.revoked = true;
        ids.push_back(id);
      }
    }
    if (ids.empty()) return size_t{0};
    revoked = ids.size();
    // Revoked in memory already, whatever the disk says (fail closed).
    auto written = record(json{{"op", "revoke"}, {"ids", ids}}.dump());
    if (!written) return written.error().with_context("revoke tokens of " + tenant);
    mark = *written;
  }
  if (auto st = durable(mark); !st.ok())
    return st.error().with_context("revoke tokens of " + tenant);
  return revoked;
}

}  // namespace factory::enroll
