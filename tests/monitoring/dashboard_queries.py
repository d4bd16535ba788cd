#!/usr/bin/env python3
"""Print every PromQL query of the Meridian Grafana dashboards as JSON lines.

    tests/monitoring/dashboard_queries.py DASH_DIR

One line per panel target and per annotation query:
    {"dashboard": "meridian-network", "panel": "Path RTT", "kind": "panel", "refId": "A",
     "instant": false, "expr": "..."}
"dashboard" is the file name without .json (also the dashboard uid); "panel" is the panel
title as written (a repeated panel keeps its "$var"), or the annotation name for
kind "annotation". The expressions are runnable as they stand: every dashboard template
variable matches everything (label="$v" and label=~"$v" become label=~".+"; label!="$v"
becomes label!~".+"), and Grafana's built-in interval variables get fixed values
($__rate_interval and $__interval -> 1m, $__range -> 1h).

Also a small library for check_dashboards.py: load(), panels(), queries().
"""
import json
import os
import re
import signal
import sys

BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}


def load(dash_dir):
    """(name, dashboard) for each *.json in dash_dir, sorted by name."""
    out = []
    for fn in sorted(os.listdir(dash_dir)):
        if fn.endswith(".json"):
            with open(os.path.join(dash_dir, fn), encoding="utf-8") as f:
                out.append((fn[: -len(".json")], json.load(f)))
    return out


def panels(dash):
    """Every panel, rows' nested panels (collapsed rows keep theirs) included."""
    for p in dash.get("panels", []):
        yield p
        for q in p.get("panels", []) if p.get("type") == "row" else []:
            yield q


def annotation_expr(a):
    t = a.get("target")
    if isinstance(t, dict) and t.get("expr"):
        return t["expr"]
    return a.get("expr", "")


def queries(dash):
    """(kind, title, refId, instant, raw expr) for each panel target and annotation query."""
    for p in panels(dash):
        for t in p.get("targets", []) or []:
            yield ("panel", p.get("title", ""), t.get("refId", ""), bool(t.get("instant")), t.get("expr", ""))
    for a in (dash.get("annotations") or {}).get("list", []):
        if a.get("builtIn"):
            continue
        yield ("annotation", a.get("name", ""), "Anno", False, annotation_expr(a))


def variable_names(dash):
    return [v["name"] for v in (dash.get("templating") or {}).get("list", []) if v.get("name")]


def var_ref(name):
    """A regex for one reference to variable `name`: $name, ${name}, ${name:fmt}, [[name]]."""
    n = re.escape(name)
    return r"(?:\$\{" + n + r"(?::[^}]*)?\}|\$" + n + r"(?![A-Za-z0-9_])|\[\[" + n + r"(?::[^\]]*)?\]\])"


def substitute(expr, names):
    """Make expr runnable outside Grafana: template variables match everything."""
    for name in sorted(names, key=len, reverse=True):
        ref = var_ref(name)
        # A label matcher whose whole value is the variable.
        expr = re.sub(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"' + ref + r'"',
                      lambda m: m.group(1) + ("!~" if m.group(2) in ("!=", "!~") else "=~") + '".+"',
                      expr)
        expr = re.sub(ref, ".+", expr)
    for name, value in sorted(BUILTINS.items(), key=lambda kv: len(kv[0]), reverse=True):
        expr = re.sub(var_ref(name), value, expr)
    return expr


def main(argv):
    if len(argv) != 2:
        print("usage: dashboard_queries.py DASH_DIR", file=sys.stderr)
        return 2
    for name, dash in load(argv[1]):
        names = variable_names(dash)
        for kind, title, ref, instant, expr in queries(dash):
            print(json.dumps({"dashboard": name, "panel": title, "kind": kind, "refId": ref,
                              "instant": instant, "expr": substitute(expr, names)}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    sys.exit(main(sys.argv))
