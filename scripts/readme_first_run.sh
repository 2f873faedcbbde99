#!/bin/sh
# The README's "Try it" as a new user meets it: a fresh clone of this repository in a temporary
# folder, the README's own command line (read from its ```sh block, so the two never part), then
# `.venv/bin/actor-run status`, which must show the run's three seeds succeeded and no machine
# alive. Its state and settings live in the temporary folder; nothing of the user's is read.
set -eu
cd "$(dirname "$0")/.."
repo="$(pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
git clone -q "$repo" "$tmp/actor-run"
cd "$tmp/actor-run"
line="$(awk '/^## Try it/ {on=1} on && /^```sh$/ {getline; print; exit}' README.md)"
case "$line" in
  "python3 -m venv .venv && "*" && .venv/bin/actor-run run examples/seeds.toml") ;;
  *) echo "readme_first_run: the README's Try-it line changed: $line" >&2; exit 1 ;;
esac
export XDG_STATE_HOME="$tmp/state" XDG_CONFIG_HOME="$tmp/config"
unset ACTOR_RUN_LEDGER ACTOR_RUN_CONFIG
echo "readme_first_run: $line"
sh -c "$line" > "$tmp/run.txt" 2>&1 || { cat "$tmp/run.txt"; exit 1; }
.venv/bin/actor-run status > "$tmp/status.txt"
cat "$tmp/status.txt"
for seed in 1 2 3; do
  grep -Eq "^  seeds/seed-$seed +succeeded +1 attempt\(s\)" "$tmp/status.txt" || { echo "readme_first_run: seed $seed did not succeed" >&2; exit 1; }
done
grep -q "^no machine alive" "$tmp/status.txt" || { echo "readme_first_run: a machine is alive" >&2; exit 1; }
test -f actor-run-out/latest/seeds/seed-1/response.json
echo "readme_first_run: the README's two commands work from a fresh clone"
