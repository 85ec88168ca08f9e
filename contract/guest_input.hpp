#pragma once
// Reading what a guest sends. The guest is the customer's: its agent may
// send anything, so every message the coordinator takes in (an event, a
// hello, a health sample, ...) is read field by field with one reader and
// one vocabulary of reasons: each field is checked for its type, its
// length, its range and (for names) its characters; a field that fails is
// dropped and reported as a Rejection, which the coordinator counts in
// factory_agent_messages_rejected_total{tenant,reason} with the reason's
// name below, whichever message it came in.
//
// Pure functions over parsed JSON: no state, no I/O, no exceptions, so a
// fuzz target can call them directly.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace factory::proto {

// Why a field or a message was not kept: the `reason` label of the metric.
enum class RejectReason {
  missing,        // a required field is absent
  wrong_type,     // a string where a number belongs, a list for an object, ...
  too_long,       // a string over its limit
  too_many,       // a list or object over its number of items
  too_deep,       // nested deeper than free-form JSON may be
  out_of_range,   // a number outside its range
  bad_format,     // characters its grammar does not allow (a control character
                  // in a name, a bad time, a code that is not one)
  unknown_value,  // not one of the values the field may take
  unknown_field,  // a field this message type does not have
};
const char* reason_name(RejectReason r);
inline constexpr RejectReason kAllRejectReasons[] = {
    RejectReason::missing,    RejectReason::wrong_type,    RejectReason::too_long,
    RejectReason::too_many,   RejectReason::too_deep,      RejectReason::out_of_range,
    RejectReason::bad_format, RejectReason::unknown_value, RejectReason::unknown_field};
inline constexpr std::size_t kRejectReasons = std::size(kAllRejectReasons);

struct Rejection {
  std::string field;  // "hostname", "diagnosis.summary", "gpu.gpus[0].name"
  RejectReason reason;
};

// What the readers of one message dropped: every rejection counted by
// reason, the first kKept listed with their field. A hostile message may
// hold thousands of bad fields; the first ones say enough for a log line,
// and the counts keep the metric exact without the list growing with them.
class Rejections {
 public:
  static constexpr std::size_t kKept = 64;
  // Field names may be the agent's own (an unknown key): kept short, since
  // they go to the log.
  static constexpr std::size_t kMaxFieldName = 80;

  void add(std::string field, RejectReason r);

  bool empty() const { return total_ == 0; }
  std::uint64_t total() const { return total_; }
  std::uint64_t count(RejectReason r) const { return counts_[static_cast<std::size_t>(r)]; }
  // The first kKept, in the order they were found.
  const std::vector<Rejection>& kept() const { return kept_; }
  auto begin() const { return kept_.begin(); }
  auto end() const { return kept_.end(); }

 private:
  std::vector<Rejection> kept_;
  std::array<std::uint64_t, kRejectReasons> counts_{};
  std::uint64_t total_ = 0;
};

// A decoded message: the value, what was dropped on the way, and, when no
// value could be made, why (one line for the error frame).
template <class T>
struct Decoded {
  std::optional<T> value;
  Rejections rejected;
  std::string refusal;  // set exactly when !value
};

// Grammars of the names a guest sends.
// Step ids, diagnosis codes, tiers, states: what the catalog allows for a
// step id (contract/catalog.cpp), the strictest grammar any of them has.
bool is_name(std::string_view s);
// A version as build systems write them: 0.1.0, 1.2.3-rc1+g1234abc, 2:1.0~beta.
bool is_version(std::string_view s);
// RFC 1123 host names (labels of letters, digits and hyphens), with the
// underscore some real machines have in theirs; at most 253 bytes.
bool is_hostname(std::string_view s);
bool is_hex(std::string_view s);
// A string as it may be shown without the display sanitizer: true when it
// has no control characters (C0, DEL, C1) and is at most max bytes.
bool is_clean_text(const std::string& s, std::size_t max);

