# A throwaway NATS server with JetStream for scripts/test. Source it after scripts/pg-cluster.sh
# (it uses its `say`, `die`, `apt_install` and `port_is_free`); it defines functions and runs
# nothing:
#
#   nats_install   finds nats-server, installing Debian's `nats-server` package when missing
#   nats_start     starts `nats-server -js` on 127.0.0.1 on a free port, its JetStream store in a
#                  new temp dir, waits (bounded) until it answers, and exports IDEM_TEST_NATS_URL
#                  and IDEM_REQUIRE_NATS=1
#   nats_stop      stops the server and deletes the temp dir; safe to call at any time
#
# The caller traps EXIT to call nats_stop.

nats_dir=""
nats_pid=""

nats_install() {
    command -v nats-server >/dev/null 2>&1 || apt_install nats-server
    command -v nats-server >/dev/null 2>&1 || die "nats-server was installed but is not on PATH"
    say "nats-server $(nats-server --version 2>&1 | head -c 40)"
}

nats_start() {
    local port tries
    nats_dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-test-nats.XXXXXX")
    for tries in $(seq 1 200); do
        port=$((20000 + RANDOM % 20000))
        port_is_free "$port" && break
    done
    say "starting nats-server -js on 127.0.0.1:$port"
    nats-server -js -a 127.0.0.1 -p "$port" -sd "$nats_dir/js" >"$nats_dir/nats.log" 2>&1 &
    nats_pid=$!
    for tries in $(seq 1 100); do
        if grep -q "Server is ready" "$nats_dir/nats.log" 2>/dev/null; then
            export IDEM_TEST_NATS_URL="nats://127.0.0.1:$port"
            export IDEM_REQUIRE_NATS=1
            say "IDEM_TEST_NATS_URL=$IDEM_TEST_NATS_URL IDEM_REQUIRE_NATS=1"
            return 0
        fi
        kill -0 "$nats_pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$nats_dir/nats.log" >&2 || true
    die "nats-server did not start on port $port"
}

nats_stop() {
    if [ -n "$nats_pid" ]; then
        kill "$nats_pid" 2>/dev/null || true
        wait "$nats_pid" 2>/dev/null || true
        nats_pid=""
    fi
    if [ -n "$nats_dir" ]; then
        rm -rf "$nats_dir"
        nats_dir=""
    fi
}
