// KubeClient::watch against the fake API server (tests/fakes/kube_apiserver.py),
// which streams watch events as kube-apiserver does (chunked JSON lines,
// bookmarks, ERROR 410 "too old resource version" after compaction) and can
// cut streams on demand: the situations a long-running coordinator meets when
// the API server restarts or its etcd compacts.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "coordinator/kube/client.hpp"
#include "tests/fakes/fake_kube.hpp"
#include "tests/support/test_support.hpp"

namespace factory::kube {
namespace {

using namespace std::chrono_literals;
using factory::testing::eventually;
using factory::testing::FakeKube;

json secret(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"labels", {{"w", "1"}}}}},
          {"data", {{"k", "dg=="}}}};
}

// Runs a watch on a thread and records what it reports.
class Recorder {
 public:
  Recorder(KubeClient client, WatchOptions opts) : client_(std::move(client)) {
    thread_ = std::thread([this, opts] {
      result_ = client_.watch(kSecret, "default", opts, [this](const WatchEvent& e) {
        std::lock_guard<std::mutex> l(mu_);
        events_.push_back(e.type + " " + e.object["metadata"]["name"].get<std::string>());
        return !stop_;
      });
      done_ = true;
    });
  }
  ~Recorder() {
    stop();
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> l(mu_);
    return events_;
  }
  bool saw(const std::string& e) {
    auto ev = events();
    return std::find(ev.begin(), ev.end(), e) != ev.end();
  }
  size_t count(const std::string& e) {
    auto ev = events();
    return std::count(ev.begin(), ev.end(), e);
  }
  void stop() { stop_ = true; }
  bool done() const { return done_; }
  const Status& result() const { return result_; }
  void join() { thread_.join(); }

 private:
  KubeClient client_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> events_;
  std::atomic<bool> stop_{false}, done_{false};
  Status result_;
};

KubeClient client_for(const FakeKube& kube) {
  auto a = load_kubeconfig(kube.kubeconfig());
  EXPECT_TRUE(a.ok());
  return KubeClient(*a);
}

TEST(KubeWatch, ReportsWhatExistsThenEveryChange) {
  FakeKube kube;
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto client = client_for(kube);
  ASSERT_TRUE(client.create(secret("before")).ok());

  Recorder rec(client, {.label_selector = "w=1", .timeout = 20s});
  ASSERT_TRUE(eventually([&] { return rec.saw("ADDED before"); }));
  ASSERT_TRUE(client.create(secret("after")).ok());
  auto other = secret("unlabelled");
  other["metadata"]["labels"] = json::object();
  ASSERT_TRUE(client.create(other).ok());
  auto s = client.get(kSecret, "default", "after");
  (*s)["metadata"]["labels"]["x"] = "y";
  ASSERT_TRUE(client.update(*s).ok());
  ASSERT_TRUE(client.remove(kSecret, "default", "before").ok());
  ASSERT_TRUE(eventually([&] { return rec.saw("DELETED before"); }));
  EXPECT_EQ(rec.events(), (std::vector<std::string>{"ADDED before", "ADDED after", "MODIFIED after",
                                                    "DELETED before"}));
  rec.stop();
  ASSERT_TRUE(client.create(secret("last")).ok());  // an event to notice the stop on
  ASSERT_TRUE(eventually([&] { return rec.done(); }));
  EXPECT_TRUE(rec.result().ok()) << rec.result().error().message;
}

TEST(KubeWatch, ResumesAfterDroppedStreamsWithoutLosingOrRepeating) {
  // Every watch stream is cut after two events, mid-body.
  FakeKube kube({"--drop-watch-after", "2"});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto client = client_for(kube);
  Recorder rec(client, {.timeout = 30s, .retry_delay = 50ms});
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(client.create(secret("s" + std::to_string(i))).ok());
    std::this_thread::sleep_for(30ms);
  }
  ASSERT_TRUE(eventually([&] { return rec.saw("ADDED s6"); }, 15s))
      << ::testing::PrintToString(rec.events());
  for (int i = 0; i < 7; ++i) EXPECT_EQ(rec.count("ADDED s" + std::to_string(i)), 1u) << i;
  EXPECT_EQ(rec.events().size(), 7u);

  // It reconnected with the last version it had seen, not from scratch.
  json seen = kube.control("/_fake/requests", {}, "GET");
  int watches = 0;
  for (const auto& r : seen["requests"]) {
    std::string p = r["path"];
    if (p.find("watch=1") == std::string::npos) continue;
    ++watches;
    EXPECT_NE(p.find("resourceVersion="), std::string::npos) << p;
    EXPECT_NE(p.find("allowWatchBookmarks=true"), std::string::npos) << p;
  }
  EXPECT_GE(watches, 3);
  rec.stop();
  ASSERT_TRUE(client.create(secret("stop")).ok());
}

