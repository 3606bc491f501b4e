# Sourced by the scripts/*_venv.sh builders: one build of a venv at a time, and a stamp that
# says whether a built venv is current. A builder calls, in this order:
#   venv_lock VENV          take VENV.lock (a second build of the same venv waits here, e.g. the
#                           serve tests' call while `make test` builds it in the background)
#   venv_current VENV HASH  true when VENV's stamp equals HASH (the builder exits 0: kept as is)
#   venv_stamp VENV HASH    the builder's last step: a venv without it is rebuilt from scratch
# HASH is the builder's choice: its own text, this file's, and what the venv reuses.
#
# A venv that reuses nothing of the clone (the vLLM venv, and speculators' venv on top of it) is
# built once per machine in the venv cache and linked into the clone (venv_cached, venv_link), as
# scripts/llama_cpp_build.sh does for llama.cpp: a fresh clone, a rerun of CI or a second
# worktree finds it and skips ~3.5 minutes of downloading and unpacking on the cores the suite
# needs. The cache is $SPECDRAFT_VENV_CACHE (default ~/.cache/specdraft); a cached venv unused
# for VENV_CACHE_KEEP_DAYS is removed when another of its kind is built. The venvs layered on the
# clone's own .venv (SGLang's, SpecForge's) stay under build/: their .pth points into the clone.

VENV_CACHE_ROOT="${SPECDRAFT_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specdraft}"
VENV_CACHE_KEEP_DAYS=14

venv_lock() {
  mkdir -p "$(dirname "$1")"
  exec 9>"$1.lock"
  flock 9
}

venv_current() {
  [ -f "$1/.specdraft-stamp" ] && [ "$(cat "$1/.specdraft-stamp")" = "$2" ]
}

venv_stamp() {
  echo "$2" >"$1/.specdraft-stamp"
}

# The cache folder of the venv NAME whose builder's HASH is given: named by both, so a changed
# builder (or a changed venv it reuses) gets a folder of its own and never overwrites one that
# another clone on an older commit still links to.
venv_cached() {
  echo "$VENV_CACHE_ROOT/$1-${2:0:12}"
}

# Make VENV (the clone's path, e.g. build/vllm-venv) a link to CACHED, replacing a venv an older
# checkout built in place there, and mark CACHED used (the pruning below goes by that mark).
venv_link() {
  if [ -e "$1" ] && [ ! -L "$1" ]; then
    rm -rf "$1"
  fi
  mkdir -p "$(dirname "$1")"
  ln -sfn "$2" "$1"
  touch "$2/.specdraft-used"
}

# The cached builders' first step: set CACHED (venv_cached NAME HASH) and take its lock; when it
# is current, link VENV to it and succeed (the builder exits 0); else prune its kind, clear
# CACHED and fail, and the builder builds into CACHED, stamps it and links VENV to it.
venv_from_cache() {
  CACHED="$(venv_cached "$1" "$2")"
  venv_lock "$CACHED"
  if venv_current "$CACHED" "$2"; then
    venv_link "$3" "$CACHED"
    return 0
  fi
  venv_prune "$1" "$CACHED"
  rm -rf "$CACHED"
  return 1
}

# Remove the cached venvs of kind NAME other than KEEP that no clone has linked for
# VENV_CACHE_KEEP_DAYS days (each is 0.3 to 2.5 GB); one being built (its lock held) is left.
venv_prune() {
  local old
  for old in "$VENV_CACHE_ROOT/$1"-*/; do
    old="${old%/}"
    [ -d "$old" ] && [ "$old" != "$2" ] || continue
    if [ -z "$(find "$old/.specdraft-used" -mtime -"$VENV_CACHE_KEEP_DAYS" 2>/dev/null)" ]; then
      (flock -n 8 && rm -rf "$old" "$old.lock") 8>"$old.lock" || true
    fi
  done
}

# The builder's step before its stamp: files identical to the project's other finished venvs
# become hard links (scripts/share_files.sh says why and when that is safe).
venv_share_files() {
  bash scripts/share_files.sh "$1"
}
