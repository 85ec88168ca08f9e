// The two JSON writers (common/json_writer.hpp): one list of calls gives a
// tree and bytes that are the same JSON value, and a string's bytes are
// exactly nlohmann's dump of it, escapes and replaced UTF-8 included.
#include "common/json_writer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace {

using factory::JsonText;
using factory::JsonTree;
using nlohmann::json;

std::string nlohmann_dump(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

// Every kind of value, nested, through either writer.
template <class W>
void write_everything(W& w) {
  w.begin_object();
  w.key("zeta");
  w.value("last in the tree, first in the text");
  w.key("null");
  w.value(nullptr);
  w.key("yes");
  w.value(true);
  w.key("no");
  w.value(false);
  w.key("int_min");
  w.value(std::numeric_limits<std::int64_t>::min());
  w.key("u64_max");
  w.value(std::numeric_limits<std::uint64_t>::max());
  w.key("u32");
  w.value(std::uint32_t{4242});
  w.key("negative");
  w.value(-35);
  w.key("watts");
  w.value(121.85);
  w.key("limit");
  w.value(700.0);
  w.key("missing");
  w.value(std::optional<int>());
  w.key("present");
  w.value(std::optional<double>(0.5));
  w.key("details");
  w.value(json{{"b", {1, 2}}, {"a", "x\ny"}});
  w.key("list");
  w.begin_array();
  w.begin_object();
  w.key("inner");
  w.begin_array();
  w.end_array();
  w.end_object();
  w.begin_object();
  w.end_object();
  w.value(std::string("text"));
  w.end_array();
  w.key("empty");
  w.begin_object();
  w.end_object();
  w.end_object();
}

TEST(JsonWriter, TextAndTreeAreTheSameValue) {
  JsonText text;
  write_everything(text);
  JsonTree tree;
  write_everything(tree);
  json t = tree.take();
  EXPECT_EQ(json::parse(text.str()), t) << text.str();
  EXPECT_EQ(t["u64_max"].get<std::uint64_t>(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_TRUE(t["limit"].is_number_float());
  EXPECT_TRUE(t["missing"].is_null());
  EXPECT_EQ(t["list"].size(), 3u);
  // Keys in the order written: the text is not sorted.
  EXPECT_EQ(text.str().rfind("{\"zeta\":", 0), 0u) << text.str();
  // The numbers as nlohmann writes them.
  EXPECT_NE(text.str().find("\"watts\":121.85,\"limit\":700.0,"), std::string::npos) << text.str();
}

TEST(JsonWriter, StringsAreWrittenAsNlohmannDumpsThem) {
  const std::vector<std::string> cases = {
      "",
      "NVIDIA H200",
      "a \"quoted\" back\\slash",
      "line\nfeed\ttab\rcr\bbs\fff",
      std::string("nul\0byte", 8),
      "\x01\x1f control",
      "del\x7f",
      "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",  // é € 😀
      "bad \xff byte",
      "cut \xe2\x82",       // a sequence cut short
      "overlong \xc0\xaf",  // '/' in two bytes
      "surrogate \xed\xa0\x80",
      "\x1b[31mred\x1b[0m",
  };
  for (const auto& s : cases) {
    std::string out;
    factory::append_json_string(out, s);
    EXPECT_EQ(out, nlohmann_dump(s)) << json(s).dump(-1, ' ', true, json::error_handler_t::replace);
    JsonText w;
    w.value(s);
    EXPECT_EQ(w.str(), nlohmann_dump(s));
  }
}

TEST(JsonWriter, NumbersThatAreNotNumbersAreNull) {
  JsonText w;
  w.begin_array();
  w.value(std::nan(""));
  w.value(std::numeric_limits<double>::infinity());
  w.end_array();
  EXPECT_EQ(w.str(), "[null,null]");
}

TEST(JsonWriter, RawSplicesAValueWrittenBefore) {
  JsonText inner;
  inner.begin_object();
  inner.key("a");
  inner.value(1);
  inner.end_object();
  JsonText w;
  w.begin_object();
  w.key("first");
  w.raw(inner.str());
  w.key("second");
  w.begin_array();
  w.raw("true");
  w.raw(inner.str());
  w.end_array();
  w.end_object();
  EXPECT_EQ(w.str(), R"({"first":{"a":1},"second":[true,{"a":1}]})");
}

}  // namespace
