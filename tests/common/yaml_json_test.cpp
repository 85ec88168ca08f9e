// to_yaml (common/yaml_json.hpp) keeps every string exact: what a guest
// reported, control characters and all, reads back byte for byte, and the
// text stays YAML that a parser other than yaml-cpp accepts.
#include "common/yaml_json.hpp"

#include <gtest/gtest.h>

#include "common/subprocess.hpp"

using nlohmann::json;

namespace {
const std::vector<std::string> kStrings = {
    "plain",
    "two\nlines\n",
    "no final newline\nhere",
    "trailing blank lines\n\n\n",
    "  indented first line\nsecond\n",
    "\x1b[2J\x1b]0;owned\x07\r\nfake line \xe2\x80\xae"
    "gnp.exe \xc2\x9b"
    "31m\x7f",
    "tab\there\n",
    "quote \" and backslash \\ and colon: x",
    "",
    std::string("nul\0byte", 8),
};
}  // namespace

TEST(ToYaml, EveryStringReadsBackExactly) {
  json doc = json::object();
  int i = 0;
  for (const auto& s : kStrings) doc["s" + std::to_string(i++)] = s;
  doc["list"] = kStrings;
  doc["odd key \x1b"] = 1;
  const std::string text = factory::to_yaml(doc);
  auto back = factory::parse_yaml(text, "round trip");
  ASSERT_TRUE(back.ok()) << back.error().message << "\n" << text;
  EXPECT_EQ(*back, doc) << text;
  EXPECT_EQ(text.find('\x7f'), std::string::npos) << "DEL is escaped";
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << "ESC is escaped";
  EXPECT_NE(text.find("s1: |\n  two\n  lines\n"), std::string::npos)
      << "text that a block keeps exactly is still a block:\n"
      << text;

  // Python's YAML parser (stricter about what may appear raw) agrees.
  factory::CommandSpec py;
  py.argv = {"/usr/bin/python3", "-c",
             "import sys, yaml, json; print(json.dumps(yaml.safe_load(sys.stdin.read())))"};
  py.stdin_data = text;
  auto r = factory::run_command(py);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->exit_code, 0) << r->output << text;
  EXPECT_EQ(json::parse(r->output), doc);
}
