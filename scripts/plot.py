#!/usr/bin/env python3
"""Line plots as SVG from a CSV file, with no dependency beyond Python.

    plot.py DATA.csv --x COLUMN --y COL[,COL...] --out PLOT.svg
            [--title T] [--xlabel L] [--ylabel L] [--logx] [--logy]
            [--where COLUMN=VALUE ...] [--label COL=NAME ...]

One series per `--y` column, drawn against `--x` (rows sorted by x; empty
cells skipped). `--where` keeps only the rows whose COLUMN equals VALUE
(repeatable), so one long CSV can feed several plots (the scaling curves
of docs/benchmarks.md: extraction against size and against entry count,
manifest apply against items and bytes, the daemon against runs, startup
against binds). Log axes use powers of ten for their ticks, linear axes
1/2/5 steps. Every point is marked, and its value is in the SVG's <title>
(shown when hovering in a browser).
"""
import argparse
import csv
import math
import sys

W, H = 780, 440
LEFT, RIGHT, TOP, BOTTOM = 78, 230, 40, 58
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def nice_ticks(lo, hi, log):
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        return [10.0**e for e in range(a, b + 1)]
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / 6
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 0.5:
        ticks.append(round(t, 10))
        t += step
    return ticks


def fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or abs(v) < 1e-3:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    if abs(v - round(v)) < 1e-9:
        return f"{int(round(v)):,}".replace(",", " ")
    return f"{v:g}"


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--x", required=True)
    ap.add_argument("--y", required=True, help="comma-separated columns, one series each")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    ap.add_argument("--xlabel")
    ap.add_argument("--ylabel", default="")
    ap.add_argument("--logx", action="store_true")
    ap.add_argument("--logy", action="store_true")
    ap.add_argument("--where", action="append", default=[], metavar="COLUMN=VALUE")
    ap.add_argument("--label", action="append", default=[], metavar="COLUMN=NAME")
    a = ap.parse_args()

    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    for cond in a.where:
        col, _, val = cond.partition("=")
        rows = [r for r in rows if r.get(col) == val]
    labels = dict(item.partition("=")[::2] for item in a.label)
    series = []
    for col in a.y.split(","):
        pts = sorted((float(r[a.x]), float(r[col])) for r in rows if r.get(col) not in (None, "") and r.get(a.x))
        if pts:
            series.append((labels.get(col, col), pts))
    if not series:
        sys.exit(f"plot.py: no data for {a.y} against {a.x} in {a.csv}")

    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    xlo, xhi = min(xs), max(xs)
    ylo, yhi = (min(ys), max(ys)) if a.logy else (0.0, max(ys) * 1.08 or 1.0)
    xt, yt = nice_ticks(xlo, xhi, a.logx), nice_ticks(ylo, yhi, a.logy)
    if a.logx:
        xlo, xhi = xt[0], xt[-1]
    else:
        xlo, xhi = min(xlo, xt[0]), max(xhi, xt[-1])
    ylo, yhi = (yt[0], yt[-1]) if a.logy else (0.0, max(yhi, yt[-1]))
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x):
        f = (math.log10(x) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo) or 1) if a.logx else (x - xlo) / ((xhi - xlo) or 1)
        return LEFT + f * pw

    def py(y):
        f = (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo) or 1) if a.logy else (y - ylo) / ((yhi - ylo) or 1)
        return TOP + ph - f * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT + pw / 2}" y="22" text-anchor="middle" font-size="14" font-weight="bold">{esc(a.title)}</text>']
    for t in xt:
        if xlo <= t <= xhi:
            out.append(f'<line x1="{px(t):.1f}" y1="{TOP}" x2="{px(t):.1f}" y2="{TOP + ph}" stroke="#e5e5e5"/>')
            out.append(f'<text x="{px(t):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{fmt(t)}</text>')
    for t in yt:
        if ylo <= t <= yhi:
            out.append(f'<line x1="{LEFT}" y1="{py(t):.1f}" x2="{LEFT + pw}" y2="{py(t):.1f}" stroke="#e5e5e5"/>')
            out.append(f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 14}" text-anchor="middle">{esc(a.xlabel or a.x)}'
               f'{" (log scale)" if a.logx else ""}</text>')
    out.append(f'<text transform="translate(18,{TOP + ph / 2}) rotate(-90)" text-anchor="middle">{esc(a.ylabel)}'
               f'{" (log scale)" if a.logy else ""}</text>')
    for i, (name, pts) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{'M' if j == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for j, (x, y) in enumerate(pts))
        out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}">'
                       f'<title>{esc(name)}: {fmt(x)} → {y:g}</title></circle>')
        ly = TOP + 12 + i * 20
        out.append(f'<line x1="{LEFT + pw + 12}" y1="{ly}" x2="{LEFT + pw + 32}" y2="{ly}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{LEFT + pw + 38}" y="{ly + 4}">{esc(name)}</text>')
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
