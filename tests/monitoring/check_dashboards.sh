#!/usr/bin/env bash
# check_dashboards.sh DASH_DIR WORK_DIR
#
# Checks the Grafana dashboards in DASH_DIR (*.json) two ways:
#  1. lint_dashboards.py: what the schema does not say (unique panel ids, gridPos, the
#     meridian-prometheus datasource everywhere, a non-empty expr per panel, and only metric
#     names Meridian exports);
#  2. Grafana's published dashboard schema, the TypeScript types of @grafana/schema: each
#     dashboard is compiled by `tsc --noEmit --strict` as an object literal that must satisfy
#     `Dashboard`. Both checks also run on deliberately broken copies and must reject them,
#     so neither can pass vacuously.
# The npm packages go to WORK_DIR (installed once, pinned; later runs are offline and quiet).
# Exit status: 0 all good, 1 a dashboard does not fit (the messages say why), 2 usage,
# 77 skipped (no node on PATH, or nothing installed yet and no npm).
set -euo pipefail

GRAFANA_SCHEMA_VERSION=13.2.3
TYPESCRIPT_VERSION=5.9.3

if [ $# -ne 2 ]; then
  echo "usage: $0 DASH_DIR WORK_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dash_dir=$(cd "$1" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)

shopt -s nullglob
dashboards=("$dash_dir"/*.json)
if [ ${#dashboards[@]} -eq 0 ]; then
  echo "check_dashboards: no *.json in $dash_dir" >&2
  exit 1
fi

fail() { echo "check_dashboards: $*" >&2; exit 1; }

# --- 1. lint ------------------------------------------------------------------------------
python3 "$here/lint_dashboards.py" "$dash_dir" || fail "lint failed (above)"

# Broken copies: each must be rejected by its check. make_broken OUT_DIR lint|schema
make_broken() {
  python3 - "$dash_dir" "$1" "$2" <<'PY'
import copy, json, os, sys
src, out, kind = sys.argv[1:4]
name = sorted(f for f in os.listdir(src) if f.endswith(".json"))[0]
with open(os.path.join(src, name)) as f:
    d = json.load(f)
first = lambda x: next(p for p in x["panels"] if p.get("type") != "row")
cases = {}
def case(cname, mutate):
    c = copy.deepcopy(d); mutate(c); cases[cname] = c
if kind == "lint":
    case("lint_duplicate_id", lambda c: c["panels"][1].update(id=c["panels"][0]["id"]))
    case("lint_unknown_metric", lambda c: first(c)["targets"][0].update(
        expr="rate(meridian_routing_path_rtt_secs[5m])"))
    case("lint_wrong_datasource", lambda c: first(c).update(datasource={"type": "prometheus", "uid": "other"}))
    case("lint_bare_histogram", lambda c: first(c)["targets"][0].update(
        expr="meridian_collectives_op_latency_seconds"))
    case("lint_no_expr", lambda c: first(c).update(targets=[]))
else:
    case("schema_gridpos_missing_h", lambda c: first(c)["gridPos"].pop("h"))
    case("schema_wrong_type", lambda c: first(c)["gridPos"].update(w="12"))
    case("schema_bad_enum_value", lambda c: first(c)["fieldConfig"]["defaults"]["thresholds"].update(mode="absolut"))
    case("schema_unknown_property", lambda c: c.update(panelz=c.pop("panels")))
os.makedirs(out, exist_ok=True)
for cname, c in cases.items():
    with open(os.path.join(out, cname + ".json"), "w") as f:
        json.dump(c, f, indent=2)
PY
}

rm -rf "$work/broken-lint"
make_broken "$work/broken-lint" lint
for f in "$work"/broken-lint/*.json; do
  one="$work/broken-lint/one"; rm -rf "$one"; mkdir -p "$one"; cp "$f" "$one/"
  if python3 "$here/lint_dashboards.py" "$one" >/dev/null; then
    fail "negative case $(basename "$f" .json): lint accepted a broken dashboard"
  fi
done

# --- 2. schema ----------------------------------------------------------------------------
if ! command -v node >/dev/null; then
  echo "SKIPPED: the schema check needs node and npm (scripts/lib/common.sh installs npm)"
  exit 77
fi

installed_version() {  # installed_version PACKAGE -> version, or nothing
  local pj="$work/node_modules/$1/package.json"
  [ -f "$pj" ] && node -e 'process.stdout.write(require(process.argv[1]).version)' "$pj" || true
}
if [ "$(installed_version @grafana/schema)" != "$GRAFANA_SCHEMA_VERSION" ] ||
   [ "$(installed_version typescript)" != "$TYPESCRIPT_VERSION" ]; then
  if ! command -v npm >/dev/null; then
    echo "SKIPPED: the schema check needs npm once, to install its packages (scripts/lib/common.sh installs npm)"
    exit 77
  fi
  echo "check_dashboards: installing @grafana/schema@$GRAFANA_SCHEMA_VERSION typescript@$TYPESCRIPT_VERSION in $work"
  if ! npm install --no-audit --no-fund --save-exact --prefix "$work" \
      "@grafana/schema@$GRAFANA_SCHEMA_VERSION" "typescript@$TYPESCRIPT_VERSION" >"$work/npm-install.log" 2>&1; then
    cat "$work/npm-install.log" >&2
    fail "npm install failed"
  fi
fi
tsc=("node" "$work/node_modules/typescript/bin/tsc")

gen="$work/gen"
rm -rf "$gen"
mkdir -p "$gen/good" "$gen/broken"

cp "$here/dashboard_schema.ts" "$gen/dashboard_schema.ts"

# Each dashboard becomes `export const dashboard = (<the JSON>) satisfies DashboardJson;`
# (dashboard_schema.ts: @grafana/schema's Dashboard, Prometheus targets, enums as values).
# An inline object literal keeps its literal types (an imported .json module widens every
# string to `string`, which no union field accepts) and gets excess-property checks. The
# header shares line 1 with the JSON's opening brace, so tsc's line numbers are the JSON's.
to_ts() {  # to_ts JSON TS
  {
    printf "import type { DashboardJson } from '../dashboard_schema'; export const dashboard = ("
    cat "$1"
    printf ') satisfies DashboardJson;\n'
  } >"$2"
}
for f in "${dashboards[@]}"; do to_ts "$f" "$gen/good/$(basename "$f" .json).ts"; done
make_broken "$gen/broken-json" schema
for f in "$gen"/broken-json/*.json; do to_ts "$f" "$gen/broken/$(basename "$f" .json).ts"; done

tsconfig() {  # tsconfig DIR: a project compiling gen/DIR/*.ts (modules resolve from WORK_DIR/node_modules)
  cat >"$gen/tsconfig.$1.json" <<JSON
{
  "compilerOptions": {
    "strict": true, "noEmit": true, "target": "es2022", "module": "esnext",
    "moduleResolution": "bundler", "skipLibCheck": true, "types": []
  },
  "include": ["$1/*.ts", "dashboard_schema.ts"]
}
JSON
}
tsconfig good
tsconfig broken

# The real dashboards must compile; report errors against the JSON files.
if ! out=$(cd "$gen" && "${tsc[@]}" -p tsconfig.good.json --noEmit --strict --pretty false 2>&1); then
  printf '%s\n' "$out" | sed -E "s#^good/([^(]+)\.ts\(#$dash_dir/\1.json(#" >&2
  fail "a dashboard does not fit Grafana's schema (@grafana/schema@$GRAFANA_SCHEMA_VERSION)"
fi

# Every broken copy must be rejected, each with an error of its own.
if out=$(cd "$gen" && "${tsc[@]}" -p tsconfig.broken.json --noEmit --strict --pretty false 2>&1); then
  fail "tsc accepted the broken dashboards: the schema check is vacuous"
fi
for f in "$gen"/broken/*.ts; do
  case_name=$(basename "$f" .ts)
  printf '%s\n' "$out" | grep -q "^broken/$case_name\.ts(.*error TS" ||
    { printf '%s\n' "$out" >&2; fail "negative case $case_name: tsc accepted it"; }
done
echo "check_dashboards: ${#dashboards[@]} dashboards fit @grafana/schema@$GRAFANA_SCHEMA_VERSION and the lint; broken copies rejected"
