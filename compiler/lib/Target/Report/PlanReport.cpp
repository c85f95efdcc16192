//===- PlanReport.cpp - a plan as one HTML page ----------------------------===//
//
// Lays out report::Model (ReportModel.h) as one self-contained HTML page:
// inline CSS and SVG (hover details are SVG <title>s), no script, no
// network. Colours are the Okabe-Ito palette (readable for colour-blind
// readers and in print); every figure has a title and units. Plans of many
// ranks are drawn aggregated: nodes instead of devices, ranks of equal
// memory as one bar. Every drawn rank / expert carries its numbers as
// data-* attributes, which tests/tools/check-report.py compares with moec
// --json. docs/plan-report.md.
//
//===----------------------------------------------------------------------===//
#include "moe/Target/PlanReport.h"
#include "moe/Target/PlanWriter.h"
#include "ReportModel.h"
#include "ReportText.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <map>

using namespace llvm;
using moe::report::Model;
using moe::report::Rank;
using namespace moe::report;

namespace {

const char *const kStageColours[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7",
                                     "#56B4E9", "#D55E00", "#F0E442", "#777777"};
const char *const kTimeColours[] = {"#0072B2", "#56B4E9", "#009E73", "#E69F00", "#D55E00",
                                    "#CC79A7"};
const char *const kTimeNames[] = {"GEMMs", "attention", "memory-bound ops",
                                  "all-to-all", "all-reduce", "send/recv"};
struct MemoryPart {
  const char *name, *colour;
  int64_t moe::report::Memory::*field;
};
const MemoryPart kMemoryParts[] = {
    {"weights", "#0072B2", &moe::report::Memory::weights},
    {"KV cache", "#E69F00", &moe::report::Memory::kvCache},
    {"activations", "#009E73", &moe::report::Memory::activations},
    {"workspace", "#CC79A7", &moe::report::Memory::workspace}};

/// More ranks than this: drawn as nodes, and memory bars grouped.
constexpr int64_t kRanksDrawn = 256;
constexpr int64_t kBarsDrawn = 64;

class Page {
public:
  explicit Page(const Model &m) : m(m) {}
  std::string render();

private:
  void header();
  void mesh();
  void groups();
  void experts();
  void memory();
  void time();
  void layouts();
  void vocab();
  void slices();
  void measured();
  void legend(ArrayRef<std::pair<std::string, std::string>> items);

