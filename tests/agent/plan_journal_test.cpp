// PlanJournal on its own: round trip, checksum, schema, the files it keeps.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "agent/plan/journal.hpp"
#include "common/atomic_file.hpp"
#include "contract/catalog.hpp"
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

namespace {

// The journal's lines: the header, then one record per step.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    out.push_back(text.substr(pos, nl - pos));
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (auto& l : lines) out += l + "\n";
  return out;
}

// A line with its checksum made right again, as a consistent writer would.
std::string resealed(json line) {
  line.erase("checksum");
  line["checksum"] = factory::catalog::sha256_hex(factory::catalog::canonical_json(line));
  return line.dump();
}

}  // namespace

TEST(PlanJournal, DetectsADamagedHeader) {
  TempDir dir;
  PlanJournal j(dir / "plan");
  JournalState st = sample();
  ASSERT_TRUE(j.save(st).ok());
  std::string text = factory::testing::slurp(j.file());
  auto lines = lines_of(text);
  ASSERT_EQ(lines.size(), 3u) << "a header and one line per step";

  auto problem = [&](const std::string& damaged) {
    auto r = PlanJournal::parse(damaged);
    return r.ok() ? std::string("ok") : r.error().message;
  };
  EXPECT_EQ(problem(text), "ok");
  // Re-indenting a line does not matter: each checksum is over the canonical form.
  auto reindented = lines;
  reindented[0] = json::parse(lines[0]).dump(-1);
  EXPECT_EQ(problem(joined(reindented)), "ok");
  EXPECT_EQ(problem(text.substr(0, lines[0].size() / 2)), "not valid JSON (truncated?)");
  EXPECT_EQ(problem(""), "the file is empty");
  json head = json::parse(lines[0]);
  auto with_head = [&](const std::string& h) {
    auto l = lines;
    l[0] = h;
    return joined(l);
  };
  json edited = head;
  edited["state"] = "succeeded";
  EXPECT_EQ(problem(with_head(edited.dump())),
            "checksum mismatch (the file was altered or damaged)");
  edited = head;
  edited.erase("checksum");
  EXPECT_EQ(problem(with_head(edited.dump())), "no checksum");
  edited = head;
  edited["schema"] = "factory.plan-journal/v1";
  EXPECT_EQ(problem(with_head(resealed(edited))), "schema is not factory.plan-journal/v2");
  // A consistent header whose plan is not the one its hash names.
  edited = head;
  edited["plan"]["tier"] = "gpu-k8s";
  EXPECT_EQ(problem(with_head(resealed(edited))), "stored plan does not match its hash");
  edited = head;
  edited["steps"] = 3;
  EXPECT_EQ(problem(with_head(resealed(edited))), "step records do not match the plan");

  ASSERT_TRUE(factory::write_file_atomic(j.file(), "[1,2").ok());
  auto loaded = j.load();
  EXPECT_EQ(loaded.kind, PlanJournal::Loaded::Kind::corrupt);
  EXPECT_EQ(loaded.problem, "not valid JSON (truncated?)");
}

TEST(PlanJournal, ADamagedStepRecordCostsOnlyItsStepAndKeepsTheRecordsAfterIt) {
  TempDir dir;
  PlanJournal j(dir / "plan");
  // Three steps: the middle record is the one damaged.
  JournalState st = sample();
  st.plan["steps"].push_back(
      {{"id", "model"}, {"kind", "ollama_model"}, {"params", json::object()}});
  st.plan_hash = factory::catalog::plan_hash(st.plan);
  StepRecord c;
  c.id = "model";
  c.kind = "ollama_model";
  c.state = StepState::succeeded;
  c.message = "pulled";
  st.steps.push_back(c);
  st.state = PlanState::succeeded;
  ASSERT_TRUE(j.save(st).ok());
  auto lines = lines_of(factory::testing::slurp(j.file()));
  ASSERT_EQ(lines.size(), 4u);

  struct Damage {
    const char* what;
    std::string line;
    const char* why;
  };
  json rec = json::parse(lines[2]);
  json flipped = rec;
  flipped["state"] = "succeeded";
  std::vector<Damage> damages = {
      {"bytes overwritten", std::string(lines[2].size(), '\x01'), "not valid JSON"},
      {"edited", flipped.dump(), "checksum mismatch"},
      {"another step's record", lines[1], "it is step 'gpu', the plan has 'driver' here"},
  };
  for (auto& d : damages) {
    SCOPED_TRACE(d.what);
    auto damaged = lines;
    damaged[2] = d.line;
    const std::string text = joined(damaged);
    ASSERT_TRUE(factory::write_file_atomic(j.file(), text, 0600).ok());
    auto loaded = j.load();
    ASSERT_EQ(loaded.kind, PlanJournal::Loaded::Kind::ok) << loaded.problem;
    // The records before and after the damage are kept as they were.
    EXPECT_EQ(loaded.state.steps[0].to_json(), st.steps[0].to_json());
    EXPECT_EQ(loaded.state.steps[2].to_json(), st.steps[2].to_json());
    // The damaged one starts over from its check.
    EXPECT_EQ(loaded.state.steps[1].id, "driver");
    EXPECT_EQ(loaded.state.steps[1].state, StepState::pending);
    EXPECT_EQ(loaded.state.steps[1].reboot_requests, 0);
    // A finished plan with a step it cannot vouch for runs again (checks
    // find what is done).
    EXPECT_EQ(loaded.state.state, PlanState::running);
    ASSERT_EQ(loaded.repairs.size(), 1u);
    const size_t offset = lines[0].size() + 1 + lines[1].size() + 1;
    EXPECT_EQ(loaded.repairs[0].rfind(j.file().string() + " offset " + std::to_string(offset) +
                                          ": the record of step 'driver' (2 of 3) is damaged (" +
                                          d.why + ")",
                                      0),
              0u)
        << loaded.repairs[0];
  }

  // A file cut short (by hand: the writer replaces it whole) loses the
  // records it no longer has, and nothing else.
  ASSERT_TRUE(factory::write_file_atomic(j.file(), joined({lines[0], lines[1]}), 0600).ok());
  auto cut = j.load();
  ASSERT_EQ(cut.kind, PlanJournal::Loaded::Kind::ok) << cut.problem;
  EXPECT_EQ(cut.state.steps[0].to_json(), st.steps[0].to_json());
  EXPECT_EQ(cut.state.steps[1].state, StepState::pending);
  EXPECT_EQ(cut.state.steps[2].state, StepState::pending);
  EXPECT_EQ(cut.repairs.size(), 2u);
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
