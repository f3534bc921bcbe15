#!/usr/bin/env bash
# The Python package as a user installs it (CI runs this after make test):
# `pip wheel .` builds the wheel with the project's CMake (scikit-build-core),
# it is installed into a folder of its own, and the installed package (not
# the build tree's) loads a model folder and translates, as the qkv program does.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/wheel
rm -rf "$out"
mkdir -p "$out"
start=$(date +%s)
# CI runs as root; these quiet pip's warnings for every pip command (pip wheel has no --root-user-action flag).
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
# --no-build-isolation: the build requirements are those install-deps.sh installed.
python3 -m pip wheel . --no-deps --no-build-isolation --quiet -w "$out/dist"
python3 -m pip install --no-deps --quiet --target "$out/site" "$out"/dist/qkv-*.whl
echo "check-wheel: built and installed $(basename "$out"/dist/qkv-*.whl) in $(( $(date +%s) - start )) s"
cd "$out"  # away from the source tree, so that only the installed package can be imported
PYTHONPATH="$PWD/site" python3 - <<'PY'
import pathlib, subprocess
import qkv
assert pathlib.Path(qkv.__file__).is_relative_to(pathlib.Path("site").resolve()), qkv.__file__
assert (pathlib.Path(qkv.__file__).parent / "_qkv.pyi").is_file(), "the type stubs are not installed"
folder = "../../tests/fixtures/folders/transformer"
got = qkv.load(folder).translate(["我是中国人"], max_len=10)
cli = subprocess.run(["../release/qkv", "translate", "--model", folder, "--max-len", "10"], input="我是中国人\n",
                     capture_output=True, text=True, check=True).stdout.splitlines()
assert got == cli, (got, cli)
print("check-wheel: the installed package translates as the qkv program does")
PY
