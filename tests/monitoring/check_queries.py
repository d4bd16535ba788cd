#!/usr/bin/env python3
"""Runs every PromQL query of every dashboard (panels, nested rows, annotations) against a
live Prometheus and requires each panel's to return data carrying the labels the panel uses
(its `by (...)` groupings and the {{label}}s of its legend); annotation queries must be
valid (the events they mark may not happen in a calm run). Retries until all pass or the
timeout; prints what still fails. Standard library only."""
import argparse
import glob
import json
import re
import sys
import time
import urllib.parse
import urllib.request


def walk_panels(panels):
    for p in panels or []:
        yield p
        yield from walk_panels(p.get("panels"))


def queries(dashboard_dir):
    out = []
    for path in sorted(glob.glob(f"{dashboard_dir}/*.json")):
        d = json.load(open(path))
        name = d.get("title", path)
        for p in walk_panels(d.get("panels")):
            for t in p.get("targets", []) or []:
                if t.get("expr"):
                    out.append((name, p.get("title", "?"), t["expr"], t.get("legendFormat", "")))
        for a in d.get("annotations", {}).get("list", []):
            expr = a.get("expr") or (a.get("target") or {}).get("expr")
            if expr:
                out.append((name, "annotation: " + a.get("name", "?"), expr, a.get("titleFormat", "") + a.get("textFormat", "")))
    return out


def concrete(expr):
    """Dashboard variables become match-anything; Grafana's interval macros a fixed window."""
    expr = re.sub(r'=\s*"\$\{?\w+\}?"', '=~".+"', expr)
    expr = re.sub(r'=~\s*"\$\{?\w+(:\w+)?\}?"', '=~".+"', expr)
    expr = re.sub(r"\$\{?__(rate_interval|interval|range)\}?", "15s", expr)
    return expr


def needed_labels(expr, legend):
    labels = set()
    for m in re.finditer(r"\bby\s*\(([^)]*)\)", expr):
        labels.update(x.strip() for x in m.group(1).split(",") if x.strip())
    labels.update(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
    labels.discard("le")  # grouped by for histogram_quantile, which consumes it
    return labels


def run(base, expr):
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(body.get("error", body))
    return body["data"]["result"]


def check(base, q):
    dash, panel, expr, legend = q
    e = concrete(expr)
    try:
        result = run(base, e)
    except Exception as ex:  # a query Prometheus refuses is a failure, with its message
        return f"{dash} / {panel}: {e}: {ex}"
    if not result:
        # Annotations mark events (congestion, replans) that a calm run may not have: they
        # must be valid queries; panels must show data.
        return None if panel.startswith("annotation: ") else f"{dash} / {panel}: {e}: no data"
    need = needed_labels(expr, legend)
    for series in result:
        metric = series.get("metric", {})
        missing = [l for l in need if not metric.get(l)]
        if missing:
            return f"{dash} / {panel}: {e}: a series lacks {missing}: {metric}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--dashboards", required=True)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--ranks", type=int, default=1)
    a = ap.parse_args()
    qs = queries(a.dashboards)
    if not qs:
        print(f"no queries found in {a.dashboards}")
        return 1
    deadline = time.time() + a.timeout
    failures = ["not checked yet"]
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{a.prometheus}/api/v1/targets", timeout=10) as r:
                targets = json.load(r)["data"]["activeTargets"]
            up = [t for t in targets if t.get("health") == "up"]
            if len(up) < a.ranks:
                failures = [f"{len(up)} of {a.ranks} rank targets up: {[t.get('lastError') for t in targets]}"]
                time.sleep(2)
                continue
        except OSError as ex:
            failures = [f"Prometheus not answering: {ex}"]
            time.sleep(2)
            continue
        failures = [f for f in (check(a.prometheus, q) for q in qs) if f]
        if not failures:
            print(f"all {len(qs)} dashboard queries return data with their labels "
                  f"({len(up)} targets up)")
            return 0
        time.sleep(3)
    print(f"{len(failures)} of {len(qs)} dashboard queries still failing after {a.timeout:.0f} s:")
    for f in failures:
        print("  " + f)
    return 1


if __name__ == "__main__":
    sys.exit(main())
