// PlanJournal on its own: round trip, checksum, schema, the files it keeps.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "agent/plan/journal.hpp"
#include "common/atomic_file.hpp"
#include "common/catalog.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::agent;
using factory::testing::TempDir;
using nlohmann::json;

namespace {

JournalState sample() {
  json plan = {
      {"tier", "gpu-vm"},
      {"steps",
       {{{"id", "gpu"}, {"kind", "gpu_present"}, {"params", json::object()}},
        {{"id", "driver"}, {"kind", "nvidia_driver"}, {"params", {{"version", "615.71.09"}}}}}}};
  JournalState st;
  st.plan = plan;
  st.plan_hash = factory::catalog::plan_hash(plan);
  st.tier = "gpu-vm";
  StepRecord a;
  a.id = "gpu";
  a.kind = "gpu_present";
  a.state = StepState::succeeded;
  a.skipped = true;
  StepRecord b;
  b.id = "driver";
  b.kind = "nvidia_driver";
  b.state = StepState::reboot_requested;
  b.boot_id = "2f1c0d6e-6f0a-4b7e-9d36-0c2b5d1f8e11";
  b.reboot_requests = 1;
  b.attempts = 1;
  b.entries = 0;
  b.message = "installed; rebooting";
  b.diagnosis = {{"code", "driver_reboot_pending"}};
  st.steps = {a, b};
  return st;
}

}  // namespace

TEST(PlanJournal, RoundTripsEveryField) {
  TempDir dir;
  PlanJournal j(dir / "plan");
  EXPECT_EQ(j.load().kind, PlanJournal::Loaded::Kind::missing);
  JournalState st = sample();
  ASSERT_TRUE(j.save(st).ok());
  EXPECT_FALSE(st.updated_at.empty());
  EXPECT_EQ(st.created_at, st.updated_at);
  auto loaded = j.load();
  ASSERT_EQ(loaded.kind, PlanJournal::Loaded::Kind::ok) << loaded.problem;
  EXPECT_EQ(loaded.state.to_json(), st.to_json());
  EXPECT_EQ(loaded.state.steps[1].state, StepState::reboot_requested);
  EXPECT_EQ(loaded.state.steps[1].boot_id, "2f1c0d6e-6f0a-4b7e-9d36-0c2b5d1f8e11");
  EXPECT_EQ(loaded.state.steps_done(), 1u);
  // The agent's state: readable by root only.
  struct stat sb {};
  ASSERT_EQ(::stat(j.file().c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
}

TEST(PlanJournal, DetectsDamage) {
  TempDir dir;
  PlanJournal j(dir / "plan");
  JournalState st = sample();
  ASSERT_TRUE(j.save(st).ok());
  std::string text = factory::testing::slurp(j.file());

  auto problem = [&](const std::string& damaged) {
    auto r = PlanJournal::parse(damaged);
    return r.ok() ? std::string("ok") : r.error().message;
  };
  EXPECT_EQ(problem(text), "ok");
  // Re-indenting does not matter: the checksum is over the canonical form.
  EXPECT_EQ(problem(json::parse(text).dump()), "ok");
  EXPECT_EQ(problem(text.substr(0, text.size() - 10)), "not valid JSON (truncated?)");
  json doc = json::parse(text);
  doc["steps"][1]["boot_id"] = "another";
  EXPECT_EQ(problem(doc.dump()), "checksum mismatch (the file was altered or damaged)");
  doc = json::parse(text);
  doc.erase("checksum");
  EXPECT_EQ(problem(doc.dump()), "no checksum");
  // A consistent file whose plan is not the one its hash names.
  doc = json::parse(text);
  doc["plan"]["tier"] = "gpu-k8s";
  doc.erase("checksum");
  doc["checksum"] = factory::catalog::sha256_hex(factory::catalog::canonical_json(doc));
  EXPECT_EQ(problem(doc.dump()), "stored plan does not match its hash");
  // Records that do not match the plan's steps.
  doc = json::parse(text);
  doc["steps"].erase(1);
  doc.erase("checksum");
  doc["checksum"] = factory::catalog::sha256_hex(factory::catalog::canonical_json(doc));
  EXPECT_EQ(problem(doc.dump()), "step records do not match the plan");
  doc = json::parse(text);
  doc["steps"][0]["state"] = "exploded";
  doc.erase("checksum");
  doc["checksum"] = factory::catalog::sha256_hex(factory::catalog::canonical_json(doc));
  EXPECT_EQ(problem(doc.dump()), "step 'gpu' has unknown state 'exploded'");

  ASSERT_TRUE(factory::write_file_atomic(j.file(), "[1,2").ok());
  auto loaded = j.load();
  EXPECT_EQ(loaded.kind, PlanJournal::Loaded::Kind::corrupt);
  EXPECT_EQ(loaded.problem, "not valid JSON (truncated?)");
}

TEST(PlanJournal, ArchiveAndQuarantineKeepTheOldFile) {
  TempDir dir;
  PlanJournal j(dir / "plan");
  JournalState st = sample();
  ASSERT_TRUE(j.save(st).ok());
  std::string text = factory::testing::slurp(j.file());
  ASSERT_TRUE(j.archive().ok());
  EXPECT_FALSE(std::filesystem::exists(j.file()));
  EXPECT_EQ(factory::testing::slurp(j.prev_file()), text);
  ASSERT_TRUE(j.save(st).ok());
  ASSERT_TRUE(j.quarantine().ok());
  EXPECT_TRUE(std::filesystem::exists(j.corrupt_file()));
  EXPECT_TRUE(j.archive().ok());  // nothing to move: not an error
}

TEST(PlanJournal, OutputTailIsCapped) {
  TempDir dir;
  PlanJournal j(dir / "plan");
  JournalState st = sample();
  st.steps[1].output_tail = std::string(100000, 'x') + "the end";
  ASSERT_TRUE(j.save(st).ok());
  auto loaded = j.load();
  ASSERT_EQ(loaded.kind, PlanJournal::Loaded::Kind::ok);
  EXPECT_EQ(loaded.state.steps[1].output_tail.size(), PlanJournal::kMaxTail);
  EXPECT_EQ(loaded.state.steps[1].output_tail.substr(PlanJournal::kMaxTail - 7), "the end");
}

TEST(PlanJournal, ResetClearsARecordButItsName) {
  StepRecord r = sample().steps[1];
  r.reset();
  EXPECT_EQ(r.id, "driver");
  EXPECT_EQ(r.kind, "nvidia_driver");
  EXPECT_EQ(r.state, StepState::pending);
  EXPECT_EQ(r.reboot_requests, 0);
  EXPECT_TRUE(r.boot_id.empty());
  EXPECT_TRUE(r.diagnosis.is_null());
}
