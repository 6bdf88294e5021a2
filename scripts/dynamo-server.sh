# A throwaway DynamoDB-compatible server (moto, in server mode) for scripts/test and
# scripts/bench. Source it after scripts/pg-cluster.sh (it uses its `say`, `die`,
# `port_is_free` and `venv_install`); it defines functions and runs nothing:
#
#   dynamo_install   makes a Python venv with a pinned moto[server] in the cache dir
#                    (${XDG_CACHE_HOME:-$HOME/.cache}/idem/moto-$MOTO_VERSION) when missing, from
#                    PyPI; sets `moto_python`
#   dynamo_start     starts moto on 127.0.0.1 on a free port (scripts/moto-serial.py: one request
#                    at a time, so conditional writes are atomic as in DynamoDB), waits until it
#                    answers (bounded), and exports IDEM_TEST_DYNAMODB_URL, IDEM_REQUIRE_DYNAMODB=1,
#                    IDEM_TEST_S3_URL (the same endpoint: moto serves S3 there too, for
#                    idem-object-store's tests) and IDEM_REQUIRE_S3=1,
#                    IDEM_DYNAMODB_SERVER_CMD (how a test starts a server of its own: the command,
#                    to which it appends `HOST PORT`) and dummy AWS credentials, region and
#                    AWS_EC2_METADATA_DISABLED=true so nothing reaches the network
#   dynamo_stop      stops the server and deletes its temp dir; safe to call at any time
#
# The caller traps EXIT to call dynamo_stop.

MOTO_VERSION=5.2.5
dynamo_dir=""
dynamo_pid=""

dynamo_install() {
    local cache="${XDG_CACHE_HOME:-$HOME/.cache}/idem/moto-$MOTO_VERSION"
    moto_python="$cache/bin/python"
    venv_install "$cache" "moto[server]==$MOTO_VERSION" "moto.server, werkzeug"
    say "moto $MOTO_VERSION: $cache"
}

dynamo_start() {
    dynamo_dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-test-dynamo.XXXXXX")
    local launcher="$PWD/scripts/moto-serial.py" candidate port=""
    for _ in 1 2 3 4 5; do
        candidate=$((20000 + RANDOM % 40000))
        port_is_free "$candidate" || continue
        say "starting moto (DynamoDB) on 127.0.0.1:$candidate"
        "$moto_python" "$launcher" 127.0.0.1 "$candidate" >"$dynamo_dir/server.log" 2>&1 &
        dynamo_pid=$!
        # Bounded wait: 30 s at most.
        for _ in $(seq 1 150); do
            if ! kill -0 "$dynamo_pid" 2>/dev/null; then break; fi
            if (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
                port=$candidate
                break
            fi
            sleep 0.2
        done
        [ -n "$port" ] && break
        tail -n 5 "$dynamo_dir/server.log" >&2 || true
        kill "$dynamo_pid" 2>/dev/null || true
        wait "$dynamo_pid" 2>/dev/null || true
        dynamo_pid=""
    done
    [ -n "$port" ] || die "could not start moto; see the log above"
    export IDEM_TEST_DYNAMODB_URL="http://127.0.0.1:$port"
    export IDEM_REQUIRE_DYNAMODB=1
    export IDEM_DYNAMODB_SERVER_CMD="$moto_python $launcher"
    # moto serves S3 on the same endpoint (path-style requests, any bucket name).
    export IDEM_TEST_S3_URL="$IDEM_TEST_DYNAMODB_URL"
    export IDEM_REQUIRE_S3=1
    # Dummy credentials and region for any SDK that reads them; never the instance metadata.
    export AWS_ACCESS_KEY_ID=idem-test AWS_SECRET_ACCESS_KEY=idem-test AWS_REGION=us-east-1
    export AWS_EC2_METADATA_DISABLED=true
    say "IDEM_TEST_DYNAMODB_URL=$IDEM_TEST_DYNAMODB_URL IDEM_REQUIRE_DYNAMODB=1"
    say "IDEM_TEST_S3_URL=$IDEM_TEST_S3_URL IDEM_REQUIRE_S3=1"
}

dynamo_stop() {
    if [ -n "$dynamo_pid" ]; then
        say "stopping moto"
        kill "$dynamo_pid" 2>/dev/null || true
        wait "$dynamo_pid" 2>/dev/null || true
        dynamo_pid=""
    fi
    if [ -n "$dynamo_dir" ]; then rm -rf "$dynamo_dir"; dynamo_dir=""; fi
}
