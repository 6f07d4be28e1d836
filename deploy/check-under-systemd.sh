#!/usr/bin/env bash
# Run deploy/shoal.service, sandbox as shipped, under a throwaway systemd and check what the unit
# promises: READY=1 after the load, shoal serving from inside the sandbox (an inference on the
# TorchScript example when the repository has it), the sandbox in force (uid, no capabilities,
# seccomp), a SIGSTOPped broker restarted by the watchdog, and a clean `systemctl stop`.
#
# For machines where systemd is installed but not init (containers, CI runners): systemd runs as
# PID 1 of private pid, mount and cgroup namespaces with an empty unit set, so nothing of the
# host's units starts. The host keeps only the cgroup directories it creates, which are removed
# at the end. Needs root, unshare/nsenter (util-linux) and this checkout's .venv. Takes ~1 min.
#
# Usage: deploy/check-under-systemd.sh [MODEL_REPOSITORY]   (default: examples/model_repository)
#        KEEP=1 keeps the work directory (shoal's log, the units) for a look afterwards.
# The drop-in it adds to the unit: User=nobody (no `shoal` user needed), ExecStart on this
# checkout's virtualenv and free ports, WatchdogSec=6 (a quick watchdog check), a log file, and
# read-only binds for a checkout or python under /root, /home or /tmp (hidden by the sandbox).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repository="$(realpath "${1:-$root/examples/model_repository}")"
python="$root/.venv/bin/python"
systemd_bin=""
for candidate in /usr/lib/systemd/systemd /lib/systemd/systemd; do
  if [ -x "$candidate" ]; then systemd_bin="$candidate"; break; fi
done

