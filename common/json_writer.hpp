#pragma once
// Two JSON writers with one interface, so a type lists its fields once, in
// a template `write(W&)`, and gets both forms from that one list:
//   JsonTree  an nlohmann::json, for code that edits, embeds or compares it;
//   JsonText  the bytes, for a hot path that only sends or stores them:
//             no node per field, no sorting, no second pass to dump.
// JsonText writes keys in the order they are given, the tree sorts them;
// both are the same JSON value, and a string's bytes are written as
// nlohmann's dump writes them (invalid UTF-8 becomes U+FFFD, never an
// exception), so text and tree.dump() differ only in key order.
//
// The calls: begin_object/end_object, begin_array/end_array, key(k) before
// each member's value, and value(v) for null (nullptr), bool, any integer,
// double, text, an optional (null when empty) or a whole nlohmann::json.
// JsonText also takes raw(text): a value already serialized, spliced in.
#include <charconv>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace factory {

// `s` as a JSON string, quotes included, appended to `out`: the bytes
// nlohmann::json(s).dump() writes with error_handler_t::replace.
void append_json_string(std::string& out, std::string_view s);

class JsonText {
 public:
  JsonText() = default;
  explicit JsonText(std::size_t reserve) { out_.reserve(reserve); }

  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  void key(std::string_view k) {
    separate();
    append_json_string(out_, k);
    out_ += ':';
    need_comma_ = false;
  }

  void value(std::nullptr_t) { raw("null"); }
  void value(bool b) { raw(b ? "true" : "false"); }
  template <class T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) void value(T v) {
    separate();
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, r.ptr);
    need_comma_ = true;
  }
  void value(double d);
  void value(std::string_view s) {
    separate();
    append_json_string(out_, s);
    need_comma_ = true;
  }
  void value(const char* s) { value(std::string_view(s)); }
  void value(const std::string& s) { value(std::string_view(s)); }
  void value(const nlohmann::json& j);
  template <class T>
  void value(const std::optional<T>& v) {
    if (v)
      value(*v);
    else
      value(nullptr);
  }
  // A value already serialized as JSON (the caller's word that it is one).
  void raw(std::string_view json_text) {
    separate();
    out_ += json_text;
    need_comma_ = true;
  }

  const std::string& str() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void separate() {
    if (need_comma_) out_ += ',';
  }
  void open(char c) {
    separate();
    out_ += c;
    need_comma_ = false;
  }
  void close(char c) {
    out_ += c;
    need_comma_ = true;
  }

  std::string out_;
  bool need_comma_ = false;
};

class JsonTree {
 public:
  void begin_object() { stack_.push_back(&place(nlohmann::json::object())); }
  void end_object() { stack_.pop_back(); }
  void begin_array() { stack_.push_back(&place(nlohmann::json::array())); }
  void end_array() { stack_.pop_back(); }
  void key(std::string_view k) { key_.assign(k); }

  void value(std::nullptr_t) { place(nullptr); }
  void value(bool b) { place(b); }
  template <class T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) void value(T v) { place(v); }
  void value(double d) { place(d); }
  void value(std::string_view s) { place(std::string(s)); }
  void value(const char* s) { place(std::string(s)); }
  void value(const std::string& s) { place(s); }
  void value(const nlohmann::json& j) { place(j); }
  template <class T>
  void value(const std::optional<T>& v) {
    if (v)
      value(*v);
    else
      value(nullptr);
  }

  nlohmann::json take() { return std::move(root_); }

 private:
  // Where the next value goes: the member named by the last key() of the
  // open object, the end of the open array, or the root.
  nlohmann::json& place(nlohmann::json v) {
    if (stack_.empty()) return root_ = std::move(v);
    nlohmann::json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return top.back();
    }
    return top[key_] = std::move(v);
  }

  nlohmann::json root_;
  // The open containers. A pointer to an array's element stays good while
  // it is open: nothing is added to that array until it is closed.
  std::vector<nlohmann::json*> stack_;
  std::string key_;
};

}  // namespace factory
