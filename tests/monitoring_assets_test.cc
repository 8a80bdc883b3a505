// The monitoring assets in deploy/monitoring against the real tools and the real metric names:
// promtool checks and unit-tests the rules, and every kvrm: name the rules and the Grafana
// dashboard query is one that KvrmMetrics exposes or a rule records (so a renamed metric cannot
// leave a dashboard silently empty).
#include <sys/wait.h>

#include <cstdio>
#include <regex>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "metrics/kvrm_metrics.h"
#include "metrics/registry.h"

namespace kvrm {
namespace {

constexpr char kRules[] = "deploy/monitoring/kvrm-rules.yml";
constexpr char kRulesTest[] = "deploy/monitoring/kvrm-rules.test.yml";
constexpr char kDashboard[] = "deploy/monitoring/kvrm-dashboard.json";

std::pair<int, std::string> Shell(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Every kvrm: identifier in `text`.
std::set<std::string> KvrmNames(const std::string& text) {
  static const std::regex name(R"(kvrm:[a-zA-Z0-9_:]+)");
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), name); it != std::sregex_iterator();
       ++it) {
    out.insert(it->str());
  }
  return out;
}

// Family and series names KvrmMetrics exposes, plus the names the rules record.
std::set<std::string> KnownNames(const std::string& rules) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, {"m", "static"});
  std::set<std::string> known;
  for (absl::string_view line : absl::StrSplit(registry.Render(), '\n')) {
    if (absl::StartsWith(line, "# TYPE ")) {  // family names, as the annotations cite them
      known.insert(std::string(line.substr(7, line.find(' ', 7) - 7)));
    }
    if (line.empty() || line[0] == '#') continue;
    known.insert(std::string(line.substr(0, line.find_first_of("{ "))));
  }
  static const std::regex record(R"(record:\s*(kvrm:[a-zA-Z0-9_:]+))");
  for (auto it = std::sregex_iterator(rules.begin(), rules.end(), record);
       it != std::sregex_iterator(); ++it) {
    known.insert((*it)[1].str());
  }
  return known;
}

TEST(MonitoringAssetsTest, PromtoolChecksTheRules) {
  auto [rc, out] = Shell(std::string("/usr/bin/promtool check rules ") + kRules);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "SUCCESS")) << out;
}

TEST(MonitoringAssetsTest, PromtoolRuleUnitTestsPass) {
  auto [rc, out] = Shell(std::string("/usr/bin/promtool test rules ") + kRulesTest);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "SUCCESS")) << out;
}

TEST(MonitoringAssetsTest, RulesOnlyQueryExposedOrRecordedNames) {
  absl::StatusOr<std::string> rules = ReadFileToString(kRules);
  ASSERT_TRUE(rules.ok()) << rules.status();
  const std::set<std::string> known = KnownNames(*rules);
  const std::set<std::string> used = KvrmNames(*rules);
  EXPECT_GE(used.size(), 10u);
  for (const std::string& n : used) EXPECT_TRUE(known.count(n)) << n << " in " << kRules;
}

TEST(MonitoringAssetsTest, DashboardParsesAndQueriesExposedNames) {
  absl::StatusOr<Json> dash = ReadJsonFile(kDashboard);
  ASSERT_TRUE(dash.ok()) << dash.status();
  absl::StatusOr<std::string> rules = ReadFileToString(kRules);
  ASSERT_TRUE(rules.ok());
  const std::set<std::string> known = KnownNames(*rules);
  ASSERT_TRUE(dash->contains("panels") && (*dash)["panels"].is_array());
  int exprs = 0;
  std::set<std::string> titles;
  for (const Json& panel : (*dash)["panels"]) {
    titles.insert(panel.value("title", ""));
    ASSERT_TRUE(panel.contains("targets") && panel["targets"].is_array());
    for (const Json& target : panel["targets"]) {
      ASSERT_TRUE(target.contains("expr") && target["expr"].is_string());
      const std::string& expr = target["expr"].get_ref<const std::string&>();
      ++exprs;
      const std::set<std::string> names = KvrmNames(expr);
      EXPECT_FALSE(names.empty()) << expr;
      for (const std::string& n : names) EXPECT_TRUE(known.count(n)) << n << " in " << expr;
    }
  }
  EXPECT_GE(exprs, 15);
  // What the issue asks the dashboard to show.
  for (const char* want : {"Time to first token", "Inter-token latency", "Throughput", "Slots",
                           "KV bytes: reserved vs used", "Transport waits"}) {
    bool found = false;
    for (const std::string& t : titles) found |= absl::StrContains(t, want);
    EXPECT_TRUE(found) << want;
  }
}

}  // namespace
}  // namespace kvrm