fail() { echo "check-under-systemd: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "run as root"
[ -n "$systemd_bin" ] || fail "systemd is not installed (apt-get install systemd)"
[ "$(cat /proc/1/comm)" != systemd ] || fail "systemd is init here: install the unit for real"
for tool in unshare nsenter pgrep; do
  command -v "$tool" >/dev/null || fail "needs $tool"
done
[ -x "$python" ] || fail "no $python (make setup)"

work="$(mktemp -d /var/tmp/shoal-sdcheck-XXXXXX)"
chmod 0755 "$work"
log="$work/shoal.log"
read -r http_port grpc_port metrics_port < <("$python" - <<'EOF'
import random, socket
ports = []
while len(ports) < 3:
    port = random.randrange(20000, 32768)
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            continue
    ports.append(port)
print(*ports)
EOF
)

cgroups_before="$(find /sys/fs/cgroup -mindepth 1 -type d 2>/dev/null | sort)"
sd_pid=""
cleanup() {
  if [ -n "$sd_pid" ]; then kill -KILL "$sd_pid" 2>/dev/null || true; sleep 1; fi
  # the cgroup directories the namespace's systemd created, deepest first
  comm -13 <(echo "$cgroups_before") <(find /sys/fs/cgroup -mindepth 1 -type d 2>/dev/null | sort) \
    | sort -r | while read -r dir; do rmdir "$dir" 2>/dev/null || true; done
  if [ -n "${KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# --- the units: empty targets, the unit as shipped, the check's drop-in
mkdir -p "$work/units/shoal.service.d"
for target in sysinit basic shutdown network-online multi-user sockets paths timers slices \
              shoal-check; do
  printf '[Unit]\nDescription=%s\n' "$target" > "$work/units/$target.target"
done
cp "$root/deploy/shoal.service" "$work/units/shoal.service"
{
  echo "[Service]"
  echo "User=nobody"
  echo "Group=$(id -gn nobody)"
  echo "WorkingDirectory=$root"
  echo "ExecStart="
  echo "ExecStart=$python -m shoal serve --model-repository $repository --exit-timeout-secs 30" \
       "--http-port $http_port --grpc-port $grpc_port --metrics-port $metrics_port"
  echo "WatchdogSec=6"
  echo "StandardOutput=append:$log"
  echo "StandardError=inherit"
  base="$("$python" -c 'import sys; print(sys.base_prefix)')"
  for path in "$root" "$base" "$repository"; do
    case "$path" in
      /root/*|/home/*) echo "ProtectHome=tmpfs"; echo "BindReadOnlyPaths=$path" ;;
      /tmp/*|/var/tmp/*) echo "BindReadOnlyPaths=$path" ;;
    esac
  done
} > "$work/units/shoal.service.d/check.conf"

# --- boot systemd as PID 1 of new namespaces
cat > "$work/boot.sh" <<EOF
#!/bin/bash
set -e
mount -t proc proc /proc
# this namespace's cgroup view: the current cgroups are its roots (limits stay in force)
umount -R /sys/fs/cgroup
mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup
for line in \$(grep -v '^0::' /proc/self/cgroup | cut -d: -f2); do
  name=\${line#name=}
  mkdir -p /sys/fs/cgroup/\$name
  if [ "\$name" = "\$line" ]; then opts=\$line; else opts=none,\$line; fi
  mount -t cgroup -o \$opts cgroup /sys/fs/cgroup/\$name
done
if grep -q '^0::' /proc/self/cgroup; then
  mkdir -p /sys/fs/cgroup/unified; mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
fi
for dir in /run /var/cache /var/lib/systemd /etc/systemd/system \$(realpath /lib/systemd/system); do
  mkdir -p \$dir; mount -t tmpfs tmpfs \$dir
done
cp -r "$work/units/." /etc/systemd/system/
exec env container=shoal-check "$systemd_bin" --system --unit=shoal-check.target </dev/null
EOF
chmod +x "$work/boot.sh"
setsid unshare --pid --fork --mount --cgroup --propagation private "$work/boot.sh" \
  > "$work/systemd.log" 2>&1 &
unshare_pid=$!
for _ in $(seq 50); do
  sd_pid="$(ps -o pid= --ppid "$unshare_pid" | tr -d ' ' || true)"
  [ -n "$sd_pid" ] && break
  sleep 0.1
done
[ -n "$sd_pid" ] || fail "systemd did not start: $(cat "$work/systemd.log")"
sd() { nsenter -t "$sd_pid" -m -p "$@"; }
for _ in $(seq 100); do
  state="$(sd systemctl is-system-running 2>/dev/null || true)"
  [ "$state" = running ] || [ "$state" = degraded ] && break
  sleep 0.1
done
prop() { sd systemctl show shoal.service -p "$1" --value; }
check() { printf '  %-58s %s\n' "$1" "$2"; }
seconds_since() { awk -v a="$1" -v b="${2:-$(date +%s.%N)}" 'BEGIN { printf "%.1f", b - a }'; }
show_log() { echo "--- shoal's log:"; tail -30 "$log" >&2 || true; }

echo "systemd $("$systemd_bin" --version | head -1 | cut -d' ' -f2) as PID 1 of new namespaces; serving $repository"
started=$(date +%s.%N)
sd systemctl start shoal.service || { show_log; fail "start failed"; }
check "start (returns after READY=1)" "$(seconds_since "$started") s"
[ "$(prop ActiveState)" = active ] || { show_log; fail "not active"; }
sleep 1
check "STATUS" "$(prop StatusText)"

main="$(prop MainPID)"
status="$(sd cat "/proc/$main/status")"
uid="$(awk '/^Uid:/ {print $2}' <<<"$status")"
caps="$(awk '/^CapEff:/ {print $2}' <<<"$status")"
seccomp="$(awk '/^Seccomp:/ {print $2}' <<<"$status")"
check "supervisor uid / effective capabilities / seccomp mode" "$uid / $caps / $seccomp"
if [ "$uid" != 65534 ] || [ "$caps" != 0000000000000000 ] || [ "$seccomp" != 2 ]; then
  fail "not sandboxed"
fi

"$python" - "$http_port" "$repository" <<'EOF' || { show_log; fail "serving failed"; }
import os, sys, httpx
base = f"http://127.0.0.1:{sys.argv[1]}"
assert httpx.get(f"{base}/v2/health/ready").status_code == 200
print(f"  {'GET /v2/health/ready':58} 200")
if os.path.isdir(os.path.join(sys.argv[2], "mlp")):
    body = {"inputs": [{"name": "INPUT__0", "shape": [2, 256], "datatype": "FP32",
                        "data": [0.5] * 512}]}
    answer = httpx.post(f"{base}/v2/models/mlp/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    print(f"  {'infer mlp (TorchScript) over HTTP':58} 200, {answer.json()['outputs'][0]['shape']}")
EOF

broker="$(sd pgrep -P "$main" -f 'shoal[.]broker')"
sd kill -STOP "$broker"
stopped=$(date +%s.%N)
restarted=""
for _ in $(seq 600); do
  if [ "$(prop NRestarts)" = 1 ] && [ "$(prop ActiveState)" = active ]; then
    restarted=$(date +%s.%N); break
  fi
  sleep 0.1
done
[ -n "$restarted" ] || { show_log; fail "the watchdog did not restart the service"; }
check "broker SIGSTOPped -> watchdog restart -> READY again" \
  "$(seconds_since "$stopped" "$restarted") s (3 s heartbeat + WatchdogSec=6 + a start)"
grep -q "watchdog pings are withheld" "$log" || fail "no 'pings withheld' in the log"

sd systemctl stop shoal.service
result="$(prop Result) / exit $(prop ExecMainStatus)"
check "systemctl stop: result / exit status" "$result"
[ "$result" = "success / exit 0" ] || { show_log; fail "unclean stop"; }
left="$(find /dev/shm -maxdepth 1 -user nobody -name 'shoal-*' | wc -l)"
check "shoal files of user nobody left in /dev/shm" "$left"
[ "$left" = 0 ] || fail "segments left behind"
echo "ok"
