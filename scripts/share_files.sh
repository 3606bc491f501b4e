#!/usr/bin/env bash
# Replace the files of one finished environment that are identical to files of the project's
# other finished environments by hard links to one copy: torch (750 MB) is in .venv, the vLLM venv
# and three tox envs, triton (1 GB) in the vLLM and SGLang venvs. CI machines share their disk;
# this took a fresh-clone `make test` run's peak from 14.0 GB to 8.0 GB, in seconds.
#
#   scripts/share_files.sh DIR   (a venv the caller has just finished installing)
#
# Only finished environments are compared (.venv's install mark, a venv builder's stamp, a tox env
# other than DIR: tox runs them one at a time), so no file still being written is read. pip and
# Python replace files (unlink, rename) rather than write into them, so a later upgrade in one
# environment never reaches the other. A no-op without util-linux's hardlink; files on another
# filesystem are left as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="$(realpath "$1")"
command -v hardlink >/dev/null || exit 0
# The other finished environments, DIR itself left out.
others=()
add() { [ "$(realpath "$1")" != "$DIR" ] && others+=("$(realpath "$1")") || true; }
[ -f .venv/bin/.installed ] && add .venv
for other in build/*-venv; do [ -f "$other/.specdraft-stamp" ] && add "$other"; done
for other in .tox/*/; do [ -f "$other/pyvenv.cfg" ] && add "$other"; done
[ ${#others[@]} -gt 0 ] || exit 0
# --respect-name: only files of the same name are compared (a venv's duplicates always are).
hardlink --quiet --content --respect-name "$DIR" "${others[@]}" || true
