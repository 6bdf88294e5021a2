# Throwaway Redis servers for scripts/test and scripts/bench: one standalone server and a
# 3-master Redis Cluster, on 127.0.0.1, in a temp dir, without persistence. Source it after
# scripts/pg-cluster.sh (it uses its `say`, `die`, `apt_install` and `port_is_free`); it defines
# functions and runs nothing:
#
#   redis_install   finds redis-server and redis-cli, installing Debian's `redis-server` package
#                   when missing; sets `redis_bindir`
#   redis_start     starts the servers on free ports, makes the cluster (`redis-cli --cluster
#                   create … --cluster-yes`), waits (bounded) until every node reports
#                   `cluster_state:ok`, and exports IDEM_TEST_REDIS_URL,
#                   IDEM_TEST_REDIS_CLUSTER_URLS (comma-separated), IDEM_REDIS_BINDIR (for tests
#                   that start servers of their own) and IDEM_REQUIRE_REDIS=1
#   redis_replica_start
#                   after redis_start: a replica of the standalone server (REPLICAOF), waited
#                   for (bounded) until its link is up and the master counts it, so `WAIT 1`
#                   has a replica to wait for (scripts/bench's `wait_for_replicas` rows)
#   redis_stop      stops every server started here and deletes the temp dir; safe at any time
#
# The caller traps EXIT to call redis_stop.

redis_dir=""
redis_bindir=""

redis_install() {
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        apt_install redis-server
        # Debian's package may start a server of its own where a service manager runs; the
        # tests use only the servers started below.
    fi
    command -v redis-server >/dev/null 2>&1 || die "redis-server was installed but is not on PATH"
    redis_bindir=$(dirname "$(command -v redis-server)")
    say "redis: $("$redis_bindir/redis-server" --version | head -c 60)"
}

# A free port whose cluster bus port (port + 10000) is free too.
redis_free_port() {
    local candidate tries
    for tries in $(seq 1 200); do
        candidate=$((20000 + RANDOM % 9000))
        port_is_free "$candidate" && port_is_free "$((candidate + 10000))" || continue
        printf '%s\n' "$candidate"
        return 0
    done
    die "no free port pair for Redis after 200 tries"
}

# redis_server_start NAME PORT [cluster]: one server in $redis_dir/NAME.
redis_server_start() {
    local name=$1 port=$2 dir="$redis_dir/$1" args=()
    mkdir -p "$dir"
    if [ "${3:-}" = cluster ]; then
        args+=(--cluster-enabled yes --cluster-config-file "$dir/nodes.conf"
            --cluster-node-timeout 2000)
    fi
    "$redis_bindir/redis-server" --port "$port" --bind 127.0.0.1 --dir "$dir" \
        --save '' --appendonly no --daemonize yes --pidfile "$dir/redis.pid" \
        --logfile "$dir/redis.log" "${args[@]}" ||
        die "redis-server $name did not start on port $port"
    local tries
    for tries in $(seq 1 100); do
        if "$redis_bindir/redis-cli" -p "$port" ping 2>/dev/null | grep -q PONG; then
            return 0
        fi
        sleep 0.1
    done
    die "redis-server $name did not answer on port $port within 10 s: $(tail -5 "$dir/redis.log")"
}

redis_start() {
    redis_dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-redis.XXXXXX")
    local port nodes=() urls=() node tries ok
    port=$(redis_free_port)
    redis_server_start standalone "$port"
    export IDEM_TEST_REDIS_URL="redis://127.0.0.1:$port"
    for node in 1 2 3; do
        port=$(redis_free_port)
        redis_server_start "cluster-$node" "$port" cluster
        nodes+=("127.0.0.1:$port")
        urls+=("redis://127.0.0.1:$port")
    done
    "$redis_bindir/redis-cli" --cluster create "${nodes[@]}" --cluster-replicas 0 \
        --cluster-yes >"$redis_dir/cluster-create.log" 2>&1 ||
        die "redis-cli --cluster create failed: $(tail -5 "$redis_dir/cluster-create.log")"
    for tries in $(seq 1 100); do
        ok=0
        for node in "${nodes[@]}"; do
            "$redis_bindir/redis-cli" -p "${node##*:}" cluster info 2>/dev/null |
                grep -q 'cluster_state:ok' && ok=$((ok + 1))
        done
        [ "$ok" -eq "${#nodes[@]}" ] && break
        sleep 0.1
    done
    [ "$ok" -eq "${#nodes[@]}" ] || die "the Redis cluster did not reach cluster_state:ok in 10 s"
    IDEM_TEST_REDIS_CLUSTER_URLS=$(
        IFS=,
        printf '%s' "${urls[*]}"
    )
    export IDEM_TEST_REDIS_CLUSTER_URLS
    export IDEM_REDIS_BINDIR="$redis_bindir"
    export IDEM_REQUIRE_REDIS=1
    say "IDEM_TEST_REDIS_URL=$IDEM_TEST_REDIS_URL IDEM_TEST_REDIS_CLUSTER_URLS=$IDEM_TEST_REDIS_CLUSTER_URLS"
}

redis_replica_start() {
    local master_port=${IDEM_TEST_REDIS_URL##*:} port tries
    port=$(redis_free_port)
    redis_server_start standalone-replica "$port"
    "$redis_bindir/redis-cli" -p "$port" replicaof 127.0.0.1 "$master_port" >/dev/null ||
        die "redis-cli replicaof failed on port $port"
    for tries in $(seq 1 100); do
        if "$redis_bindir/redis-cli" -p "$port" info replication 2>/dev/null |
            grep -q 'master_link_status:up' &&
            "$redis_bindir/redis-cli" -p "$master_port" info replication 2>/dev/null |
            grep -q 'connected_slaves:1'; then
            say "a replica of 127.0.0.1:$master_port on 127.0.0.1:$port"
            return 0
        fi
        sleep 0.1
    done
    die "the replica on port $port did not sync with 127.0.0.1:$master_port within 10 s"
}

redis_stop() {
    [ -n "$redis_dir" ] && [ -d "$redis_dir" ] || return 0
    local pidfile pid
    local pids=()
    for pidfile in "$redis_dir"/*/redis.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null && pids+=("$pid")
    done
    # A server writes to its directory as it shuts down (its log's last lines; a cluster node
    # also its nodes.conf): deleting the directory before it has exited races with those writes
    # ("Directory not empty", seen once in CI). Wait for each, 10 s at most.
    for pid in ${pids[@]+"${pids[@]}"}; do
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    done
    rm -rf "$redis_dir"
    redis_dir=""
}