  const Model &m;
  std::string html;
  raw_string_ostream os{html};
};

void Page::legend(ArrayRef<std::pair<std::string, std::string>> items) {
  os << "<p class=\"legend\">";
  for (const auto &[colour, name] : items)
    os << formatv("<span><i style=\"background:{0}\"></i>{1}</span>", colour, escape(name));
  os << "</p>\n";
}

void Page::header() {
  const int64_t maxPeak =
      std::max_element(m.ranks.begin(), m.ranks.end(), [](const Rank &a, const Rank &b) {
        return a.memory.peak < b.memory.peak;
      })->memory.peak;
  os << "<header><h1>" << escape(m.modelType) << " on " << m.worldSize
     << (m.worldSize == 1 ? " rank" : " ranks") << "</h1>\n<p class=\"sub\">plan "
     << escape(m.planPath) << (m.source.empty() ? "" : " &middot; config " + escape(m.source))
     << "</p></header>\n<section id=\"summary\"><div class=\"cards\">\n";
  auto card = [&](StringRef title, const std::string &value, StringRef note = "") {
    os << "<div class=\"card\"><h3>" << title << "</h3><b>" << value << "</b>"
       << (note.empty() ? "" : "<small>" + escape(note) + "</small>") << "</div>\n";
  };
  std::string layout;
  for (const char *axis : {"dp", "pp", "tp", "ep", "etp"})
    layout += formatv("{0}{1} {2}", layout.empty() ? "" : " &times; ", axis, m.degrees.at(axis));
  card("Layout", layout, formatv("edp {0}", m.degrees.at("edp")).str());
  if (m.hasPlanner) {
    card("Machine", escape(m.cluster),
         formatv("{0} per node, {1} each", m.devicesPerNode, gib(m.memoryBytes)).str());
    card("Predicted throughput", thousands(m.tokensPerSecond) + " tokens/s",
         "step of " + ms(m.stepSeconds));
    card("Search", formatv("{0} layouts", m.layoutsConsidered).str(),
         formatv("{0} fit, {1} rejected", m.fitting, m.rejected.size()).str());
  }
  card("Peak memory (largest rank)", gib(maxPeak),
       m.memoryBudget ? "of " + gib(m.memoryBudget) + " usable" : "");
  card("Workload",
       formatv("{0} tokens/step", m.maxBatchTokens).str(),
       formatv("{0} sequences x {1} positions", m.maxSequences, m.maxSeqLen).str());
  if (m.measured)
    card("Measured", formatv("{0:f1} tokens/s", m.measuredTokensPerSecond).str(),
         formatv("{0} tokens in {1:f2} s", m.measuredTokens, m.measuredSeconds).str());
  os << "</div></section>\n";
}

void Page::mesh() {
  os << "<section id=\"mesh\"><h2>Device mesh</h2>\n";
  const int64_t perNode = std::max<int64_t>(1, std::min(m.devicesPerNode, m.worldSize));
  const int64_t nodes = (m.worldSize + perNode - 1) / perNode;
  const bool byNode = m.worldSize > kRanksDrawn;
  os << "<p>" << m.worldSize << " ranks on " << nodes << (nodes == 1 ? " node" : " nodes")
     << " of " << perNode << " devices; colour: pipeline stage"
     << (byNode ? " (one box per node: too many ranks to draw each)" : "") << ". Axes: ";
  bool any = false;
  for (const char *axis : {"dp", "pp", "tp", "ep", "etp"}) {
    if (m.degrees.at(axis) <= 1)
      continue;
    auto link = m.links.find(axis);
    os << (any ? "; " : "") << "<b>" << axis << " " << m.degrees.at(axis) << "</b>"
       << (link != m.links.end() ? " (" + escape(link->second == "intra_node" ? "within a node"
                                                                                : "across nodes") +
                                       ")"
                                 : "");
    any = true;
  }
  os << (any ? "" : "none (one rank)") << ".</p>\n";
  const int cell = byNode ? 14 : 34, gap = byNode ? 3 : 10;
  const int64_t nodeWidth = byNode ? cell : perNode * cell + 8;
  const int64_t perRow = std::max<int64_t>(1, 1100 / (nodeWidth + gap));
  const int64_t rows = (nodes + perRow - 1) / perRow;
  const int64_t width = std::min<int64_t>(nodes, perRow) * (nodeWidth + gap) + gap;
  const int64_t height = rows * (cell + 8 + gap) + gap + 4;
  os << formatv("<svg class=\"mesh\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                "role=\"img\"><title>Device mesh: {2} ranks</title>\n",
                width, height, m.worldSize);
  for (int64_t n = 0; n < nodes; ++n) {
    const int64_t x = gap + (n % perRow) * (nodeWidth + gap), y = gap + (n / perRow) * (cell + 8 + gap);
    const int64_t first = n * perNode, last = std::min(m.worldSize, first + perNode) - 1;
    if (byNode) {
      std::vector<int64_t> stages;
      for (int64_t r = first; r <= last; ++r)
        stages.push_back(m.ranks[r].pp);
      os << formatv("<g data-ranks=\"{0}-{1}\"><rect x=\"{2}\" y=\"{3}\" width=\"{4}\" "
                    "height=\"{4}\" fill=\"{5}\"/><title>node {6}: ranks {0}-{1}, pp stage "
                    "{7}</title></g>\n",
                    first, last, x, y + 4, cell, kStageColours[stages[0] % 8], n,
                    ranges(stages));
      continue;
    }
    os << formatv("<rect class=\"node\" x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\"/>\n", x,
                  y, nodeWidth, cell + 8);
    for (int64_t r = first; r <= last; ++r) {
      const Rank &k = m.ranks[r];
      const int64_t cx = x + 4 + (r - first) * cell;
      os << formatv("<g data-ranks=\"{0}\"><rect x=\"{1}\" y=\"{2}\" width=\"{3}\" height=\"{3}\" "
                    "rx=\"3\" fill=\"{4}\"/><text x=\"{5}\" y=\"{6}\">{0}</text><title>rank {0}: "
                    "{7}; {8} peak</title></g>\n",
                    r, cx + 1, y + 5, cell - 2, kStageColours[k.pp % 8], cx + cell / 2,
                    y + 5 + cell / 2 + 4, coordsText(k), gib(k.memory.peak));
    }
  }
  os << "</svg>\n";
  std::vector<std::pair<std::string, std::string>> items;
  for (int64_t s = 0; s < m.degrees.at("pp"); ++s) {
    const int64_t first = s < static_cast<int64_t>(m.stageBegin.size()) ? m.stageBegin[s] : 0;
    const int64_t end = s + 1 < static_cast<int64_t>(m.stageBegin.size()) ? m.stageBegin[s + 1] : 0;
    items.push_back({kStageColours[s % 8], formatv("stage {0}: layers {1}-{2}", s, first, end - 1)});
  }
  legend(items);
  groups();
  os << "</section>\n";
}

void Page::groups() {
  // The groups rank 0 communicates in, one per axis of degree > 1: the
  // ranks that share its other coordinates (dense axes dp, pp, tp; expert
  // axes edp, ep, etp within its stage).
  struct Axis {
    const char *name, *what;
    int64_t Rank::*coord;
    std::vector<int64_t Rank::*> same;
  };
  const std::vector<Axis> axes = {
      {"tp", "all-reduces of tensor-parallel layers", &Rank::tp, {&Rank::dp, &Rank::pp}},
      {"ep", "all-to-alls of the routed tokens", &Rank::ep, {&Rank::pp, &Rank::edp, &Rank::etp}},
      {"etp", "all-reduces of expert-tensor-parallel FFNs", &Rank::etp,
       {&Rank::pp, &Rank::edp, &Rank::ep}},
      {"pp", "send/recv between stages", &Rank::pp, {&Rank::dp, &Rank::tp}},
      {"dp", "replicas (no collective in inference)", &Rank::dp, {&Rank::pp, &Rank::tp}}};
  const Rank &zero = m.ranks.front();
  bool any = false;
  for (const Axis &a : axes) {
    if (m.degrees.at(a.name) <= 1)
      continue;
    if (!any)
      os << "<table class=\"groups\"><tr><th>axis</th><th>rank 0's group</th><th>link</th>"
         << "<th>carries</th></tr>\n";
    any = true;
    std::vector<int64_t> members;
    for (const Rank &k : m.ranks) {
      bool same = true;
      for (auto c : a.same)
        same = same && k.*c == zero.*c;
      if (same)
        members.push_back(k.rank);
    }
    auto link = m.links.find(a.name);
    std::string kind = "";
    if (link != m.links.end())
      kind = link->second == "intra_node" ? "within a node" : "across nodes";
    else if (!members.empty())
      kind = members.back() / m.devicesPerNode == members.front() / m.devicesPerNode
                 ? "within a node"
                 : "across nodes";
    os << formatv("<tr data-axis=\"{0}\"><td>{0} {1}</td><td>{2}</td><td>{3}</td><td>{4}</td>"
                  "</tr>\n",
                  a.name, m.degrees.at(a.name), ranges(members), kind, a.what);
  }
  if (any)
    os << "</table>\n";
}

void Page::experts() {
  os << "<section id=\"experts\"><h2>Expert placement</h2>\n";
  if (m.numExperts == 0) {
    os << "<p>A dense model: no expert stacks.</p></section>\n";
    return;
  }
  // (ep, etp) group -> its experts and ranks.
  std::map<std::pair<int64_t, int64_t>, std::pair<std::pair<int64_t, int64_t>, std::vector<int64_t>>>
      groups;
  for (const Rank &k : m.ranks)
    if (k.firstExpert >= 0) {
      auto &g = groups[{k.ep, k.etp}];
      g.first = {k.firstExpert, k.experts};
      g.second.push_back(k.rank);
    }
  const int64_t ep = m.degrees.at("ep"), etp = m.degrees.at("etp");
  os << "<p>" << m.numExperts << " routed experts per MoE layer (stack <code>"
     << escape(m.expertStack) << "</code>), split over <b>ep " << ep << "</b>"
     << (etp > 1 ? formatv(", each expert's FFN split over <b>etp {0}</b>", etp).str() : "")
     << "; every MoE layer places them alike. Colour: expert-parallel group.</p>\n";
  const int64_t width = 1100, cellW = std::max<int64_t>(1, width / m.numExperts);
  os << formatv("<svg class=\"experts\" width=\"{0}\" height=\"46\" viewBox=\"0 0 {0} 46\" "
                "role=\"img\"><title>Experts 0-{1} by expert-parallel group</title>\n",
                cellW * m.numExperts, m.numExperts - 1);
  for (const auto &[key, value] : groups) {
    if (key.second != 0)
      continue; // one row of cells per ep group (etp parts share them)
    const auto &[range, ranks] = value;
    std::vector<int64_t> all;
    for (const auto &[k2, v2] : groups)
      if (k2.first == key.first)
        all.insert(all.end(), v2.second.begin(), v2.second.end());
    os << formatv("<g data-ep=\"{0}\" data-experts=\"{1}-{2}\" data-ranks=\"{3}\">", key.first,
                  range.first, range.first + range.second - 1, ranges(all));
    os << formatv("<rect x=\"{0}\" y=\"4\" width=\"{1}\" height=\"26\" fill=\"{2}\"/>",
                  range.first * cellW, range.second * cellW, kStageColours[key.first % 8]);
    if (range.second * cellW >= 40)
      os << formatv("<text x=\"{0}\" y=\"22\" class=\"light\">ep {1}</text>",
                    range.first * cellW + range.second * cellW / 2, key.first);
    os << formatv("<title>experts {0}-{1}: ep group {2}, ranks {3}</title></g>\n", range.first,
                  range.first + range.second - 1, key.first, ranges(all));
  }
  os << formatv("<text x=\"0\" y=\"44\" class=\"axis\" text-anchor=\"start\">expert 0</text>"
                "<text x=\"{0}\" y=\"44\" class=\"axis\" text-anchor=\"end\">expert {1}</text>",
                cellW * m.numExperts, m.numExperts - 1);
  os << "</svg>\n";
  const bool fold = groups.size() > 32;
  os << (fold ? "<details><summary>Every group's experts and ranks</summary>" : "")
     << "<table><tr><th>ep</th><th>etp</th><th>experts</th><th>ranks</th></tr>\n";
  for (const auto &[key, value] : groups)
    os << formatv("<tr><td>{0}</td><td>{1}</td><td>{2}-{3}</td><td>{4}</td></tr>\n", key.first,
                  key.second, value.first.first, value.first.first + value.first.second - 1,
                  ranges(value.second));
  os << "</table>" << (fold ? "</details>" : "") << "\n</section>\n";
}

void Page::memory() {
  os << "<section id=\"memory\"><h2>Memory per rank (predicted)</h2>\n";
  // Ranks of equal predicted memory share a bar when there are many.
  std::map<moe::report::Memory, std::vector<int64_t>> groups;
  std::vector<std::pair<moe::report::Memory, std::vector<int64_t>>> bars;
  if (m.worldSize <= kBarsDrawn) {
    for (const Rank &k : m.ranks)
      bars.push_back({k.memory, {k.rank}});
  } else {
    for (const Rank &k : m.ranks)
      groups[k.memory].push_back(k.rank);
    for (auto &[mem, ranks] : groups)
      bars.push_back({mem, ranks});
  }
  int64_t scale = std::max(m.memoryBytes, m.memoryBudget);
  for (const auto &[mem, ranks] : bars)
    scale = std::max(scale, mem.peak);
  for (const Rank &k : m.ranks)
    scale = std::max(scale, k.measuredPeak);
  scale = std::max<int64_t>(scale, 1);
  os << "<p>Weights, KV cache, activations and workspace of each rank"
     << (m.worldSize > kBarsDrawn ? " (ranks with equal figures share a bar)" : "");
  if (m.memoryBudget)
    os << " against the usable memory (dashed: " << gib(m.memoryBudget) << ")";
  if (m.memoryBytes)
    os << " and the device's (solid: " << gib(m.memoryBytes) << ")";
  os << (m.measured ? "; black tick: measured peak" : "") << ".</p>\n";
  const int labelW = 170, barW = 760, rowH = 22;
  const int64_t height = static_cast<int64_t>(bars.size()) * rowH + 26;
  os << formatv("<svg class=\"bars\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                "role=\"img\"><title>Predicted memory per rank, bytes</title>\n",
                labelW + barW + 170, height);
  auto x = [&](int64_t bytes) {
    return labelW + static_cast<double>(bytes) / static_cast<double>(scale) * barW;
  };
  for (size_t i = 0; i < bars.size(); ++i) {
    const auto &[mem, ranks] = bars[i];
    const int64_t y = static_cast<int64_t>(i) * rowH + 4;
    const std::string label = ranks.size() == 1 ? formatv("rank {0}", ranks[0]).str()
                                                : formatv("ranks {0}", ranges(ranks)).str();
    os << formatv("<g data-ranks=\"{0}\" data-peak=\"{1}\" data-weights=\"{2}\">", ranges(ranks),
                  mem.peak, mem.weights);
    os << formatv("<text x=\"{0}\" y=\"{1}\" class=\"label\">{2}</text>", labelW - 6, y + 14,
                  escape(label.size() > 26 ? label.substr(0, 24) + "…" : label));
    double at = labelW;
    std::string tip;
    for (const auto &part : kMemoryParts) {
      const int64_t bytes = mem.*part.field;
      const double w = x(bytes) - labelW;
      if (w > 0)
        os << formatv("<rect x=\"{0:f1}\" y=\"{1}\" width=\"{2:f1}\" height=\"16\" fill=\"{3}\"/>",
                      at, y + 2, w, part.colour);
      at += w;
      tip += formatv("{0}{1} {2}", tip.empty() ? "" : ", ", part.name, gib(bytes)).str();
    }
    os << formatv("<text x=\"{0:f1}\" y=\"{1}\" class=\"value\">{2}{3}</text>", at + 6, y + 14,
                  gib(mem.peak),
                  m.memoryBytes ? " (" + percent(static_cast<double>(mem.peak) / m.memoryBytes) + ")"
                                : "");
    if (ranks.size() == 1 && m.ranks[ranks[0]].measuredPeak >= 0) {
      const double mx = x(m.ranks[ranks[0]].measuredPeak);
      os << formatv("<line x1=\"{0:f1}\" x2=\"{0:f1}\" y1=\"{1}\" y2=\"{2}\" class=\"measured\"/>",
                    mx, y, y + 20);
      tip += ", measured peak " + gib(m.ranks[ranks[0]].measuredPeak);
    }
    os << "<title>" << escape(label) << ": " << escape(tip) << "; peak " << gib(mem.peak)
       << "</title></g>\n";
  }
  const int64_t bottom = height - 20;
  if (m.memoryBudget)
    os << formatv("<line x1=\"{0:f1}\" x2=\"{0:f1}\" y1=\"0\" y2=\"{1}\" class=\"budget\"/>",
                  x(m.memoryBudget), bottom);
  if (m.memoryBytes)
    os << formatv("<line x1=\"{0:f1}\" x2=\"{0:f1}\" y1=\"0\" y2=\"{1}\" class=\"capacity\"/>",
                  x(m.memoryBytes), bottom);
  os << formatv("<text x=\"{0}\" y=\"{1}\" class=\"axis\">0</text><text x=\"{2}\" y=\"{1}\" "
                "class=\"axis\">{3}</text></svg>\n",
                labelW, height - 4, labelW + barW, gib(scale));
  std::vector<std::pair<std::string, std::string>> items;
  for (const auto &part : kMemoryParts)
    items.push_back({part.colour, part.name});
  legend(items);
  os << "</section>\n";
}

void Page::time() {
  if (!m.hasPlanner || m.stages.empty())
    return;
  os << "<section id=\"time\"><h2>Step time per stage (predicted)</h2>\n<p>One micro-batch of "
     << m.maxBatchTokens << " tokens through each pipeline stage, by component (the cost "
     << "model's figures for " << escape(m.cluster) << "); the step takes " << ms(m.stepSeconds)
     << (m.bubbleSeconds > 0 ? ", of which " + ms(m.bubbleSeconds) + " pipeline bubble" : "")
     << ".</p>\n";
  double longest = 0;
  for (const auto &st : m.stages) {
    double sum = 0;
    for (const auto &p : st.parts)
      sum += p.second;
    longest = std::max(longest, sum);
  }
  longest = std::max(longest, 1e-12);
  const int labelW = 170, barW = 760, rowH = 24;
  const int64_t height = static_cast<int64_t>(m.stages.size()) * rowH + 26;
  os << formatv("<svg class=\"bars\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                "role=\"img\"><title>Predicted time per stage, milliseconds</title>\n",
                labelW + barW + 170, height);
  for (size_t i = 0; i < m.stages.size(); ++i) {
    const auto &st = m.stages[i];
    const int64_t y = static_cast<int64_t>(i) * rowH + 4;
    os << formatv("<g data-stage=\"{0}\"><text x=\"{1}\" y=\"{2}\" class=\"label\">stage {0} "
                  "(layers {3}-{4})</text>",
                  i, labelW - 6, y + 14, st.firstLayer, st.endLayer - 1);
    double at = labelW, sum = 0;
    std::string tip;
    for (size_t p = 0; p < st.parts.size(); ++p) {
      const double w = st.parts[p].second / longest * barW;
      if (w > 0)
        os << formatv("<rect x=\"{0:f1}\" y=\"{1}\" width=\"{2:f1}\" height=\"18\" fill=\"{3}\"/>",
                      at, y + 1, w, kTimeColours[p]);
      at += w;
      sum += st.parts[p].second;
      tip += formatv("{0}{1} {2}", tip.empty() ? "" : ", ", kTimeNames[p], ms(st.parts[p].second))
                 .str();
    }
    os << formatv("<text x=\"{0:f1}\" y=\"{1}\" class=\"value\">{2}</text><title>stage {3}: {4}"
                  "</title></g>\n",
                  at + 6, y + 14, ms(sum), i, escape(tip));
  }
  os << formatv("<text x=\"{0}\" y=\"{1}\" class=\"axis\">0 ms</text><text x=\"{2}\" y=\"{1}\" "
                "class=\"axis\">{3}</text></svg>\n",
                labelW, height - 4, labelW + barW, ms(longest));
  std::vector<std::pair<std::string, std::string>> items;
  for (size_t p = 0; p < std::size(kTimeNames); ++p)
    items.push_back({kTimeColours[p], kTimeNames[p]});
  legend(items);
  os << "</section>\n";
}

void Page::layouts() {
  if (!m.hasPlanner)
    return;
  os << "<section id=\"layouts\"><h2>Layouts considered</h2>\n<p>" << m.layoutsConsidered
     << " layouts of " << m.worldSize << " ranks searched; " << m.fitting << " fit, "
     << m.rejected.size() << " are rejected. The best that fit, fastest first (the first is the "
     << "plan's):</p>\n<table><tr><th>layout</th><th>peak memory per rank</th><th>predicted "
     << "tokens/s</th><th>vs the chosen</th></tr>\n";
  const double best = m.alternatives.empty() ? 0 : m.alternatives.front().tokensPerSecond;
  for (size_t i = 0; i < m.alternatives.size(); ++i) {
    const auto &a = m.alternatives[i];
    os << formatv("<tr{0}><td>{1}</td><td>{2}</td><td>{3}</td><td>{4}</td></tr>\n",
                  i == 0 ? " class=\"chosen\"" : "", escape(a.degrees), gib(a.peak),
                  thousands(a.tokensPerSecond),
                  i == 0 ? std::string("chosen")
                         : percent(best > 0 ? a.tokensPerSecond / best : 0) + " of its speed");
  }
  os << "</table>\n";
  if (!m.rejected.empty()) {
    const size_t shown = std::min<size_t>(m.rejected.size(), 12);
    os << "<p>Rejected (they do not fit, or the compiler cannot run them):</p><table><tr><th>layout</th><th>why</th></tr>\n";
    auto row = [&](const moe::report::Alternative &a) {
      os << "<tr><td>" << escape(a.degrees) << "</td><td>" << escape(a.reason) << "</td></tr>\n";
    };
    for (size_t i = 0; i < shown; ++i)
      row(m.rejected[i]);
    os << "</table>\n";
    if (m.rejected.size() > shown) {
      os << "<details><summary>" << m.rejected.size() - shown
         << " more rejected layouts</summary><table>\n";
      for (size_t i = shown; i < m.rejected.size(); ++i)
        row(m.rejected[i]);
      os << "</table></details>\n";
    }
  }
  os << "</section>\n";
}

void Page::vocab() {
  const int64_t tp = m.degrees.at("tp");
  os << "<section id=\"vocab\"><h2>Vocabulary</h2>\n<table>"
     << "<tr><th>vocabulary</th><td data-vocab=\"" << m.vocabSize << "\">"
     << thousands(m.vocabSize) << " tokens</td></tr>\n<tr><th>padded for tp " << tp
     << " (multiple of " << m.padTo << " per rank)</th><td data-padded=\"" << m.padded << "\">"
     << thousands(m.padded) << " rows, " << thousands(m.padded / std::max<int64_t>(1, tp))
     << " per tensor-parallel rank</td></tr>\n<tr><th>padding rows</th><td>"
     << thousands(m.padded - m.vocabSize)
     << " (in memory only: checkpoints keep the model's " << thousands(m.vocabSize)
     << " rows, and sampling never sees the padding)</td></tr></table></section>\n";
}

void Page::slices() {
  os << "<section id=\"slices\"><h2>Checkpoint slices per rank</h2>\n<p>Rank lists: "
     << "<code>a-b</code> every rank from a to b, <code>a-b:s</code> every s-th. What each rank reads "
     << "from the checkpoint: boxes of the model's tensors (a rank that reads the same boxes as "
     << "another lists it). Primary bytes: the slices that rank owns in a sharded checkpoint.</p>"
     << "\n";
  // Ranks with the same slice source and totals share a row, in the order
  // of their first rank.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::vector<int64_t>> groups;
  for (const Rank &k : m.ranks)
    groups[{k.slicesOf, k.slices, k.sliceBytes, k.primaryBytes}].push_back(k.rank);
  std::vector<std::pair<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::vector<int64_t>>>
      rows(groups.begin(), groups.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto &a, const auto &b) { return a.second.front() < b.second.front(); });
  const bool fold = rows.size() > 24;
  os << (fold ? "<details><summary>" + std::to_string(rows.size()) + " groups of ranks</summary>"
              : "")
     << "<table><tr><th>ranks</th><th>slices of rank</th><th>tensors</th><th>bytes read</th>"
     << "<th>primary bytes</th></tr>\n";
  for (const auto &[key, ranks] : rows)
    os << formatv("<tr data-ranks=\"{0}\"><td>{0}</td><td>{1}</td><td>{2}</td><td>{3}</td>"
                  "<td>{4}</td></tr>\n",
                  ranges(ranks), std::get<0>(key), std::get<1>(key), gib(std::get<2>(key)),
                  gib(std::get<3>(key)));
  os << "</table>" << (fold ? "</details>" : "") << "\n";
  // The boxes of rank 0, for a feel of the layout.
  auto first = m.slices.find(m.ranks.front().slicesOf);
  if (first != m.slices.end()) {
    os << "<details><summary>The " << first->second.size() << " boxes rank 0 reads</summary>"
       << "<table><tr><th>tensor</th><th>offset</th><th>shape</th><th>of</th><th>dtype</th>"
       << "<th>bytes</th></tr>\n";
    auto dims = [](const std::vector<int64_t> &v) {
      std::string out;
      for (int64_t d : v)
        out += (out.empty() ? "" : ", ") + std::to_string(d);
      return "[" + out + "]";
    };
    for (const auto &s : first->second)
      os << "<tr><td><code>" << escape(s.name) << "</code></td><td>" << dims(s.offset)
         << "</td><td>" << dims(s.shape) << "</td><td>" << dims(s.globalShape) << "</td><td>"
         << escape(s.dtype) << "</td><td>" << thousands(static_cast<double>(s.bytes))
         << "</td></tr>\n";
    os << "</table></details>\n";
  }
  os << "</section>\n";
}

