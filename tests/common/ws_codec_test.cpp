// The websocket codec on bytes: what RFC 6455 says a server must accept and
// refuse, fed in every split the network could produce.
#include "common/net/ws_codec.hpp"

#include <gtest/gtest.h>

namespace factory::net::ws {
namespace {

const std::uint8_t kMask[4] = {0x37, 0xfa, 0x21, 0x3d};

std::vector<Message> feed_all(Decoder& d, std::string_view bytes, bool* ok = nullptr) {
  std::vector<Message> out;
  bool r = d.feed(bytes, out);
  if (ok) *ok = r;
  return out;
}

TEST(WsCodec, RfcExampleMaskedHelloIsOneTextMessage) {
  // RFC 6455 5.7: a single-frame masked text message containing "Hello".
  const unsigned char frame[] = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58};
  Decoder d(1024);
  auto msgs = feed_all(d, std::string_view(reinterpret_cast<const char*>(frame), sizeof frame));
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_EQ(msgs[0].op, Opcode::text);
  EXPECT_EQ(msgs[0].payload, "Hello");
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(WsCodec, EverySplitOfTwoFramesGivesTheSameMessages) {
  std::string big(70000, 'x');  // 64-bit length form
  std::string mid(300, 'y');    // 16-bit length form
  std::string bytes = encode_client_frame(Opcode::text, mid, kMask) +
                      encode_client_frame(Opcode::binary, big, kMask) +
                      encode_client_frame(Opcode::ping, "p", kMask);
  for (std::size_t cut : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7},
                          std::size_t{150}, std::size_t{305}, std::size_t{306}, bytes.size() - 1}) {
    Decoder d(1 << 20);
    std::vector<Message> out;
    ASSERT_TRUE(d.feed(std::string_view(bytes).substr(0, cut), out));
    ASSERT_TRUE(d.feed(std::string_view(bytes).substr(cut), out));
    ASSERT_EQ(out.size(), 3u) << "cut at " << cut;
    EXPECT_EQ(out[0].payload, mid);
    EXPECT_EQ(out[1].op, Opcode::binary);
    EXPECT_EQ(out[1].payload, big);
    EXPECT_EQ(out[2].op, Opcode::ping);
    EXPECT_EQ(d.buffered(), 0u);
  }
}

TEST(WsCodec, ByteByByteFragmentedMessageWithControlFrameInBetween) {
  std::string bytes = encode_client_frame(Opcode::text, "hel", kMask, false) +
                      encode_client_frame(Opcode::ping, "!", kMask) +
                      encode_client_frame(Opcode::continuation, "lo", kMask, true);
  Decoder d(1024);
  std::vector<Message> out;
  for (char c : bytes) ASSERT_TRUE(d.feed(std::string_view(&c, 1), out));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].op, Opcode::ping);
  EXPECT_EQ(out[1].payload, "hello");
}

TEST(WsCodec, UnmaskedClientFrameIsAProtocolError) {
  std::string f = encode_frame(Opcode::text, "hi");  // server frames are unmasked
  Decoder d(1024);
  bool ok = true;
  feed_all(d, f, &ok);
  EXPECT_FALSE(ok);
  EXPECT_EQ(d.violation().code, close_code::protocol_error);
  // Spent: a later call fails the same way.
  std::vector<Message> out;
  EXPECT_FALSE(d.feed(encode_client_frame(Opcode::text, "x", kMask), out));
}

