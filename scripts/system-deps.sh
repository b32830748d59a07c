#!/usr/bin/env bash
# The Debian packages the tests need that pip cannot bring: Chromium's headless shell (the
# browser tests drive it; Playwright's own browser downloads are never used),
# redis-server (the Redis-backed tests start a throwaway one), iproute2 (`ip`: the cluster
# of test hosts, scripts/cluster.sh, builds network namespaces, a bridge and veth links
# with it; the bridge itself is the kernel's), pgbouncer (tests/end_to_end/test_pgbouncer.py runs
# the product through a throwaway one in transaction mode), dovecot-imapd (the email
# platform's tests run a real Dovecot IMAP server as an unprivileged user: tests/fakes/dovecot.py), and patroni with etcd (the
# database that fails over: `scripts/cluster.sh up --ha`, tests/end_to_end/test_failover.py). As root, installs what is
# missing and says what; as another user, only says what is missing.
# Called by .ci/run and scripts/test.sh (`make test`).
set -euo pipefail
need=()
[ -x /usr/lib/chromium/chromium-headless-shell ] || need+=(chromium-headless-shell)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need+=(iproute2)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
command -v patroni >/dev/null 2>&1 || need+=(patroni)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
[ -x /usr/sbin/dovecot ] && [ -x /usr/lib/dovecot/imap ] || need+=(dovecot-imapd)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "system-deps: missing Debian packages: ${need[*]} (not root: run 'apt-get install ${need[*]}' as root; the tests that need them will fail)" >&2
  exit 0
fi
echo "system-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
