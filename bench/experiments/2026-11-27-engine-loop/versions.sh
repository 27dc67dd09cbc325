# Sourced by the timing scripts of this folder: `in_version VERSION COMMAND...` runs COMMAND with the code
# of VERSION, "before" (the folder $BEFORE: an unpacked old commit whose dmae_fast/ holds symlinks kernels,
# export, train, bench to its top-level folders) or "after" (this checkout), and fails if Python would
# import the other one. The command runs inside that version's folder with PYTHONPATH set to it:
# `python -m` puts the working directory first on sys.path, so run from this checkout with PYTHONPATH
# alone, "before" imported this checkout's code (the mistake in the step-8 records, found in step 9).
# OUT paths must be absolute (see absolute_dir).
AFTER=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)

absolute_dir() {  # absolute_dir DIR: makes DIR and prints its absolute path
  mkdir -p "$1" && (cd "$1" && pwd)
}

in_version() {  # in_version VERSION COMMAND...
  local dir=$AFTER
  [ "$1" = before ] && dir=$BEFORE
  shift
  local found
  found=$(cd "$dir" && PYTHONPATH="$dir" ${PYTHON:-python} -c 'import dmae_fast; print(dmae_fast.__file__)')
  if [ "$found" != "$dir/dmae_fast/__init__.py" ]; then
    echo "in_version: $dir imports $found, not its own dmae_fast" >&2
    return 1
  fi
  (cd "$dir" && PYTHONPATH="$dir" "$@")
}
