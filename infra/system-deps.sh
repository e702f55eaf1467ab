#!/usr/bin/env bash
# The Debian packages some tests drive as real clients: Chromium (tests/browser),
# Prometheus (tests/observability), node and npm (tests/frontends, tests/browser),
# HAProxy (tests/cluster: several gateways behind a load balancer).
# `make test` runs this: as root with apt-get it installs what is missing; otherwise it
# says what is missing, and those tests skip (or, with CI=true, fail).
set -u
missing=()
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
[ ${#missing[@]} -eq 0 ] && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "system-deps: installing ${missing[*]} (Debian packages)"
  apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; } ||
    echo "system-deps: could not install ${missing[*]}; the tests that drive them will skip (fail with CI=true)"
else
  echo "system-deps: missing ${missing[*]} (install them as root, e.g. apt-get install ${missing[*]});" \
       "the tests that drive them will skip (fail with CI=true)"
fi
exit 0
