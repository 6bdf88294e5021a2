# A throwaway PostgreSQL cluster, shared by scripts/test and scripts/bench. Source it; it defines
# functions and runs nothing:
#
#   pg_cluster_install   finds PostgreSQL's server programs, installing PostgreSQL with apt-get
#                        when missing (without the cluster Debian's package would create); sets
#                        `bindir`
#   pg_cluster_start     initdb in a new temp dir and start a server on 127.0.0.1 on a free port
#                        (fsync off: the data is thrown away; with `pg_fsync=on` set first, the
#                        server's defaults instead: fsync and synchronous_commit on, for rows
#                        compared at equal durability); sets `pgdir`, `port`, `pg_url`
#   pg_cluster_stop      stops the server and deletes the temp dir; safe to call at any time
#
# The caller sets `set -euo pipefail` and traps EXIT to call pg_cluster_stop. Messages go to
# stderr as `==> …`; fatal errors are prefixed with the calling script's name.

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'scripts/%s: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root to run: $*"
    fi
}

apt_updated=0
apt_install() {
    say "installing $* with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if [ "$apt_updated" -eq 0 ]; then
        as_root apt-get update -qq
        apt_updated=1
    fi
    # --force-confold keeps our createcluster.conf (below) instead of prompting.
    as_root apt-get install -y -qq -o Dpkg::Options::=--force-confold "$@" >/dev/null
}

# venv_install DIR REQUIREMENT IMPORTS: a Python venv in DIR with REQUIREMENT pip-installed,
# unless DIR already has one whose python imports IMPORTS (comma-separated modules).
venv_install() {
    local dir=$1 requirement=$2 imports=$3
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import $imports" 2>/dev/null; then
        return 0
    fi
    command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv
    say "installing $requirement into $dir"
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    python3 -m venv "$dir" || {
        apt_install python3-venv
        python3 -m venv "$dir"
    } || die "could not create a Python venv in $dir"
    "$dir/bin/pip" install --quiet --disable-pip-version-check "$requirement" ||
        die "pip could not install $requirement"
    "$dir/bin/python" -c "import $imports" || die "$requirement was installed but does not import"
}

# A directory holding PostgreSQL's server programs, or nothing.
find_pg_bindir() {
    local dir candidates=()
    if command -v pg_config >/dev/null 2>&1; then
        candidates+=("$(pg_config --bindir 2>/dev/null || true)")
    fi
    # Newest version first.
    while IFS= read -r dir; do candidates+=("$dir"); done < <(
        ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r
    )
    if command -v initdb >/dev/null 2>&1; then
        candidates+=("$(dirname "$(command -v initdb)")")
    fi
    for dir in "${candidates[@]}"; do
        if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] &&
            [ -x "$dir/postgres" ] && [ -x "$dir/pg_isready" ]; then
            printf '%s\n' "$dir"
            return 0
        fi
    done
    # Nothing found: print nothing, and do not trip `set -e` in the caller.
    return 0
}

pg_cluster_install() {
    bindir=$(find_pg_bindir)
    if [ -z "$bindir" ]; then
        # Debian's package would also create and start a cluster of its own: we want none.
        as_root mkdir -p /etc/postgresql-common
        if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
            echo "create_main_cluster = false" | as_root tee /etc/postgresql-common/createcluster.conf >/dev/null
        fi
        apt_install postgresql
        bindir=$(find_pg_bindir)
        [ -n "$bindir" ] || die "PostgreSQL was installed but its server programs were not found"
    fi
    say "PostgreSQL: $("$bindir/postgres" --version) in $bindir"
}

port_is_free() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null
    else
        # Nothing answering is as good as we can tell without binding.
        ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
    fi
}

pgdir=""
run_pg=()
pg_fsync=${pg_fsync:-off}

pg_cluster_start() {
    # PostgreSQL refuses to run as root: as root, run it as the `postgres` user.
    if [ "$(id -u)" -eq 0 ]; then
        if ! id postgres >/dev/null 2>&1; then
            say "creating the system user postgres"
            useradd --system --no-create-home --shell /usr/sbin/nologin postgres
        fi
        run_pg=(runuser -u postgres --)
    fi

    pgdir=$(mktemp -d "${TMPDIR:-/tmp}/idem-test-pg.XXXXXX")
    chmod 700 "$pgdir"
    if [ "${#run_pg[@]}" -gt 0 ]; then chown postgres: "$pgdir"; fi

    say "initdb in $pgdir"
    "${run_pg[@]}" "$bindir/initdb" -D "$pgdir/data" -U postgres --auth=trust --no-sync \
        -E UTF8 --locale=C >"$pgdir/initdb.log" 2>&1 || {
        cat "$pgdir/initdb.log" >&2
        die "initdb failed"
    }

    port=""
    local candidate durability="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    if [ "$pg_fsync" = on ]; then durability=""; fi
    for _ in 1 2 3 4 5; do
        candidate=$((20000 + RANDOM % 40000))
        port_is_free "$candidate" || continue
        say "starting PostgreSQL on 127.0.0.1:$candidate"
        if "${run_pg[@]}" "$bindir/pg_ctl" -D "$pgdir/data" -l "$pgdir/server.log" -w -t 60 \
            -o "-p $candidate -k $pgdir -c listen_addresses=127.0.0.1 $durability -c max_connections=300" \
            start >/dev/null; then
            port=$candidate
            break
        fi
        # Lost a race for the port (or another start problem): show why and try another port.
        tail -n 5 "$pgdir/server.log" >&2 || true
    done
    [ -n "$port" ] || die "could not start PostgreSQL; see the log above"

    for _ in $(seq 1 120); do
        if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; then break; fi
        sleep 0.5
    done
    "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres || die "PostgreSQL did not become ready"
    pg_url="postgres://postgres@127.0.0.1:$port/postgres"
}

pg_cluster_stop() {
    if [ -z "$pgdir" ]; then return 0; fi
    if [ -f "$pgdir/data/postmaster.pid" ]; then
        say "stopping the test cluster"
        "${run_pg[@]}" "$bindir/pg_ctl" -D "$pgdir/data" -m immediate -w -t 60 stop >/dev/null 2>&1 || true
    fi
    rm -rf "$pgdir"
}
