# Sourced by the install steps: `retry CMD ARGS...` runs a download-and-install
# command up to three times, 5 s then 10 s apart, so that one network hiccup
# on a fresh machine does not fail the whole run.
retry() {
  local attempt
  for attempt in 1 2 3; do
    "$@" && return 0
    [ "$attempt" = 3 ] && break
    echo "retry: attempt $attempt failed, again in $((attempt * 5)) s: $*" >&2
    sleep $((attempt * 5))
  done
  return 1
}