TEST(WsCodec, OversizeMessageIsRefusedOnItsHeaderAlone) {
  // Only the 10-byte header of a frame announcing 1 MiB: refused before any
  // payload arrives, so no memory is ever given to it.
  std::string f = encode_client_frame(Opcode::text, std::string(1 << 20, 'a'), kMask);
  Decoder d(64 * 1024);
  bool ok = true;
  feed_all(d, std::string_view(f).substr(0, 14), &ok);
  EXPECT_FALSE(ok);
  EXPECT_EQ(d.violation().code, close_code::too_big);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(WsCodec, FragmentsAddUpAgainstTheLimit) {
  Decoder d(10);
  std::vector<Message> out;
  ASSERT_TRUE(d.feed(encode_client_frame(Opcode::text, "123456", kMask, false), out));
  EXPECT_FALSE(d.feed(encode_client_frame(Opcode::continuation, "78901", kMask, true), out));
  EXPECT_EQ(d.violation().code, close_code::too_big);
}

TEST(WsCodec, InvalidUtf8TextIs1007) {
  Decoder d(1024);
  bool ok = true;
  feed_all(d, encode_client_frame(Opcode::text, "\xc3\x28", kMask), &ok);
  EXPECT_FALSE(ok);
  EXPECT_EQ(d.violation().code, close_code::invalid_payload);
  // A sequence cut between fragments is fine once whole.
  Decoder d2(1024);
  std::vector<Message> out;
  ASSERT_TRUE(d2.feed(encode_client_frame(Opcode::text, "\xe2\x82", kMask, false), out));
  ASSERT_TRUE(d2.feed(encode_client_frame(Opcode::continuation, "\xac", kMask, true), out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].payload, "\xe2\x82\xac");
}

TEST(WsCodec, ProtocolViolations) {
  struct Case {
    const char* name;
    std::string bytes;
  };
  std::string long_ping = encode_client_frame(Opcode::ping, std::string(126, 'p'), kMask);
  std::string frag_ping = encode_client_frame(Opcode::ping, "p", kMask, false);
  std::string rsv = encode_client_frame(Opcode::text, "x", kMask);
  rsv[0] = static_cast<char>(rsv[0] | 0x40);
  std::string opcode3 = encode_client_frame(Opcode::text, "x", kMask);
  opcode3[0] = static_cast<char>(0x83);
  std::string lone_cont = encode_client_frame(Opcode::continuation, "x", kMask);
  std::string nested = encode_client_frame(Opcode::text, "a", kMask, false) +
                       encode_client_frame(Opcode::text, "b", kMask);
  std::string one_byte_close = encode_client_frame(Opcode::close, "x", kMask);
  std::string bad_code =
      encode_client_frame(Opcode::close, std::string("\x03\xed", 2), kMask);  // 1005
  for (const Case& c :
       {Case{"long ping", long_ping}, Case{"fragmented ping", frag_ping}, Case{"rsv bit", rsv},
        Case{"opcode 3", opcode3}, Case{"lone continuation", lone_cont},
        Case{"nested message", nested}, Case{"one-byte close", one_byte_close},
        Case{"close code 1005", bad_code}}) {
    Decoder d(1024);
    bool ok = true;
    feed_all(d, c.bytes, &ok);
    EXPECT_FALSE(ok) << c.name;
    EXPECT_EQ(d.violation().code, close_code::protocol_error) << c.name;
  }
}

TEST(WsCodec, CloseFrameCarriesCodeAndReason) {
  std::string payload("\x03\xe9", 2);  // 1001
  payload += "rebooting";
  Decoder d(1024);
  auto msgs = feed_all(d, encode_client_frame(Opcode::close, payload, kMask));
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_EQ(msgs[0].op, Opcode::close);
  EXPECT_EQ(msgs[0].close_code, 1001);
  EXPECT_EQ(msgs[0].payload, "rebooting");
  auto empty = feed_all(d, encode_client_frame(Opcode::close, "", kMask));
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0].close_code, close_code::no_status);
}

TEST(WsCodec, EncodeCloseCutsTheReasonOnACharacterBoundary) {
  std::string reason(122, 'a');
  reason += "\xe2\x82\xac";  // a 3-byte character straddling the 123-byte limit
  std::string f = encode_close(1008, reason);
  ASSERT_EQ(static_cast<unsigned char>(f[0]), 0x88);
  std::size_t len = static_cast<unsigned char>(f[1]);
  EXPECT_LE(len, 125u);
  EXPECT_TRUE(valid_utf8(std::string_view(f).substr(4)));
  EXPECT_EQ(f.substr(4), std::string(122, 'a'));
}

TEST(WsCodec, Utf8Validation) {
  EXPECT_TRUE(valid_utf8("plain ascii"));
  EXPECT_TRUE(valid_utf8("\xf0\x9f\x98\x80"));   // U+1F600
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));      // a UTF-16 surrogate
  EXPECT_FALSE(valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(valid_utf8("\xe2\x82"));          // cut short
}

TEST(WsCodec, AcceptKeyFromTheRfc) {
  EXPECT_EQ(accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

}  // namespace
}  // namespace factory::net::ws
