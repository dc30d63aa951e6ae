#!/usr/bin/env bash
# The studio's accessibility tests inject axe-core (a devDependency of ui/) into each page.
# `make test` installs ui/'s locked dependencies from npm where npm is present; elsewhere it says
# so and those checks skip, naming the reason.
set -uo pipefail
cd "$(dirname "$0")/../ui" || exit 0
[ -f node_modules/axe-core/axe.min.js ] && exit 0
if ! command -v npm >/dev/null 2>&1; then
  echo "conch: no npm: the studio's accessibility checks (axe-core) will skip"
  exit 0
fi
echo "conch: installing ui/'s dependencies (npm ci) for the studio's accessibility checks"
npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 \
  || npm install --no-audit --no-fund --loglevel=error >/dev/null 2>&1 \
  || echo "conch: npm could not install ui/'s dependencies: the accessibility checks will skip"
exit 0
