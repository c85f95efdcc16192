#!/usr/bin/env python3
"""Checks a plan report (moec report, docs/plan-report.md); stdlib only.

  check-report.py REPORT.html --plan PLAN [--json LAYOUT.json] [--measured M.json]
                  [--png SCREENSHOT.png]

- the HTML is well formed (every element closed in order; SVG elements may
  close themselves);
- every rank of the plan is drawn once in the mesh, once among the memory
  bars and once in the slice table (rank lists: "a", "a-b", "a-b:step");
- every expert of the first expert stack is placed once per expert-parallel
  layout (the placement strip covers 0..E-1 without overlap);
- each memory bar's data-peak / data-weights equal `moec compile --json`'s
  figures for every rank it stands for (--json), the summary's throughput
  is the planner's; with --measured, every rank's measured peak is shown;
- every <svg> draws something;
- --png: the screenshot headless Chromium took of the page is a real
  rendering: a valid PNG, not one colour, with ink on a good part of it.
"""
import argparse
import html.parser
import json
import struct
import sys
import zlib

VOID = {"meta", "br", "img", "input", "hr", "link", "wbr", "col", "area", "base", "source"}


def fail(message):
    print("check-report: " + message, file=sys.stderr)
    sys.exit(1)


def rank_list(text):
    out = []
    for item in text.split(","):
        step = 1
        if ":" in item:
            item, s = item.split(":")
            step = int(s)
        if "-" in item:
            a, b = item.split("-")
            out += list(range(int(a), int(b) + 1, step))
        else:
            out.append(int(item))
    return out


class Report(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.section, self.elements, self.text = [], None, [], []
        self.svg_children = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section = attrs.get("id")
        if tag == "svg":
            self.svg_children.append(0)
        elif self.svg_children and tag in ("rect", "line", "text", "g", "path", "circle"):
            self.svg_children[-1] += 1
        self.elements.append((self.section, tag, attrs))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        attrs = dict(attrs)
        if self.svg_children and tag in ("rect", "line", "text", "path", "circle"):
            self.svg_children[-1] += 1
        self.elements.append((self.section, tag, attrs))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            fail("HTML: </%s> closes <%s> (line %d)" % (tag, self.stack[-1] if self.stack else "nothing",
                                                          self.getpos()[0]))
        self.stack.pop()
        if tag == "section":
            self.section = None

    def handle_data(self, data):
        self.text.append(data)


def png_pixels(path):
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(path + ": not a PNG")
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace:
                fail(path + ": unexpected PNG kind (depth %d, colour %d)" % (depth, colour))
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, previous = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, previous))
        elif f == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = previous[i], previous[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        previous = line
    return width, height, bpp, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--json")
    ap.add_argument("--measured")
    ap.add_argument("--png")
    args = ap.parse_args()
    plan = json.load(open(args.plan))
    world = plan["world_size"]
    r = Report()
    r.feed(open(args.report, encoding="utf-8").read())
    r.close()
    if r.stack:
        fail("HTML: <%s> never closed" % r.stack[-1])
    if not r.svg_children or min(r.svg_children) == 0:
        fail("an <svg> draws nothing")

    def covered(section, attr="data-ranks"):
        seen = []
        for s, tag, attrs in r.elements:
            if s == section and attr in attrs:
                seen += rank_list(attrs[attr])
        return sorted(seen)

    for section in ("mesh", "memory", "slices"):
        if covered(section) != list(range(world)):
            fail("%s: the ranks drawn are not each of 0..%d once" % (section, world - 1))
    stacks = [w for w in plan["weights"] if "experts" in w]
    if stacks:
        experts = stacks[0]["experts"]
        placed = sorted(e for s, tag, a in r.elements if s == "experts" and "data-experts" in a
                        for e in rank_list(a["data-experts"]))
        if placed != list(range(experts)):
            fail("experts: the placement does not cover experts 0..%d once" % (experts - 1))
    if args.json:
        layout = json.load(open(args.json))
        by_rank = {k["rank"]: k["memory"] for k in layout["ranks"]}
        for s, tag, a in r.elements:
            if s == "memory" and "data-peak" in a:
                for rank in rank_list(a["data-ranks"]):
                    if int(a["data-peak"]) != by_rank[rank]["peak"] or \
                       int(a["data-weights"]) != by_rank[rank]["weights"]:
                        fail("memory: rank %d's bar says peak %s, weights %s; --json says %s" %
                             (rank, a["data-peak"], a["data-weights"], by_rank[rank]))
        tps = "{:,}".format(round(layout["search"]["chosen"]["tokens_per_second"]))
        if tps + " tokens/s" not in "".join(r.text):
            fail("summary: the planner's %s tokens/s is not shown" % tps)
    if args.measured:
        measured = {k["rank"]: k["peak"] for k in json.load(open(args.measured))["ranks"]}
        shown = {int(a["data-rank"]): int(a["data-measured-peak"]) for s, tag, a in r.elements
                 if s == "measured" and "data-measured-peak" in a}
        if shown != measured:
            fail("measured: the table shows %s, the file says %s" % (shown, measured))
    if args.png:
        width, height, bpp, rows = png_pixels(args.png)
        colours, ink = set(), 0
        for line in rows[::4]:
            for x in range(0, width * bpp, bpp * 4):
                px = bytes(line[x:x + 3])
                colours.add(px)
                ink += px != b"\xff\xff\xff"
        samples = ((height + 3) // 4) * ((width + 3) // 4)
        if len(colours) < 8 or ink < 0.02 * samples:
            fail("%s: the page did not render (%d colours, %.1f%% ink)" %
                 (args.png, len(colours), 100.0 * ink / samples))
        print("rendered: %dx%d, %d colours, %.1f%% ink" % (width, height, len(colours),
                                                           100.0 * ink / samples))
    print("report ok: %d ranks, %d elements" % (world, len(r.elements)))


if __name__ == "__main__":
    main()
