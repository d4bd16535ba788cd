#!/usr/bin/env python3
"""The demo's summary, from what Prometheus scraped and meridian-train's JSON summary.

Prints the at-a-glance summary, writes report.json, the data files and a gnuplot script
(plot.gp -> demo.png): the region-by-region latency matrix Meridian measured before the
congestion, and the training rate and allreduce bus bandwidth over time with the
congestion event marked. Only the Python standard library is used.
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
    a = ap.parse_args()
    base = a.prometheus
    train = json.load(open(a.train_json))
    end = time.time()
    start = end - train["wall_s"] - 15
    try:
        inject = float(open(a.inject).read().strip())
    except (OSError, ValueError):
        inject = None
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
    sps = series(query_range(base, 'avg_over_time(max(meridian_trainer_samples_per_second{rank="0"})[10s:1s])',
                             start, end))
    busbw = series(query_range(base, 'max(meridian_collectives_busbw_bytes_per_second{op="allreduce",rank="0"})',
                               start, end))
    if inject and sps:
        before = [v for t, v in sps if t < inject and v > 0]
        settle = inject + (reroute or detect or 0) + 4
        after = [v for t, v in sps if t >= settle and v > 0]
        rate_before = statistics.median(before) if before else None
        rate_after = statistics.median(after) if after else None
    report.update({"detect_s": detect, "reroute_s": reroute, "samples_per_s_before": rate_before,
                   "samples_per_s_after": rate_after})
    json.dump(report, open(f"{a.out}/report.json", "w"), indent=2, default=str)

    # Data and the gnuplot script for demo.png.
    t0 = sps[0][0] if sps else start
    with open(f"{a.out}/rate.dat", "w") as f:
        for t, v in sps:
            f.write(f"{t - t0:.1f} {v:.1f}\n")
    with open(f"{a.out}/busbw.dat", "w") as f:
        for t, v in busbw:
            f.write(f"{t - t0:.1f} {v / 1e6:.3f}\n")
    heat = matrix.get(plane) or (next(iter(matrix.values())) if matrix else {})
    with open(f"{a.out}/matrix.dat", "w") as f:
        for i, s in enumerate(order):
            for j, d in enumerate(order):
                v = heat.get((s, d))
                f.write(f"{j} {i} {v if v is not None else 'NaN'}\n")
            f.write("\n")
    labels = ", ".join(f'"{r}" {i}' for i, r in enumerate(order))
    marker = f"set arrow from {inject - t0:.1f}, graph 0 to {inject - t0:.1f}, graph 1 nohead lc rgb 'red' dt 2\n" \
             f"set label 'wan-a {r1}-{r2} cut to {a.congested_mbit:g} Mbit/s' at {inject - t0:.1f}, graph 0.97 " \
             f"tc rgb 'red' offset 0.5,0\n" if inject else ""
    with open(f"{a.out}/plot.gp", "w") as f:
        f.write(f"""set terminal pngcairo size 1400,560 font ',11'
set output '{a.out}/demo.png'
set multiplot layout 1,2 title 'Meridian demo: {train['ranks']} nodes, sync {train['sync']}, test accuracy {100 * train['test_accuracy']:.1f}%'
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
{marker}plot '{a.out}/rate.dat' using 1:2 with lines lw 2 title 'samples/s (rank 0, 10 s average)', \\
     '{a.out}/busbw.dat' using 1:2 axes x1y2 with points pt 7 ps 0.4 title 'allreduce busbw'
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
        print(f"  congestion    {plane} {r1}-{r2} cut from {a.wan_mbit:g} to {a.congested_mbit:g} Mbit/s half-way")
        print(f"  detected      {fmt_s(detect)} after the cut (path flagged congested)")
        print(f"  rerouted      {fmt_s(reroute)} after the cut (the path's multipath weight below 0.5: "
              f"traffic moved to the other plane)")
        if rate_before and rate_after:
            print(f"  training rate {rate_before:.0f} samples/s before, {rate_after:.0f} after rerouting "
                  f"({100 * rate_after / rate_before:.0f}%)")
    else:
        print("  congestion    not injected (the run ended before half-way)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
