// The agent's outbox on disk: durable before emit() returns, survives a
// crash mid-append, bounded, and compacted once delivered.
#include "agent/link/spool.hpp"

#include <fstream>

#include <gtest/gtest.h>

#include "tests/support/test_support.hpp"

using factory::agent::EventSpool;
using factory::testing::TempDir;
using factory::testing::slurp;

TEST(Spool, EmitsDurablyAndReplaysUnackedAfterReopen) {
  TempDir dir("spool");
  {
    auto s = EventSpool::open(dir.path(), 100);
    ASSERT_TRUE(s.ok()) << s.error().message;
    for (int i = 1; i <= 5; ++i) {
      auto id = (*s)->emit({{"kind", "test"}, {"n", i}});
      ASSERT_TRUE(id.ok());
      EXPECT_EQ(*id, static_cast<uint64_t>(i));
    }
    ASSERT_TRUE((*s)->ack_through(3).ok());
  }
  // As after a crash: a fresh process opens the same directory.
  auto s = EventSpool::open(dir.path(), 100);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->acked(), 3u);
  auto pending = (*s)->pending_after(0, 100);
  ASSERT_EQ(pending.size(), 2u);
  EXPECT_EQ(pending[0].id, 4u);
  EXPECT_EQ(pending[0].body["n"], 4);
  EXPECT_FALSE(pending[0].body.value("time", "").empty());
  // Ids keep counting from where they were: never reused.
  EXPECT_EQ(*(*s)->emit({{"kind", "test"}}), 6u);
}

TEST(Spool, ATornLastRecordIsCutAndTheRestKept) {
  TempDir dir("spool");
  {
    auto s = EventSpool::open(dir.path(), 100);
    ASSERT_TRUE((*s)->emit({{"kind", "a"}}).ok());
    ASSERT_TRUE((*s)->emit({{"kind", "b"}}).ok());
  }
  {
    std::ofstream f(dir.path() / "spool.log", std::ios::app);
    f << R"({"id":3,"kind":"c","ti)";  // the process died here
  }
  auto s = EventSpool::open(dir.path(), 100);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ((*s)->pending(), 2u);
  EXPECT_EQ(*(*s)->emit({{"kind", "c"}}), 3u);
  auto log = slurp(dir.path() / "spool.log");
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 3);
}

TEST(Spool, BoundedDropsTheOldestAndCountsThem) {
  TempDir dir("spool");
  auto s = EventSpool::open(dir.path(), 16);
  for (int i = 0; i < 40; ++i) ASSERT_TRUE((*s)->emit({{"kind", "test"}, {"n", i}}).ok());
  EXPECT_EQ((*s)->pending(), 16u);
  EXPECT_EQ((*s)->dropped(), 24u);
  auto p = (*s)->pending_after(0, 100);
  EXPECT_EQ(p.front().id, 25u);
  EXPECT_EQ(p.back().id, 40u);
}

TEST(Spool, DeliveredHistoryIsCompactedAway) {
  TempDir dir("spool");
  auto s = EventSpool::open(dir.path(), 10000);
  for (int i = 0; i < 600; ++i) ASSERT_TRUE((*s)->emit({{"kind", "test"}}).ok());
  ASSERT_TRUE((*s)->ack_through(590).ok());
  auto log = slurp(dir.path() / "spool.log");
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 10) << "only the undelivered tail stays";
  auto again = EventSpool::open(dir.path(), 10000);
  EXPECT_EQ((*again)->pending(), 10u);
  EXPECT_EQ((*again)->last_id(), 600u);
}

TEST(Spool, AnEventTooBigForAFrameKeepsItsTail) {
  TempDir dir("spool");
  auto s = EventSpool::open(dir.path(), 100);
  std::string out(200000, 'x');
  out += "E: the error is at the end";
  ASSERT_TRUE((*s)->emit({{"kind", "progress"}, {"output_tail", out}}).ok());
  auto e = (*s)->pending_after(0, 1).front().body;
  EXPECT_LT(e.dump().size(), 64u * 1024);
  EXPECT_NE(e["output_tail"].get<std::string>().find("the error is at the end"), std::string::npos);
}

TEST(Spool, FilesArePrivate) {
  TempDir dir("spool");
  auto s = EventSpool::open(dir.path() / "sub", 100);
  ASSERT_TRUE((*s)->emit({{"kind", "x"}}).ok());
  ASSERT_TRUE((*s)->ack_through(1).ok());
  namespace fs = std::filesystem;
  for (auto p : {dir.path() / "sub", dir.path() / "sub" / "spool.log", dir.path() / "sub" / "spool.acked"})
    EXPECT_EQ(fs::status(p).permissions() & (fs::perms::group_all | fs::perms::others_all),
              fs::perms::none) << p;
}
