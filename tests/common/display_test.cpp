// The display sanitizer (common/display.hpp): what a terminal could act on
// is shown escaped, everything else passes unchanged.
#include "common/display.hpp"

#include <gtest/gtest.h>

using factory::display::columns;
using factory::display::is_display_safe;
using factory::display::sanitize;

TEST(Display, OrdinaryTextPassesUnchanged) {
  for (std::string s : {"", "tenant-1", "NVIDIA L4 (580.126.20)", "pulling llama3.2:1b: 42%",
                        "gpu \u2014 \u00e9t\u00e9 \u65e5\u672c \U0001F680", "C:\\path\\x1b"}) {
    EXPECT_TRUE(is_display_safe(s)) << s;
    EXPECT_EQ(sanitize(s), s);
  }
}

TEST(Display, C0ControlsAndDelAreEscaped) {
  EXPECT_EQ(sanitize("\x1b[2Jgone\x07"), "\\x1b[2Jgone\\x07");
  EXPECT_EQ(sanitize("a\r\nb\tc"), "a\\r\\nb\\tc");
  EXPECT_EQ(sanitize(std::string("nul\0here", 8)), "nul\\x00here");
  EXPECT_EQ(sanitize("del\x7f"), "del\\x7f");
  EXPECT_FALSE(is_display_safe("\x1b]0;owned\x07"));
}

TEST(Display, C1ControlsAreEscaped) {
  // U+009B is CSI for a terminal that takes 8-bit controls.
  EXPECT_EQ(sanitize("\xc2\x9b"
                     "31m red"),
            "\\u009b31m red");
  EXPECT_EQ(sanitize("\xc2\x85"), "\\u0085");
  EXPECT_EQ(sanitize("\xc2\xa0"), "\xc2\xa0") << "U+00A0 is printable";
}

TEST(Display, BidiControlsAreEscaped) {
  // The Trojan Source overrides and isolates, and the marks.
  EXPECT_EQ(sanitize("admin\xe2\x80\xae"
                     "txt.exe"),
            "admin\\u202etxt.exe");
  for (unsigned cp : {0x202Au, 0x202Bu, 0x202Cu, 0x202Du, 0x202Eu, 0x2066u, 0x2067u, 0x2068u,
                      0x2069u, 0x200Eu, 0x200Fu, 0x2028u, 0x2029u}) {
    std::string s;
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
    char want[8];
    std::snprintf(want, sizeof want, "\\u%04x", cp);
    EXPECT_EQ(sanitize(s), want);
  }
  EXPECT_EQ(sanitize("\xd8\x9c"), "\\u061c");
}

TEST(Display, InvalidUtf8IsEscapedByteByByte) {
  EXPECT_EQ(sanitize("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(sanitize("\xc0\xaf"), "\\xc0\\xaf") << "overlong '/'";
  EXPECT_EQ(sanitize("\xed\xa0\x80"), "\\xed\\xa0\\x80") << "a surrogate";
  EXPECT_EQ(sanitize("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80") << "past U+10FFFF";
  EXPECT_EQ(sanitize("cut \xe2\x82"), "cut \\xe2\\x82") << "a sequence cut short";
  EXPECT_EQ(sanitize("\xe2\x82\xac"), "\xe2\x82\xac") << "the euro sign is fine";
}

TEST(Display, TheResultIsAlwaysSafe) {
  // Every single byte and every pair: what comes out has nothing left to escape.
  for (int a = 0; a < 256; ++a) {
    std::string one(1, static_cast<char>(a));
    EXPECT_TRUE(is_display_safe(sanitize(one))) << a;
    for (int b = 0; b < 256; b += 7) {
      std::string two = one + static_cast<char>(b);
      EXPECT_TRUE(is_display_safe(sanitize(two))) << a << " " << b;
    }
  }
}

TEST(Display, ColumnsCountCodePoints) {
  EXPECT_EQ(columns("abc"), 3u);
  EXPECT_EQ(columns("\xc3\xa9t\xc3\xa9"), 3u);
  EXPECT_EQ(columns(sanitize("\x1b")), 4u);
}
