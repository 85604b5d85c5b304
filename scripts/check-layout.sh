#!/usr/bin/env bash
# The layout rules the tree must keep (README, "Architecture"): an app that only
# places calls (the Call and Transport libraries) links nothing server-only, the
# sans-IO cores link no networking library, and the base depends on nothing.
# Reads the manifest (swift package describe), builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
manifest=$(mktemp)
trap 'rm -f "$manifest"' EXIT
swift package describe --type json >"$manifest"
python3 - "$manifest" <<'PY'
import json, sys
targets = {t["name"]: t for t in json.load(open(sys.argv[1]))["targets"]}
def closure(name):
    seen, todo, products = set(), [name], set()
    while todo:
        n = todo.pop()
        if n in seen or n not in targets: continue
        seen.add(n)
        products.update(targets[n].get("product_dependencies", []))
        todo.extend(targets[n].get("target_dependencies", []))
    return seen | products
rules = {
    # what a calling app links (NIOSSL is a client's too: a party member reaches
    # the relay inside TLS where only TLS passes)
    "Call": {"Relay", "Directory", "SQLiteNIO", "PostgresNIO", "CRelayIO", "NIOHTTP1", "Prometheus", "ServiceLifecycle", "CoreMetrics"},
    "Transport": {"Relay", "Directory", "SQLiteNIO", "PostgresNIO", "CRelayIO", "NIOHTTP1", "Prometheus", "ServiceLifecycle", "CoreMetrics"},
    # sans-IO cores: no sockets, no event loops
    **{core: {"NIOCore", "NIOPosix", "Transport", "Relay", "Directory", "CRelayIO"} for core in
       ["TusaBase", "STUN", "TURN", "Secure", "ICE", "Rendezvous", "Voice"] + [t for t in ["CallControl", "Party"] if t in targets]},
}
failed = False
for target, forbidden in rules.items():
    if target not in targets:
        print(f"layout: target {target} is missing"); failed = True; continue
    bad = sorted(closure(target) & forbidden)
    if bad:
        print("layout: %s reaches %s" % (target, ", ".join(bad))); failed = True
base = targets["TusaBase"]
if base.get("target_dependencies") or base.get("product_dependencies"):
    print("layout: TusaBase must depend on nothing"); failed = True
if failed: sys.exit(1)
print("layout: ok (Call and Transport link nothing server-only; the cores link no NIO; TusaBase depends on nothing)")
PY
