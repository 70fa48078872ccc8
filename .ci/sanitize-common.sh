# Shared by .ci/sanitize and .ci/sanitize-memprof (sourced, not run): a copy of the
# tree in $work (removed on exit), the interpreter's headers and extension suffix, and
# build_ext to compile one extension module's C file into that copy, with or without
# AddressSanitizer. Expects $py, the interpreter to build for.
libasan=$(gcc -print-file-name=libasan.so)
[ -e "$libasan" ] || { echo "no libasan for gcc here"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git ls-files -co --exclude-standard -z | xargs -0 tar -cf - | tar -xf - -C "$work"
inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1

# build_ext SOURCE MODULE asan|plain: e.g. build_ext sampler/_native/engine.c sampler/_native asan
build_ext() {
  local flags=(-g -O1 -std=gnu11 -shared -fPIC -I"$inc")
  [ "$3" = asan ] && flags=(-fsanitize=address -fno-omit-frame-pointer "${flags[@]}")
  gcc "${flags[@]}" "$work/$1" -o "$work/$2$suffix" -lpthread -lm
}
