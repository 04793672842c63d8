# Sourced by the e2e install scripts: `retry CMD...` runs CMD up to three times, 5 s then 10 s apart (a
# registry can fail a download now and then).
retry() {
  local try
  for try in 1 2 3; do
    "$@" && return 0
    echo "install.sh: try $try of 3 failed: $*" >&2
    sleep $((try * 5))
  done
  return 1
}
