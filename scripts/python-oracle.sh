#!/usr/bin/env bash
# Make sure the Python oracle venv exists: onnxruntime, onnx and numpy at pinned versions
# (no torch: only scripts/onnx_models.py needs torch, and the fixtures it writes are
# committed). Idempotent and quiet when the venv is already right; prints one line.
#
#   scripts/python-oracle.sh [VENV]      # default ${CARGO_TARGET_DIR:-<repo>/target}/oracle-venv
#   scripts/python-oracle.sh --python [VENV]
#                                        # print only the venv's interpreter path
#
# The interpreter is VENV/bin/python. Set PYTHON to choose the Python that makes the venv
# (default python3). Safe to run from several processes at once (flock).
set -euo pipefail

# The pins: the versions the fixtures under tests/data/onnx-models were made and checked
# with. Change them together with the fixtures (rerun scripts/onnx_models.py).
PINS=(onnxruntime==1.32.0 onnx==1.23.2 numpy==2.4.6)

print_python=0
if [[ "${1:-}" == "--python" ]]; then
    print_python=1
    shift
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac # as cargo reads it
venv="${1:-$target/oracle-venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
py="$venv/bin/python"
stamp="$venv/.sluice-oracle-pins"
want="${PINS[*]}"

say() {
    if ((print_python)); then
        echo "$py"
    else
        echo "python-oracle: $venv ready (${PINS[*]})"
    fi
}

# already right: the stamp names these pins and those versions are what is installed
check() {
    [[ -x "$py" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] || return 1
    "$py" - "${PINS[@]}" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    if version(name) != want:
        sys.exit(1)
EOF
}

if check; then
    say
    exit 0
fi

mkdir -p "$(dirname "$venv")"
lock="$venv.lock"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$lock"
    flock 9
    if check; then # another process finished it while we waited
        say
        exit 0
    fi
fi

base="${PYTHON:-python3}"
command -v "$base" >/dev/null 2>&1 || { echo "python-oracle: no $base on PATH" >&2; exit 1; }

# a venv whose interpreter is missing or broken is made anew
if [[ -e "$venv" ]] && ! "$py" -c "import sys" >/dev/null 2>&1; then
    rm -rf "$venv"
fi
if [[ ! -x "$py" ]]; then
    if ! "$base" -m venv "$venv" >/dev/null 2>&1; then
        # Debian/Ubuntu split venv (ensurepip) into python3-venv
        rm -rf "$venv"
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            ver="$("$base" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$ver-venv" >/dev/null 2>&1 ||
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null 2>&1 || true
        fi
        "$base" -m venv "$venv" >/dev/null 2>&1 || {
            echo "python-oracle: '$base -m venv' failed (on Debian: apt-get install python3-venv)" >&2
            exit 1
        }
    fi
fi

rm -f "$stamp"
if ! out="$("$py" -m pip install --quiet --disable-pip-version-check --no-input "${PINS[@]}" 2>&1)"; then
    echo "$out" >&2
    echo "python-oracle: pip install ${PINS[*]} into $venv failed" >&2
    exit 1
fi
echo "$want" >"$stamp"
if ! check || ! "$py" -c "import onnxruntime, onnx, numpy" >/dev/null 2>&1; then
    echo "python-oracle: $venv does not have ${PINS[*]} after installing them" >&2
    exit 1
fi
say
