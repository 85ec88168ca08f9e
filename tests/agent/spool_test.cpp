// The agent's outbox on disk: durable before emit() returns, survives a
// crash mid-append, bounded, and compacted once delivered.
#include "agent/link/spool.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <sstream>

#include "common/atomic_file.hpp"
#include "tests/support/captured_log.hpp"
#include "tests/support/test_support.hpp"

using factory::agent::EventSpool;
using factory::testing::slurp;
using factory::testing::TempDir;

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

namespace {

using factory::testing::CapturedLog;

}  // namespace

TEST(Spool, ADamagedRecordInTheMiddleIsSkippedAndNothingAfterItIsCut) {
  TempDir dir("spool");
  {
    auto s = EventSpool::open(dir.path(), 100);
    for (int i = 1; i <= 6; ++i) ASSERT_TRUE((*s)->emit({{"kind", "test"}, {"n", i}}).ok());
    ASSERT_TRUE((*s)->ack_through(2).ok());
  }
  // Damage: record 2 (delivered already) and record 4 (not yet) overwritten
  // in place, as a bad sector would leave them; then a torn tail.
  const auto logp = dir.path() / "spool.log";
  std::string text = slurp(logp);
  std::vector<size_t> starts = {0};
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n' && i + 1 < text.size()) starts.push_back(i + 1);
  ASSERT_EQ(starts.size(), 6u);
  auto smash = [&](size_t line) {
    size_t end = text.find('\n', starts[line]);
    for (size_t i = starts[line]; i < end; ++i) text[i] = '\x01';
  };
  smash(1);  // id 2
  smash(3);  // id 4
  text += R"({"id":7,"kind":"test","ti)";
  ASSERT_TRUE(factory::write_file_atomic(logp, text, 0600).ok());

  CapturedLog log;
  {
    auto s = EventSpool::open(dir.path(), 100);
    ASSERT_TRUE(s.ok()) << s.error().message;
    std::vector<uint64_t> ids;
    for (auto& e : (*s)->pending_after(0, 100)) ids.push_back(e.id);
    EXPECT_EQ(ids, (std::vector<uint64_t>{3, 5, 6})) << "the records after the damage are kept";
    EXPECT_EQ((*s)->dropped(), 1u) << "record 4 was never delivered; record 2 was";
    EXPECT_EQ(*(*s)->emit({{"kind", "after"}}), 7u);
  }
  const std::string said = log.text();
  for (size_t line : {1, 3})
    EXPECT_NE(said.find(logp.string() + " offset " + std::to_string(starts[line]) +
                        ": skipping a damaged record"),
              std::string::npos)
        << said;
  EXPECT_NE(said.find("cutting a torn record"), std::string::npos) << said;

  // Repaired on disk: the next start reads it clean, with the count kept.
  CapturedLog again;
  auto s = EventSpool::open(dir.path(), 100);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->pending(), 4u);
  EXPECT_EQ((*s)->dropped(), 1u);
  EXPECT_EQ(again.text().find("damaged"), std::string::npos) << again.text();
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
  for (auto p :
       {dir.path() / "sub", dir.path() / "sub" / "spool.log", dir.path() / "sub" / "spool.acked"})
    EXPECT_EQ(fs::status(p).permissions() & (fs::perms::group_all | fs::perms::others_all),
              fs::perms::none)
        << p;
}