void Page::measured() {
  if (!m.measured)
    return;
  os << "<section id=\"measured\"><h2>Predicted and measured</h2>\n<p>From <code>"
     << escape(m.measuredPath) << "</code> (moert run --report-json): " << m.measuredTokens
     << " tokens in " << formatv("{0:f3}", m.measuredSeconds) << " s, "
     << formatv("{0:f1}", m.measuredTokensPerSecond) << " tokens/s measured";
  if (m.hasPlanner)
    os << " (predicted for " << escape(m.cluster) << ": " << thousands(m.tokensPerSecond)
       << " tokens/s at full batches)";
  os << ".</p>\n<p>Peaks: the planner's estimate (the bars above, with the workspace it "
     << "reserves on the device), the compiled program's exact weights, buffers and KV caches, "
     << "and what moert measured; the error is the measured against the program's.</p>\n"
     << "<table><tr><th>rank</th><th>weights (plan)</th><th>weights loaded</th>"
     << "<th>peak (planner)</th><th>peak (program)</th><th>peak (measured)</th><th>error</th>"
     << "</tr>\n";
  for (const Rank &k : m.ranks) {
    if (k.measuredPeak < 0)
      continue;
    const double error = k.programPeak ? static_cast<double>(k.measuredPeak - k.programPeak) /
                                             static_cast<double>(k.programPeak)
                                       : 0;
    os << formatv("<tr data-rank=\"{0}\" data-measured-peak=\"{1}\"><td>{0}</td><td>{2}</td>"
                  "<td>{3}</td><td>{4}</td><td>{5}</td><td>{6}</td><td>{7}{8:f1}%</td></tr>\n",
                  k.rank, k.measuredPeak, gib(k.memory.weights), gib(k.measuredWeights),
                  gib(k.memory.peak), gib(k.programPeak), gib(k.measuredPeak),
                  error >= 0 ? "+" : "", error * 100);
  }
  os << "</table></section>\n";
}

