#!/usr/bin/env python3
"""The demo's summary, from what Prometheus scraped and meridian-train's JSON summary.

Prints the at-a-glance summary, writes report.json, the data files and a gnuplot script
(plot.gp -> demo.png): the region-by-region latency matrix Meridian measured before the
congestion, the training rate and allreduce bus bandwidth, the membership, and each
plane's cross-region traffic over time, with the congestion and the outage marked. Only
the Python standard library is used.
"""
import argparse
import json
import statistics
import sys
import time
import urllib.parse
import urllib.request


def query(base, expr, at=None):
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    with urllib.request.urlopen(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"query {expr}: {body}")
    return body["data"]["result"]


def query_range(base, expr, start, end, step=1.0):
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"}
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{urllib.parse.urlencode(params)}", timeout=20) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"query_range {expr}: {body}")
    return body["data"]["result"]


def series(result):
    """The first series of a range result as [(t, value)]."""
    if not result:
        return []
    return [(float(t), float(v)) for t, v in result[0]["values"]]


def read_time(path):
    """A `date +%s.%N` written by demo.sh, or None when the event did not happen."""
    try:
        return float(open(path).read().strip())
    except (OSError, ValueError):
        return None


def median_in(points, lo, hi):
    vals = [v for t, v in points if lo <= t < hi]
    return statistics.median(vals) if vals else None


