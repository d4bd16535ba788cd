#!/usr/bin/env python3
"""What the Grafana schema does not check in the Meridian dashboards.

    tests/monitoring/lint_dashboards.py DASH_DIR

Per dashboard: a uid and title; every panel has a unique id and a gridPos inside the
24-column grid; every non-row panel, each of its targets, each template variable and each
annotation query uses the datasource {"type": "prometheus", "uid": "meridian-prometheus"};
every non-row panel has a target with a non-empty expr, and no target has an empty one;
refIds are unique within a panel; an annotation that keeps its expr both in target and at
the top level (for older Grafana) has the same one in both; every $variable used is defined
(or one of Grafana's $__ built-ins); brackets balance; and every metric name in a query is
one of Meridian's exported metrics (histograms only through _bucket, _sum or _count).
Prints one line per problem and exits 1 if there is any.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboard_queries as dq  # noqa: E402

DS_UID = "meridian-prometheus"

# The metric contract of Meridian's /metrics (monitoring exporter).
PLAIN = {
    # routing: probes, congestion, plans
    "meridian_routing_path_rtt_seconds",
    "meridian_routing_path_min_rtt_seconds",
    "meridian_routing_path_jitter_seconds",
    "meridian_routing_path_loss_ratio",
    "meridian_routing_path_congested",
    "meridian_routing_path_weight",
    "meridian_routing_congestion_changes_total",
    "meridian_routing_plan_epoch",
    "meridian_routing_replans_total",
    # transport
    "meridian_transport_path_sent_bytes_total",
    "meridian_transport_path_received_bytes_total",
    "meridian_transport_path_resent_chunks_total",
    "meridian_transport_path_tcp_delivery_rate_bytes_per_second",
    "meridian_transport_path_tcp_rtt_seconds",
    "meridian_transport_path_tcp_retransmits",
    "meridian_transport_path_up",
    # collectives
    "meridian_collectives_op_bytes_total",
    "meridian_collectives_busbw_bytes_per_second",
    # trainer
    "meridian_trainer_loss",
    "meridian_trainer_train_accuracy_ratio",
    "meridian_trainer_test_accuracy_ratio",
    "meridian_trainer_samples_per_second",
    "meridian_trainer_steps_total",
    "meridian_trainer_sync_payload_bytes_total",
    "meridian_trainer_membership_changes_total",
    "meridian_trainer_world_size",
    # membership (docs/elastic.md)
    "meridian_membership_epoch",
    "meridian_membership_size",
    "meridian_membership_peers_lost_total",
}
HISTOGRAMS = {
    "meridian_collectives_op_latency_seconds",
    "meridian_trainer_step_compute_seconds",
    "meridian_trainer_step_exposed_comm_seconds",
    "meridian_trainer_recovery_seconds",
}
ALLOWED = PLAIN | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
METRIC_RE = re.compile(r"meridian_[A-Za-z0-9_:]+")
VAR_RE = re.compile(r"\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\$([A-Za-z0-9_]+)|\[\[([A-Za-z0-9_]+)(?::[^\]]*)?\]\]")


def metric_names(expr):
    # Quoted label values may hold anything; only names outside quotes are metrics.
    unquoted = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return METRIC_RE.findall(unquoted)


def balanced(expr):
    stack, pairs = [], {")": "(", "]": "[", "}": "{"}
    for c in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if c in "([{":
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack


def check_ds(ds, where, errs):
    if not isinstance(ds, dict) or ds.get("uid") != DS_UID or ds.get("type") != "prometheus":
        errs.append(f"{where}: datasource must be {{type: prometheus, uid: {DS_UID}}}, is {ds!r}")


def check_expr(expr, where, variables, errs):
    if not isinstance(expr, str) or not expr.strip():
        errs.append(f"{where}: empty expr")
        return
    for m in metric_names(expr):
        if m not in ALLOWED:
            hint = " (a histogram: use _bucket, _sum or _count)" if m in HISTOGRAMS else ""
            errs.append(f"{where}: metric {m} is not one Meridian exports{hint}")
    for g in VAR_RE.findall(expr):
        name = next(x for x in g if x)
        if name not in variables and name not in dq.BUILTINS:
            errs.append(f"{where}: undefined variable ${name}")
    if not balanced(expr):
        errs.append(f"{where}: unbalanced brackets in {expr!r}")


def lint(name, dash):
    errs = []
    if not dash.get("uid") or not dash.get("title"):
        errs.append(f"{name}: dashboard needs a uid and a title")
    variables = dq.variable_names(dash)
    for v in (dash.get("templating") or {}).get("list", []):
        where = f"{name}: variable {v.get('name')!r}"
        if v.get("type") == "query":
            check_ds(v.get("datasource"), where, errs)
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else q
            check_expr(q, where, variables, errs)
    ids = {}
    for p in dq.panels(dash):
        title = p.get("title", "")
        where = f"{name}: panel {p.get('id')!r} {title!r}"
        pid = p.get("id")
        if not isinstance(pid, int):
            errs.append(f"{where}: no integer id")
        elif pid in ids:
            errs.append(f"{where}: id {pid} also used by {ids[pid]!r}")
        else:
            ids[pid] = title
        g = p.get("gridPos")
        if not isinstance(g, dict) or not all(isinstance(g.get(k), int) for k in "hwxy"):
            errs.append(f"{where}: gridPos needs integer h, w, x, y")
        elif g["w"] < 1 or g["h"] < 1 or g["x"] < 0 or g["y"] < 0 or g["x"] + g["w"] > 24:
            errs.append(f"{where}: gridPos {g} outside the 24-column grid")
        if p.get("type") == "row":
            continue
        check_ds(p.get("datasource"), where, errs)
        targets = p.get("targets") or []
        if not any(isinstance(t.get("expr"), str) and t["expr"].strip() for t in targets):
            errs.append(f"{where}: no target with an expr")
        refs = set()
        for t in targets:
            tw = f"{where} target {t.get('refId')!r}"
            check_ds(t.get("datasource"), tw, errs)
            check_expr(t.get("expr"), tw, variables, errs)
            if t.get("refId") in refs:
                errs.append(f"{tw}: duplicate refId")
            refs.add(t.get("refId"))
    for a in (dash.get("annotations") or {}).get("list", []):
        if a.get("builtIn"):
            continue
        where = f"{name}: annotation {a.get('name')!r}"
        check_ds(a.get("datasource"), where, errs)
        t = a.get("target")
        if isinstance(t, dict):
            if "datasource" in t:
                check_ds(t["datasource"], where + " target", errs)
            if a.get("expr") and t.get("expr") and a["expr"] != t["expr"]:
                errs.append(f"{where}: target.expr and expr differ")
        check_expr(dq.annotation_expr(a), where, variables, errs)
    return errs


def main(argv):
    if len(argv) != 2:
        print("usage: lint_dashboards.py DASH_DIR", file=sys.stderr)
        return 2
    dashboards = dq.load(argv[1])
    if not dashboards:
        print(f"lint_dashboards: no *.json in {argv[1]}", file=sys.stderr)
        return 1
    errs = [e for name, d in dashboards for e in lint(name, d)]
    for e in errs:
        print(e)
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
