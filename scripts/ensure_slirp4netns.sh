#!/usr/bin/env bash
# The agent server gives a worker allowed the network (`allow_network`) a network namespace of
# its own, reached through slirp4netns, Debian's user-mode network stack. `make` installs it
# where it can: as root, or with sudo that needs no password. Elsewhere it says so: workers
# allowed the network then share the host's network namespace (`/health?detail=true` names
# the missing stack, `sandbox = "strict"` refuses to start), and the tests that need it skip.
set -uo pipefail
command -v slirp4netns >/dev/null 2>&1 && exit 0
[ -x /usr/bin/slirp4netns ] && exit 0
[ "$(uname -s)" = Linux ] || exit 0
if [ "$(id -u)" = 0 ]; then
  run=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  run=(sudo -n)
else
  echo "conch: no slirp4netns and no root to install it: sandbox workers allowed the network will share the host's network namespace (apt-get install -y slirp4netns)"
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  echo "conch: installing slirp4netns for the sandbox's network namespaces (apt-get)"
  "${run[@]}" apt-get install -y -q slirp4netns >/dev/null 2>&1 \
    || { "${run[@]}" apt-get update -q >/dev/null && "${run[@]}" apt-get install -y -q slirp4netns >/dev/null; } \
    || echo "conch: apt-get could not install slirp4netns: sandbox workers allowed the network will share the host's network namespace"
else
  echo "conch: no apt-get to install slirp4netns: sandbox workers allowed the network will share the host's network namespace"
fi
exit 0
