#!/usr/bin/env bash
# `tusa interop check` over ../shared/interop (with the credentials its README
# gives) and over Tusa's own captures in Interop/. Exit 1 on any failure.
# --quiet leaves out the notes (MESSAGE-INTEGRITY without credentials).
set -euo pipefail
cd "$(dirname "$0")/.."
TUSA=${TUSA:-.build/debug/tusa}
filter=cat
[ "${1:-}" = "--quiet" ] && filter="grep -v ^..note:"
status=0
if [ -d ../shared/interop ]; then
  "$TUSA" interop check ../shared/interop/messages ../shared/interop/captures \
    --user alice:wonderland --user "マトリックス:TheMatrIX" --secret northwind \
    --ice alic:alicepassword0123456789abc --ice bobb:bobpassword0123456789abcdef \
    --ice evtj:VOkJxbRl1RmTxUk/WvJxBt | $filter || status=1
else
  echo "interop-check: ../shared/interop is absent: shared corpus skipped"
fi
if ls Interop/*.pcapng >/dev/null 2>&1; then
  "$TUSA" interop check --user alice:wonderland --secret northwind Interop | $filter || status=1
fi
exit $status
