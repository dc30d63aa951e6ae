#!/usr/bin/env bash
# The studio's browser tests drive Debian's Chromium (Playwright's own download is not
# reachable from every machine). `make test` installs it where it can: as root, or with sudo
# that needs no password. Elsewhere it says so and the browser tests skip, naming the reason.
set -uo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
[ -x "${CONCH_CHROMIUM:-/usr/bin/chromium}" ] && exit 0
if [ "$(id -u)" = 0 ]; then
  run=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  run=(sudo -n)
else
  echo "conch: no Chromium and no root to install it: the studio's browser tests will skip (apt-get install -y chromium)"
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  echo "conch: installing Chromium for the studio's browser tests (apt-get)"
  "${run[@]}" apt-get update -q >/dev/null && "${run[@]}" apt-get install -y -q chromium >/dev/null \
    || echo "conch: apt-get could not install Chromium: the studio's browser tests will skip"
else
  echo "conch: no apt-get to install Chromium: the studio's browser tests will skip"
fi
exit 0
