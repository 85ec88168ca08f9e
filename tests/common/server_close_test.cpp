// The server's two decisions that hold no connection: how a connection ends
// (decide_close, common/net/server_close.hpp) and who is admitted
// (Admission, common/net/server_admission.hpp). The server's own tests
// (server_test.cpp) show the same rules through real TLS connections on
// loopback; these pin the table itself, case by case.
#include "common/net/server_close.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <thread>

#include "common/net/server_admission.hpp"
#include "common/net/ws_codec.hpp"

namespace factory::net {
namespace {

using Kind = CloseAction::Kind;
using Count = CloseAction::Count;
using Phase = CloseContext::Phase;

CloseContext in(Phase p, bool stranger = false) {
  CloseContext c;
  c.phase = p;
  c.stranger = stranger;
  c.stranger_deadline = std::chrono::seconds(10);
  return c;
}

TEST(DecideClose, APeersCloseFrameIsAnsweredAndHeardAsThePeers) {
  auto a = decide_close(CloseReason::closed_by_peer, {1000, "bye"}, in(Phase::websocket));
  EXPECT_EQ(a.kind, Kind::close_frame);
  EXPECT_TRUE(a.info.by_peer);
  EXPECT_EQ(a.info.code, 1000);
  EXPECT_EQ(a.info.reason, "bye");
  EXPECT_EQ(a.count, Count::none);
}

TEST(DecideClose, OnceClosingTheApplicationsCloseWaitsButADeadlineCuts) {
  EXPECT_EQ(decide_close(CloseReason::closed_by_application, {1008, "x"}, in(Phase::closing)).kind,
            Kind::none);
  auto d = decide_close(CloseReason::deadline, {}, in(Phase::closing));
  EXPECT_EQ(d.kind, Kind::cut);
  EXPECT_EQ(d.count, Count::deadline);
  EXPECT_EQ(decide_close(CloseReason::peer_hung_up, {}, in(Phase::closing)).kind, Kind::cut);
  EXPECT_EQ(decide_close(CloseReason::server_stopping, {}, in(Phase::closing)).kind, Kind::cut);
}

TEST(DecideClose, AStrangersDeadlineSaysWhatItNeededToDo) {
  auto a = decide_close(CloseReason::deadline, {}, in(Phase::websocket, true));
  EXPECT_EQ(a.kind, Kind::close_frame);
  EXPECT_EQ(a.info.code, ws::close_code::policy);
  EXPECT_EQ(a.info.reason, "stranger deadline: no certificate, enroll within 10s");
  EXPECT_EQ(a.count, Count::deadline);
  EXPECT_EQ(decide_close(CloseReason::deadline, {}, in(Phase::websocket)).info.reason,
            "deadline passed");
}

TEST(DecideClose, AnOversizeFrameIsCountedAndLoggedAsTheOperatorsBusiness) {
  auto a = decide_close(CloseReason::protocol_violation, {ws::close_code::too_big, "too big"},
                        in(Phase::websocket));
  EXPECT_EQ(a.kind, Kind::close_frame);
  EXPECT_EQ(a.info.code, ws::close_code::too_big);
  EXPECT_EQ(a.count, Count::oversize);
  EXPECT_TRUE(a.warn);
  auto b = decide_close(CloseReason::protocol_violation, {ws::close_code::protocol_error, "bad"},
                        in(Phase::websocket));
  EXPECT_EQ(b.count, Count::none);
}

TEST(DecideClose, WithoutAWebsocketEveryEndIsACut) {
  for (auto why : {CloseReason::closed_by_application, CloseReason::handler_failed,
                   CloseReason::idle_timeout, CloseReason::deadline, CloseReason::server_stopping,
                   CloseReason::peer_hung_up, CloseReason::handshake_failed})
    EXPECT_EQ(decide_close(why, {}, in(Phase::before_websocket)).kind, Kind::cut)
        << close_reason_name(why);
}

TEST(DecideClose, AConnectionLostUnderAWebsocketIsHeardAsAbnormal) {
  auto a = decide_close(CloseReason::peer_hung_up, {}, in(Phase::websocket));
  EXPECT_EQ(a.kind, Kind::cut);
  EXPECT_EQ(a.info.code, ws::close_code::abnormal);
  EXPECT_FALSE(a.info.by_peer);
  auto w = decide_close(CloseReason::write_failed, {0, "write"}, in(Phase::websocket));
  EXPECT_EQ(w.info.code, ws::close_code::abnormal);
  EXPECT_EQ(w.info.reason, "connection lost");
  auto h = decide_close(CloseReason::handshake_failed, {0, ""}, in(Phase::before_websocket));
  EXPECT_EQ(h.count, Count::handshake_failure);
  EXPECT_EQ(h.log, "TLS handshake failed: connection closed");
}

TEST(DecideClose, StoppingTheServerIsGoingAway) {
  auto a = decide_close(CloseReason::server_stopping, {}, in(Phase::websocket));
  EXPECT_EQ(a.kind, Kind::close_frame);
  EXPECT_EQ(a.info.code, ws::close_code::going_away);
  auto b = decide_close(CloseReason::server_stopped, {}, in(Phase::websocket));
  EXPECT_EQ(b.kind, Kind::cut);
  EXPECT_EQ(b.info.code, ws::close_code::going_away);
}

class AdmissionTest : public ::testing::Test {
 protected:
  Admission::Socket socket() { return Admission::Socket(io_); }
  boost::asio::io_context io_;
};

TEST_F(AdmissionTest, AnAddressPastItsConnectionsIsRefusedUntilOneCloses) {
  ServerOptions o;
  o.max_connections_per_address = 2;
  Admission a(o);
  EXPECT_TRUE(a.take_address("10.0.0.1"));
  EXPECT_TRUE(a.take_address("10.0.0.1"));
  EXPECT_FALSE(a.take_address("10.0.0.1"));
  EXPECT_TRUE(a.take_address("10.0.0.2"));
  a.release_address("10.0.0.1");
  EXPECT_TRUE(a.take_address("10.0.0.1"));
}

TEST_F(AdmissionTest, AStrangerPastItsAddressesShareWaitsAndTakesTheNextSlot) {
  ServerOptions o;
  o.strangers.max_per_address = 1;
  o.strangers.max_waiting = 1;
  Admission a(o);
  auto s1 = socket(), s2 = socket(), s3 = socket();
  EXPECT_EQ(a.take_stranger_slot("10.0.0.1", s1, 0), Admission::Slot::granted);
  EXPECT_EQ(a.take_stranger_slot("10.0.0.1", s2, 1), Admission::Slot::waiting);
  // The queue is full: a third is refused, not queued.
  EXPECT_EQ(a.take_stranger_slot("10.0.0.1", s3, 0), Admission::Slot::refused);
  EXPECT_EQ(a.strangers_open(), 1u);
  EXPECT_EQ(a.strangers_waiting(), 1u);
  auto r = a.release_stranger_slot("10.0.0.1", false);
  ASSERT_TRUE(r.next);
  EXPECT_EQ(r.next->thread, 1u);
  EXPECT_EQ(a.strangers_open(), 1u);  // passed on, not given back
  EXPECT_EQ(a.strangers_waiting(), 0u);
  auto r2 = a.release_stranger_slot("10.0.0.1", false);
  EXPECT_FALSE(r2.next);
  EXPECT_EQ(a.strangers_open(), 0u);
}

TEST_F(AdmissionTest, OneWhoWaitedPastAStrangersDeadlineIsClosedNotStarted) {
  ServerOptions o;
  o.strangers.max_per_address = 1;
  o.strangers.deadline = std::chrono::seconds(0);
  Admission a(o);
  auto s1 = socket(), s2 = socket();
  ASSERT_EQ(a.take_stranger_slot("10.0.0.1", s1, 0), Admission::Slot::granted);
  ASSERT_EQ(a.take_stranger_slot("10.0.0.1", s2, 0), Admission::Slot::waiting);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto r = a.release_stranger_slot("10.0.0.1", false);
  EXPECT_FALSE(r.next);
  EXPECT_EQ(r.expired.size(), 1u);
  EXPECT_EQ(a.strangers_open(), 0u);
}

TEST_F(AdmissionTest, FullHandshakesPauseTheAcceptorUntilOneEnds) {
  ServerOptions o;
  o.max_handshakes = 1;
  Admission a(o);
  EXPECT_TRUE(a.room_or_pause());
  a.handshake_started();
  EXPECT_FALSE(a.room_or_pause());
  EXPECT_TRUE(a.handshake_ended());   // paused, and room again: resume
  EXPECT_FALSE(a.handshake_ended());  // not paused: nothing to resume
}

}  // namespace
}  // namespace factory::net
