#!/usr/bin/env bash
# Install shoal as a systemd service (run as root from a checkout of shoal):
#   - the system user and group `shoal` (no login, no home of its own),
#   - a virtualenv at $PREFIX/venv with torch (CPU build by default) first, then shoal,
#   - the model repository $MODEL_REPOSITORY (root-owned, readable by shoal; put models there),
#   - the unit deploy/shoal.service as $UNIT_DIR/shoal.service (paths rewritten to the above),
#   - systemctl daemon-reload, then enable --now (unless --no-start).
#
# Usage: deploy/install.sh [--dry-run] [--no-venv] [--no-start]
#   --dry-run   print every step, change nothing
#   --no-venv   keep the virtualenv as it is (update the unit and directories only)
#   --no-start  install and enable nothing in systemd beyond the unit file and daemon-reload
# Environment (defaults):
#   PREFIX=/opt/shoal  MODEL_REPOSITORY=/var/lib/shoal/models  UNIT_DIR=/etc/systemd/system
#   PYTHON=python3  TORCH_SPEC=torch==2.13.0
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu   (empty: pip's configured index;
#                                                           a CUDA index on GPU hosts)
#   SHOAL_SPEC=<this checkout>                               (or e.g. shoal==0.1.0)
#   DESTDIR=                                                 stage every file under this root
#       instead of /, and skip what acts on the running host (user, ownership, systemctl)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PREFIX="${PREFIX:-/opt/shoal}"
MODEL_REPOSITORY="${MODEL_REPOSITORY:-/var/lib/shoal/models}"
UNIT_DIR="${UNIT_DIR:-/etc/systemd/system}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TORCH_INDEX_URL="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
SHOAL_SPEC="${SHOAL_SPEC:-$(dirname "$here")}"
DESTDIR="${DESTDIR:-}"
SERVICE_USER=shoal

dry_run=0 venv=1 start=1
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    --no-venv) venv=0 ;;
    --no-start) start=0 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

# Every change goes through `step`: printed, and run unless --dry-run.
step() {
  printf '+ %s\n' "$*"
  if [ "$dry_run" -eq 0 ]; then "$@"; fi
}

# Steps that act on the running host rather than on files: skipped when staging into DESTDIR.
host_step() {
  if [ -n "$DESTDIR" ]; then
    printf '# skipped (DESTDIR): %s\n' "$*"
  else
    step "$@"
  fi
}

if [ "$dry_run" -eq 0 ] && [ -z "$DESTDIR" ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (or with --dry-run, or DESTDIR=<staging dir>)" >&2
  exit 1
fi
case "$PREFIX$MODEL_REPOSITORY$UNIT_DIR" in
  *[[:space:]]*) echo "install.sh: paths must not contain spaces" >&2; exit 2 ;;
esac

venv_dir="$PREFIX/venv"

# 1. the service user
if ! id -u "$SERVICE_USER" >/dev/null 2>&1; then
  host_step useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin "$SERVICE_USER"
fi

# 2. the virtualenv: torch first, pinned (so no dependency pulls another build), then shoal
if [ "$venv" -eq 1 ]; then
  step install -d -m 0755 "$DESTDIR$PREFIX"
  step "$PYTHON" -m venv "$DESTDIR$venv_dir"
  step "$DESTDIR$venv_dir/bin/pip" install --quiet --upgrade pip
  torch_args=()
  if [ -n "$TORCH_INDEX_URL" ]; then torch_args=(--index-url "$TORCH_INDEX_URL"); fi
  step "$DESTDIR$venv_dir/bin/pip" install --quiet "${torch_args[@]}" "$TORCH_SPEC"
  step "$DESTDIR$venv_dir/bin/pip" install --quiet "$SHOAL_SPEC"
fi

# 3. the model repository: root's, readable (not writable) by the service
step install -d -m 0755 "$DESTDIR$(dirname "$MODEL_REPOSITORY")"
step install -d -m 0750 "$DESTDIR$MODEL_REPOSITORY"
host_step chown "root:$SERVICE_USER" "$MODEL_REPOSITORY"

# 4. the unit, with this install's paths
unit_text="$(sed \
  -e "s|/opt/shoal/venv|$venv_dir|g" \
  -e "s|^WorkingDirectory=/opt/shoal\$|WorkingDirectory=$PREFIX|" \
  -e "s|/var/lib/shoal/models|$MODEL_REPOSITORY|g" \
  "$here/shoal.service")"
step install -d -m 0755 "$DESTDIR$UNIT_DIR"
printf '+ write %s\n' "$DESTDIR$UNIT_DIR/shoal.service"
if [ "$dry_run" -eq 0 ]; then
  printf '%s\n' "$unit_text" > "$DESTDIR$UNIT_DIR/shoal.service"
  chmod 0644 "$DESTDIR$UNIT_DIR/shoal.service"
fi

# 5. systemd
host_step systemctl daemon-reload
if [ "$start" -eq 1 ]; then
  host_step systemctl enable --now shoal.service
fi
echo "done: models go in $MODEL_REPOSITORY; 'systemctl status shoal' shows the server's STATUS"