// A stream cut, and meanwhile the history the client would resume from is
// compacted away: the server answers 410 Gone, the client lists again and
// reports the differences it missed.
void gone_then_relist(const std::string& style) {
  FakeKube kube;
  ASSERT_TRUE(kube.ok()) << kube.log();
  kube.control("/_fake/gone", {{"style", style}});
  auto client = client_for(kube);
  ASSERT_TRUE(client.create(secret("keep")).ok());
  ASSERT_TRUE(client.create(secret("old")).ok());
  Recorder rec(client, {.timeout = 30s, .retry_delay = 1500ms});
  ASSERT_TRUE(eventually([&] { return rec.saw("ADDED old"); }));

  // The client is kept away (a reconnect after a cleanly ended stream is
  // immediate) while things change and the history is compacted.
  kube.control("/_fake/hold-watches", {{"hold", true}});
  kube.control("/_fake/drop-watches");
  ASSERT_TRUE(client.remove(kSecret, "default", "old").ok());
  ASSERT_TRUE(client.create(secret("new")).ok());
  auto k = client.get(kSecret, "default", "keep");
  (*k)["metadata"]["labels"]["touched"] = "yes";
  ASSERT_TRUE(client.update(*k).ok());
  kube.control("/_fake/compact");
  kube.control("/_fake/hold-watches", {{"hold", false}});

  ASSERT_TRUE(eventually([&] { return rec.saw("ADDED new") && rec.saw("DELETED old"); }, 20s))
      << ::testing::PrintToString(rec.events());
  EXPECT_EQ(rec.count("MODIFIED keep"), 1u) << ::testing::PrintToString(rec.events());
  EXPECT_EQ(rec.count("ADDED keep"), 1u);

  // The re-list happened after a watch was refused.
  json seen = kube.control("/_fake/requests", {}, "GET");
  int lists = 0;
  for (const auto& r : seen["requests"]) {
    std::string p = r["path"];
    if (r["method"] == "GET" && p.find("/secrets") != std::string::npos &&
        p.find("watch=1") == std::string::npos && p.find("/secrets/") == std::string::npos)
      ++lists;
  }
  EXPECT_EQ(lists, 2) << "one initial list, one after 410";

  // Watching goes on after the re-list.
  ASSERT_TRUE(client.create(secret("later")).ok());
  ASSERT_TRUE(eventually([&] { return rec.saw("ADDED later"); }));
  rec.stop();
  ASSERT_TRUE(client.create(secret("stop")).ok());  // the event that delivers the stop
}

TEST(KubeWatch, GoneAsAnErrorEventRelists) {
  ASSERT_NO_FATAL_FAILURE(gone_then_relist("event"));
}
TEST(KubeWatch, GoneAsHttp410Relists) {
  ASSERT_NO_FATAL_FAILURE(gone_then_relist("http"));
}

TEST(KubeWatch, ResumesFromTheBookmarkVersion) {
  FakeKube kube({"--bookmark-interval", "0.3"});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto client = client_for(kube);
  ASSERT_TRUE(client.create(secret("a")).ok());
  Recorder rec(client, {.timeout = 30s, .retry_delay = 100ms});
  ASSERT_TRUE(eventually([&] { return rec.saw("ADDED a"); }));
  // Other kinds move the store's version on; bookmarks carry it to us.
  json cm = {{"apiVersion", "v1"},
             {"kind", "ConfigMap"},
             {"metadata", {{"name", "c"}, {"namespace", "default"}}},
             {"data", {{"x", "y"}}}};
  auto created = client.create(cm);
  ASSERT_TRUE(created.ok()) << created.error().message;
  std::string cm_rv = (*created)["metadata"]["resourceVersion"];
  std::this_thread::sleep_for(900ms);
  kube.control("/_fake/drop-watches");
  ASSERT_TRUE(eventually(
      [&] {
        json seen = kube.control("/_fake/requests", {}, "GET");
        for (const auto& r : seen["requests"]) {
          std::string p = r["path"];
          if (p.find("watch=1") != std::string::npos &&
              p.find("resourceVersion=" + cm_rv) != std::string::npos)
            return true;
        }
        return false;
      },
      5s));
  EXPECT_EQ(rec.events(), std::vector<std::string>{"ADDED a"});
  rec.stop();
  ASSERT_TRUE(client.create(secret("z")).ok());
}

TEST(KubeWatch, GivesUpAtItsTimeoutWithAClearError) {
  FakeKube kube;
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto client = client_for(kube);
  auto t0 = std::chrono::steady_clock::now();
  auto st =
      client.watch(kSecret, "default", {.timeout = 1500ms}, [](const WatchEvent&) { return true; });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::timeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 6s);
}

TEST(KubeWatch, ForbiddenWatchIsNotRetried) {
  FakeKube kube({"--forbid", "watch:secrets"});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto client = client_for(kube);
  auto st =
      client.watch(kSecret, "default", {.timeout = 10s}, [](const WatchEvent&) { return true; });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::permission_denied);
  EXPECT_EQ(st.error().message,
            "forbidden: the coordinator's account cannot watch secrets in namespace default: grant "
            "it with RBAC (see deploy/)");
}

}  // namespace
}  // namespace factory::kube

// A line of the wrong shape (a broken proxy, a buggy server) is a protocol
// error that ends the watch with its reason; before parse_watch_line an
// ERROR whose object was not an object, or a type that was not a string,
// threw nlohmann's type_error out of watch().
TEST(KubeWatch, ALineOfTheWrongShapeIsAProtocolErrorNotAnException) {
  using factory::kube::parse_watch_line;
  for (const char* line : {R"({"type":"ERROR","object":5})", R"({"type":7,"object":{}})",
                           R"({"type":"ADDED"})", R"([1,2])", "not json"}) {
    auto ev = parse_watch_line(line);
    ASSERT_FALSE(ev) << line;
    EXPECT_EQ(ev.error().code, factory::Errc::protocol) << line;
  }
  auto ok =
      parse_watch_line(R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}})");
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->type, "BOOKMARK");
  EXPECT_EQ(ok->object["metadata"]["resourceVersion"], "9");
}
