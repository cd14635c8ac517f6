# Sourced by scripts/gpu-session.sh, gpu-variants.sh and gpu-fixtures.sh on the GPU
# machine: repo root, output folders, the programs carried by gpu-prepare.sh.
#   OUT  what the device tool brings back (at most 8 files: logs go to LOG, packed)
#   B    the carried build tree;  M17  where the 1.7B-shaped checkpoint is generated
#   ours CMD...  runs CMD with the carried libraries (only ours: system curl keeps
#                its own) and KDA_SRC / KDA_BUILD set for the test programs
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/kda-out}
LOG=/tmp/kda-logs
rm -rf "$LOG"; mkdir -p "$OUT" "$LOG"
# a packed carry (gpu-prepare.sh's .carry.txz) is unpacked when .carry itself did not travel
if [ ! -d .carry/build ] && [ -f .carry.txz ]; then
  xz -dc .carry.txz | tar xf - 2>/dev/null \
    || python3 -c 'import tarfile; tarfile.open(".carry.txz", "r:xz").extractall(".")'
fi
B=.carry/build
M17=/tmp/kda-1.7b
export KDA_LIB_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
ours() { env LD_LIBRARY_PATH="$KDA_LIB_PATH" KDA_SRC="$PWD" KDA_BUILD="$PWD/$B" "$@"; }