// How far free-form JSON (a diagnosis's details, an event kind this
// coordinator does not know yet) may go.
struct FreeFormLimits {
  int depth = 6;
  std::size_t items = 64;  // keys of an object, items of a list
  std::size_t key = 64;
  std::size_t string = 4096;
};
// Free-form JSON kept within the limits: what does not fit is dropped and
// reported under `where`, the rest kept as it came.
nlohmann::json bounded(const nlohmann::json& v, const std::string& where, int depth,
                       Rejections& out, const FreeFormLimits& lim = {});

// Reads one JSON object field by field. Each accessor marks its key as
// known and returns the value only when it passes, reporting why not;
// finish() reports every key nobody asked for (for messages whose fields
// are closed; a health sample leaves a newer agent's fields unread).
class FieldReader {
 public:
  // prefix: the object's path in the message ("" at the top, "ranges",
  // "gpu.gpus[0]"), so a rejection names the field in full.
  FieldReader(const nlohmann::json& obj, Rejections& out, std::string prefix = "")
      : obj_(obj), out_(out), prefix_(std::move(prefix)) {}

  std::string at(const char* key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
  // The path of item i of the list under key: "gpu.gpus[3]".
  std::string item(const char* key, std::size_t i) const {
    return at(key) + "[" + std::to_string(i) + "]";
  }
  void reject(const char* key, RejectReason r) { out_.add(at(key), r); }
  Rejections& rejections() { return out_; }
  bool is_object() const { return obj_.is_object(); }
  bool has(const char* key) const { return obj_.is_object() && obj_.contains(key); }

  // The value, or nullptr when the key is absent or null (absent, as far as
  // an optional field is concerned).
  const nlohmann::json* get(const char* key);

  std::optional<std::string> string(const char* key, std::size_t max);
  // Free text: any valid UTF-8 (the JSON parser saw to that), within max;
  // shown through display::sanitize wherever a terminal or a page gets it.
  std::optional<std::string> text(const char* key, std::size_t max) { return string(key, max); }
  // Text shown as it is (a GPU's name on a dashboard): no control characters.
  std::optional<std::string> clean_text(const char* key, std::size_t max);
  template <class Pred>
  std::optional<std::string> matching(const char* key, std::size_t max, Pred ok) {
    auto s = string(key, max);
    if (!s) return s;
    if (!ok(*s)) return reject(key, RejectReason::bad_format), std::nullopt;
    return s;
  }
  std::optional<std::string> name(const char* key, std::size_t max = 64);
  std::optional<std::string> one_of(const char* key, std::initializer_list<std::string_view> vals,
                                    std::size_t max = 64);
  // An RFC 3339 time.
  std::optional<std::string> time(const char* key, std::size_t max = 40);

  // A whole number in [lo, hi], as T (the bounds are long double so that
  // any 64-bit bound is exact and a negative number meets an unsigned T's
  // range check, not a wrap).
  template <class T>
  std::optional<T> integer(const char* key, long double lo, long double hi) {
    auto x = whole(key, lo, hi);
    if (!x) return std::nullopt;
    return static_cast<T>(*x);
  }
  std::optional<std::uint64_t> count(const char* key, std::uint64_t max) {
    return integer<std::uint64_t>(key, 0, static_cast<long double>(max));
  }
  // Any finite number in [lo, hi].
  std::optional<double> number(const char* key, double lo, double hi);
  std::optional<bool> boolean(const char* key);
  // Free-form JSON under key, bounded; an object unless any_type.
  std::optional<nlohmann::json> free_form(const char* key, bool any_type = false,
                                          const FreeFormLimits& lim = {});
  // The objects of a list field, at most max (the rest counted once as
  // too_many); an item that is no object is counted and skipped.
  std::vector<const nlohmann::json*> objects(const char* key, std::size_t max);

  // Marks keys as known without reading them (read elsewhere, or ignored).
  void known(std::initializer_list<const char*> keys);
  void finish();

 private:
  std::optional<long double> whole(const char* key, long double lo, long double hi);

  const nlohmann::json& obj_;
  Rejections& out_;
  std::string prefix_;
  std::set<std::string, std::less<>> known_;
};

}  // namespace factory::proto