const char *kStyle = R"(
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1180px;color:#222;padding:0 16px}
h1{font-size:24px;margin:0}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #ccc}
.sub{color:#555;margin:2px 0 12px}.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #ccc;border-radius:6px;padding:8px 12px;min-width:150px}
.card h3{font-size:12px;font-weight:normal;color:#555;margin:0}.card b{font-size:18px;display:block}
.card small{color:#555}table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-variant-numeric:tabular-nums}
th{background:#f3f3f3}tr.chosen td{font-weight:bold}svg{display:block;margin:6px 0}
svg text{font:11px system-ui,sans-serif;fill:#222}.mesh text{text-anchor:middle;fill:#fff;font-weight:bold}
.node{fill:none;stroke:#888}.label{text-anchor:end}.value{text-anchor:start}
text.light{fill:#fff;text-anchor:middle;font-weight:bold}.axis{fill:#555}
.budget{stroke:#222;stroke-dasharray:4 3}.capacity{stroke:#222}.measured{stroke:#000;stroke-width:3}
.legend span{margin-right:14px;white-space:nowrap}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px;border:1px solid #555}
footer{margin-top:32px;color:#777;font-size:12px}
@media print{details{display:block}details>summary{display:none}body{margin:0}}
)";

std::string Page::render() {
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Plan report: "
     << escape(m.modelType) << " on " << m.worldSize << " ranks</title><style>" << kStyle
     << "</style></head>\n<body>\n";
  header();
  mesh();
  experts();
  memory();
  time();
  layouts();
  vocab();
  slices();
  measured();
  os << "<footer>moec report &middot; figures: the plan's and its planner's predictions"
     << (m.measured ? ", and moert's measurements" : "")
     << "; GiB = 2<sup>30</sup> bytes.</footer>\n</body>\n</html>\n";
  return html;
}

} // namespace

llvm::Error moe::writePlanReport(StringRef planPath, StringRef measuredPath, StringRef outPath) {
  Expected<report::Model> model = report::readModel(planPath, measuredPath);
  if (!model)
    return model.takeError();
  const std::string html = Page(*model).render();
  return writeFileAtomically(outPath, html, "the report");
}
