#!/usr/bin/env bash
# Regenerates the knob table in README.md from core/knob_list.h (via meridian-knobs).
source "$(dirname "$0")/lib/common.sh"
configure_and_build meridian-knobs
table=$("$MERIDIAN_BUILD/core/meridian-knobs" --markdown)
python3 - "$MERIDIAN_ROOT/README.md" "$table" <<'PY'
import sys, re
path, table = sys.argv[1], sys.argv[2]
text = open(path).read()
new = re.sub(r"(<!-- knobs:begin -->\n).*?(<!-- knobs:end -->)", lambda m: m.group(1) + table + "\n" + m.group(2), text, flags=re.S)
open(path, "w").write(new)
PY
say "README.md knob table updated"