def first_time(points, pred, after):
    for t, v in points:
        if t >= after and pred(v):
            return t
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-json", required=True)
    ap.add_argument("--inject", required=True)
    ap.add_argument("--congested-plane", required=True)
    ap.add_argument("--congested-regions", nargs=2, required=True)
    ap.add_argument("--congested-mbit", type=float, required=True)
    ap.add_argument("--wan-mbit", type=float, required=True)
    ap.add_argument("--isolate", help="file with the time the region went off the network")
    ap.add_argument("--reconnect", help="file with the time it came back")
    ap.add_argument("--isolated-region", default="singapore")
    a = ap.parse_args()
    base = a.prometheus
    train = json.load(open(a.train_json))
    end = time.time()
    start = end - train["wall_s"] - 15
    inject = read_time(a.inject)
    isolate = read_time(a.isolate) if a.isolate else None
    reconnect = read_time(a.reconnect) if a.reconnect else None
    r1, r2 = a.congested_regions
    plane = a.congested_plane
    pair = (f'plane="{plane}",region=~"{r1}|{r2}",peer_region=~"{r1}|{r2}"')
    report = {"train": train, "inject_unix": inject}

    # The latency matrix just before the congestion (or at the end without one).
    at = (inject - 2) if inject else end
    matrix = {}
    # The minimum round trip each pair's probes saw (the links themselves, without the queueing
    # of the moment), the median over the node pairs of each region pair.
    for row in query(base, "quantile by (region, peer_region, plane) (0.5, meridian_routing_path_min_rtt_seconds)", at):
        m = row["metric"]
        if "region" in m and "peer_region" in m and "plane" in m:
            matrix.setdefault(m["plane"], {})[(m["region"], m["peer_region"])] = 1e3 * float(row["value"][1])
    order = []
    for p in matrix.values():
        for (s, d) in p:
            for r in (s, d):
                if r not in order:
                    order.append(r)
    preferred = ["london", "virginia", "singapore"]
    order.sort(key=lambda r: preferred.index(r) if r in preferred else 99)
    report["rtt_ms"] = {p: {f"{s}->{d}": v for (s, d), v in cells.items()} for p, cells in matrix.items()}

    # The congestion: when Meridian flagged it, when it moved the traffic, what rate remained.
    detect = reroute = None
    rate_before = rate_after = None
    if inject:
        flagged = series(query_range(base, f"max(meridian_routing_path_congested{{{pair}}})", inject - 10, end))
        t = first_time(flagged, lambda v: v >= 1, inject)
        detect = t - inject if t else None
        weight = series(query_range(base, f"min(meridian_routing_path_weight{{{pair}}})", inject - 10, end))
        t = first_time(weight, lambda v: v < 0.5, inject)
        reroute = t - inject if t else None
    # From the step counter, so that a stall (a membership change) reads as one, where the
    # samples/s gauge would keep its last value.
    sps = series(query_range(base, f'max(rate(meridian_trainer_steps_total{{rank="0"}}[10s])) * {train["batch"]}',
                             start, end))
    busbw = series(query_range(base, 'max(meridian_collectives_busbw_bytes_per_second{op="allreduce",rank="0"})',
                               start, end))
    if inject and sps:
        before = [v for t, v in sps if t < inject and v > 0]
        settle = inject + (reroute or detect or 0) + 4
        after = [v for t, v in sps if settle <= t < (isolate or end) and v > 0]
        rate_before = statistics.median(before) if before else None
        rate_after = statistics.median(after) if after else None
    report.update({"detect_s": detect, "reroute_s": reroute, "samples_per_s_before": rate_before,
                   "samples_per_s_after": rate_after})

    # The membership rank 0 trained in (job rank 0 stays in London), and each plane's
    # cross-region traffic: every rank's bytes written to paths whose peer is in another
    # region, summed per plane (the per-path series carry plane, region and peer_region).
    members = series(query_range(base, 'max(meridian_trainer_world_size{rank="0"})', start, end))
    traffic = {}
    for row in query_range(base, "sum by (plane, region, peer_region) "
                           "(rate(meridian_transport_path_sent_bytes_total[4s]))", start, end):
        m = row["metric"]
        if not m.get("plane") or not m.get("region") or not m.get("peer_region") or m["region"] == m["peer_region"]:
            continue
        per_t = traffic.setdefault(m["plane"], {})
        for t, v in row["values"]:
            per_t[float(t)] = per_t.get(float(t), 0.0) + float(v)
    planes = sorted(traffic)
    traffic = {p: sorted(traffic[p].items()) for p in planes}
    # Windows around the events: each starts a few seconds after its event (detection and
    # re-planning) and ends at the next event.
    began = sps[0][0] if sps else start  # the first sample of training
    events = [("before the congestion", began, inject)]
    if inject:
        events.append(("congested", inject + 6, isolate or end))
    if isolate:
        events.append((f"{a.isolated_region} off the network", isolate + 6, reconnect or end))
    if reconnect:
        events.append((f"{a.isolated_region} back", reconnect + 8, end))
    windows = []
    for name, lo, hi in events:
        if hi is None or hi - lo < 2:
            continue
        sizes = [v for t, v in members if lo <= t < hi]
        windows.append({"window": name, "from_s": lo, "to_s": hi,
                        "ranks": f"{min(sizes):.0f}" + (f"-{max(sizes):.0f}" if max(sizes) != min(sizes) else "")
                        if sizes else "-",
                        "samples_per_s": median_in(sps, lo, hi),
                        "cross_region_mb_per_s": {p: (median_in(traffic[p], lo, hi) or 0) / 1e6 for p in planes}})
    changes = []
    for (t1, v1), (t2, v2) in zip(members, members[1:]):
        if v2 != v1 and v2 > 0:
            changes.append({"t": t2, "from": v1, "to": v2})
    report.update({"isolate_unix": isolate, "reconnect_unix": reconnect, "windows": windows,
                   "membership_changes": changes})
    json.dump(report, open(f"{a.out}/report.json", "w"), indent=2, default=str)

    # Data and the gnuplot script for demo.png.
    t0 = sps[0][0] if sps else start
    with open(f"{a.out}/rate.dat", "w") as f:
        for t, v in sps:
            f.write(f"{t - t0:.1f} {v:.1f}\n")
    with open(f"{a.out}/busbw.dat", "w") as f:
        for t, v in busbw:
            f.write(f"{t - t0:.1f} {v / 1e6:.3f}\n")
    with open(f"{a.out}/members.dat", "w") as f:
        for t, v in members:
            f.write(f"{t - t0:.1f} {v:.0f}\n")
    with open(f"{a.out}/traffic.dat", "w") as f:
        f.write("# t " + " ".join(planes) + "  (MB/s between regions)\n")
        times = sorted({t for p in planes for t, _ in traffic[p]})
        lookup = {p: dict(traffic[p]) for p in planes}
        for t in times:
            f.write(f"{t - t0:.1f} " + " ".join(f"{lookup[p].get(t, 0) / 1e6:.3f}" for p in planes) + "\n")
    heat = matrix.get(plane) or (next(iter(matrix.values())) if matrix else {})
    with open(f"{a.out}/matrix.dat", "w") as f:
        for i, s in enumerate(order):
            for j, d in enumerate(order):
                v = heat.get((s, d))
                f.write(f"{j} {i} {v if v is not None else 'NaN'}\n")
            f.write("\n")
    labels = ", ".join(f'"{r}" {i}' for i, r in enumerate(order))
    marks = []
    if inject:
        marks.append((inject, f"{plane} {r1}-{r2} to {a.congested_mbit:g} Mbit/s", "red"))
    if isolate:
        marks.append((isolate, f"{a.isolated_region} off", "dark-violet"))
    if reconnect:
        marks.append((reconnect, f"{a.isolated_region} back", "dark-green"))
    marker = "".join(f"set arrow from {t - t0:.1f}, graph 0 to {t - t0:.1f}, graph 1 nohead lc rgb '{c}' dt 2\n"
                     f"set label '{text}' at {t - t0:.1f}, graph {0.95 - 0.07 * i:.2f} tc rgb '{c}' offset 0.5,0\n"
                     for i, (t, text, c) in enumerate(marks))
    traffic_plot = ", ".join(f"'{a.out}/traffic.dat' using 1:{i + 2} with lines lw 2 title '{p}'"
                             for i, p in enumerate(planes)) or "NaN notitle"
    with open(f"{a.out}/plot.gp", "w") as f:
        f.write(f"""set terminal pngcairo size 1400,1000 font ',11'
set output '{a.out}/demo.png'
set multiplot layout 2,2 title 'Meridian demo: {train['ranks']} nodes, sync {train['sync']}, test accuracy {100 * train['test_accuracy']:.1f}%'
set title 'Minimum round trip, plane {plane} (ms), before the congestion'
set xtics ({labels})
set ytics ({labels})
set yrange [] reverse
set xlabel 'to'
set ylabel 'from'
set cbrange [0:*]
set palette defined (0 '#f7fbff', 1 '#6baed6', 2 '#08306b')
unset key
plot '{a.out}/matrix.dat' using 1:2:3 with image, '' using 1:2:(sprintf('%.0f', $3)) with labels tc rgb 'black'
unset xtics; unset ytics; set xtics; set ytics; set yrange [*:*] noreverse
set title 'Training rate and allreduce bus bandwidth'
set xlabel 'seconds since training started'
set ylabel 'samples/s'
set y2label 'busbw (MB/s)'
set y2tics
set key bottom left opaque
{marker}plot '{a.out}/rate.dat' using 1:2 with lines lw 2 title 'samples/s (rank 0 steps x batch, 10 s rate)', \\
     '{a.out}/busbw.dat' using 1:2 axes x1y2 with points pt 7 ps 0.4 title 'allreduce busbw'
unset y2tics; unset y2label
set title 'Membership: ranks training together (rank 0)'
set ylabel 'ranks'
set yrange [0:{max([v for _, v in members] + [train['ranks']]) + 1:.0f}]
plot '{a.out}/members.dat' using 1:2 with steps lw 2 lc rgb '#08306b' title 'world size'
set yrange [0:*]
set title 'Cross-region traffic per plane (all ranks, sent)'
set ylabel 'MB/s'
plot {traffic_plot}
unset multiplot
""")

    # The summary.
    def fmt_s(x):
        return f"{x:.1f} s" if x is not None else "not seen"
    speedup = train["samples_per_s"] / train["one_rank_samples_per_s"] if train.get("one_rank_samples_per_s") else 0
    print("\n== Meridian demo summary ==")
    print(f"  accuracy      {100 * train['test_accuracy']:.2f}% on the Fashion-MNIST test set "
          f"(sync {train['sync']}, {train['ranks']} nodes in {train['regions']} regions)")
    import os
    cores = os.cpu_count() or 1
    shared = f"; the {train['ranks']} nodes share this machine's {cores} cores" if train["ranks"] > cores else ""
    print(f"  wall time     {train['wall_s']:.1f} s, {train['samples_per_s']:.0f} samples/s; "
          f"speedup against one node {speedup:.2f}x (one node alone: {train['one_rank_samples_per_s']:.0f} samples/s{shared})")
    print(f"  across WAN    {train['bytes_cross_region'] / 1e6:.1f} MB sent between regions "
          f"(of {train['bytes_sent'] / 1e6:.1f} MB)")
    for p in sorted(matrix):
        print(f"  RTT {p:<6} (ms: minimum round trip Meridian's probes measured before the congestion; rows from, columns to)")
        print("                " + "".join(f"{r:>12}" for r in order))
        for s in order:
            cells = "".join(f"{matrix[p][(s, d)]:12.1f}" if (s, d) in matrix[p] else f"{'-':>12}" for d in order)
            print(f"    {s:<12}{cells}")
    if inject:
        print(f"  congestion    {plane} {r1}-{r2} cut from {a.wan_mbit:g} to {a.congested_mbit:g} Mbit/s at "
              f"{inject - t0:.0f} s (30% of the steps)")
        print(f"  detected      {fmt_s(detect)} after the cut (path flagged congested)")
        print(f"  rerouted      {fmt_s(reroute)} after the cut (the path's multipath weight below 0.5: "
              f"traffic moved to the other plane)")
        if rate_before and rate_after:
            print(f"  training rate {rate_before:.0f} samples/s before, {rate_after:.0f} after rerouting "
                  f"({100 * rate_after / rate_before:.0f}%)")
    else:
        print("  congestion    not injected (the run ended before 30%)")
    if isolate:
        back = f"back after {reconnect - isolate:.0f} s" if reconnect else "not back before the end"
        print(f"  outage        {a.isolated_region} off the network (every plane, both ways), {back}")
        for c in changes:
            since = f"{c['t'] - isolate:+.1f} s from the outage"
            if reconnect:
                since += f", {c['t'] - reconnect:+.1f} s from the return"
            print(f"  membership    {c['from']:.0f} -> {c['to']:.0f} ranks at {c['t'] - t0:.0f} s ({since})")
        if not changes:
            print("  membership    no change seen by Prometheus")
    if windows:
        head = "".join(f"{p + ' MB/s':>13}" for p in planes)
        print(f"  {'window (s since training started)':<38}{'ranks':>6}{'samples/s':>11}{head}   (cross-region, all ranks, medians)")
        for w in windows:
            name = f"{w['window']} ({w['from_s'] - t0:.0f}-{w['to_s'] - t0:.0f})"
            ranks = w["ranks"]
            rate = f"{w['samples_per_s']:.0f}" if w["samples_per_s"] is not None else "-"
            cells = "".join(f"{w['cross_region_mb_per_s'][p]:13.2f}" for p in planes)
            print(f"    {name:<36}{ranks:>6}{rate:>11}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
