# Sourced by the scripts/*_venv.sh builders: one build of a venv at a time, and a stamp that
# says whether a built venv is current. A builder calls, in this order:
#   venv_lock VENV          take VENV.lock (a second build of the same venv waits here, e.g. the
#                           serve tests' call while `make test` builds it in the background)
#   venv_current VENV HASH  true when VENV's stamp equals HASH (the builder exits 0: kept as is)
#   venv_stamp VENV HASH    the builder's last step: a venv without it is rebuilt from scratch
# HASH is the builder's choice: its own text, this file's, and what the venv reuses.

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

# The builder's step before its stamp: files identical to the project's other finished venvs
# become hard links (scripts/share_files.sh says why and when that is safe).
venv_share_files() {
  bash scripts/share_files.sh "$1"
}
